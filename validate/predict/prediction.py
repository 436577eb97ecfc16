"""Which calibration predicts which timed run: the rolling one-step-ahead prediction.

The in-schedule calibration (``calibration="schedule"``, a real workload, no costs given)
predicts each timed run from the stage times and executor overheads traced in the run just
before it::

    timed run 0      <- the last warm-up run
    timed run r >= 1 <- timed run r - 1

always out of sample: a run's own trace never predicts it. Each run's error is
``measured_r / predicted_r - 1``; the report's error is their median, with its p10-p90.

Why not the warm-up run alone: the machine's speed moves between runs (measured on the
project's 2-core VM, one transformer launch, makespans in ms: 260 230 208 209 213; another
407 391 403 424 420 380 337 341 354 334), and the last warm-up run is systematically slower
than the timed runs after it. Predicting every run from that one sample put the median error
of 3 of 6 transformer schedule-launches (K=2, M=8, GPipe and 1F1B) past 5% (-11.2%, -9.2%,
-14.9%); predicting each run from the run before it put all 6 within 2.2% (an experiment on
the same launches, 24 Nov 2026, runs 2-9 of 10: pooling every earlier run, or every other run,
did worse than the nearest one: the machine drifts, so the nearest sample is the best). A
replay with each run's own times (:mod:`validate.predict.replay`) already showed the model itself
misses ~0%: the error was the gap between the one calibration sample and the runs, which the
nearest earlier run shrinks. With this prediction, 14 transformer rows of 7 quiet launches
(K=2, M=8, GPipe and 1F1B, load 0.3-0.9 before each) had median errors -2.1..+3.3% (README, benchmark).

Its price: one run that is slow by chance (a preemption) is charged twice, to its own error and
to the prediction of the next run; the median over the runs absorbs one such run.

The report still says what the warm-up run alone would have given
(``makespan_error_from_warmup``), so the gain is visible, never hidden.

Given costs (a costs file, the emulated workload) and ``calibration="isolated"`` keep one
prediction for every run: those costs do not come from the runs.

Units: seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.core.ir import Schedule
from sim.results.result import Result

from validate.predict.calibrate import WARMUP_RUN, Calibration, in_schedule_costs, in_schedule_overhead
from validate.request import RankResult

__all__ = ["RunPredictions", "TracedTimes", "traced_times", "per_run_sources", "predict_runs", "ROLLING_SOURCE",
           "FIXED_SOURCE"]

ROLLING_SOURCE = "each timed run predicted from the run before it (the first from the last warm-up run)"
"""How the rolling prediction was made, in words (the report's ``calibration_source``)."""
FIXED_SOURCE = "every timed run predicted from the same costs"
"""How a single prediction was made (given costs, emulated workload, isolated calibration)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedTimes:
    """What one traced run of every rank says the stages cost: the input of one prediction."""

    run: str
    """Which run: ``"warm-up run"`` (the last one) or ``"timed run N"`` (N counted from 1)."""
    stage_times: dict[int, dict[str, float]]
    """stage -> {op letter: trimmed mean seconds} (:func:`validate.predict.calibrate.in_schedule_costs`)."""
    overhead: dict[int, dict[str, float]]
    """stage -> {cost column: mean executor overhead per action} (:func:`validate.predict.calibrate.in_schedule_overhead`)."""


def traced_times(schedule: Schedule, ranks: Sequence[RankResult], run: int) -> TracedTimes:
    """The stage times and overheads traced in timed run *run* (0-based) of every rank.

    Each rank is summarised alone and the stages merged as the worker's warm-up summaries are
    (:func:`warmup_times`): a stage's figures come from the rank that holds it.
    """
    stage_times: dict[int, dict[str, float]] = {}
    overhead: dict[int, dict[str, float]] = {}
    for r in ranks:
        trace = r.traces[run]
        stage_times.update(in_schedule_costs(schedule, trace.compute))
        overhead.update(in_schedule_overhead(schedule, trace.overhead))
    return TracedTimes(run=f"timed run {run + 1}", stage_times=stage_times, overhead=overhead)


def warmup_times(ranks: Sequence[RankResult]) -> TracedTimes:
    """The stage times and overheads of the last warm-up run, as every rank summarised them."""
    cals = [r.calibration for r in ranks if r.calibration is not None]
    return TracedTimes(run=WARMUP_RUN, stage_times={s: c for cal in cals for s, c in (cal.in_schedule or {}).items()},
                       overhead={s: c for cal in cals for s, c in (cal.action_overhead or {}).items()})


def per_run_sources(schedule: Schedule, ranks: Sequence[RankResult], *, rolling: bool) -> list[TracedTimes]:
    """One :class:`TracedTimes` per timed run: what predicts it.

    *rolling*: run 0 from the last warm-up run, run r >= 1 from timed run r - 1 (never run r itself);
    otherwise every run from the last warm-up run (the same object, so it is calibrated and simulated once).
    """
    repeats = len(ranks[0].traces)
    warm = warmup_times(ranks)
    if not rolling:
        return [warm] * repeats
    return [warm] + [traced_times(schedule, ranks, r - 1) for r in range(1, repeats)]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPredictions:
    """The prediction of every timed run, and the calibration that made each."""

    calibrations: tuple[Calibration, ...]
    """Per timed run, the calibration its prediction used (one object repeated when every run shares it)."""
    results: tuple[Result, ...]
    """Per timed run, the simulated run (one object repeated likewise)."""
    rolling: bool
    """True: each run predicted from the run before it; False: every run from the same costs."""
    traced_in: tuple[str, ...] = ()
    """Per timed run, the traced run its prediction came from (``"warm-up run"``, ``"timed run N"``)."""

    @property
    def makespans(self) -> tuple[float, ...]:
        return tuple(r.metrics.makespan for r in self.results)

    @property
    def warmup_makespan(self) -> float:
        """The makespan predicted from the last warm-up run (run 0's prediction, or everyone's)."""
        return self.results[0].metrics.makespan

    @property
    def source(self) -> str:
        return ROLLING_SOURCE if self.rolling else FIXED_SOURCE


def predict_runs(sources: Sequence[TracedTimes], calibrate: Callable[[TracedTimes], Calibration],
                 simulate: Callable[[Calibration], Result], *, rolling: bool) -> RunPredictions:
    """Calibrate and simulate once per distinct source of :func:`per_run_sources`.

    *calibrate*: the stage times and overheads of one traced run -> the :class:`Calibration` of a
    prediction (isolated sizes, link fit, given costs or hardware: the caller's); *simulate*: that
    calibration -> the simulated run.
    """
    done: dict[int, tuple[Calibration, Result]] = {}
    for source in sources:
        if id(source) not in done:
            cal = calibrate(source)
            done[id(source)] = (cal, simulate(cal))
    pairs = [done[id(source)] for source in sources]
    return RunPredictions(calibrations=tuple(c for c, _ in pairs), results=tuple(r for _, r in pairs), rolling=rolling,
                          traced_in=tuple(source.run for source in sources))
