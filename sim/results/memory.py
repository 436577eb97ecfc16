"""Memory per device over time, derived from a timeline (simulated or measured alike).

What a device holds (bytes, from :class:`~sim.model.cost.StageCosts`):

- from the start: weights, gradient buffers and optimizer state of its stages;
- at the start of F(s,m): the activations of stage s for micro-batch m
  (``activation_bytes``), or only the stage input (``checkpoint_bytes``) when the
  backward is preceded by a recompute R(s,m), which brings the activations back;
- until the end of B(s,m), or of W(s,m) when the backward is split; with the split, B(s,m) frees at its end
  what W does not need (``activation_bytes - weight_activation_bytes``) and W(s,m) the rest (the zero-bubble
  paper's memory per pass, Qi et al., ICLR 2024, section 2.1: F +M_B, B -(M_B - M_W), W -M_W; its runtime
  approximates M_B = 34h + 5as and M_W = 32h bytes per token, sail-sg/zero-bubble-pipeline-parallelism,
  ``megatron/core/pipeline_parallel/zerobubble/runtime.py``). By default W keeps everything
  (``weight_activation_bytes = activation_bytes``) and B frees nothing;
- weight versions: every U creates a new version of the stage's weights; an old
  version is kept while a micro-batch whose forward used it still has to run its
  backward (PipeDream's weight stashing). Flush schedules therefore hold one version.

At equal times, frees are applied before allocations (a buffer is reused at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from sim import jit
from sim.model.cost import StageCosts
from sim.core.ir import OP_B as _B
from sim.core.ir import OP_F as _F
from sim.core.ir import OP_R as _R
from sim.core.ir import OP_U as _U
from sim.core.ir import OP_W as _W
from sim.core.ir import Schedule
from sim.results.memory_kernel import memory_peaks
from sim.results.timeline import EngineRun, TimelineRows

__all__ = ["MemoryProfile", "memory_profile", "Overflow", "member_of", "weight_version_events", "activation_events"]


@dataclass(frozen=True, slots=True)
class Overflow:
    """A device that needed more memory than its capacity."""

    device: int
    first_time: float
    """Seconds: when the device first went over capacity."""
    peak_time: float
    """Seconds: when it was furthest over."""
    excess_bytes: float
    """How far over capacity at the peak."""

    def __str__(self) -> str:
        return (f"device {self.device} exceeds its memory capacity by {self.excess_bytes:.4g} bytes "
                f"at t={self.peak_time:.6g} (first over at t={self.first_time:.6g})")


class MemoryProfile:
    """Memory per device: peaks (computed with the metrics) and the step function over time
    (:attr:`usage`, a DataFrame built on first access)."""

    __slots__ = ("_usage", "peak", "peak_inflight", "weight_versions", "capacity", "overflows")

    def __init__(self, usage, peak: list[float], peak_inflight: list[int], weight_versions: list[int],
                 capacity: float | None = None, overflows: list[Overflow] | None = None) -> None:
        self._usage = usage
        """The step function, or a function without arguments that builds it."""
        self.peak = peak
        """Peak bytes per device."""
        self.peak_inflight = peak_inflight
        """Most micro-batches with activations held at once, per device."""
        self.weight_versions = weight_versions
        """Most weight versions held at once, per device (summed over its stages)."""
        self.capacity = capacity
        self.overflows = list(overflows or [])

    @property
    def usage(self) -> pd.DataFrame:
        """Step function: columns device, time, bytes (bytes held from *time* until the next row)."""
        if callable(self._usage):
            self._usage = self._usage()
        return self._usage

    def __repr__(self) -> str:
        return (f"MemoryProfile(peak={self.peak}, peak_inflight={self.peak_inflight}, "
                f"weight_versions={self.weight_versions}, capacity={self.capacity}, overflows={self.overflows})")


def memory_profile(schedule: Schedule, costs: StageCosts, timeline: pd.DataFrame | TimelineRows | EngineRun,
                   capacity: float | None = None) -> MemoryProfile:
    """The memory of *schedule*'s devices over *timeline* (a timeline DataFrame, the engines' rows, or the fast
    engine's run)."""
    K = schedule.devices
    act = np.asarray(costs.activation_bytes, dtype=float)
    ckpt = np.asarray(costs.checkpoint_bytes, dtype=float)
    drop = costs.kept_after_b()
    drop = None if drop is None else np.asarray(drop, dtype=float)  # what a split B frees (None: nothing)
    placement = np.asarray(schedule.placement, dtype=np.int64)
    held = np.asarray(costs.weight_bytes, dtype=float) + np.asarray(costs.grad_bytes, dtype=float) \
        + np.asarray(costs.optimizer_bytes, dtype=float)
    static = np.bincount(placement, weights=held, minlength=K)  # each device's stages, added in stage order
    stages_on = np.bincount(placement, minlength=K).astype(float)  # version 0 of every stage exists from the start
    if isinstance(timeline, EngineRun):
        compiled = _compiled_peaks(schedule, costs, timeline, act, ckpt, drop, static, stages_on, capacity)
        if compiled is not None:
            return compiled
    return _numpy_profile(schedule, costs, TimelineRows.of(timeline), act, ckpt, drop, static, stages_on, capacity)


