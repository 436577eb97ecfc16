"""The correctness check of a validation run: every update, against a float64 one-process replay.

Each real stage logs, for every update U it applied, the accumulated gradient and
the weights after the step (:meth:`validate.rank.workloads.TorchStage.update_log`). The
check compares both, update by update, with :func:`validate.correctness.reference.emulate_updates`
under the schedule's own semantics (weight stashing; for flush schedules that is
plain one-process SGD on each whole mini-batch, iteration after iteration):

    error = max over stages and updates of  max|got - ref| / max|ref|     (per stage and update)

and passes when ``error <= tolerance``. The run is float32 and the reference
float64, so the error is the run's own rounding: 2e-7..7e-7 for the small models here,
but some float32 kernels round much more (CPU attention at d_model 256 or 64 tokens:
about 4e-4). The tolerance is therefore ``max(TOLERANCE, ROUNDING_MARGIN x floor)`` where
the floor is how far the *same replay in float32* (one process, no pipeline) lands from
the float64 one: a pipelined run must be as exact as plain training, up to that margin.

Power: a check that cannot fail proves nothing. For schedules whose weight versions
differ from synchronous SGD (PipeDream, 2BW with several updates in flight), the same
error is computed between the stashing reference and two wrong semantics, synchronous
SGD and no stash (the version current at the backward); the report states them ("synchronous
SGD would differ by X; tolerance Y"). The learning rate of the workload is raised for such
schedules until both are at least ``POWER_MARGIN`` times the tolerance (see
:func:`powered_learning_rate`), so the check separates them by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sim.core.ir import Schedule

from validate.correctness.reference import UpdateLog, emulate_updates, relative_difference, weight_versions

__all__ = ["CorrectnessCheck", "check_updates", "update_log_of", "TOLERANCE", "POWER_MARGIN", "ROUNDING_MARGIN",
           "is_asynchronous", "powered_learning_rate", "tolerance_for", "check_step_gradients"]

TOLERANCE = 2e-5
"""Largest relative difference (per stage and update) a float32 run may have from the float64 reference.

Measured: 2e-7..6e-7 for the mlp and transformer stages of the tests and the default sizes."""
POWER_MARGIN = 100.0
"""The wrong semantics must differ from the right one by at least this many tolerances."""
ROUNDING_MARGIN = 10.0
"""The tolerance is at least this many times the float32 rounding floor of one-process training."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectnessCheck:
    """What the check compared, what it found, and how able it was to find a fault."""

    passed: bool | None
    """True / False; None: not checked (emulated compute, no updates)."""
    error: float | None = None
    """Largest relative difference found (see module docstring)."""
    tolerance: float = TOLERANCE
    power: dict[str, float] = field(default_factory=dict)
    """wrong semantics -> how far it would be from the reference (same measure as *error*)."""
    what: str = ""
    worst: str = ""
    """Where the largest difference is: stage, update, gradient or weights."""

    @property
    def conclusive(self) -> bool:
        """Whether every wrong semantics would have failed by at least POWER_MARGIN tolerances."""
        return all(v >= POWER_MARGIN * self.tolerance for v in self.power.values())

    def summary(self) -> str:
        if self.passed is None:
            return self.what
        verdict = "passed" if self.passed else "FAILED"
        out = f"{verdict}: {self.what}; largest relative difference {self.error:.3g} ({self.worst}), tolerance {self.tolerance:.3g}"
        if self.power:
            out += "; " + ", ".join(f"{name} would differ by {v:.3g}" for name, v in self.power.items())
            if not self.conclusive:
                out += (f" (less than {POWER_MARGIN:g}x the tolerance: this run cannot tell them apart; "
                        "give more micro-batches or iterations)")
        return out

    def to_dict(self) -> dict:
        return {"passed": self.passed, "error": self.error, "tolerance": self.tolerance, "power": dict(self.power),
                "conclusive": self.conclusive if self.passed is not None else None, "what": self.what,
                "worst": self.worst}


def is_asynchronous(schedule: Schedule) -> bool:
    """Whether some micro-batch runs on other weights than synchronous SGD would give it."""
    return weight_versions(schedule, "stash") != weight_versions(schedule, "sync")


def _difference(got: UpdateLog, ref: UpdateLog) -> tuple[float, str]:
    worst, where = 0.0, "none"
    for s in ref.grads:
        for u in range(len(ref.grads[s])):
            for what, a, b in (("gradient", got.grads[s][u], ref.grads[s][u]),
                               ("weights", got.weights[s][u], ref.weights[s][u])):
                d = relative_difference(a, b)
                if d > worst or d != d:  # NaN is the worst of all
                    worst, where = d, f"stage {s}, update {u}, {what}"
    return worst, where


def tolerance_for(spec, schedule: Schedule, ref: UpdateLog, device=None) -> float:
    """``max(TOLERANCE, ROUNDING_MARGIN x`` how far the float32 one-process replay is from *ref* ``)``."""
    import torch
    floor, _ = _difference(emulate_updates(spec, schedule, semantics="stash", dtype=torch.float32, device=device), ref)
    return max(TOLERANCE, ROUNDING_MARGIN * floor)


