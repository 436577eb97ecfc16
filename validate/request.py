"""What crosses the process boundary of a validation run, typed: the request to every rank, each rank's result.

The launcher (:mod:`validate.launch`) pickles one :class:`RunRequest` for all ranks;
every rank (:mod:`validate.rank.worker`) sends one :class:`RankResult` per job back to rank 0.
Importable without torch (the command line builds a request before torch is loaded);
the tensors inside a :class:`RankResult` are only unpickled where torch is.

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import json

from sim.model.cost import StageCosts
from sim.core.ir import Schedule
from sim.engines.variability import Variability

from validate.errors import WORKLOADS, ValidationError, WorkloadError, is_entry_point

__all__ = ["WorkloadSpec", "InjectSpec", "Job", "RunRequest", "RankResult", "StageCalibration", "ClockOffsets", "LaunchResult",
           "CpuShare", "RunOptions", "DEFAULT_REPEATS", "DEFAULT_WARMUP", "RENDEZVOUS_FILE"]

DEFAULT_REPEATS = 5
"""Timed runs of each schedule (the makespan is their median)."""
DEFAULT_WARMUP = 2
"""Untimed runs before them (the last one is traced for the in-schedule calibration)."""


RENDEZVOUS_FILE = "PIPESIM_RENDEZVOUS_FILE"
"""Environment variable a one-machine launcher gives its ranks: the file of the ``FileStore`` they meet
through, in the launcher's private temporary folder (:func:`validate.rank.comm.init_method`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Sizes of the stage modules and their data (one micro-batch)."""

    name: str = "mlp"
    """One of ``mlp``, ``transformer``, ``emulated``, or the user's own model as ``package.module:function``
    (:mod:`validate.rank.user_model`; the sizes below then do not apply, except ``batch``, ``seed`` and ``lr``)."""
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
    path: str | None = None
    """User's model: the folder put first on ``sys.path`` to import it (the folder the command ran in)."""
    boundaries: tuple[tuple[int, ...], ...] = ()
    """User's model: stage s's output shape, s = 0 .. S-2 (what travels between stages; found by
    :func:`validate.rank.user_model.prepare` before any rank starts)."""

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS and not is_entry_point(self.name):
            raise WorkloadError(f"unknown workload {self.name!r}; choose one of: {', '.join(WORKLOADS)}, or your own "
                                f"model as package.module:function")
        # a spec read back from JSON (the torch runtime's ranks) has lists: tuples keep it hashable
        object.__setattr__(self, "boundaries", tuple(tuple(int(n) for n in shape) for shape in self.boundaries))
        for label in ("width", "depth", "batch", "d_model", "heads", "seq"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"workload {label} must be a positive integer, got {value!r}")
        if self.name == "transformer" and self.d_model % self.heads:
            raise WorkloadError(f"d_model {self.d_model} must be divisible by heads {self.heads}")
        if not self.lr > 0:
            raise WorkloadError(f"workload lr must be > 0, got {self.lr!r}")

    @property
    def user(self) -> bool:
        """Whether this is the user's own model (``package.module:function``)."""
        return is_entry_point(self.name)

    @property
    def label(self) -> str:
        """The name for file names and reports: the entry point with ``:`` as ``.`` for the user's model."""
        return self.name.replace(":", ".")

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectSpec:
    """What a measured run injects (``validate --inject``): a per-action distribution and stragglers, and the seed of
    the draws. Travels to the ranks in :attr:`RunRequest.inject`; drawn by :mod:`validate.rank.inject`."""

    compute: str = "none"
    """``lognormal:CV``, ``normal:CV`` or ``none``."""
    stragglers: tuple[str, ...] = ()
    """``device=N|any,factor=F[,prob=P]`` each."""
    seed: int = 0

    def variability(self) -> Variability:
        """The same specification for the Monte Carlo prediction."""
        return Variability.parse(None if self.compute == "none" else self.compute, stragglers=self.stragglers)

    def to_json(self) -> str:
        return json.dumps({"compute": self.compute, "stragglers": list(self.stragglers), "seed": self.seed})

    @classmethod
    def from_json(cls, text: str) -> InjectSpec:
        data = json.loads(text)
        return cls(compute=data["compute"], stragglers=tuple(data["stragglers"]), seed=int(data["seed"]))

    def describe(self) -> str:
        return ";".join([self.compute] + [f"straggler={s}" for s in self.stragglers])


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
    inject: InjectSpec | None = None
    """Variability the ranks inject (``validate --inject``): the emulated workload draws its waits, real stages are
    padded to drawn durations (:mod:`validate.rank.inject`). None: nothing injected."""
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
    """stage -> costs and sizes (columns of :class:`sim.model.cost.StageCosts`), measured before the timed runs."""
    after: dict[int, dict[str, float]]
    """The same, measured after them (their spread is part of the noise floor)."""
    in_schedule: dict[int, dict[str, float]]
    """stage -> {op letter: median seconds} in the last traced warm-up run (the first timed run's calibration;
    later runs are calibrated from the timed run before them, on rank 0: :mod:`validate.predict.prediction`)."""
    ping: list[float] | None
    """One-way seconds per size of :data:`validate.predict.calibrate.PING_SIZES` (rank 0 only)."""
    overhead: float
    """Executor overhead per action on zero-cost actions without communication, seconds (the fallback)."""
    action_overhead: dict[int, dict[str, float]] = field(default_factory=dict)
    """stage -> {cost column: mean executor overhead per action} in the last traced warm-up run."""
    padded: dict[int, dict[str, float]] = field(default_factory=dict)
    """Injected real stages (``--inject`` on mlp, transformer, a user's model): stage -> {cost column: the
    seconds each action is padded to before the drawn factor} (:func:`validate.rank.inject.padded_costs`);
    empty otherwise."""


