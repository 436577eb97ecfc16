"""Figures of merit computed from a timeline and its memory profile.

- makespan: end of the last row (seconds).
- busy[d]: seconds device d spends computing (F, B, W, R, U; transfers excluded).
- utilization: sum(busy) / (K x makespan); bubble_fraction = 1 - utilization,
  the idle share of K x makespan (GPipe paper's bubble, (K-1)/(M+K-1) for uniform stages).
- bubble_ratio: total idle / total busy, Megatron's "bubble time over ideal time"
  ((K-1)/M for uniform stages; Narayanan et al., SC'21, section 2.2).
- throughput: samples per second = micro-batches x micro-batch size / makespan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .memory import MemoryProfile

__all__ = ["Metrics", "compute_metrics"]


@dataclass(frozen=True, slots=True)
class Metrics:
    makespan: float
    utilization: float
    bubble_fraction: float
    bubble_ratio: float
    throughput: float
    busy: list[float]
    device_utilization: list[float]
    peak_memory: list[float]
    peak_inflight: list[int]
    weight_versions: list[int]
    memory_overflow: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def compute_metrics(timeline: pd.DataFrame, memory: MemoryProfile, *, devices: int, samples: float) -> Metrics:
    end = timeline["end"].to_numpy()
    makespan = float(end.max()) if len(end) else 0.0
    computing = timeline["src"].to_numpy() < 0  # computations, not transfers (see sim.timeline)
    seconds = end[computing] - timeline["start"].to_numpy()[computing]
    busy = np.bincount(timeline["device"].to_numpy()[computing], weights=seconds, minlength=devices).tolist()
    total = sum(busy)
    # a run of no time wastes none: utilization 1, bubble 0, so bubble = 1 - utilization holds always
    utilization = total / (devices * makespan) if makespan > 0 else 1.0
    return Metrics(
        makespan=makespan,
        utilization=utilization,
        bubble_fraction=1.0 - utilization,
        bubble_ratio=(devices * makespan - total) / total if total > 0 else 0.0,
        throughput=samples / makespan if makespan > 0 else float("inf"),
        busy=busy,
        device_utilization=[b / makespan if makespan > 0 else 1.0 for b in busy],
        peak_memory=list(memory.peak),
        peak_inflight=list(memory.peak_inflight),
        weight_versions=list(memory.weight_versions),
        memory_overflow=[str(o) for o in memory.overflows],
    )
