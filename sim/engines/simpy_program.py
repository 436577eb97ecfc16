"""The discrete-event engine (simpy) for lowered programs: the twin of :mod:`sim.engines.rendezvous`.

Each device is a simpy process that walks its program (:class:`sim.core.comm_lowering.CommProgram`): a
computation waits for its inputs (events), spends its dispatch overhead and its duration; a post starts the
transfer processes of its sends and marks its receives as posted; a wait yields until every transfer of the
batch has arrived. A transfer process queues for its directed link (a ``simpy.Resource`` of capacity 1) the
moment its send is posted, so the link serves transfers in the sender's posting order (as NCCL and gloo serve
the operations between two ranks); under rendezvous semantics it then holds the link until its receive is
posted as well, and for latency + bytes / bandwidth after that. It also models run-to-run variation
(``jitter``, a lognormal factor on every computation's duration, as :mod:`sim.engines.simpy_engine`).

Deterministic runs give the identical floats of the list scheduler (``tests/test_runtime_engines.py``).
"""

from __future__ import annotations

import math
import random

import numpy as np
import simpy

from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST, CommProgram
from sim.core.keys import ScheduleError
from sim.engines.plan import Plan
from sim.engines.rendezvous import ProgramRun, check_item_seconds, check_sender_seconds, pending_spans
from sim.results.timeline import EngineRun

__all__ = ["run_simpy_program"]


def run_simpy_program(plan: Plan, program: CommProgram, *, eager: bool, jitter: float = 0.0, seed: int = 0,
                      post_seconds: float = 0.0, item_seconds=None, sender_seconds=None) -> ProgramRun:
    """Simulate *plan* run as *program*; *jitter* is the coefficient of variation of every computation;
    *post_seconds* how long each post holds its device, *item_seconds* how long each batch item's own call holds
    it, the item posted as its call returns, *sender_seconds* per transfer when its sender's wait returns, counted
    from its start (:mod:`sim.engines.rendezvous`)."""
    flat = plan.flat
    items = check_item_seconds(program, item_seconds).tolist()
    batch_start = program.batch_start.tolist()
    sender = check_sender_seconds(plan.send_seconds, sender_seconds).tolist()
    n = len(flat.keys)
    env = simpy.Environment()
    start, end = np.zeros(n), np.zeros(n)
    sent_start, sent_end = np.zeros(n), np.zeros(n)
    send_post, recv_post = np.full(n, -1.0), np.full(n, -1.0)
    done = [env.event() for _ in range(n)]  # action i ended
    arrived = [env.event() for _ in range(n)]  # the transfer of action i's result ended
    received = [env.event() for _ in range(n)]  # its receive was posted
    acked = [env.event() for _ in range(n)]  # its sender's wait for it returns
    links: dict[int, simpy.Resource] = {}
    waits: dict[int, list[tuple[float, float]]] = {}
    dep_start, dep_slot = flat.dep_start.tolist(), flat.dep_slot.tolist()
    duration, overhead = plan.durations.tolist(), plan.overhead.tolist()
    occupy = plan.occupy.tolist()
    link, seconds = plan.link.tolist(), plan.send_seconds.tolist()
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(jitter * jitter)) if jitter > 0 else 0.0

    def slot_event(slot: int):
        return done[slot] if slot < n else arrived[slot - n]

    def transfer(p: int):
        resource = links.get(link[p])
        if resource is None:
            resource = links[link[p]] = simpy.Resource(env, capacity=1)
        with resource.request() as req:
            yield req  # queued at the send's post: the sender's posting order
            if not eager and not received[p].processed:
                yield received[p]
            sent_start[p] = env.now
            env.process(ack(p))
            yield env.timeout(seconds[p])
            sent_end[p] = env.now
        arrived[p].succeed()

    def ack(p: int):
        yield env.timeout(sender[p])
        acked[p].succeed()

    def device_process(d: int):
        for op, arg in program.steps(d):
            if op == STEP_COMPUTE:
                i = arg
                pending = [slot_event(s) for s in dep_slot[dep_start[i]:dep_start[i + 1]]
                           if not slot_event(s).processed]
                if pending:
                    yield env.all_of(pending)
                ready = env.now
                if sigma:  # the noise is on the computation, not on the dispatch overhead
                    hold = overhead[i] + duration[i] * rng.lognormvariate(-sigma * sigma / 2, sigma)
                else:
                    hold = occupy[i]
                start[i] = ready + overhead[i]
                yield env.timeout(hold)
                end[i] = env.now
                done[i].succeed()
            elif op == STEP_POST:
                began = env.now
                if post_seconds > 0.0:  # the call that posts the batch holds the device
                    yield env.timeout(post_seconds)
                for j, item in enumerate(program.batch(arg), start=batch_start[arg]):
                    if items[j] > 0.0:  # the operation's own call, posted as it returns
                        yield env.timeout(items[j])
                    if item >= 0:
                        send_post[item] = env.now
                        env.process(transfer(item))
                    else:
                        recv_post[~item] = env.now
                        received[~item].succeed()
                if env.now > began:
                    waits.setdefault(d, []).append((began, env.now))
            else:
                pending = [acked[i] if i >= 0 else arrived[~i] for i in program.batch(arg)]
                pending = [e for e in pending if not e.processed]
                if pending:
                    began = env.now
                    yield env.all_of(pending)
                    if env.now > began:
                        waits.setdefault(d, []).append((began, env.now))

    processes = [env.process(device_process(d)) for d in range(program.devices)]
    env.run()
    stuck = [d for d, proc in enumerate(processes) if not proc.triggered]
    if stuck:  # the list scheduler reports deadlocks before anything runs (sim.simulate); keep this engine honest
        raise ScheduleError(f"the simpy engine stopped with devices {stuck} blocked: the {program.lowering} "
                            f"program deadlocks")
    run = EngineRun(plan.schedule, flat.keys, flat.device, flat.device_start, start, end, np.asarray(plan.link),
                    sent_start, sent_end, flat.send_to, plan.send_bytes)
    return ProgramRun(run, {d: sorted(s) for d, s in waits.items()}, program,
                      lambda: pending_spans(program, flat, send_post, sent_start, sender), send_post, recv_post)