@dataclass(slots=True, kw_only=True)
class RankResult:
    """What one rank sends to rank 0 for one job."""

    rank: int
    traces: list[Any]
    """One :class:`validate.rank.tracing.RankTrace` per timed run."""
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockOffsets:
    """Each rank's clock against rank 0's, as rank 0 measured it (:meth:`validate.rank.comm.Comm.clock_offsets`).

    Seconds. On one host every rank reads the same clock (``perf_counter``) and every offset is exactly 0.
    """

    offsets: tuple[float, ...]
    """rank -> its clock minus rank 0's (subtract it from the rank's times to read rank 0's clock)."""
    uncertainty: tuple[float, ...]
    """rank -> half the least round trip of the ping-pong that measured its offset (0 on one host)."""
    one_host: bool
    """Whether every rank ran on one host (same boot id): then one clock, no estimate."""
    drift: tuple[float, ...] = ()
    """rank -> how far its offset moved between before and after the timed runs (empty: not measured)."""

    @classmethod
    def same_clock(cls, ranks: int) -> ClockOffsets:
        """*ranks* ranks reading one clock: one host."""
        zeros = (0.0,) * ranks
        return cls(offsets=zeros, uncertainty=zeros, one_host=True, drift=zeros)

    @property
    def max_uncertainty(self) -> float:
        return max(self.uncertainty, default=0.0)

    @property
    def max_drift(self) -> float:
        return max(self.drift, default=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    """What rank 0 hands back to the launcher after a run: every rank's result of every job, and the clocks."""

    jobs: tuple[tuple[RankResult, ...], ...]
    """job -> rank -> that rank's :class:`RankResult` (in the order of the request's jobs)."""
    clocks: ClockOffsets
    cpu: CpuShare | None = None
    """Where the machine's CPU time went during the launch (None: not measured, e.g. not Linux)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuShare:
    """CPU seconds the whole machine and the launch itself (launcher + ranks) used while the ranks ran.

    The machine's from ``/proc/stat`` (every core's user + system + nice + irq time), the launch's from
    ``getrusage`` of the launcher and of its waited-for children. What is left is other work's. The load
    average cannot tell them apart: 17 emulated ranks on 2 cores raise it above the cores by themselves.
    """

    wall: float
    """Seconds the ranks ran."""
    machine: float
    """CPU seconds of every process of the machine in that time."""
    own: float
    """CPU seconds of the launcher and its ranks."""

    @property
    def other(self) -> float:
        """CPU seconds of other work (never below 0: the two counters tick at different moments)."""
        return max(0.0, self.machine - self.own)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """The options of one ``pipesim validate`` run, as the command line (``sim.cli.validate``) and the torchrun
    entry point (:mod:`validate.torchrun`) hand them to :func:`validate.run.run_validations`."""

    schedule: str
    devices: int | None
    microbatches: int
    iterations: int = 1
    recompute: bool = False
    chunks: int | None = None
    workload: str = "mlp"
    backend: str = "gloo"
    costs: str | None = None
    """A costs CSV used instead of calibrating (emulated: the waits)."""
    hardware: str | None = None
    """A hardware JSON used instead of the ping-pong link fit."""
    timeout: float = 300.0
    max_time: float | None = None
    threads: int = 1
    output_dir: str | None = "reports/validation"
    fail_at: str | None = None
    calibration: str = "schedule"
    repeats: int = DEFAULT_REPEATS
    workload_options: dict = field(default_factory=dict)
    """Workload sizes the user gave (the probe chooses the others)."""

    def run_keywords(self) -> dict:
        """The keyword options of :func:`validate.run.run_validation` after the schedule, K and M."""
        return {"iterations": self.iterations, "recompute": self.recompute, "chunks": self.chunks,
                "workload": self.workload, "backend": self.backend, "costs": self.costs, "hardware": self.hardware,
                "timeout": self.timeout, "max_time": self.max_time, "threads": self.threads,
                "output_dir": self.output_dir, "fail_at": self.fail_at, "calibration": self.calibration,
                "repeats": self.repeats, "workload_options": dict(self.workload_options)}
