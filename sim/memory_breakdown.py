"""What a device holds at its memory peak, by kind: "why does stage 0 need more?" answered in bytes.

For every device, at the instant of its peak (the first one if the peak is reached
several times), the bytes of :mod:`sim.memory`'s model are split into

- ``weights``: one version of the weights of every stage on the device;
- ``grads``: their gradient buffers; ``optimizer``: their optimizer state;
- ``activations``: the activation (or, under re-materialization, checkpoint) bytes of
  the micro-batches in flight at that instant;
- ``stashed_weights``: weight versions beyond the first (PipeDream's weight stashing).

The five add up to the device's peak; :func:`memory_breakdown` checks that they do, so
the breakdown can never drift from the memory model it explains. Units: bytes, seconds.
"""

from __future__ import annotations

import numpy as np

from .memory import _member, _op_codes, _weight_version_events
from .result import Result

__all__ = ["memory_breakdown", "BREAKDOWN_KEYS"]

BREAKDOWN_KEYS = ("weights", "grads", "optimizer", "activations", "stashed_weights")

_F, _B, _W, _R, _U = range(5)  # positions in sim.timeline.OPS, as in sim.memory


def memory_breakdown(result: Result) -> list[dict]:
    """Per device: ``{"device", "time", "peak", "weights", "grads", "optimizer", "activations", "stashed_weights"}``
    at its peak (``time`` in seconds; the rest in bytes)."""
    schedule, costs, timeline = result.schedule, result.costs, result.timeline
    K, S = schedule.devices, schedule.stages
    usage = result.memory.usage
    comp = timeline["src"].to_numpy() < 0
    stage = timeline["stage"].to_numpy()[comp]
    mb = timeline["microbatch"].to_numpy()[comp]
    op = _op_codes(timeline["op"])[comp]
    start = timeline["start"].to_numpy()[comp]
    end = timeline["end"].to_numpy()[comp]
    device = timeline["device"].to_numpy()[comp]
    pair = mb * S + stage
    has_w = _member(pair, pair[op == _W])
    act = np.asarray(costs.activation_bytes)
    ckpt = np.asarray(costs.checkpoint_bytes)
    v_dev, v_time, v_delta, v_stage = _weight_version_events(schedule, stage, mb, op, start, end, has_w)
    v_bytes = v_delta * np.asarray(costs.weight_bytes)[v_stage] if len(v_stage) else v_delta

    # when each (stage, micro-batch) frees its activations: the end of its W, or of its B if unsplit
    freeing = (op == _W) | ((op == _B) & ~has_w)
    free_at = dict(zip(pair[freeing].tolist(), end[freeing].tolist()))
    recompute_at = dict(zip(pair[op == _R].tolist(), start[op == _R].tolist()))

    out = []
    for d in range(K):
        rows = usage[usage["device"] == d]
        levels = rows["bytes"].to_numpy()
        top = int(levels.argmax())
        t, peak = float(rows["time"].to_numpy()[top]), float(levels[top])
        stages_on = [s for s in range(S) if schedule.placement[s] == d]
        entry = {"device": d, "time": t, "peak": peak,
                 "weights": float(sum(costs.weight_bytes[s] for s in stages_on)),
                 "grads": float(sum(costs.grad_bytes[s] for s in stages_on)),
                 "optimizer": float(sum(costs.optimizer_bytes[s] for s in stages_on))}
        # a level at time t counts every event at t (memory.py keeps the level after all of them)
        held = 0.0
        mine = (device == d) & (op == _F) & (start <= t)
        for p, s in zip(pair[mine].tolist(), stage[mine].tolist()):
            if free_at.get(p, np.inf) <= t:
                continue
            if p in recompute_at:
                held += ckpt[s] + (act[s] if recompute_at[p] <= t else 0.0)
            else:
                held += act[s]
        entry["activations"] = float(held)
        on_d = v_dev == d
        entry["stashed_weights"] = float(v_bytes[on_d & (v_time <= t)].sum())
        total = sum(entry[k] for k in BREAKDOWN_KEYS)
        assert abs(total - peak) <= 1e-6 * max(1.0, peak), (d, total, peak)  # the parts must add up to the peak
        out.append(entry)
    return out

