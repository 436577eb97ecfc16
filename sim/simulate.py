"""simulate(): a schedule, its costs and the hardware in; a Result out."""

from __future__ import annotations

from .cost import StageCosts
from .fastpath import run_fast
from .hardware import Hardware
from .ir import Schedule
from .plan import make_plan
from .result import Result, make_result

__all__ = ["simulate", "ENGINES"]

ENGINES = ("auto", "fast", "simpy")


def simulate(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *,
             microbatch_size: float = 1.0, engine: str = "auto", jitter: float = 0.0, seed: int = 0) -> Result:
    """Simulate one run of *schedule*.

    *engine*: ``"simpy"`` (general: also models ``jitter``, the coefficient of
    variation of computation times), ``"fast"`` (exact list scheduler, deterministic
    only), or ``"auto"`` (fast unless jitter is asked for). Both give identical
    timelines where both apply.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not jitter >= 0:
        raise ValueError(f"jitter must be >= 0, got {jitter!r}")
    if not microbatch_size > 0:
        raise ValueError(f"microbatch_size must be > 0, got {microbatch_size!r}")
    if engine == "fast" and jitter > 0:
        raise ValueError("the fast engine is deterministic; use engine='simpy' for jitter")
    hardware = hardware or Hardware(devices=schedule.devices)
    schedule.validate()
    plan = make_plan(schedule, costs, hardware)
    if engine == "simpy" or jitter > 0:
        from .engine import run_simpy  # here, not at the top: simpy is loaded only when asked for

        built = run_simpy(plan, jitter=jitter, seed=seed)
    else:
        built = run_fast(plan)
    return make_result(schedule, costs, hardware, built, microbatch_size=microbatch_size)
