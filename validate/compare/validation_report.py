"""The outcome of one validation: predicted and measured Results of one schedule, how far apart they are, and how
far the figures move by chance (the noise floor). Plain data, no torch: :mod:`validate.run` makes it,
:mod:`validate.compare.report` writes it.

Units: seconds, relative amounts (0.05 = 5%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.results.result import Result

from validate.correctness.checks import CorrectnessCheck
from validate.predict.calibrate import Calibration
from validate.request import ClockOffsets

__all__ = ["ValidationReport", "NoiseFloor", "noise_floor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoiseFloor:
    """How far this run's figures move by chance: relative amounts (0.05 = 5%).

    *makespans*: half the p10-p90 spread of the timed runs' makespans, relative to their median
    (how far one run's figure moves by chance). *stage_costs*: the largest relative change of a
    stage's compute time per micro-batch (F + B + W) between the calibrations before and after
    the runs, each stage measured alone, as ``max / min - 1``: how far the machine's speed moved
    while we measured (the prediction uses one calibration; a stage twice as slow at the end
    can make the run up to 100% slower than predicted). The others are filled in once the runs'
    own traces are replayed (:func:`build_report`).
    """

    makespans: float = 0.0
    stage_costs: float = 0.0
    in_runs: float = 0.0
    """Largest move of the action times in the timed runs from the costs that predicted each run."""
    replay: float = 0.0
    """Median shift of the prediction when the simulator replays each run's own action times."""
    model_miss: float = 0.0
    """Median miss of the model itself: measured makespan against the replay of the same run."""
    replayed_makespans: tuple[float, ...] = ()

    @property
    def noise(self) -> float:
        """The floor: the larger of the costs' spread, the action times' move in the runs and the shift the
        runs' own action times explain plus the run-to-run spread around it (two sources: they add)."""
        return max(self.makespans, self.stage_costs, self.in_runs, abs(self.replay) + self.makespans)

    def to_dict(self) -> dict:
        return {"makespans": self.makespans, "stage_costs": self.stage_costs, "in_runs": self.in_runs,
                "replay": self.replay, "model_miss": self.model_miss,
                "replayed_makespans": list(self.replayed_makespans), "noise": self.noise}


def noise_floor(makespans: Sequence[float], before: dict[int, dict] | None,
                after: dict[int, dict] | None) -> NoiseFloor:
    """The noise floor of the runs' makespans and of the calibrations *before* and *after* them (see
    :class:`NoiseFloor`)."""
    runs = np.asarray(makespans, dtype=float)
    spread = 0.0
    if len(runs) > 1 and np.median(runs) > 0:
        spread = float((np.percentile(runs, 90) - np.percentile(runs, 10)) / 2 / np.median(runs))
    drift = 0.0
    for s in (before or {}):
        if s not in (after or {}):
            continue
        a, b = (sum(c.get(col, 0.0) for col in ("forward", "backward", "weight")) for c in (before[s], after[s]))
        if min(a, b) > 0:
            drift = max(drift, max(a, b) / min(a, b) - 1)
    return NoiseFloor(makespans=spread, stage_costs=drift)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """Predicted and measured results of one schedule, and how far apart they are."""

    predicted: Result
    """The prediction of the run shown (:attr:`measured`), made by :attr:`calibration`."""
    measured: Result
    """The timed run of median makespan."""
    calibration: Calibration
    """The calibration that predicted the run shown (what the costs and hardware files hold)."""
    workload: str
    backend: str
    start_error: tuple[float, float]
    """(median, worst) |measured - predicted| start of each action, seconds (median run)."""
    end_error: tuple[float, float]
    """(median, worst) |measured - predicted| end of each action, seconds (median run)."""
    check: CorrectnessCheck
    makespans: tuple[float, ...] = ()
    """Measured makespan of every timed run, seconds."""
    predictions: tuple[float, ...] = ()
    """Predicted makespan of every timed run, seconds (empty: every run has :attr:`predicted`'s)."""
    median_run: int = 0
    """Index (from 0) of the run shown in :attr:`makespans`: the run of median makespan."""
    warmup_prediction: float | None = None
    """Rolling prediction only: the makespan predicted from the last warm-up run (that of run 0), seconds."""
    calibration_source: str = ""
    """How the prediction was made (:data:`validate.predict.prediction.ROLLING_SOURCE` or ``FIXED_SOURCE``)."""
    predicted_from: str = ""
    """Rolling prediction only: the traced run the shown prediction came from (``"timed run N"``)."""
    noise_floor: NoiseFloor = field(default_factory=lambda: NoiseFloor())
    """How far the figures move by chance (:attr:`noise` is the floor)."""
    clocks: ClockOffsets = field(default_factory=lambda: ClockOffsets.same_clock(1))
    """The ranks' clocks against rank 0's (all 0 on one host)."""
    load: tuple[float, float] = (math.nan, math.nan)
    """1-minute load average before and after the run."""
    memory: list = field(default_factory=list)
    """Peak CUDA memory allocated per rank (bytes), or None per rank on CPU (not measured)."""
    replay: str = ""
    """The ``pipesim simulate`` command that replays the prediction from the written costs and hardware."""
    paths: dict = field(default_factory=dict)
    """What was written: report, figure, costs, hardware."""
    distribution: object = None
    """With ``inject``: the predicted against the measured distribution of the makespan
    (:class:`validate.compare.distributions.DistributionComparison`), else None."""
    inject: str = ""
    """What was injected (``--inject``), '' for nothing."""

    @property
    def gradients_match(self) -> bool | None:
        return self.check.passed

    @property
    def gradient_error(self) -> float | None:
        """Largest relative difference the correctness check found (None: not checked)."""
        return self.check.error

    @property
    def failed(self) -> bool:
        return self.check.passed is False

    @property
    def errors(self) -> np.ndarray:
        """measured / predicted - 1 of every timed run, each against its own prediction."""
        runs = np.asarray(self.makespans or (self.measured.metrics.makespan,), dtype=float)
        return _relative_errors(runs, self.predictions or (self.predicted.metrics.makespan,) * len(runs))

    @property
    def makespan_error(self) -> float:
        """Median over the timed runs of measured / predicted - 1 (each run against its own prediction)."""
        return float(np.median(self.errors))

    @property
    def makespan_error_from_warmup(self) -> float | None:
        """The median error had every run been predicted from the last warm-up run (rolling prediction only)."""
        if self.warmup_prediction is None:
            return None
        runs = np.asarray(self.makespans or (self.measured.metrics.makespan,), dtype=float)
        return float(np.median(_relative_errors(runs, (self.warmup_prediction,) * len(runs))))

    @property
    def makespan_error_range(self) -> tuple[float, float]:
        e = self.errors
        return float(np.percentile(e, 10)), float(np.percentile(e, 90))

    @property
    def significant(self) -> bool:
        """Whether the median error stands outside the noise floor."""
        return abs(self.makespan_error) > self.noise

    @property
    def noise(self) -> float:
        """Relative noise floor (:attr:`NoiseFloor.noise`)."""
        return self.noise_floor.noise

    @property
    def noise_parts(self) -> dict:
        return self.noise_floor.to_dict()

    @property
    def clock_uncertainty(self) -> float:
        """Largest clock-offset uncertainty between ranks, seconds (0 on one host)."""
        return self.clocks.max_uncertainty

    @property
    def clock_drift(self) -> float:
        """Largest change of a rank's clock offset between before and after the runs, seconds (0 on one host)."""
        return self.clocks.max_drift

    def to_dict(self) -> dict:
        s, p, m = self.predicted.schedule, self.predicted.metrics, self.measured.metrics
        runs = np.asarray(self.makespans or (m.makespan,), dtype=float)
        return {
            "schedule": s.name, "devices": s.devices, "stages": s.stages, "microbatches": s.microbatches,
            "iterations": s.iterations, "repeats": len(runs), "workload": self.workload, "backend": self.backend,
            "predicted_makespan": p.makespan, "measured_makespan": float(np.median(runs)),
            "measured_makespan_range": [float(np.percentile(runs, 10)), float(np.percentile(runs, 90))],
            "measured_makespans": [float(x) for x in runs],
            "predicted_makespans": [float(x) for x in (self.predictions or (p.makespan,) * len(runs))],
            "median_run": self.median_run, "calibration_source": self.calibration_source,
            "predicted_from": self.predicted_from,
            "makespan_error": self.makespan_error, "makespan_error_range": list(self.makespan_error_range),
            "makespan_error_from_warmup": self.makespan_error_from_warmup,
            "noise": self.noise, "noise_parts": self.noise_parts, "significant": self.significant,
            "predicted_bubble_fraction": p.bubble_fraction, "measured_bubble_fraction": m.bubble_fraction,
            "predicted_utilization": p.device_utilization, "measured_utilization": m.device_utilization,
            "start_error_median": self.start_error[0], "start_error_worst": self.start_error[1],
            "end_error_median": self.end_error[0], "end_error_worst": self.end_error[1],
            "gradients_match": self.check.passed, "gradient_error": self.check.error, "check": self.check.to_dict(),
            "clock_uncertainty": self.clock_uncertainty, "clock_drift": self.clock_drift,
            "load_average": list(self.load), "measured_peak_memory": self.memory,
            "executor_overhead": {  # what the prediction adds to every action for the executor's own work
                "mean_s": self.calibration.overhead, "included": self.calibration.overhead_included,
                "source": self.calibration.overhead_source,
                "per_stage_s": {str(s): dict(v) for s, v in self.calibration.overhead_per_stage.items()}},
            "calibration": self.calibration.to_dict(), "replay": self.replay,
            # the runtime model of the prediction (sim/model/runtimes.py): pipesim's executor keeps its receives
            # posted ahead, so eager links; its overhead is folded into the action costs (executor_overhead)
            "runtime_model": {"runtime": "pipesim", "links": "eager", "lowering": "pipesim"},
            "notes": list(self.measured.notes), "paths": dict(self.paths),
            "inject": self.inject,
            "distribution": self.distribution.to_dict() if self.distribution is not None else None,
        }


def _relative_errors(measured: np.ndarray, predicted: Sequence[float]) -> np.ndarray:
    p = np.asarray(predicted, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, measured / np.where(p > 0, p, 1.0) - 1, math.inf)


# ------------------------------------------------------------------------------------------ checks
