"""Memory peaks in one compiled pass: the numbers of :func:`sim.memory.memory_profile`, without its numpy calls.

:func:`sim.memory.memory_profile` builds every allocation and free as an event, sorts them by
(device, time, frees first) with a stable sort, and takes running sums. On a schedule of a few
thousand actions its ~100 numpy calls cost about half a millisecond, most of a whole simulation.
:func:`memory_peaks` computes the same events, the same order and the same sums in one loop
kernel (compiled by numba, :mod:`sim.jit`), so the peaks are the same floats.

Why it needs no general sort: it keeps numpy's order exactly, breaking ties by the position an
event has in numpy's concatenation (forwards, recomputes, frees, weight versions), but it places
each device's events in the order of its actions. The fast engine lists a device's actions in
the order they ran, one after another (:class:`sim.timeline.EngineRun`), so those events are in
time order already, except for ties at an instant (a zero-length action): an insertion sort
finishes them in linear time. The weight-version events (two per update) are sorted on their
own (a stable merge sort) and merged in. Actions in any other order would make the insertion
sort quadratic, so it gives up after a budget of moves and the caller falls back to numpy.
"""

from __future__ import annotations

import numpy as np

from .ir import NUM_KINDS, OP_B, OP_F, OP_R, OP_U, OP_W

__all__ = ["memory_peaks"]


