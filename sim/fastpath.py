"""Exact list scheduler for the deterministic case: the same timeline as the simpy engine, faster.

Why it is exact: a device runs its actions in order, an action starts when its
device is free and every input has arrived, and a directed link serves transfers
first come, first served. All transfers on link (a, b) are requested by device
a's actions, which finish in device order, so the link's queue order is device
a's action order. Walking each device's list as far as its inputs allow, and
resuming it when a missing input is produced, therefore reproduces the event
order of :mod:`sim.engine` with the same float arithmetic. ``tests/test_engines.py``
checks that the two timelines are identical.
"""

from __future__ import annotations

from .plan import Plan
from .timeline import TimelineBuilder

__all__ = ["run_fast"]


def run_fast(plan: Plan) -> TimelineBuilder:
    schedule, overlap = plan.schedule, plan.hardware.overlap
    duration, deps, transfers = plan.duration, plan.deps, plan.transfer
    out = TimelineBuilder()
    # bound appends: this loop runs once per action and dominates large simulations
    add_device, add_key, add_start, add_end = out.device.append, out.key.append, out.start.append, out.end.append
    add_sent, add_sent_start, add_sent_end = out.sent_key.append, out.sent_start.append, out.sent_end.append
    ready: dict[int, float] = {}  # key -> its end on its device; ~key -> arrival of its result elsewhere
    device_free = [0.0] * schedule.devices
    link_free: dict[tuple[int, int], float] = {}
    position = [0] * schedule.devices
    waiting: dict[int, list[int]] = {}  # missing input -> devices blocked on it
    todo = list(range(schedule.devices))
    ready_get, transfers_get, waiting_pop = ready.get, transfers.get, waiting.pop
    while todo:
        device = todo.pop()
        keys = plan.keys[device]
        n = len(keys)
        i = position[device]
        t_free = device_free[device]
        while i < n:
            key = keys[i]
            start = t_free
            blocked = None
            for p in deps[key]:
                t = ready_get(p)
                if t is None:
                    blocked = p
                    break
                if t > start:
                    start = t
            if blocked is not None:
                waiting.setdefault(blocked, []).append(device)
                break
            end = start + duration[key]
            add_device(device), add_key(key), add_start(start), add_end(end)
            ready[key] = end
            t_free = end
            woken = waiting_pop(key, None)
            if woken:  # blocked devices retry; one still missing an input registers again
                todo.extend(woken)
            tr = transfers_get(key)
            if tr is not None:
                src, dst, seconds = tr
                t0 = link_free.get((src, dst), 0.0)
                if end > t0:
                    t0 = end
                t1 = t0 + seconds
                link_free[(src, dst)] = t1
                add_sent(key), add_sent_start(t0), add_sent_end(t1)
                ready[~key] = t1
                if not overlap:
                    t_free = t1  # a blocking send keeps the sender busy until the data has left
                arrived = waiting_pop(~key, None)
                if arrived:
                    todo.extend(arrived)
            i += 1
        position[device] = i
        device_free[device] = t_free
    stuck = [d for d in range(schedule.devices) if position[d] < len(plan.keys[d])]
    if stuck:  # validate() rules this out; keep the engine honest anyway
        raise AssertionError(f"fast path stopped with devices {stuck} unfinished")
    return out
