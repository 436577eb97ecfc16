"""pipesim's simulator: schedules as data, simulated on K devices with links and memory.

Importable without torch::

    import sim
    schedule = sim.schedules.gpipe(4, 4)
    result = sim.simulate(schedule, sim.uniform(4, forward=1, backward=2))
    result.metrics.bubble_fraction  # 3/7
"""

__version__ = "0.2.0"  # the package version (pyproject.toml reads it from here)

from . import schedules
from .config import ConfigError, PipelineConfig
from .errors import PipesimError, PipesimTypeError
from .cost import CostsError, StageCosts, load_costs, save_costs, uniform
from .hardware import Hardware, HardwareError, load_hardware, save_hardware
from .ir import Action, ActionKind, Schedule, ScheduleError
from .limits import TooLargeError
from .result import Result, make_result
from .simulate import simulate

__all__ = [
    "Action", "ActionKind", "Schedule", "ScheduleError", "PipelineConfig", "ConfigError",
    "StageCosts", "CostsError", "uniform", "load_costs", "save_costs",
    "Hardware", "HardwareError", "load_hardware", "save_hardware",
    "Result", "make_result", "simulate", "schedules", "TooLargeError", "PipesimError", "PipesimTypeError",
]
