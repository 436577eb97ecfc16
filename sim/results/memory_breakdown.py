"""What a device holds at its memory peak, by kind: "why does stage 0 need more?" answered in bytes.

For every device, at the instant of its peak (the first one if the peak is reached
several times), the bytes of :mod:`sim.results.memory`'s model are split into

- ``weights``: one version of the weights of every stage on the device;
- ``grads``: their gradient buffers; ``optimizer``: their optimizer state;
- ``activations``: the activation (or, under re-materialization, checkpoint) bytes of
  the micro-batches in flight at that instant (after a split backward's B only what its W still needs,
  ``weight_activation_bytes``);
- ``stashed_weights``: weight versions beyond the first (PipeDream's weight stashing).

The five add up to the device's peak; :func:`memory_breakdown` checks that they do, so
the breakdown can never drift from the memory model it explains. Units: bytes, seconds.
"""

from __future__ import annotations

import numpy as np

from sim.results.memory import activation_events, weight_version_events
from sim.results.result import Result

__all__ = ["memory_breakdown", "BREAKDOWN_KEYS"]

BREAKDOWN_KEYS = ("weights", "grads", "optimizer", "activations", "stashed_weights")


def memory_breakdown(result: Result) -> list[dict]:
    """Per device: ``{"device", "time", "peak", "weights", "grads", "optimizer", "activations", "stashed_weights"}``
    at its peak (``time`` in seconds; the rest in bytes).

    The step functions of activations and of stashed weight versions are rebuilt here from the
    timeline's arrays (no DataFrame), kind by kind, with :mod:`sim.results.memory`'s rules; their sum plus
    the static bytes must reach exactly the peak the memory profile found.
    """
    schedule, costs, rows = result.schedule, result.costs, result.rows
    K, S = schedule.devices, schedule.stages
    act = np.asarray(costs.activation_bytes, dtype=float)
    ckpt = np.asarray(costs.checkpoint_bytes, dtype=float)
    drop = costs.kept_after_b()  # a split B frees part of the activations (the zero-bubble paper's M_B - M_W)
    events, (stage, mb, op, start, end, has_w) = activation_events(
        rows, S, act, ckpt, None if drop is None else np.asarray(drop, dtype=float))

    # events: (device, time, delta activation bytes, delta stashed bytes)
    v_dev, v_time, v_delta, v_stage = weight_version_events(schedule, stage, mb, op, start, end, has_w)
    v_bytes = v_delta * np.asarray(costs.weight_bytes, dtype=float)[v_stage] if len(v_stage) else v_delta
    dev = np.concatenate([e[0] for e in events] + [v_dev]).astype(np.int64)
    time = np.concatenate([e[1] for e in events] + [v_time]).astype(float)
    d_act = np.concatenate([np.asarray(e[2], dtype=float) for e in events] + [np.zeros(len(v_dev))])
    d_stash = np.concatenate([np.zeros(sum(len(e[0]) for e in events)), v_bytes])
    frees_first = np.where((d_act < 0) | (d_stash < 0), 0, 1)  # as sim.results.memory: at one instant, frees first
    order = np.lexsort((frees_first, time, dev))
    dev, time, d_act, d_stash = dev[order], time[order], d_act[order], d_stash[order]
    bounds = np.searchsorted(dev, np.arange(K + 1))

    placement = np.asarray(schedule.placement, dtype=np.int64)  # static bytes per device, summed over its stages
    weights, grads, optimizer = (np.bincount(placement, weights=np.asarray(b, dtype=float), minlength=K)
                                 for b in (costs.weight_bytes, costs.grad_bytes, costs.optimizer_bytes))
    out = []
    for d in range(K):
        entry = {"device": d, "time": 0.0, "peak": 0.0, "weights": float(weights[d]), "grads": float(grads[d]),
                 "optimizer": float(optimizer[d])}
        static = entry["weights"] + entry["grads"] + entry["optimizer"]
        lo, hi = bounds[d], bounds[d + 1]
        times = np.concatenate([[0.0], time[lo:hi]])
        acts = np.concatenate([[0.0], np.cumsum(d_act[lo:hi])])
        stash = np.concatenate([[0.0], np.cumsum(d_stash[lo:hi])])
        last_at_time = np.append(times[1:] != times[:-1], True)  # a level counts once all events of its instant ran
        levels = np.where(last_at_time, acts + stash, -np.inf)
        top = int(levels.argmax())
        entry.update(time=float(times[top]), peak=float(static + acts[top] + stash[top]),
                     activations=float(acts[top]), stashed_weights=float(stash[top]))
        # the parts must add up to the peak the memory model found (the two derivations agree)
        assert abs(entry["peak"] - result.memory.peak[d]) <= 1e-9 * max(1.0, entry["peak"]), (d, entry)
        out.append(entry)
    return out
