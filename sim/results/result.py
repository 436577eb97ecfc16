"""Result: one schema for simulated and measured runs (timeline, memory, metrics).

Metrics and memory peaks are computed from the engine's arrays when the result is made;
the pandas timeline (and the memory step function) are built on first access, so a
caller that reads only ``result.metrics`` (a sweep, a planner: thousands of runs) never
builds a DataFrame, nor imports pandas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from sim.core.ir import Schedule
from sim.results.memory import MemoryProfile, memory_profile
from sim.results.metrics import Metrics, compute_metrics
from sim.results.timeline import EngineRun, TimelineRows

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Result", "make_result"]


@dataclass(frozen=True, eq=False)
class Result:
    schedule: Schedule
    costs: StageCosts
    hardware: Hardware
    _timeline: pd.DataFrame | TimelineRows | EngineRun = field(repr=False)
    """The timeline, or the engine's rows or run it is built from on first access (see :attr:`timeline`)."""
    memory: MemoryProfile
    metrics: Metrics
    microbatch_size: float = 1.0
    source: str = "simulated"
    """'simulated' or 'measured'."""
    notes: list[str] = field(default_factory=list)
    """Caveats a reader must see, e.g. 'compute was emulated'."""

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per computation and transfer (schema in :mod:`sim.results.timeline`), sorted by start time."""
        if isinstance(self._timeline, (TimelineRows, EngineRun)):
            object.__setattr__(self, "_timeline", TimelineRows.of(self._timeline).frame())  # built once, then kept
        return self._timeline

    @property
    def rows(self) -> TimelineRows:
        """The timeline as numpy columns (no DataFrame is built for it)."""
        return TimelineRows.of(self._timeline)


def make_result(schedule: Schedule, costs: StageCosts, hardware: Hardware,
                timeline: pd.DataFrame | TimelineRows | EngineRun, *,
                microbatch_size: float = 1.0, source: str = "simulated", notes: list[str] | None = None) -> Result:
    """Derive memory and metrics from a timeline (a DataFrame, the engines' rows, or the fast engine's run); used
    for simulated and measured timelines alike."""
    # an engine's run is read as arrays (its rows are made on demand); anything else as rows
    arrays = timeline if isinstance(timeline, EngineRun) else TimelineRows.of(timeline)
    memory = memory_profile(schedule, costs, arrays, hardware.memory_capacity)
    metrics = compute_metrics(arrays, memory, devices=schedule.devices,
                              samples=schedule.total_microbatches * microbatch_size)
    return Result(schedule, costs, hardware, timeline, memory, metrics, microbatch_size, source, list(notes or []))