def activation_events(rows: TimelineRows, S: int, act: np.ndarray, ckpt: np.ndarray, drop: np.ndarray | None):
    """The activation events of *rows*' computations, in one fixed order (forwards, recomputes, frees at W or at an
    unsplit B, then the partial frees at a split B): a tuple of (devices, times, delta bytes, delta in-flight) per
    group. One definition for :mod:`sim.results.memory_breakdown` too; the compiled kernel
    (:mod:`sim.results.memory_kernel`) keeps the same order for its ties."""
    comp = rows.computing
    stage, mb, op = rows.stage[comp], rows.microbatch[comp], rows.op[comp]
    start, end, device = rows.start[comp], rows.end[comp], rows.device[comp]
    pair = mb * S + stage  # (stage, micro-batch) as one integer
    is_f, is_b, is_w, is_r = op == _F, op == _B, op == _W, op == _R
    has_w = member_of(pair, pair[is_w])  # backward split: W frees the activations, else B does
    has_r = member_of(pair, pair[is_r])
    is_free = is_w | (is_b & ~has_w)
    if drop is None:  # W (or an unsplit B) frees all of the activations: pipesim's default model
        freed = act[stage]
    else:  # W frees what its B left
        freed = np.where(is_w, (act - drop)[stage], act[stage])
    events = [
        (device[is_f], start[is_f], np.where(has_r[is_f], ckpt[stage[is_f]], act[stage[is_f]]), 1.0),
        (device[is_r], start[is_r], act[stage[is_r]], 0.0),
        (device[is_free], end[is_free], -np.where(has_r[is_free], ckpt[stage[is_free]] + freed[is_free],
                                                  freed[is_free]), -1.0),
    ]
    if drop is not None:  # a split B frees what its W does not need, at the B's end
        is_part = is_b & has_w & (drop[stage] > 0)
        events.append((device[is_part], end[is_part], -drop[stage[is_part]], 0.0))
    return events, (stage, mb, op, start, end, has_w)


def _numpy_profile(schedule, costs, rows, act, ckpt, drop, static, stages_on, capacity) -> MemoryProfile:
    """The profile computed with numpy: every event, one sort, running sums per device."""
    K, S = schedule.devices, schedule.stages
    # events: (device, time, delta bytes, delta in-flight micro-batches, delta weight versions)
    events, (stage, mb, op, start, end, has_w) = activation_events(rows, S, act, ckpt, drop)
    events = [e + (0.0,) for e in events]
    v_dev, v_time, v_delta, v_stage = weight_version_events(schedule, stage, mb, op, start, end, has_w)
    events.append((v_dev, v_time, v_delta * np.asarray(costs.weight_bytes)[v_stage], 0.0, v_delta))

    dev = np.concatenate([e[0] for e in events]).astype(np.int64)
    time = np.concatenate([e[1] for e in events]).astype(float)
    nbytes = np.concatenate([e[2] for e in events]).astype(float)
    inflight = np.concatenate([np.broadcast_to(e[3], len(e[0])) for e in events]).astype(float)
    versions = np.concatenate([np.broadcast_to(e[4], len(e[0])) for e in events]).astype(float)

    # one sort: by device, then time, then frees before allocations
    frees_first = np.where((nbytes < 0) | (inflight < 0) | (versions < 0), 0, 1)
    order = np.lexsort((frees_first, time, dev))
    dev, time, nbytes, inflight, versions = dev[order], time[order], nbytes[order], inflight[order], versions[order]
    bounds = np.searchsorted(dev, np.arange(K + 1))
    counts = np.diff(bounds)
    # each device's events as one row of a K x width table, zeros after its last: a cumulative sum along the rows is
    # each device's own running sum (the same additions in the same order as summing the device alone)
    width = int(counts.max(initial=0))
    column = np.arange(len(dev)) - bounds[dev]

    def running(values: np.ndarray) -> np.ndarray:
        table = np.zeros((K, width))
        table[dev, column] = values
        return np.cumsum(table, axis=1)

    levels = static[:, None] + running(nbytes)  # bytes held after each event
    peaks = np.maximum(static, levels.max(axis=1, initial=-np.inf)).tolist()
    inflight_peaks = [int(v) for v in np.maximum(0.0, running(inflight).max(axis=1, initial=0.0))]
    version_peaks = [int(v) for v in stages_on + np.maximum(0.0, running(versions).max(axis=1, initial=0.0))]

    def steps(d: int) -> tuple[np.ndarray, np.ndarray]:
        """Device d's step function: (times, bytes held from each time on), starting at 0 with its static bytes."""
        times = np.concatenate([[0.0], time[bounds[d]:bounds[d + 1]]])
        held = np.concatenate([[static[d]], levels[d, :counts[d]]])
        last_at_time = np.append(times[1:] != times[:-1], True)  # events at one instant: keep the level after all
        return times[last_at_time], held[last_at_time]

    overflows = []
    for d in np.flatnonzero(capacity is not None and np.asarray(peaks) > (capacity or 0.0)).tolist():
        times = np.concatenate([[0.0], time[bounds[d]:bounds[d + 1]]])
        held = np.concatenate([[static[d]], levels[d, :counts[d]]])
        over = np.nonzero(held > capacity)[0]
        top = int(held.argmax())
        overflows.append(Overflow(d, float(times[over[0]]), float(times[top]), float(held[top] - capacity)))

    def usage() -> pd.DataFrame:  # built on first access: a metrics-only caller never needs it
        import pandas as pd  # here, not at the top: `import sim` stays light

        columns = [steps(d) for d in range(K)]
        return pd.DataFrame({
            "device": np.repeat(np.arange(K, dtype=np.int64), [len(t) for t, _ in columns]),
            "time": np.concatenate([t for t, _ in columns]),
            "bytes": np.concatenate([b for _, b in columns]),
        })

    return MemoryProfile(usage, peaks, inflight_peaks, version_peaks, capacity, overflows)