def memory_peaks(keys, device, start, end, S, act, ckpt, weight_bytes, placement, static, capacity, max_moves):
    """Peaks of a fast-engine run (:class:`sim.timeline.EngineRun`): every action's key, device, start and end.

    Per-stage *act*, *ckpt*, *weight_bytes*; *placement* (stage -> device); *static* bytes per device;
    *capacity* (inf for none). Returns (ok, peak bytes, peak in-flight, peak extra weight versions, first time
    over capacity (nan: never), time of the peak), per device; ok is False when sorting needed more than
    *max_moves* moves (then nothing else is meaningful).
    """
    n = len(keys)
    K = len(static)
    kind = np.empty(n, dtype=np.int64)  # the codec (sim.ir), one division per part: (mb*S + stage)*5 + kind
    stage = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    top = 0
    for i in range(n):
        pair = keys[i] // NUM_KINDS
        kind[i] = keys[i] - pair * NUM_KINDS
        mb[i] = pair // S
        stage[i] = pair - mb[i] * S
        if mb[i] > top:
            top = mb[i]
    # (stage, micro-batch) pairs whose backward is split (has W) or recomputed (has R), as numpy's _member
    has_w = np.zeros((top + 1) * S, dtype=np.bool_)
    has_r = np.zeros((top + 1) * S, dtype=np.bool_)
    n_f = n_r = n_free = n_u = 0
    for i in range(n):
        k = kind[i]
        if k == OP_W:
            has_w[mb[i] * S + stage[i]] = True
        elif k == OP_R:
            has_r[mb[i] * S + stage[i]] = True
        elif k == OP_U:
            n_u += 1
    for i in range(n):  # counts per event group, for the events' concatenation positions
        k = kind[i]
        if k == OP_F:
            n_f += 1
        elif k == OP_R:
            n_r += 1
        elif k == OP_W or (k == OP_B and not has_w[mb[i] * S + stage[i]]):
            n_free += 1
    n_rows = n_f + n_r + n_free
    n_events = n_rows + 2 * n_u
    ev_device = np.empty(n_events, dtype=np.int64)
    ev_time = np.empty(n_events)
    ev_bytes = np.empty(n_events)
    ev_inflight = np.zeros(n_events)
    ev_versions = np.zeros(n_events)
    ev_tie = np.empty(n_events, dtype=np.int64)  # position in numpy's concatenation: breaks ties as its stable sort
    e = 0
    at_f, at_r, at_free = 0, n_f, n_f + n_r
    for i in range(n):
        k = kind[i]
        s = stage[i]
        pair = mb[i] * S + s
        if k == OP_F:
            ev_time[e] = start[i]
            ev_bytes[e] = ckpt[s] if has_r[pair] else act[s]
            ev_inflight[e] = 1.0
            ev_tie[e] = at_f
            at_f += 1
        elif k == OP_R:
            ev_time[e] = start[i]
            ev_bytes[e] = act[s]
            ev_tie[e] = at_r
            at_r += 1
        elif k == OP_W or (k == OP_B and not has_w[pair]):
            ev_time[e] = end[i]
            ev_bytes[e] = -(ckpt[s] + act[s]) if has_r[pair] else -act[s]
            ev_inflight[e] = -1.0
            ev_tie[e] = at_free
            at_free += 1
        else:
            continue
        ev_device[e] = device[i]
        e += 1

    # weight versions (sim.memory._weight_version_events): version v+1 of stage s is created at the end of its
    # v-th update (in time order) and retired when superseded and no forward that read it awaits its backward
    if n_u:
        u_start = np.zeros(S + 1, dtype=np.int64)
        for i in range(n):
            if kind[i] == OP_U:
                u_start[stage[i] + 1] += 1
        for s in range(S):
            u_start[s + 1] += u_start[s]
        created = np.empty(n_u)
        fill = u_start[:S].copy()
        for i in range(n):
            if kind[i] == OP_U:
                created[fill[stage[i]]] = end[i]
                fill[stage[i]] += 1
        for s in range(S):
            created[u_start[s]:u_start[s + 1]] = np.sort(created[u_start[s]:u_start[s + 1]])
        backward_end = np.zeros((top + 1) * S)  # (mb, stage) -> end of its backward (its W when split)
        for i in range(n):
            if kind[i] == OP_W or (kind[i] == OP_B and not has_w[mb[i] * S + stage[i]]):
                backward_end[mb[i] * S + stage[i]] = end[i]
        release = created.copy()  # version v is retired no earlier than v+1's creation ...
        for i in range(n):
            if kind[i] == OP_F:
                s = stage[i]
                lo, hi = u_start[s], u_start[s + 1]
                v = lo  # the version its forward read: how many updates ended by its start (searchsorted, right)
                top_v = hi
                while v < top_v:  # by hand: a slice and a call per forward cost more than the whole loop
                    mid = (v + top_v) // 2
                    if created[mid] <= start[i]:
                        v = mid + 1
                    else:
                        top_v = mid
                if v < hi:  # ... nor before its last reader's backward (the newest version is never retired)
                    b = backward_end[mb[i] * S + s]
                    if b > release[v]:
                        release[v] = b
        tie = n_rows
        for s in range(S):  # numpy's order: per stage, its creations, then its retirements
            for half in range(2):
                for v in range(u_start[s], u_start[s + 1]):
                    ev_device[e] = placement[s]
                    ev_time[e] = created[v] if half == 0 else release[v]
                    ev_bytes[e] = weight_bytes[s] if half == 0 else -1.0 * weight_bytes[s]
                    ev_versions[e] = 1.0 if half == 0 else -1.0
                    ev_tie[e] = tie
                    tie += 1
                    e += 1

    # frees before allocations at one instant (numpy's frees_first key is 0 for frees)
    ev_late = np.empty(n_events, dtype=np.int64)
    for j in range(n_events):
        ev_late[j] = 0 if (ev_bytes[j] < 0 or ev_inflight[j] < 0 or ev_versions[j] < 0) else 1

    # group by device (stable), row events first, then version events, each in generation order
    count = np.zeros(K + 1, dtype=np.int64)
    for j in range(n_events):
        count[ev_device[j] + 1] += 1
    for d in range(K):
        count[d + 1] += count[d]
    order = np.empty(n_events, dtype=np.int64)
    fill = count[:K].copy()
    rows_end = np.empty(K, dtype=np.int64)  # per device: where its version events begin in `order`
    for j in range(n_rows):
        d = ev_device[j]
        order[fill[d]] = j
        fill[d] += 1
    rows_end[:] = fill
    for j in range(n_rows, n_events):
        d = ev_device[j]
        order[fill[d]] = j
        fill[d] += 1

    moves = 0
    merged = np.empty(n_events, dtype=np.int64)
    peak = static.copy()
    peak_inflight = np.zeros(K)
    peak_versions = np.zeros(K)
    first_over = np.full(K, np.nan)
    peak_time = np.zeros(K)
    for d in range(K):
        lo, hi = count[d], rows_end[d]
        for a in range(lo + 1, hi):  # insertion sort by (time, late, tie): linear on nearly sorted input
            j = order[a]
            b = a - 1
            while b >= lo:
                o = order[b]
                if ev_time[o] < ev_time[j] or (ev_time[o] == ev_time[j] and (
                        ev_late[o] < ev_late[j] or (ev_late[o] == ev_late[j] and ev_tie[o] < ev_tie[j]))):
                    break
                order[b + 1] = o
                b -= 1
                moves += 1
            order[b + 1] = j
        if moves > max_moves:
            return False, peak, peak_inflight, peak_versions, first_over, peak_time
        lo, hi = rows_end[d], count[d + 1]
        if hi - lo > 1:  # weight versions, in tie order: frees first (a stable split), then a stable sort by time
            split = np.empty(hi - lo, dtype=np.int64)
            at = 0
            for late in range(2):
                for a in range(lo, hi):
                    if ev_late[order[a]] == late:
                        split[at] = order[a]
                        at += 1
            order[lo:hi] = split[np.argsort(ev_time[split], kind="mergesort")]
        a, b, out = count[d], rows_end[d], count[d]  # merge the two sorted runs
        while a < rows_end[d] or b < count[d + 1]:
            if b >= count[d + 1]:
                take_a = True
            elif a >= rows_end[d]:
                take_a = False
            else:
                x, y = order[a], order[b]
                take_a = ev_time[x] < ev_time[y] or (ev_time[x] == ev_time[y] and (
                    ev_late[x] < ev_late[y] or (ev_late[x] == ev_late[y] and ev_tie[x] < ev_tie[y])))
            if take_a:
                merged[out] = order[a]
                a += 1
            else:
                merged[out] = order[b]
                b += 1
            out += 1
        # running sums in that order, as numpy's cumsum along a device's row; held = static + running bytes
        held_bytes = 0.0
        held_inflight = 0.0
        held_versions = 0.0
        top_held = static[d]
        if static[d] > capacity:
            first_over[d] = 0.0
        for a in range(count[d], count[d + 1]):
            j = merged[a]
            held_bytes += ev_bytes[j]
            held_inflight += ev_inflight[j]
            held_versions += ev_versions[j]
            level = static[d] + held_bytes
            if level > top_held:
                top_held = level
                peak_time[d] = ev_time[j]
            if level > capacity and np.isnan(first_over[d]):
                first_over[d] = ev_time[j]
            if held_inflight > peak_inflight[d]:
                peak_inflight[d] = held_inflight
            if held_versions > peak_versions[d]:
                peak_versions[d] = held_versions
        peak[d] = top_held
    return True, peak, peak_inflight, peak_versions, first_over, peak_time
