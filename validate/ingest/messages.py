"""The communication a trace shows, message by message, as inputs of the runtime model.

A gloo trace of PyTorch's runtime (CPU, 2 cores shared with other work) spends most of a 1-ms-action step in
communication calls that last milliseconds although the data is tiny: a ``c10d::send`` that returns 3 ms after
its peer already had the data, a ``c10d::recv_`` that returns 7.5 ms after its sender's write completed. What
the calls do (gloo ``gloo/transport/tcp/pair.cc``, ``Pair::send`` / ``Pair::recv``; torch
``ProcessGroupGloo::send`` / ``recv``): the calling thread takes the pair's lock, then registers the operation
and writes the data (when the receiver's ready notice is already in) or its own notice; the ``gloo:send`` /
``gloo:recv`` work range opens only when the call returns. The gloo device thread moves the rest
(``Pair::handleEvents`` under the same lock: the ready notices, the data, the completion). A call's length is
the calling thread waiting for the pair's lock (a preempted device thread holds it) or for a core, which only the
trace can tell, and the lock comes first: at 1-ms actions, of 513 messages a receiver waited for whose send call
took over 1 ms, 510 arrived after the call returned (median 0.12-0.15 ms after it for three of the five
schedules), 3 while it ran (README, "A call posts as it returns"; the 3-ms send of the 0.1-ms fixtures whose peer
already had the data is the other case, a thread preempted after it wrote). So each message gives three measured
quantities (seconds, on the step's aligned clock):

- its **send call** (``c10d::send``: the sender's device is held for it; the send is posted as it returns);
- its **receive call** (``c10d::recv_``: likewise on the receiver);
- its **link time**: from the later of the two calls' returns to the receive completing (the ``wait()`` returning,
  ``ProcessGroupGloo``'s ``RecvWork``), when the receiver was blocked waiting for it (otherwise the arrival is
  only bounded by that completion, and the model's link time is kept where smaller).

:func:`message_inputs` turns them into :func:`sim.simulate.simulate_runtime`'s per-transfer call, link and sender
times (the engines' ``item_seconds`` and ``sender_seconds``); :func:`predict_with_messages` runs the runtime's
lowered program with them: the trace's communication, measured, in the runtime model; compute and
dispatch stay the calibration's per-(stage, kind) figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sim.engines.rendezvous import ProgramRun
from sim.results.result import Result
from sim.simulate import simulate_runtime

__all__ = ["MessageTimes", "MessageModel", "message_model", "message_inputs", "predict_with_messages",
           "pending_spans", "BLOCKED_SLACK", "wait_return_seconds", "queue_free_links"]

BLOCKED_SLACK = 20e-6
"""A receive whose wait returned more than this after the wait began was blocked on its arrival (20 us: above the
profiler's ~1 us resolution and a wakeup, below any transfer the traces show at 1-ms actions)."""

LATE_WAIT = 10e-3
"""A wait that begins this long after its message's later post finds the message there: no transfer or stall the
gloo traces show takes longer (the stalls end at the scheduler's next 4-ms tick, README)."""


def wait_return_seconds(per_step: Mapping[int, Mapping[int, MessageTimes]], *, least: int = 10) -> float:
    """How long the runtime's wait takes to return for a message already there, from a trace's own messages (step
    -> {key: times}): the p90 of completion - wait start over the waits that began :data:`LATE_WAIT` or more after
    their message's later post, never below :data:`BLOCKED_SLACK`; :data:`BLOCKED_SLACK` where fewer than *least*
    such waits were seen (at 1-ms actions there are none).

    Why: at probe size (width 2048, 1-MB messages, gloo, 26 Nov 2026) such waits return 17-114 us after they begin
    (p10-p90; p99 290 us), the receiving device thread copying the data, so the fixed 20-us slack took most of the
    messages found complete for blocked ones, and their link time for the whole stretch from the later post to the
    wait (35-107 ms). Replayed with those links, the steps of an interleaved-1f1b launch had errors of -2.2..-11.9%;
    with this trace's 114 us, within 0.2% (``validate/ingest/step_replay.py``)."""
    late = [m.complete - m.wait_start for msgs in per_step.values() for m in msgs.values()
            if m.wait_start is not None and m.wait_start - m.posted >= LATE_WAIT]
    if len(late) < least:
        return BLOCKED_SLACK
    return max(BLOCKED_SLACK, float(np.percentile(late, 90)))


@dataclass(frozen=True, slots=True)
class MessageTimes:
    """One message of one profiled step (seconds on the step's aligned clock)."""

    send_call: tuple[float, float]
    """(start, end) of the sender's ``c10d::send`` call."""
    recv_call: tuple[float, float]
    """(start, end) of the receiver's ``c10d::recv_`` call."""
    complete: float
    """When the receiver's wait for it returned."""
    wait_start: float | None
    """When the receiver began waiting for it (None: unknown)."""
    send_done: float | None = None
    """When the sender's work for it completed (None: unknown)."""

    @property
    def posted(self) -> float:
        """The later of the two calls' returns: when a rendezvous transfer can start (each operation exists once
        its call has taken the pair's lock, see the module's docstring)."""
        return max(self.send_call[1], self.recv_call[1])

    @property
    def blocked(self) -> bool:
        """The receiver was waiting when it arrived, so its completion is its arrival."""
        return self.waited(BLOCKED_SLACK)

    def waited(self, slack: float) -> bool:
        """:attr:`blocked` with a wait that returns *slack* seconds after it begins for a message already there
        (:func:`wait_return_seconds`)."""
        return self.wait_start is not None and self.complete > self.wait_start + slack

    @property
    def sender_seconds(self) -> float | None:
        """From the later call's return to the sender's completion (None: unknown)."""
        return None if self.send_done is None else max(0.0, self.send_done - self.posted)

    @property
    def link_seconds(self) -> float:
        """From the later call's return to the completion (an upper bound of the link time when not
        :attr:`blocked`)."""
        return max(0.0, self.complete - self.posted)


@dataclass(frozen=True, slots=True)
class MessageModel:
    """Per transfer (the schedule key of the action whose result it carries): the calls and link time to model."""

    send_call: dict
    """key -> seconds the send call holds the sender."""
    recv_call: dict
    """key -> seconds the receive call holds the receiver."""
    link: dict
    """key -> seconds the transfer holds its link (only where measured: the receiver was blocked on it)."""
    bound: dict
    """key -> an upper bound of the link seconds (receiver not blocked)."""
    sender: dict
    """key -> seconds from the later call's return to the sender's completion."""
    typical_send: float
    """The median send call: for a message the chosen step did not pair."""
    typical_recv: float
    steps: int
    """Profiled steps the figures come from."""
    send_overhead: float = 0.0
    """Seconds of the runtime's own time every send call carries beyond the call itself (building and posting the
    operation: :mod:`validate.ingest.call_overhead`), added to each send call's duration."""
    recv_overhead: float = 0.0
    """Likewise for every receive call."""

    def to_dict(self) -> dict:
        calls = list(self.send_call.values()) + list(self.recv_call.values())
        return {"steps": self.steps, "messages": len(self.send_call), "links_measured": len(self.link),
                "call_median_s": float(np.median(calls)) if calls else 0.0,
                "call_max_s": max(calls, default=0.0),
                "link_median_s": float(np.median(list(self.link.values()))) if self.link else 0.0}


def message_model(per_step: Mapping[int, Mapping[int, MessageTimes]], steps: Sequence[int],
                  overhead=None, slack: float | None = None, schedule=None) -> MessageModel:
    """The :class:`MessageModel` of *steps* (keys of *per_step*: step -> {key: times}): per message the median over
    those steps (one step: that step's own figures, a replay of its communication); *overhead*: the runtime's own
    time around each call (:class:`validate.ingest.call_overhead.CallOverhead`; None: none); *slack*: how long a wait
    for a message already there takes to return, which tells a measured link time from a bound (None: the trace's
    own, :func:`wait_return_seconds` over every step of *per_step*); *schedule*: the schedule that ran (it places
    each message on its directed link): with one step, each measured link time less the time its message queued
    behind the one before it on its link (:func:`queue_free_links`)."""
    slack = wait_return_seconds(per_step) if slack is None else slack
    sends: dict[int, list[float]] = {}
    recvs: dict[int, list[float]] = {}
    links: dict[int, list[float]] = {}
    bounds: dict[int, list[float]] = {}
    senders: dict[int, list[float]] = {}
    for s in steps:
        for key, m in per_step.get(s, {}).items():
            sends.setdefault(key, []).append(m.send_call[1] - m.send_call[0])
            recvs.setdefault(key, []).append(m.recv_call[1] - m.recv_call[0])
            (links if m.waited(slack) else bounds).setdefault(key, []).append(m.link_seconds)
            if m.sender_seconds is not None:
                senders.setdefault(key, []).append(m.sender_seconds)
    med = lambda d: {k: float(np.median(v)) for k, v in d.items()}  # noqa: E731
    all_sends = [x for v in sends.values() for x in v]
    all_recvs = [x for v in recvs.values() for x in v]
    link = med(links)
    if schedule is not None and len(steps) == 1:
        link = queue_free_links(schedule, per_step.get(steps[0], {}), link, slack)
    return MessageModel(send_call=med(sends), recv_call=med(recvs), link=link,
                        bound={k: v for k, v in med(bounds).items() if k not in links}, sender=med(senders),
                        typical_send=float(np.median(all_sends)) if all_sends else 0.0,
                        typical_recv=float(np.median(all_recvs)) if all_recvs else 0.0, steps=len(steps),
                        send_overhead=overhead.send if overhead is not None else 0.0,
                        recv_overhead=overhead.recv if overhead is not None else 0.0)


def queue_free_links(schedule, messages: Mapping[int, MessageTimes], link: Mapping[int, float],
                     slack: float) -> dict[int, float]:
    """*link* (key -> measured link seconds of one step's *messages*, from the later call's return to the completion)
    less the time each message queued behind the one its sender posted before it on the same directed link: from
    the later of its own later post and that message's arrival (its completion where its receiver waited for it,
    more than *slack*; else its later post, a lower bound). Seconds, never below 0; *schedule* places the messages.

    Why: the engines serve a directed link in its sender's posting order and hold it for each transfer's link time
    (:mod:`sim.engines.rendezvous`), so a measured link time that already holds the wait behind the message before
    it is counted twice in a replay. On gloo two consecutive messages of a pair stall together (the 1-ms traces'
    stalls end at the scheduler's tick): one interleaved-1f1b step (26 Nov 2026) had 0F2 completing 2.6 ms and 2B0
    4.1 ms after their later posts, 1.0 ms apart; replayed back to back they ended 6.7 ms after the first post
    and the step's error was -17.3% (measured / replayed - 1); queue-free, +0.7%. Every step of three 1-ms
    launches then replays within -0.8..+4.9% (-17.3..+3.8% before), the committed 1-ms fixture's worst step +1.6%
    (-8.0%)."""
    flat = schedule.compiled.flat
    ends = dict(zip(flat.keys.tolist(), zip(np.asarray(flat.device).tolist(), np.asarray(flat.send_to).tolist())))
    queues: dict[tuple[int, int], list[tuple[float, int, MessageTimes]]] = {}
    for key, m in messages.items():
        queues.setdefault(ends[int(key)], []).append((m.send_call[0], int(key), m))
    out = dict(link)
    for queue in queues.values():
        before = -np.inf  # the arrival of the message posted before on this link
        for _, key, m in sorted(queue, key=lambda item: item[0]):
            if key in out:
                out[key] = max(0.0, m.complete - max(m.posted, before))
            before = max(before, m.complete if m.waited(slack) else m.posted)
    return out


def pending_spans(messages: Mapping[int, MessageTimes], program) -> dict[int, list[tuple[float, float]]]:
    """device -> (post, its sender's completion) of each send in *messages* (key -> times of one step, on its
    clock) that *program* (the runtime's lowering, :class:`sim.core.comm_lowering.CommProgram`) waits for before a
    later computation: from the send call's start to the sender's completion (the receive's completion when that is
    unknown), at least the call. The trace's side of the rule :func:`sim.engines.rendezvous.pending_spans` applies
    to a prediction (validate/compare/idle.py)."""
    schedule = program.schedule
    flat = schedule.compiled.flat
    waited = program.waited_sends()
    position = {int(k): i for i, k in enumerate(flat.keys.tolist())}
    out: dict[int, list[tuple[float, float]]] = {}
    for key, m in messages.items():
        p = position.get(int(key))
        if p is None or not waited[p]:
            continue
        done = m.complete if m.send_done is None else m.send_done
        out.setdefault(int(flat.device[p]), []).append((m.send_call[0], max(m.send_call[1], done)))
    return {d: sorted(v) for d, v in out.items()}


def message_inputs(schedule, model: MessageModel) -> dict:
    """The keyword arguments of :func:`sim.simulate.simulate_runtime` that carry *model*: per transfer (float[n] in
    the schedule's flat order) its send and receive calls (a message the model lacks: the typical call), its link
    time (NaN where not measured: the hardware's, capped by the measured bound where there is one) and its sender
    time (NaN where not measured: it completes for its sender when it arrives)."""
    keys = schedule.compiled.flat.keys.tolist()
    n = len(keys)
    send, recv = np.zeros(n), np.zeros(n)
    link, bound, sender = np.full(n, np.nan), np.full(n, np.inf), np.full(n, np.nan)
    for p in np.flatnonzero(schedule.compiled.flat.send_to >= 0).tolist():
        key = keys[p]
        send[p] = model.send_call.get(key, model.typical_send) + model.send_overhead
        recv[p] = model.recv_call.get(key, model.typical_recv) + model.recv_overhead
        link[p] = model.link.get(key, np.nan)
        bound[p] = model.bound.get(key, np.inf)
        sender[p] = model.sender.get(key, np.nan)
    return {"send_call": send, "recv_call": recv, "link_seconds": link, "link_bound": bound, "sender_seconds": sender}


def predict_with_messages(schedule, costs, hardware, runtime: str, model: MessageModel, *, durations=None,
                          microbatch_size: float = 1.0) -> tuple[Result, ProgramRun]:
    """*schedule* as *runtime* runs it (its lowering, its link semantics: :func:`sim.simulate.simulate_runtime`),
    dispatch from *costs*, every message's calls, link and sender time from *model*; *durations*: float[n] per action
    in the schedule's flat order instead of the costs' (None: the costs'). Returns the Result and the run (its
    program and wait spans)."""
    return simulate_runtime(schedule, costs, hardware, runtime=runtime, microbatch_size=microbatch_size,
                            durations=durations, **message_inputs(schedule, model),
                            note=f"every message's calls and link time as the trace measured them ({model.steps} "
                                 f"step(s))")