def _compiled_peaks(schedule, costs, run: EngineRun, act, ckpt, drop, static, stages_on,
                    capacity) -> MemoryProfile | None:
    """The profile from :func:`sim.results.memory_kernel.memory_peaks` (the same floats), where it pays
    (:func:`sim.jit.kernel_for`). None: compute it with numpy (also should the kernel find the actions too far
    from run order to sort)."""
    kernel = jit.kernel_for(memory_peaks, len(run.keys))
    if kernel is None:
        return None
    limit = math.inf if capacity is None else float(capacity)
    ok, peak, inflight, versions, first_over, peak_time = kernel(
        run.keys, run.device_start, run.start, run.end, schedule.stages, act, ckpt,
        np.zeros(len(act)) if drop is None else drop,
        np.asarray(costs.weight_bytes, dtype=float), np.asarray(schedule.placement, dtype=np.int64), static, limit,
        4 * len(run.keys) + 1024)
    if not ok:
        return None
    overflows = [Overflow(d, float(first_over[d]), float(peak_time[d]), float(peak[d] - limit))
                 for d in np.flatnonzero(peak > limit).tolist()]

    def usage() -> pd.DataFrame:  # the step function is numpy's, built on first access
        return _numpy_profile(schedule, costs, run.rows(), act, ckpt, drop, static, stages_on, capacity).usage

    return MemoryProfile(usage, peak.tolist(), [int(v) for v in inflight],
                         [int(v) for v in stages_on + versions], capacity, overflows)


def member_of(values: np.ndarray, of: np.ndarray) -> np.ndarray:
    """``np.isin(values, of)`` for non-negative integers, by a lookup table when that is small."""
    if len(of) == 0:
        return np.zeros(len(values), dtype=bool)
    top = int(max(values.max(initial=0), of.max()))
    if top > 4 * (len(values) + len(of)) + 1024 or min(values.min(initial=0), of.min()) < 0:
        return np.isin(values, of)
    table = np.zeros(top + 1, dtype=bool)
    table[of] = True
    return table[values]


def weight_version_events(schedule, stage, mb, op, start, end, has_w):
    """+1 when a U creates a weight version, -1 when an old version is no longer needed.

    Version v of stage s lives from its creation (the end of the U that made it; v=0
    exists from the start and is counted as static) until it is superseded by v+1 and
    no micro-batch that ran its forward on v still waits for its backward.
    Returns the events' devices, times, deltas (in versions) and stages.
    """
    devs, times, deltas, stages = [], [], [], []
    is_u = op == _U
    if not is_u.any():
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    is_f, is_w = op == _F, op == _W
    last = is_w | ((op == _B) & ~has_w)  # a micro-batch's backward ends with its W if it has one
    by_stage = np.argsort(stage, kind="stable")
    bounds = np.searchsorted(stage[by_stage], np.arange(schedule.stages + 1))
    for s in range(schedule.stages):
        rows = by_stage[bounds[s]:bounds[s + 1]]
        created = np.sort(end[rows[is_u[rows]]])  # version v+1 is created at created[v]
        f_rows, b_rows = rows[is_f[rows]], rows[last[rows]]
        backward_end = np.zeros(int(mb[rows].max(initial=0)) + 1)  # initial: a stage may have no rows (an idle replica)
        backward_end[mb[b_rows]] = end[b_rows]
        # the version each micro-batch's forward read: how many updates had finished before it started
        version_of = np.searchsorted(created, start[f_rows], side="right")
        release = np.append(created, np.inf)  # version v is retired no earlier than v+1's creation ...
        np.maximum.at(release, version_of, backward_end[mb[f_rows]])  # ... nor before its last reader's backward
        n = len(created)
        devs += [schedule.placement[s]] * 2 * n
        times += created.tolist() + release[:n].tolist()
        deltas += [1.0] * n + [-1.0] * n
        stages += [s] * 2 * n
    return (np.asarray(devs, dtype=np.int64), np.asarray(times, dtype=float), np.asarray(deltas, dtype=float),
            np.asarray(stages, dtype=np.int64))
