"""The exact list scheduler: each device walks its actions as far as its inputs allow.

Why it is exact: a device runs its actions in order, an action starts when its
device is free and every input has arrived, and a directed link serves transfers
first come, first served. All transfers on link (a, b) are requested by device
a's actions, which finish in device order, so the link's queue order is device
a's action order. Walking each device's list as far as its inputs allow, and
resuming it when a missing input is produced, therefore reproduces the event
order of :mod:`sim.engines.simpy_engine` with the same float arithmetic. ``tests/test_engines.py``
checks that the two timelines are identical.

The walk is one function, :func:`_list_schedule`, over the flat arrays of
:attr:`sim.core.compiled.Compiled.flat` (times in seconds). Large schedules run it compiled by
numba (see :func:`sim.jit.compile_min_actions`); small ones run it interpreted; wide ones in a process
that has not paid numba's start-up run :mod:`sim.core.wavefront`, the same times computed wave by
wave with numpy (see :data:`WAVEFRONT_MAX_CHAIN`). All give the same floats. A run that stalls is a
deadlock: :meth:`sim.core.ir.Schedule.validate` (through :func:`sim.core.compiled.find_stall`) and the
fast engine (:mod:`sim.engines.fastpath`) both find deadlocks this way. It lives in the core, beside the
schedule's compiled arrays, because both the check of a schedule and every engine run it.
"""

from __future__ import annotations

import time

import numpy as np

from sim import jit
from sim.core.wavefront import wavefront_schedule

__all__ = ["list_schedule", "WAVEFRONT_MAX_CHAIN", "NUMBA_STARTUP_SECONDS"]

WAVEFRONT_MAX_CHAIN = 4_096
"""In a process that has not loaded numba yet, schedules whose critical path is at most about this many actions
(estimated as the longest device list plus 4K: a micro-batch's way down and back up a V of 2K stages) are
computed by :mod:`sim.core.wavefront` (numpy, about 2 x this many waves of ~50 us), which is faster than numba's
start-up: a one-off ``pipesim simulate -s 1f1b -K 64 -M 1024`` never loads numba. Once the waves have cost
:data:`NUMBA_STARTUP_SECONDS` in this process (a sweep, a notebook), or numba is loaded anyway (a longer
schedule), the compiled kernel is used: like renting skis until renting has cost the price of buying them,
never more than twice the better choice made in hindsight. All give the same floats (``tests/test_fastpath.py``)."""

NUMBA_STARTUP_SECONDS = 1.0
"""About what importing numba and loading the cached kernel costs (measured: 0.6-1.2 s on the 2-core machine)."""

_wavefront_seconds = 0.0  # spent in sim.core.wavefront by this process so far


def list_schedule(flat, durations, link, seconds, links: int, overlap: bool, paired=None):
    """Run :func:`_list_schedule` on *flat*: compiled for large schedules, interpreted over lists for small ones.

    *paired*: bool per action, True for the forward of an overlapped pair (:attr:`sim.core.ir.Schedule.fused`);
    None: no pairs. Returns start and end per action, transfer start and end per action, and how far each device
    got.
    """
    if paired is None:
        paired = np.zeros(len(flat.keys), dtype=np.bool_)
    args = (flat.device_start, flat.dep_start, flat.dep_slot, durations, link, seconds, links, overlap, paired)
    global _wavefront_seconds
    n = len(flat.keys)
    threshold = jit.compile_min_actions()
    if n >= threshold and not jit.loaded() and _wavefront_seconds < NUMBA_STARTUP_SECONDS \
            and int(np.diff(flat.device_start).max(initial=0)) + 4 * (len(flat.device_start) - 1) <= WAVEFRONT_MAX_CHAIN:
        t0 = time.perf_counter()  # wide enough: numpy waves beat loading numba, until they have cost as much
        out = wavefront_schedule(*args)
        _wavefront_seconds += time.perf_counter() - t0
        return out
    kernel = _compiled_kernel() if n >= threshold else None
    if kernel is None:  # small schedule, or numba missing: interpret the same code over lists (faster than arrays)
        kernel = _list_schedule
        args = tuple(a.tolist() if isinstance(a, np.ndarray) else a for a in args)
    return kernel(*args)


