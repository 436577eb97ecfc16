"""The fast engine: a :class:`~sim.engines.plan.Plan` of durations run by the exact list scheduler.

:func:`sim.core.listsched.list_schedule` gives every action's start and end and every transfer's; this module turns
them into an :class:`~sim.results.timeline.EngineRun`, the same timeline as the simpy engine
(:mod:`sim.engines.simpy_engine`) with the same floats (``tests/test_engines.py``). A run that stalls is a deadlock,
reported with the stuck actions.
"""

from __future__ import annotations

import numpy as np

from sim.core.listsched import list_schedule
from sim.engines.plan import Plan
from sim.results.timeline import EngineRun

__all__ = ["run_fast"]


def run_fast(plan: Plan) -> EngineRun:
    """The timeline of *plan*; a schedule that stalls raises :class:`~sim.core.ir.ScheduleError` naming the stuck actions."""
    flat, link = plan.flat, plan.link
    start, end, sent_start, sent_end, position = list_schedule(flat, plan.occupy, link, plan.send_seconds,
                                                               plan.links, bool(plan.hardware.overlap),
                                                               plan.paired)
    if (np.asarray(position) < flat.device_start[1:]).any():  # a stall is a deadlock
        raise plan.schedule.deadlock_error(position)
    start = np.asarray(start)
    if plan.has_overhead:  # the device was held from `start` on; the computation began after the dispatch overhead
        start = start + plan.overhead
    return EngineRun(plan.schedule, flat.keys, flat.device, flat.device_start, start, np.asarray(end),
                     np.asarray(link), np.asarray(sent_start), np.asarray(sent_end), flat.send_to, plan.send_bytes)
