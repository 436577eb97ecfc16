"""What crosses the process boundary of a validation run, typed: the request to every rank, each rank's result.

The launcher (:mod:`validate.launch`) pickles one :class:`RunRequest` for all ranks;
every rank (:mod:`validate.worker`) sends one :class:`RankResult` per job back to rank 0.
Importable without torch (the command line builds a request before torch is loaded);
the tensors inside a :class:`RankResult` are only unpickled where torch is.

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.cost import StageCosts
from sim.ir import Schedule

from .errors import WORKLOADS, ValidationError, WorkloadError

__all__ = ["WorkloadSpec", "Job", "RunRequest", "RankResult", "StageCalibration", "DEFAULT_REPEATS",
           "DEFAULT_WARMUP"]

DEFAULT_REPEATS = 5
"""Timed runs of each schedule (the makespan is their median)."""
DEFAULT_WARMUP = 2
"""Untimed runs before them (the last one is traced for the in-schedule calibration)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Sizes of the stage modules and their data (one micro-batch)."""

    name: str = "mlp"
    """One of ``mlp``, ``transformer``, ``emulated``."""
    width: int = 64
    """mlp: hidden width (features)."""
    depth: int = 2
    """Blocks (mlp) or encoder layers (transformer) per stage."""
    batch: int = 8
    """Samples per micro-batch."""
    d_model: int = 32
    """transformer: model width."""
    heads: int = 2
    """transformer: attention heads."""
    seq: int = 16
    """transformer: sequence length (tokens per sample)."""
    seed: int = 0
    """Seed of the model initialization and of the data."""
    lr: float = 0.05
    """SGD learning rate of U."""
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise WorkloadError(f"unknown workload {self.name!r}; choose one of: {', '.join(WORKLOADS)}")
        for label in ("width", "depth", "batch", "d_model", "heads", "seq"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"workload {label} must be a positive integer, got {value!r}")
        if self.name == "transformer" and self.d_model % self.heads:
            raise WorkloadError(f"d_model {self.d_model} must be divisible by heads {self.heads}")
        if not self.lr > 0:
            raise WorkloadError(f"workload lr must be > 0, got {self.lr!r}")

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One schedule to run, with the costs the emulated workload waits for, and an optional injected fault."""

    schedule: Schedule
    costs: StageCosts | None = None
    fail_at: str | None = None
    """``"RANK:ACTION"``: that rank raises at that action (tests of the failure path)."""
    lr: float | None = None
    """Learning rate for this schedule instead of the workload's (raised so the correctness check has its power)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """Everything every rank needs; identical on all ranks."""

    jobs: tuple[Job, ...]
    workload: WorkloadSpec
    backend: str = "gloo"
    timeout: float = 300.0
    """Seconds any single wait (a receive, a barrier) may take before the rank gives up and names it."""
    threads: int = 1
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    calibrate: bool = True
    cores: tuple[int, ...] | None = None
    """Rank r is pinned to ``cores[r]`` (None: not pinned)."""
    replicas: int = 1
    """D: data-parallel copies of the pipeline (DP x PP, :mod:`validate.dp`); rank d*K + p is device p of copy d."""
    pad: bool = False
    """Real stages whose every F/B/W is padded (a wait) up to the job's costs: real gradients, predictable times."""
    result_dir: str | None = None
    """Where a failing rank writes ``rank<r>.error.json`` and rank 0 its progress (launcher runs only)."""

    def __post_init__(self) -> None:
        if not self.jobs:
            raise ValidationError("a run needs at least one schedule")
        if self.repeats < 1:
            raise ValidationError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup < 0:
            raise ValidationError(f"warmup must be >= 0, got {self.warmup}")
        if self.replicas < 1:
            raise ValidationError(f"replicas must be >= 1, got {self.replicas}")

    @property
    def devices(self) -> int:
        """K: devices of one pipeline."""
        return self.jobs[0].schedule.devices

    @property
    def world(self) -> int:
        """Processes of the run: K x D."""
        return self.devices * self.replicas


@dataclass(slots=True, kw_only=True)
class StageCalibration:
    """One rank's calibration of one job: isolated stage measurements before and after the timed runs."""

    before: dict[int, dict[str, float]]
    """stage -> costs and sizes (columns of :class:`sim.cost.StageCosts`), measured before the timed runs."""
    after: dict[int, dict[str, float]]
    """The same, measured after them (their spread is part of the noise floor)."""
    in_schedule: dict[int, dict[str, float]]
    """stage -> {op letter: median seconds} in the last traced warm-up run (the first timed run's calibration;
    later runs are calibrated from the timed run before them, on rank 0: :mod:`validate.prediction`)."""
    ping: list[float] | None
    """One-way seconds per size of :data:`validate.calibrate.PING_SIZES` (rank 0 only)."""
    overhead: float
    """Executor overhead per action on zero-cost actions without communication, seconds (the fallback)."""
    action_overhead: dict[int, dict[str, float]] = field(default_factory=dict)
    """stage -> {cost column: mean executor overhead per action} in the last traced warm-up run."""


@dataclass(slots=True, kw_only=True)
class RankResult:
    """What one rank sends to rank 0 for one job."""

    rank: int
    traces: list[Any]
    """One :class:`validate.tracing.RankTrace` per timed run."""
    calibration: StageCalibration | None
    grads: dict[int, list[dict]] = field(default_factory=dict)
    """stage -> the gradient each update of the first timed run applied (CPU tensors)."""
    weights: dict[int, list[dict]] = field(default_factory=dict)
    """stage -> the weights after each of those updates (CPU tensors)."""
    memory: int | None = None
    """Peak CUDA memory allocated (bytes); None on CPU."""
    device: str = "cpu"
    host: str = ""
    """Per-boot id of the host (``/proc/sys/kernel/random/boot_id``), so two hosts of one name are told apart."""
    core: int | None = None
    """The core this rank was pinned to, if any."""
    allreduces: list[tuple[int, float, float]] = field(default_factory=list)
    """DP x PP: (stage, start, end) of each gradient all-reduce of the first timed run, own clock."""
