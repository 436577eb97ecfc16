"""simulate(): a schedule, its costs and the hardware in; a Result out."""

from __future__ import annotations

from .cost import StageCosts
from .errors import PipesimError
from .fastpath import run_fast
from .hardware import Hardware
from .ir import Schedule
from .limits import check_fits
from .plan import OverlapFB, make_plan
from .result import Result, make_result

__all__ = ["simulate", "ENGINES", "SimulateError"]

ENGINES = ("auto", "fast", "simpy")


class SimulateError(PipesimError):
    """An option of :func:`simulate` it cannot honour (engine, jitter, micro-batch size)."""


def simulate(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *,
             microbatch_size: float = 1.0, engine: str = "auto", jitter: float = 0.0, seed: int = 0,
             overlap_fb: OverlapFB | None = None) -> Result:
    """Simulate one run of *schedule*.

    *engine*: ``"simpy"`` (general: also models ``jitter``, the coefficient of
    variation of computation times), ``"fast"`` (exact list scheduler, deterministic
    only), or ``"auto"`` (fast unless jitter is asked for). Both give identical
    timelines where both apply.

    *overlap_fb*: how long the schedule's overlapped forward-backward pairs last
    (:class:`~sim.plan.OverlapFB`; default F + B).
    """
    if engine not in ENGINES:
        raise SimulateError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not jitter >= 0:
        raise SimulateError(f"jitter must be >= 0, got {jitter!r}")
    if not microbatch_size > 0:
        raise SimulateError(f"microbatch_size must be > 0, got {microbatch_size!r}")
    if engine == "fast" and jitter > 0:
        raise SimulateError("the fast engine is deterministic; use engine='simpy' for jitter")
    hardware = hardware or Hardware(devices=schedule.devices)
    check_fits(len(schedule), f"schedule {schedule.name!r}")
    use_simpy = engine == "simpy" or jitter > 0
    if use_simpy:
        schedule.validate()  # simpy would just stop on a deadlock; find it first
    else:
        schedule.check_structure()  # a deadlock stalls the fast engine's list scheduler, which reports it
    plan = make_plan(schedule, costs, hardware, overlap_fb)
    if use_simpy:
        from .engine import run_simpy  # here, not at the top: simpy is loaded only when asked for

        built = run_simpy(plan, jitter=jitter, seed=seed)
    else:
        built = run_fast(plan)
    return make_result(schedule, costs, hardware, built, microbatch_size=microbatch_size)