def _compiled_kernel():
    """:func:`_list_schedule` compiled by numba, or None without numba (imported on first use: ``import sim`` stays
    light)."""
    return jit.compiled(_list_schedule)


def _list_schedule(device_start, dep_start, dep_slot, duration, link, seconds, links, overlap, paired):
    """Walk each device as far as its inputs allow; park a blocked device on the missing input.

    *paired[i]*: action i is the forward of an overlapped pair, whose backward (i + 1) ends with it: with
    blocking sends the device is held for the forward's send only after that backward (and its own send),
    as a runtime sends a pair's results once the pair is done (PyTorch's ``_add_send_recv`` puts the sends of
    an ``OVERLAP_F_B`` after it), not between the two halves.

    Durations and transfer seconds are >= 0 (every cost is: :mod:`sim.model.cost`), so every time is, and -1
    marks a slot whose time is not known yet.

    Slots (see :class:`sim.core.compiled.FlatSchedule`): i is action i's end, n + i the arrival of its result.
    Returns start and end per action, transfer start and end per action (where it sends),
    and how far each device got.
    """
    n = len(duration)
    K = len(device_start) - 1
    ready = np.full(2 * n, -1.0)  # -1: not done yet (every time is >= 0: costs and transfer times are)
    head = np.full(2 * n, -1, dtype=np.int64)  # slot -> first device waiting for it
    next_waiting = np.full(K, -1, dtype=np.int64)  # device -> next device waiting for the same slot
    start_out = np.zeros(n)
    end_out = np.zeros(n)
    sent_start = np.zeros(n)
    sent_end = np.zeros(n)
    link_free = np.zeros(links)
    device_free = np.zeros(K)
    position = device_start[:K].copy()
    held = np.full(K, -1.0)  # device -> end of a pair's forward send that holds it once the pair's backward is done
    todo = np.arange(K)[::-1].copy()  # a stack of devices to walk
    count = K
    while count > 0:
        count -= 1
        d = todo[count]
        i = position[d]
        last = device_start[d + 1]
        t_free = device_free[d]
        while i < last:
            start = t_free
            blocked = -1
            for j in range(dep_start[i], dep_start[i + 1]):
                p = dep_slot[j]
                at = ready[p]
                if at < 0.0:
                    blocked = p
                    break
                if at > start:
                    start = at
            if blocked >= 0:
                next_waiting[d] = head[blocked]
                head[blocked] = d
                break
            end = start + duration[i]
            start_out[i] = start
            end_out[i] = end
            ready[i] = end
            t_free = end
            w = head[i]  # blocked devices retry; one still missing an input parks again
            head[i] = -1
            while w >= 0:
                todo[count] = w
                count += 1
                w = next_waiting[w]
            lk = link[i]
            if lk >= 0:
                t0 = link_free[lk]
                if end > t0:
                    t0 = end
                t1 = t0 + seconds[i]
                link_free[lk] = t1
                sent_start[i] = t0
                sent_end[i] = t1
                ready[n + i] = t1
                if not overlap:
                    if paired[i]:
                        held[d] = t1  # after the pair's backward
                    else:
                        t_free = t1  # a blocking send keeps the sender busy until the data has left
                w = head[n + i]
                head[n + i] = -1
                while w >= 0:
                    todo[count] = w
                    count += 1
                    w = next_waiting[w]
            if not paired[i] and held[d] >= 0.0:
                if held[d] > t_free:
                    t_free = held[d]
                held[d] = -1.0
            i += 1
        position[d] = i
        device_free[d] = t_free
    return start_out, end_out, sent_start, sent_end, position
