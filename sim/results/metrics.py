"""Figures of merit computed from a timeline and its memory profile.

- makespan: end of the last row (seconds).
- busy[d]: seconds device d spends computing (F, B, W, R, U; transfers excluded).
- utilization: sum(busy) / (K x makespan); bubble_fraction = 1 - utilization,
  the idle share of K x makespan (GPipe paper's bubble, (K-1)/(M+K-1) for uniform stages).
- bubble_ratio: total idle / total busy, Megatron's "bubble time over ideal time"
  ((K-1)/M for uniform stages; Narayanan et al., SC'21, section 2.2).
- throughput: samples per second = micro-batches x micro-batch size / makespan.
- bubble_rate_zb: the zero-bubble papers' "bubble rate", measured per device against its own span:
  (cost - busy) / cost with cost = the longest device span (first start to last end of its
  computations) and busy that device's compute time (Qi et al., Zero Bubble Pipeline Parallelism,
  ICLR 2024, section 5.1: "bubble rate = (cost - m(T_F+T_B+T_W)) / cost, where cost is the largest
  execution time of all stages"). With uniform stages 1F1B gives (K-1)/(M+K-1) like bubble_fraction,
  but a schedule whose devices start late and end early (zb-h2, zbv) has a smaller bubble_fraction.

Everything here is computed from the timeline's arrays (no DataFrame): a sweep that reads only
``result.metrics`` never builds one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from sim import jit
from sim.results.memory import MemoryProfile
from sim.results.timeline import EngineRun, TimelineRows

__all__ = ["Metrics", "compute_metrics"]


@dataclass(frozen=True, slots=True)
class Metrics:
    makespan: float
    utilization: float
    bubble_fraction: float
    bubble_ratio: float
    throughput: float
    bubble_rate_zb: float
    """The zero-bubble papers' bubble rate (see the module docstring)."""
    busy: list[float]
    device_utilization: list[float]
    peak_memory: list[float]
    peak_inflight: list[int]
    weight_versions: list[int]
    memory_overflow: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def compute_metrics(timeline: pd.DataFrame | TimelineRows | EngineRun, memory: MemoryProfile, *, devices: int,
                    samples: float) -> Metrics:
    """Metrics of *timeline* (a timeline DataFrame, the engines' rows or the fast engine's run) and its memory
    profile."""
    if isinstance(timeline, EngineRun):
        busy_array, first, last, makespan = _run_spans(timeline, devices)
    else:
        busy_array, first, last, makespan = _device_spans(TimelineRows.of(timeline), devices)
    busy = busy_array.tolist()
    total = sum(busy)
    # a run of no time wastes none: utilization 1, bubble 0, so bubble = 1 - utilization holds always
    utilization = total / (devices * makespan) if makespan > 0 else 1.0
    return Metrics(
        makespan=makespan,
        utilization=utilization,
        bubble_fraction=1.0 - utilization,
        bubble_ratio=(devices * makespan - total) / total if total > 0 else 0.0,
        throughput=samples / makespan if makespan > 0 else float("inf"),
        bubble_rate_zb=_bubble_rate_zb(first, last, busy_array),
        busy=busy,
        device_utilization=[b / makespan if makespan > 0 else 1.0 for b in busy],
        peak_memory=list(memory.peak),
        peak_inflight=list(memory.peak_inflight),
        weight_versions=list(memory.weight_versions),
        memory_overflow=[str(o) for o in memory.overflows],
    )


def _device_spans(rows: TimelineRows, devices: int):
    """Per device: seconds computing, first start and last end of its computations (inf / -inf: none); and the
    makespan, the end of the last row (transfers included)."""
    makespan = float(rows.end.max()) if len(rows) else 0.0
    computing = rows.computing  # computations, not transfers
    start, end, device = rows.start[computing], rows.end[computing], rows.device[computing]
    busy = np.bincount(device, weights=end - start, minlength=devices)
    first = np.full(devices, np.inf)
    last = np.full(devices, -np.inf)
    np.minimum.at(first, device, start)
    np.maximum.at(last, device, end)
    return busy, first, last, makespan


def _run_spans(run: EngineRun, devices: int):
    """:func:`_device_spans` of a fast-engine run, from its arrays. A device runs its actions one after another
    in their order, so its first start and last end are those of its first and last action; busy seconds are
    added in the same order as over its rows (the same floats)."""
    if (kernel := jit.kernel_for(_busy_kernel, len(run.keys))) is not None:
        busy = kernel(run.device_start, run.start, run.end)
    else:
        busy = np.bincount(run.device, weights=run.end - run.start, minlength=devices)
    has = np.diff(run.device_start) > 0
    first = np.full(devices, np.inf)
    last = np.full(devices, -np.inf)
    first[has] = run.start[run.device_start[:-1][has]]
    last[has] = run.end[run.device_start[1:][has] - 1]
    return busy, first, last, run.makespan


def _busy_kernel(device_start, start, end):
    """Per device, the seconds its actions take, added one after another in their order: the floats of
    :func:`numpy.bincount` over the same values (compiled by numba, :mod:`sim.jit`; bincount with weights costs
    several times this loop)."""
    K = len(device_start) - 1
    busy = np.zeros(K)
    for d in range(K):
        total = 0.0
        for i in range(device_start[d], device_start[d + 1]):
            total += end[i] - start[i]
        busy[d] = total
    return busy


def _bubble_rate_zb(first: np.ndarray, last: np.ndarray, busy: np.ndarray) -> float:
    """(cost - busy) / cost of the device with the longest span (ZB paper, section 5.1; see above)."""
    if not np.isfinite(first).any():
        return 0.0
    span = np.where(np.isfinite(first), last - first, 0.0)
    longest = int(span.argmax())
    cost = span[longest]
    return float((cost - busy[longest]) / cost) if cost > 0 else 0.0
