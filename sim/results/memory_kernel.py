"""Memory peaks in one compiled pass: the numbers of :func:`sim.results.memory.memory_profile`, without its numpy calls.

:func:`sim.results.memory.memory_profile` builds every allocation and free as an event, sorts them by
(device, time, frees first) with a stable sort, and takes running sums. On a schedule of a few
thousand actions its ~100 numpy calls cost about half a millisecond, most of a whole simulation.
:func:`memory_peaks` computes the same events, the same order and the same sums in one loop
kernel (compiled by numba, :mod:`sim.jit`), so the peaks are the same floats.

Why it needs no general sort: it keeps numpy's order exactly, breaking ties by the position an
event has in numpy's concatenation (forwards, recomputes, frees, weight versions), but it places
each device's events in the order of its actions. The fast engine lists a device's actions in
the order they ran, one after another (:class:`sim.results.timeline.EngineRun`), so those events are in
time order already, except for ties at an instant (a zero-length action): an insertion sort
finishes them in linear time. The weight-version events (two per update) are sorted on their
own (a stable merge sort) and merged in. Actions in any other order would make the insertion
sort quadratic, so it gives up after a budget of moves and the caller falls back to numpy.
"""

from __future__ import annotations

import numpy as np

from sim.core.ir import NUM_KINDS, OP_B, OP_F, OP_R, OP_U, OP_W

__all__ = ["memory_peaks"]


