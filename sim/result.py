"""Result: one schema for simulated and measured runs (timeline, memory, metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .cost import StageCosts
from .hardware import Hardware
from .ir import Schedule
from .memory import MemoryProfile, memory_profile
from .metrics import Metrics, compute_metrics

__all__ = ["Result", "make_result"]


@dataclass(frozen=True, slots=True)
class Result:
    schedule: Schedule
    costs: StageCosts
    hardware: Hardware
    timeline: pd.DataFrame
    """One row per computation and transfer (schema in :mod:`sim.timeline`)."""
    memory: MemoryProfile
    metrics: Metrics
    microbatch_size: float = 1.0
    source: str = "simulated"
    """'simulated' or 'measured'."""
    notes: list[str] = field(default_factory=list)
    """Caveats a reader must see, e.g. 'compute was emulated'."""


def make_result(schedule: Schedule, costs: StageCosts, hardware: Hardware, timeline: pd.DataFrame, *,
                microbatch_size: float = 1.0, source: str = "simulated", notes: list[str] | None = None) -> Result:
    """Derive memory and metrics from a timeline; used for simulated and measured timelines alike."""
    memory = memory_profile(schedule, costs, timeline, hardware.memory_capacity)
    metrics = compute_metrics(timeline, memory, devices=schedule.devices,
                              samples=schedule.total_microbatches * microbatch_size)
    return Result(schedule, costs, hardware, timeline, memory, metrics, microbatch_size, source, list(notes or []))
