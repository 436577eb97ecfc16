"""simulate(): a schedule, its costs and the hardware in; a Result out."""

from __future__ import annotations

import math

import numpy as np

from .cost import StageCosts, check_totals
from .engine import run_simpy
from .errors import PipesimError, PipesimTypeError, quote, real_number
from .fastpath import run_fast
from .hardware import Hardware
from .ir import Schedule
from .plan import make_plan
from .result import Result, make_result

__all__ = ["simulate", "ENGINES"]

ENGINES = ("auto", "fast", "simpy")
MAX_JITTER = 1e100
"""Largest jitter accepted: far past any real variation, and far from where its square overflows (1.3e154)."""


def simulate(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *,
             microbatch_size: float = 1.0, engine: str = "auto", jitter: float = 0.0, seed: int = 0) -> Result:
    """Simulate one run of *schedule*.

    *engine*: ``"simpy"`` (general: also models ``jitter``, the coefficient of
    variation of computation times), ``"fast"`` (exact list scheduler, deterministic
    only), or ``"auto"`` (fast unless jitter is asked for). Both give identical
    timelines where both apply.
    """
    _check_types(schedule, costs, hardware)
    if engine not in ENGINES:
        raise PipesimError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    jitter, microbatch_size = real_number(jitter, "jitter"), real_number(microbatch_size, "microbatch_size")
    if not 0 <= jitter <= MAX_JITTER:  # the engine squares it (sim.engine): past ~1e154 every duration is nan
        raise PipesimError(f"jitter must be >= 0 and at most {MAX_JITTER:g} (a coefficient of variation: "
                           f"0.1 is 10 %), got {jitter!r}")
    if not 0 < microbatch_size < math.inf:
        raise PipesimError(f"microbatch_size must be a finite number > 0, got {microbatch_size!r}")
    if engine == "fast" and jitter > 0:
        raise PipesimError("the fast engine is deterministic; use engine='simpy' for jitter")
    hardware = hardware or Hardware(devices=schedule.devices)
    schedule.validate()
    check_totals(costs, schedule.total_microbatches)  # sums that would overflow to inf / nan, refused up front
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is refused just below, in words
        plan = make_plan(schedule, costs, hardware)
    _check_transfers(plan)
    if engine == "simpy" or jitter > 0:
        built = run_simpy(plan, jitter=jitter, seed=seed)
    else:
        built = run_fast(plan)
    result = make_result(schedule, costs, hardware, built.frame(schedule, plan.sends), microbatch_size=microbatch_size)
    if not math.isfinite(result.metrics.makespan):  # e.g. a huge jitter on huge costs: never print inf or nan
        raise PipesimError(f"the simulated makespan overflows ({result.metrics.makespan}); use smaller costs or jitter")
    return result


def _check_types(schedule, costs, hardware) -> None:
    """Wrong types are a TypeError naming the argument (not an AttributeError deep inside the engine)."""
    for name, value, cls, takes in (
            ("schedule", schedule, Schedule, "a Schedule (e.g. sim.schedules.gpipe(4, 8))"),
            ("costs", costs, StageCosts, "a StageCosts (e.g. sim.uniform(4) or sim.cost.load_costs(path))"),
            ("hardware", hardware, (Hardware, type(None)), "a Hardware (e.g. Hardware(devices=4)) or None")):
        if not isinstance(value, cls):
            raise PipesimTypeError(f"{name} must be {takes}, got {type(value).__name__} {quote(value)}")


def _check_transfers(plan) -> None:
    """Transfer times are bytes / bandwidth: a huge size over a tiny bandwidth overflows where no cost does."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(plan.send_seconds.sum()) + float(plan.durations.sum())
    if not math.isfinite(total):
        raise PipesimError("the transfer times overflow (bytes / bandwidth past the largest float); check "
                           "--activation-bytes and --bandwidth (or the costs and hardware files) for a typo")
