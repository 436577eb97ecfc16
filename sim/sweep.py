"""Parameter sweeps: simulate every (schedule, K, M) combination into one tidy table.

    from sim.sweep import run_sweep
    df = run_sweep(["gpipe", "1f1b"], [2, 4, 8], [1, 2, 4, 8, 16], costs={"forward": 1, "backward": 2}, jobs=2)

One row per configuration (:data:`SWEEP_COLUMNS`). A configuration that a schedule
rejects (a ``ValueError`` such as ``ConfigError`` or ``ScheduleError``: e.g. a
schedule that needs M >= K) becomes a row whose ``error`` column holds the first line
of the message and whose figures are empty (NaN); it never stops the sweep.

Units: times in seconds (as the costs), memory in bytes, throughput in samples/s.
Every simulation uses the fast engine (exact and deterministic; see :mod:`sim.simulate`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

import pandas as pd
from tqdm import tqdm

from . import generators, schedules
from .cost import StageCosts, uniform
from .hardware import Hardware
from .ir import Schedule
from .simulate import simulate
from .errors import PipesimError

__all__ = ["run_sweep", "SWEEP_COLUMNS", "SweepError"]

SWEEP_COLUMNS = [
    "schedule", "devices", "stages", "microbatches", "iterations",
    "makespan",                 # seconds
    "utilization",              # busy share of K x makespan
    "bubble_fraction",          # 1 - utilization (GPipe's bubble)
    "bubble_ratio",             # idle / busy (Megatron's bubble over ideal time)
    "closed_form_utilization",  # 1 - (K-1)/(M+K-1): GPipe's formula for uniform stages, for reference
    "throughput",               # samples per second
    "peak_memory",              # bytes, the worst device
    "peak_memory_device",       # which device that is
    "peak_inflight",            # most micro-batches with activations held at once, worst device
    "weight_versions",          # most weight versions held at once, worst device
    "memory_overflows",         # devices over the hardware's memory capacity
    "error",                    # '' when the configuration ran, else why it was rejected
]

CostsSpec = StageCosts | Mapping[str, float] | Callable[[Schedule], StageCosts] | None
HardwareSpec = Hardware | Mapping[str, object] | Callable[[Schedule], Hardware] | None


class SweepError(PipesimError):
    """Sweep arguments that cannot run: unknown schedules, empty or non-positive lists, bad jobs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    """Everything a worker needs besides (schedule, K, M); picklable for the process pool."""

    iterations: int
    recompute: bool
    chunks: int | None
    costs: CostsSpec
    hardware: HardwareSpec
    microbatch_size: float


