"""The fast engine's list schedule computed wave by wave with numpy: no compiler to load.

Why it is the same schedule: in the deterministic case every time the list scheduler of
:mod:`sim.core.listsched` computes is a maximum of earlier times plus a constant (see its
docstring for why the event order is fixed in advance):

- an action starts at the latest of: the end of the previous action on its device (or,
  with blocking sends, the end of that action's transfer) and the arrival of each input;
  it ends ``duration`` later;
- a transfer starts at the latest of: its producer's end and the end of the previous
  transfer on the same directed link (the sender's device order is the link's queue
  order); it ends ``seconds`` later.

So the times are longest paths in a graph with no cycle (unless the schedule deadlocks),
and they can be computed in topological waves: every node whose predecessors are all
final is final, all at once, with the same float operations (a max, then one addition)
as the sequential walk. ``tests/test_fastpath.py`` checks that the two give identical
arrays. The number of waves is about the longest chain of actions (2M + 2K for 1F1B),
so this suits wide schedules (many devices, moderate M) in a process that has not loaded
numba: a one-off ``pipesim simulate`` of 100 k actions takes a fraction of a second
instead of paying numba's ~1 s start-up. A node that never becomes final is stuck: the
schedule deadlocks, and each device's position is where its run stopped.
"""

from __future__ import annotations

import numpy as np

__all__ = ["wavefront_schedule"]


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, e)`` for each pair (vectorised)."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total)


def wavefront_schedule(device_start, dep_start, dep_slot, duration, link, seconds, links, overlap, paired=None):
    """The arguments and results of :func:`sim.core.listsched._list_schedule` (numpy arrays in, numpy arrays out)."""
    device_start = np.asarray(device_start, dtype=np.int64)
    dep_start, dep_slot = np.asarray(dep_start, dtype=np.int64), np.asarray(dep_slot, dtype=np.int64)
    duration, seconds = np.asarray(duration, dtype=float), np.asarray(seconds, dtype=float)
    link = np.asarray(link, dtype=np.int64)
    n = len(duration)
    K = len(device_start) - 1
    sends = link >= 0
    # nodes: i is action i's end, n + i the end of its transfer (a node only where it sends)
    weight = np.concatenate([duration, seconds])
    exists = np.concatenate([np.ones(n, dtype=bool), sends])
    device = np.repeat(np.arange(K, dtype=np.int64), np.diff(device_start))
    first = np.zeros(n, dtype=bool)
    first[device_start[:-1][device_start[:-1] < device_start[1:]]] = True

    # edges u -> v: v's start waits for u's end
    src_parts, dst_parts = [], []
    paired = np.zeros(n, dtype=bool) if paired is None else np.asarray(paired, dtype=bool)
    follows = np.flatnonzero(~first)  # the previous action on the device frees it (or its blocking send does) ...
    before = follows - 1
    src_parts.append(np.where(~overlap & sends[before] & ~paired[before], n + before, before))
    dst_parts.append(follows)
    if not overlap:  # ... but a pair's forward send holds it only after the pair's backward (sim.core.listsched)
        after = follows[(before >= 1) & paired[np.maximum(before - 1, 0)] & sends[np.maximum(before - 1, 0)]]
        src_parts.append(n + after - 2)
        dst_parts.append(after)
    consumer = np.repeat(np.arange(n, dtype=np.int64), np.diff(dep_start))
    src_parts.append(dep_slot)  # inputs: slot p is action p's end, n + p the arrival of its result
    dst_parts.append(consumer)
    sender = np.flatnonzero(sends)
    src_parts.append(sender)  # a transfer starts after its producer ...
    dst_parts.append(n + sender)
    by_link = sender[np.argsort(link[sender], kind="stable")]  # ... and after the previous transfer on its link
    same = link[by_link[1:]] == link[by_link[:-1]]
    src_parts.append(n + by_link[:-1][same])
    dst_parts.append(n + by_link[1:][same])
    src, dst = np.concatenate(src_parts), np.concatenate(dst_parts)

    order = np.argsort(src, kind="stable")  # successors of each node, as CSR
    succ = dst[order]
    succ_start = np.zeros(2 * n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=2 * n), out=succ_start[1:])
    out_degree = np.diff(succ_start)
    waiting = np.bincount(dst, minlength=2 * n)
    begin = np.zeros(2 * n)  # the max over predecessors so far: a node's start once all are in
    finish = np.zeros(2 * n)
    final = np.zeros(2 * n, dtype=bool)
    wave = np.flatnonzero(exists & (waiting == 0))
    while len(wave):
        finish[wave] = begin[wave] + weight[wave]
        final[wave] = True
        at = _ranges(succ_start[wave], succ_start[wave + 1])
        if not len(at):
            break
        targets = succ[at]
        np.maximum.at(begin, targets, np.repeat(finish[wave], out_degree[wave]))
        np.subtract.at(waiting, targets, 1)
        wave = np.unique(targets[waiting[targets] == 0])

    done = final[:n]
    position = device_start[:-1] + np.bincount(device[done], minlength=K)  # finished actions: a prefix per device
    sent_start = np.where(sends & final[n:], begin[n:], 0.0)
    sent_end = np.where(sends & final[n:], finish[n:], 0.0)
    return np.where(done, begin[:n], 0.0), np.where(done, finish[:n], 0.0), sent_start, sent_end, position