def memory_peaks(keys, device_start, start, end, S, act, ckpt, drop, weight_bytes, placement, static, capacity,
                 max_moves):
    """Peaks of a fast-engine run (:class:`sim.results.timeline.EngineRun`): every action's key, start and end, device
    by device (*device_start*), each device's actions in run order.

    Per-stage *act*, *ckpt*, *drop* (what a split B frees at its end, its W the rest: the zero-bubble paper's
    M_B - M_W; zeros for pipesim's default model), *weight_bytes*; *placement* (stage -> device); *static* bytes
    per device;
    *capacity* (inf for none). Returns (ok, peak bytes, peak in-flight, peak extra weight versions, first time
    over capacity (nan: never), time of the peak), per device; ok is False when sorting needed more than
    *max_moves* moves (then nothing else is meaningful).
    """
    n = len(keys)
    K = len(static)
    peak = static.copy()
    peak_inflight = np.zeros(K)
    peak_versions = np.zeros(K)
    first_over = np.full(K, np.nan)
    peak_time = np.zeros(K)
    top = keys.max() // NUM_KINDS // S if n else 0
    # pass 1: the codec's parts (one division each), which (stage, mb) pairs are split (W) or recomputed (R),
    # and how many events of each group there are, per device
    kind = np.empty(n, dtype=np.int64)
    pair = np.empty(n, dtype=np.int64)  # mb * S + stage
    stage_of = np.empty((top + 1) * S, dtype=np.int64)  # mb * S + stage -> stage: a load, not a division
    for mb in range(top + 1):
        for s in range(S):
            stage_of[mb * S + s] = s
    has_w = np.zeros((top + 1) * S, dtype=np.bool_)
    has_r = np.zeros((top + 1) * S, dtype=np.bool_)
    n_f = n_r = n_b = n_u = n_p = 0  # n_p: partial frees (a split B with drop > 0)
    u_pos = np.empty(n, dtype=np.int64)  # where the updates are, in action order
    u_start = np.zeros(S + 1, dtype=np.int64)  # then: stage s's versions are created[u_start[s]:u_start[s+1]]
    events_of = np.zeros(K + 1, dtype=np.int64)  # per device: its events (rows, then two per update it holds)
    rows_of = np.zeros(K, dtype=np.int64)  # per device: how many of its events come from its actions
    for d in range(K):
        for i in range(device_start[d], device_start[d + 1]):
            p = keys[i] // NUM_KINDS
            k = keys[i] - p * NUM_KINDS
            kind[i] = k
            pair[i] = p
            if k == OP_F:
                n_f += 1
            elif k == OP_B:  # every B frees once: itself, or its W (the structure check pairs each W with a B)
                n_b += 1
            elif k == OP_W:
                has_w[p] = True
                if drop[stage_of[p]] > 0:  # its B (on this device, before it) frees a part: one more event
                    n_p += 1
                    events_of[d + 1] += 1
                    rows_of[d] += 1
            elif k == OP_R:
                has_r[p] = True
                n_r += 1
            else:
                u_pos[n_u] = i
                u_start[stage_of[p] + 1] += 1
                n_u += 1
            # F and R allocate, each B frees once (itself, or its W on the same device), U makes and retires a version
            if k == OP_U:
                events_of[d + 1] += 2
            elif k != OP_W:
                events_of[d + 1] += 1
                rows_of[d] += 1
    for d in range(K):
        events_of[d + 1] += events_of[d]
    n_events = events_of[K]
    ev_time = np.empty(n_events)
    ev_bytes = np.empty(n_events)
    ev_inflight = np.zeros(n_events)
    ev_versions = np.zeros(n_events)
    ev_late = np.ones(n_events, dtype=np.int64)  # frees (0) before allocations (1) at one instant, as numpy
    ev_tie = np.empty(n_events, dtype=np.int64)  # position in numpy's concatenation: breaks ties as its stable sort
    order = np.empty(n_events, dtype=np.int64)

    # weight versions (sim.results.memory.weight_version_events): version v+1 of stage s is created at the end of its
    # v-th update (in time order) and retired when superseded and no forward that read it awaits its backward
    for s in range(S):
        u_start[s + 1] += u_start[s]
    created = np.empty(n_u)
    fill = u_start[:S].copy()
    for j in range(n_u):
        i = u_pos[j]
        s = stage_of[pair[i]]
        created[fill[s]] = end[i]
        fill[s] += 1
    for s in range(S):
        created[u_start[s]:u_start[s + 1]] = np.sort(created[u_start[s]:u_start[s + 1]])
    release = created.copy()  # version v is retired no earlier than v+1's creation, nor before its last reader's
    read = np.full((top + 1) * S if n_u else 0, -1, dtype=np.int64)  # (mb, stage) -> the version its F read

    # pass 2: each device's events from its actions, in run order: forwards, recomputes, frees, partial frees; on
    # the way, the version each forward read, and the end of its backward (a forward runs before its backward on
    # its device)
    at_f, at_r, at_free, at_part = 0, n_f, n_f + n_r, n_f + n_r + n_b
    e = 0
    for d in range(K):
        e = events_of[d]
        limit = e + rows_of[d]
        for i in range(device_start[d], device_start[d + 1]):
            k = kind[i]
            p = pair[i]
            s = stage_of[p]
            partial = k == OP_B and has_w[p] and drop[s] > 0
            if e >= limit and (k == OP_F or k == OP_R or k == OP_W or (k == OP_B and not has_w[p]) or partial):
                return False, peak, peak_inflight, peak_versions, first_over, peak_time  # a W without its B
            if k == OP_F:
                ev_time[e] = start[i]
                ev_bytes[e] = ckpt[s] if has_r[p] else act[s]
                ev_inflight[e] = 1.0
                ev_tie[e] = at_f
                at_f += 1
                if n_u:  # the version it read: how many updates ended by its start (searchsorted, right)
                    v = u_start[s]
                    top_v = u_start[s + 1]
                    while v < top_v:  # by hand: a slice and a call per forward cost more than the whole loop
                        mid = (v + top_v) // 2
                        if created[mid] <= start[i]:
                            v = mid + 1
                        else:
                            top_v = mid
                    read[p] = v
            elif k == OP_R:
                ev_time[e] = start[i]
                ev_bytes[e] = act[s]
                ev_tie[e] = at_r
                at_r += 1
            elif partial:
                ev_time[e] = end[i]
                ev_bytes[e] = -drop[s]
                ev_late[e] = 0
                ev_tie[e] = at_part
                at_part += 1
            elif k == OP_W or (k == OP_B and not has_w[p]):
                freed = act[s] - drop[s] if k == OP_W else act[s]  # W frees what its B left (all by default)
                ev_time[e] = end[i]
                ev_bytes[e] = -(ckpt[s] + freed) if has_r[p] else -freed
                ev_inflight[e] = -1.0
                ev_late[e] = 0
                ev_tie[e] = at_free
                at_free += 1
                if n_u:  # the newest version (v = the stage's end) is never retired
                    v = read[p]
                    if 0 <= v < u_start[s + 1] and end[i] > release[v]:
                        release[v] = end[i]
            else:
                continue
            order[e] = e
            e += 1
        if e != limit:
            return False, peak, peak_inflight, peak_versions, first_over, peak_time

    if n_u:
        next_at = np.empty(K, dtype=np.int64)  # per device: where its next version event goes
        for d in range(K):
            next_at[d] = events_of[d] + rows_of[d]
        tie = n_f + n_r + n_b + n_p
        for s in range(S):  # numpy's order: per stage, its creations, then its retirements
            d = placement[s]
            for half in range(2):
                for v in range(u_start[s], u_start[s + 1]):
                    e = next_at[d]
                    next_at[d] += 1
                    ev_time[e] = created[v] if half == 0 else release[v]
                    ev_bytes[e] = weight_bytes[s] if half == 0 else -1.0 * weight_bytes[s]
                    ev_versions[e] = 1.0 if half == 0 else -1.0
                    ev_late[e] = 1 if half == 0 else 0
                    ev_tie[e] = tie
                    order[e] = e
                    tie += 1

    moves = 0
    for d in range(K):
        lo, mid, hi = events_of[d], events_of[d] + rows_of[d], events_of[d + 1]
        for seg in range(2):  # the action events; then a few weight versions (a flush schedule's) alike
            first, stop = (lo, mid) if seg == 0 else (mid, hi)
            if seg == 1 and hi - mid > 32:
                break
            for a in range(first + 1, stop):  # insertion sort by (time, late, tie): linear on nearly sorted input
                j = order[a]
                b = a - 1
                while b >= first:
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
        if hi - mid > 32:  # many (PipeDream's), in tie order: frees first (a stable split), then a stable sort by time
            split = np.empty(hi - mid, dtype=np.int64)
            at = 0
            for late in range(2):
                for a in range(mid, hi):
                    if ev_late[order[a]] == late:
                        split[at] = order[a]
                        at += 1
            order[mid:hi] = split[np.argsort(ev_time[split], kind="mergesort")]
        # running sums over the two sorted runs merged, as numpy's cumsum along a device's row; held = static +
        # running bytes
        held_bytes = 0.0
        held_inflight = 0.0
        held_versions = 0.0
        top_held = static[d]
        if static[d] > capacity:
            first_over[d] = 0.0
        a, b = lo, mid
        while a < mid or b < hi:
            if b >= hi:
                take_a = True
            elif a >= mid:
                take_a = False
            else:
                x, y = order[a], order[b]
                take_a = ev_time[x] < ev_time[y] or (ev_time[x] == ev_time[y] and (
                    ev_late[x] < ev_late[y] or (ev_late[x] == ev_late[y] and ev_tie[x] < ev_tie[y])))
            if take_a:
                j = order[a]
                a += 1
            else:
                j = order[b]
                b += 1
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