def run_sweep(schedules: Sequence[str], devices: Sequence[int], microbatches: Sequence[int], *,
              iterations: int = 1, recompute: bool = False, chunks: int | None = None, costs: CostsSpec = None,
              hardware: HardwareSpec = None, microbatch_size: float = 1.0, jobs: int = 1,
              progress: bool = True) -> pd.DataFrame:
    """Simulate every combination of *schedules* x *devices* (K) x *microbatches* (M); one row each.

    *costs*: ``None`` for the classroom case (uniform stages, forward 1, backward 2);
    a mapping of :func:`sim.cost.uniform` keyword arguments (``{"forward": 1,
    "activation_bytes": 4e6}``), applied to K stages and cut into *chunks*; a
    :class:`~sim.cost.StageCosts` used as is (its stage count must match, else the
    row records the error); or a function ``schedule -> StageCosts``.
    *hardware*: ``None`` (free links), a mapping of :class:`~sim.hardware.Hardware`
    keyword arguments other than ``devices`` (``{"latency": 1e-4, "bandwidth": 1e10}``),
    a ``Hardware``, or a function ``schedule -> Hardware``.
    *chunks*: model chunks per device; ``None`` gives each schedule the number it is
    built for (:func:`sim.generators.default_chunks`: 2 for V-shaped schedules and interleaved
    1F1B, else 1), so V-shaped and classic schedules can share one sweep.
    *jobs*: worker processes (1 runs in this process; functions given as *costs* or
    *hardware* must then be picklable, i.e. defined at module level).
    *progress*: a tqdm bar on stderr, shown once the sweep runs longer than half a second.

    Rows come in the order schedule, then K, then M; columns are :data:`SWEEP_COLUMNS`.
    """
    schedules, devices, microbatches = list(schedules), list(devices), list(microbatches)
    for name in schedules:
        try:
            generators.get_generator(name)
        except ValueError as exc:
            raise SweepError(str(exc)) from None
    for label, values in (("schedules", schedules), ("devices", devices), ("microbatches", microbatches)):
        if not values:
            raise SweepError(f"the sweep has no {label}; give at least one")
    for label, values in (("devices", devices), ("microbatches", microbatches)):
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise SweepError(f"{label} must be positive integers, got {values}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SweepError(f"jobs must be a positive integer, got {jobs!r}")
    settings = _Settings(iterations=iterations, recompute=recompute, chunks=chunks, costs=costs, hardware=hardware,
                         microbatch_size=microbatch_size)
    configs = [(name, k, m) for name in schedules for k in devices for m in microbatches]
    work = partial(_run_one, settings)
    bar = tqdm(total=len(configs), desc="sweep", unit="config", file=sys.stderr, disable=not progress, delay=0.5,
               leave=False)
    rows = []
    with bar:
        if jobs == 1 or len(configs) == 1:
            for config in configs:
                rows.append(work(config))
                bar.update()
        else:
            workers = min(jobs, len(configs), os.cpu_count() or jobs)
            chunk = max(1, len(configs) // (workers * 8))
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for row in pool.map(work, configs, chunksize=chunk):
                    rows.append(row)
                    bar.update()
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def _costs_for(schedule: Schedule, spec: CostsSpec, chunks: int) -> StageCosts:
    if isinstance(spec, StageCosts):
        if spec.stages != schedule.stages:
            raise SweepError(f"the costs have {spec.stages} stages but {schedule.name} with K={schedule.devices} "
                             f"has {schedule.stages}; give costs as uniform() arguments or a function of the schedule")
        return spec
    if callable(spec):
        return spec(schedule)
    costs = uniform(schedule.stages // chunks, **dict(spec or {}))
    return costs.split_into_chunks(chunks) if chunks > 1 else costs


def _hardware_for(schedule: Schedule, spec: HardwareSpec) -> Hardware:
    if isinstance(spec, Hardware):
        if spec.devices != schedule.devices:
            raise SweepError(f"the hardware describes {spec.devices} devices but K={schedule.devices}; "
                             f"give hardware as Hardware() arguments or a function of the schedule")
        return spec
    if callable(spec):
        return spec(schedule)
    return Hardware(devices=schedule.devices, **dict(spec or {}))


def _run_one(settings: _Settings, config: tuple[str, int, int]) -> dict:
    """Simulate one configuration; a PipesimError (the API's typed errors) becomes the row's error."""
    name, K, M = config
    chunks = settings.chunks or generators.default_chunks(name)
    row = dict.fromkeys(SWEEP_COLUMNS, math.nan)
    row.update(schedule=name, devices=K, stages=K * chunks, microbatches=M,
               iterations=settings.iterations, closed_form_utilization=1 - (K - 1) / (M + K - 1), error="")
    try:
        schedule = schedules.generate(name, K, M, iterations=settings.iterations, recompute=settings.recompute,
                                      chunks=chunks)
        result = simulate(schedule, _costs_for(schedule, settings.costs, chunks),
                          _hardware_for(schedule, settings.hardware), microbatch_size=settings.microbatch_size)
    except PipesimError as exc:
        row["error"] = (str(exc).splitlines() or [type(exc).__name__])[0]
        return row
    m = result.metrics
    worst = max(range(K), key=lambda d: m.peak_memory[d])
    row.update(stages=schedule.stages, makespan=m.makespan, utilization=m.utilization,
               bubble_fraction=m.bubble_fraction, bubble_ratio=m.bubble_ratio, throughput=m.throughput,
               peak_memory=m.peak_memory[worst], peak_memory_device=worst, peak_inflight=max(m.peak_inflight),
               weight_versions=max(m.weight_versions), memory_overflows=len(m.memory_overflow))
    return row