def powered_learning_rate(spec, schedule: Schedule, *, limit: float = 10.0):
    """The workload spec, its learning rate raised (x4 steps, up to *limit*) until the check has its power.

    Flush schedules, and asynchronous ones already separated at the given rate, keep *spec*.
    """
    if spec.name == "emulated" or schedule.updates_per_stage == 0 or not is_asynchronous(schedule):
        return spec
    while True:
        ref = emulate_updates(spec, schedule, semantics="stash")
        power = _power(spec, schedule, ref)
        if (min(power.values(), default=math.inf) >= POWER_MARGIN * tolerance_for(spec, schedule, ref)
                or spec.lr * 4 > limit):
            return spec
        spec = replace(spec, lr=spec.lr * 4)


_WRONG = {"sync": "synchronous SGD", "latest": "no weight stash"}


def _power(spec, schedule: Schedule, ref: UpdateLog, device=None) -> dict[str, float]:
    """How far each wrong semantics would be; only those that give some micro-batch other weights
    (with no micro-batch spanning an update, the stash is never used and "no stash" is not wrong)."""
    right = weight_versions(schedule, "stash")
    return {label: _difference(emulate_updates(spec, schedule, semantics=wrong, device=device), ref)[0]
            for wrong, label in _WRONG.items() if weight_versions(schedule, wrong) != right}


def check_updates(spec, schedule: Schedule, got: UpdateLog, *, tolerance: float | None = None,
                  device=None) -> CorrectnessCheck:
    """Compare the logged updates of every stage with the float64 replay of *schedule*.

    *tolerance*: None = :func:`tolerance_for` (from the float32 rounding floor of one-process training).
    *device*: where the replays compute (:func:`validate.correctness.reference.reference_device`; None: the CPU).
    """
    if spec.name == "emulated":
        return CorrectnessCheck(passed=None, what="gradients not checked: compute was emulated")
    if schedule.updates_per_stage == 0:
        return CorrectnessCheck(passed=None, what="gradients not checked: the schedule has no updates (U)")
    ref = emulate_updates(spec, schedule, semantics="stash", device=device)
    if tolerance is None:
        tolerance = tolerance_for(spec, schedule, ref, device)
    for s in ref.grads:
        n, m = len(ref.grads[s]), len(got.grads.get(s, []))
        if n != m:
            return CorrectnessCheck(passed=False, error=float("inf"), tolerance=tolerance, worst=f"stage {s}",
                                    what=f"stage {s} applied {m} update(s), the schedule has {n}")
    error, where = _difference(got, ref)
    updates = schedule.updates_per_stage
    if is_asynchronous(schedule):
        what = (f"gradients and weights of all {updates} updates per stage vs a float64 one-process replay of "
                f"weight stashing (lr {spec.lr:g})")
        power = _power(spec, schedule, ref, device)
    else:
        what = (f"gradients and weights of all {updates} updates per stage vs float64 one-process training on "
                f"each whole mini-batch (lr {spec.lr:g})")
        power = {}
    return CorrectnessCheck(passed=bool(error <= tolerance), error=error, tolerance=tolerance, power=power, what=what,
                            worst=where)


def check_step_gradients(spec, stages: int, microbatches: int, got: dict[int, dict], *,
                         device=None) -> CorrectnessCheck:
    """One step of PyTorch's own runtime (``--runtime torch``): each stage's gradient, accumulated over the step's
    micro-batches (PyTorch scales it by 1/M), against float64 one-process training on the whole mini-batch.

    *got*: stage -> {parameter name: gradient}. Same measure and tolerance rule as :func:`check_updates`: the
    larger of :data:`TOLERANCE` and :data:`ROUNDING_MARGIN` x how far the float32 one-process gradient is.
    *device*: where the references compute (None: the CPU).
    """
    import torch

    from validate.correctness.reference import reference_grads
    if spec.name == "emulated":
        return CorrectnessCheck(passed=None, what="gradients not checked: compute was emulated")
    ref = reference_grads(spec, stages, microbatches, device=device)
    floor = reference_grads(spec, stages, microbatches, dtype=torch.float32, device=device)
    tolerance = max(TOLERANCE, ROUNDING_MARGIN * max(relative_difference(floor[s], ref[s]) for s in ref))
    what = (f"the gradient of one step of every stage vs float64 one-process training on the whole mini-batch "
            f"({microbatches} micro-batches)")
    error, where = 0.0, "none"
    for s in ref:
        if s not in got or set(got[s]) != set(ref[s]):
            return CorrectnessCheck(passed=False, error=float("inf"), tolerance=tolerance, what=what,
                                    worst=f"stage {s}: gradients of {sorted(ref[s])} expected, got "
                                          f"{sorted(got.get(s, {}))}")
        d = relative_difference(got[s], ref[s])
        if d > error or d != d:
            error, where = d, f"stage {s}, gradient"
    return CorrectnessCheck(passed=bool(error <= tolerance), error=error, tolerance=tolerance, what=what, worst=where)


def update_log_of(ranks) -> UpdateLog:
    """The update logs of every rank's stages (:class:`validate.request.RankResult`), as one :class:`UpdateLog`."""
    return UpdateLog(grads={s: g for r in ranks for s, g in r.grads.items()},
                     weights={s: w for r in ranks for s, w in r.weights.items()})
