"""pipesim's simulator: schedules as data, simulated on K devices with links and memory.

Importable without torch::

    import sim
    schedule = sim.schedules.gpipe(4, 4)
    result = sim.simulate(schedule, sim.uniform(4, forward=1, backward=2))
    result.metrics.bubble_fraction  # 3/7
"""

__version__ = "0.3.0"  # the package version (pyproject.toml reads it from here)

from sim import schedules
from sim.core.config import ConfigError, PipelineConfig
from sim.errors import PipesimError, PipesimTypeError
from sim.model.cost import CostsError, StageCosts, load_costs, save_costs, uniform
from sim.model.hardware import Hardware, HardwareError, load_hardware, save_hardware
from sim.core.ir import Action, ActionKind, Schedule, ScheduleError
from sim.limits import TooLargeError
from sim.results.result import Result, make_result
from sim.simulate import simulate
from sim.search.montecarlo import MonteCarlo, monte_carlo
from sim.search.synthesis import SynthesisError, synthesize
from sim.moved import SIM_MOVED, install as _install_moved

_install_moved(SIM_MOVED)  # the 0.2 module paths, for one release (sim.moved)

__all__ = [
    "Action", "ActionKind", "Schedule", "ScheduleError", "PipelineConfig", "ConfigError",
    "StageCosts", "CostsError", "uniform", "load_costs", "save_costs",
    "Hardware", "HardwareError", "load_hardware", "save_hardware",
    "Result", "make_result", "simulate", "monte_carlo", "MonteCarlo", "schedules", "TooLargeError", "PipesimError",
    "PipesimTypeError", "synthesize", "SynthesisError",
]
