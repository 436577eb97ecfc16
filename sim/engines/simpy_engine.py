"""The discrete-event engine (simpy): devices as processes, links as resources.

Each device is a simpy process that walks its action list: it waits for the
inputs of the next action (the producer's end on the same device, or the
arrival of the transfer from another device), holds itself for the action's
duration, then hands the result on. A result needed on another device travels
as a transfer process that queues for the directed link (a ``simpy.Resource``
of capacity 1, first come first served) and holds it for latency + bytes /
bandwidth.

This is the general engine: it also models run-to-run variation (``jitter``,
a lognormal factor on every computation). For the deterministic case
:mod:`sim.engines.fastpath` gives the identical timeline much faster.
"""

from __future__ import annotations

import math
import random

import simpy

from sim.engines.plan import Plan
from sim.limits import SIMPY_BYTES_PER_ACTION, check_fits
from sim.results.timeline import TimelineRows, engine_rows

__all__ = ["run_simpy"]


def run_simpy(plan: Plan, *, jitter: float = 0.0, seed: int = 0) -> TimelineRows:
    """Simulate *plan*; *jitter* is the coefficient of variation of every computation's duration."""
    schedule, hw = plan.schedule, plan.hardware
    # simpy holds an event, a generator frame and dict entries per action: its own budget, before any is made
    check_fits(len(schedule), f"the simpy engine (jitter) on {schedule.name!r}", bytes_per_action=SIMPY_BYTES_PER_ACTION)
    env = simpy.Environment()
    done: tuple[list, list, list, list] = ([], [], [], [])  # computations: device, key, start, end
    sent: tuple[list, list, list] = ([], [], [])  # transfers: producer key, start, end
    # key -> its action finished on its device; ~key -> its result reached the other device
    ready = {k: env.event() for k in plan.duration}
    ready.update({~p: env.event() for p in plan.transfer})
    links = {}
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(jitter * jitter)) if jitter > 0 else 0.0

    def noisy(duration: float) -> float:
        if sigma == 0.0:
            return duration
        return duration * rng.lognormvariate(-sigma * sigma / 2, sigma)  # mean 1, cv = jitter

    def send(producer: int):
        src, dst, seconds = plan.transfer[producer]
        link = links.get((src, dst))
        if link is None:
            link = links[(src, dst)] = simpy.Resource(env, capacity=1)
        with link.request() as req:
            yield req
            start = env.now
            yield env.timeout(seconds)
            for column, value in zip(sent, (producer, start, env.now)):
                column.append(value)
        ready[~producer].succeed()

    overhead = dict(zip(plan.flat.keys.tolist(), plan.overhead.tolist())) if plan.has_overhead else {}
    pair_forwards = set(schedule.keys_array[schedule.fused].tolist())

    def device_process(device: int):
        held = None  # a pair's forward send, which holds the device only once the pair's backward is done
        for key in plan.keys[device]:
            pending = [ready[p] for p in plan.deps[key] if not ready[p].processed]
            if pending:
                yield env.all_of(pending)
            begin = env.now
            dispatch = overhead.get(key, 0.0)  # the device is held for it, but it is not computation
            yield env.timeout(dispatch + noisy(plan.duration[key]) if dispatch else noisy(plan.duration[key]))
            for column, value in zip(done, (device, key, begin + dispatch, env.now)):
                column.append(value)
            ready[key].succeed()
            if key in plan.transfer:
                sending = env.process(send(key))
                if not hw.overlap:
                    if key in pair_forwards:
                        held = sending
                    else:
                        yield sending
            if held is not None and key not in pair_forwards:
                yield held
                held = None

    for device in range(schedule.devices):
        env.process(device_process(device))
    env.run()
    unfinished = [schedule.action_of(k) for k, ev in ready.items() if k >= 0 and not ev.triggered]
    if unfinished:  # validate() rules this out; keep the engine honest anyway
        raise AssertionError(f"simpy engine stopped with {len(unfinished)} actions not run, e.g. {unfinished[:5]}")
    return engine_rows(schedule, plan.sends, device=done[0], key=done[1], start=done[2], end=done[3],
                       sent_key=sent[0], sent_start=sent[1], sent_end=sent[2])
