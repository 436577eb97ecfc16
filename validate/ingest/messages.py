"""The communication a trace shows, message by message, as inputs of the runtime model.

A gloo trace of PyTorch's runtime (CPU, 2 cores shared with other work) spends most of a 1-ms-action step in
communication calls that last milliseconds although the data is tiny: a ``c10d::send`` that returns 3 ms after
its peer already had the data, a ``c10d::recv_`` that returns 7.5 ms after its sender's write completed. What
the calls do (gloo ``gloo/transport/tcp/pair.cc``, ``Pair::send`` / ``Pair::recv``; torch
``ProcessGroupGloo::send`` / ``recv``): the calling thread takes the pair's lock, registers the operation and
writes the data (when the receiver's ready notice is already in) or its own notice, all at the top of the call;
the ``gloo:send`` / ``gloo:recv`` work range opens only when the call returns. The gloo device thread moves the
rest (``Pair::handleEvents`` under the same lock: the ready notices, the data, the completion). Nothing in the
call depends on the schedule after its first microseconds: its length is the calling thread waiting for the
pair's lock or for a core (a preempted device thread holds the lock), which only the trace can tell. So each
message gives three measured quantities (seconds, on the step's aligned clock):

- its **send call** (``c10d::send``: the sender's device is held for it; the send is posted as it begins);
- its **receive call** (``c10d::recv_``: likewise on the receiver);
- its **link time**: from the later of the two posts to the receive completing (the ``wait()`` returning,
  ``ProcessGroupGloo``'s ``RecvWork``), when the receiver was blocked waiting for it (otherwise the arrival is
  only bounded by that completion, and the model's link time is kept where smaller).

:func:`message_inputs` turns them into the engines' per-operation call times (``item_seconds`` of
:func:`sim.engines.rendezvous.run_program`) and per-transfer link times; :func:`predict_with_messages` runs the
runtime's lowered program with them: the trace's communication, measured, in the runtime model; compute and
dispatch stay the calibration's per-(stage, kind) figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.core.comm_lowering import lower
from sim.engines.plan import make_plan
from sim.engines.rendezvous import ProgramRun, run_program
from sim.model.runtimes import get_runtime
from sim.results.result import Result, make_result

__all__ = ["MessageTimes", "MessageModel", "message_model", "message_inputs", "predict_with_messages",
           "run_runtime_model"]

_BLOCKED_SLACK = 20e-6
"""A receive whose wait returned more than this after the wait began was blocked on its arrival (20 us: above the
profiler's ~1 us resolution and a wakeup, below any transfer the traces show)."""


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
        """The later of the two posts: when a rendezvous transfer can start."""
        return max(self.send_call[0], self.recv_call[0])

    @property
    def blocked(self) -> bool:
        """The receiver was waiting when it arrived, so its completion is its arrival."""
        return self.wait_start is not None and self.complete > self.wait_start + _BLOCKED_SLACK

    @property
    def sender_seconds(self) -> float | None:
        """From the later post to the sender's completion (None: unknown)."""
        return None if self.send_done is None else max(0.0, self.send_done - self.posted)

    @property
    def link_seconds(self) -> float:
        """From the later post to the completion (an upper bound of the link time when not :attr:`blocked`)."""
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
    """key -> seconds from the later post to the sender's completion."""
    typical_send: float
    """The median send call: for a message the chosen step did not pair."""
    typical_recv: float
    steps: int
    """Profiled steps the figures come from."""

    def to_dict(self) -> dict:
        calls = list(self.send_call.values()) + list(self.recv_call.values())
        return {"steps": self.steps, "messages": len(self.send_call), "links_measured": len(self.link),
                "call_median_s": float(np.median(calls)) if calls else 0.0,
                "call_max_s": max(calls, default=0.0),
                "link_median_s": float(np.median(list(self.link.values()))) if self.link else 0.0}


def message_model(per_step: Mapping[int, Mapping[int, MessageTimes]], steps: Sequence[int]) -> MessageModel:
    """The :class:`MessageModel` of *steps* (keys of *per_step*: step -> {key: times}): per message the median over
    those steps (one step: that step's own figures, a replay of its communication)."""
    sends: dict[int, list[float]] = {}
    recvs: dict[int, list[float]] = {}
    links: dict[int, list[float]] = {}
    bounds: dict[int, list[float]] = {}
    senders: dict[int, list[float]] = {}
    for s in steps:
        for key, m in per_step.get(s, {}).items():
            sends.setdefault(key, []).append(m.send_call[1] - m.send_call[0])
            recvs.setdefault(key, []).append(m.recv_call[1] - m.recv_call[0])
            (links if m.blocked else bounds).setdefault(key, []).append(m.link_seconds)
            if m.sender_seconds is not None:
                senders.setdefault(key, []).append(m.sender_seconds)
    med = lambda d: {k: float(np.median(v)) for k, v in d.items()}  # noqa: E731
    all_sends = [x for v in sends.values() for x in v]
    all_recvs = [x for v in recvs.values() for x in v]
    return MessageModel(send_call=med(sends), recv_call=med(recvs), link=med(links),
                        bound={k: v for k, v in med(bounds).items() if k not in links}, sender=med(senders),
                        typical_send=float(np.median(all_sends)) if all_sends else 0.0,
                        typical_recv=float(np.median(all_recvs)) if all_recvs else 0.0, steps=len(steps))


def message_inputs(program, plan, model: MessageModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item_seconds aligned with ``program.batch_item``, per-transfer link seconds and sender seconds aligned with
    the plan's flat order) for :func:`sim.engines.rendezvous.run_program`: the measured calls, link and sender
    times; a transfer without a measured link time keeps the plan's (capped by its measured bound), one without a
    measured sender time completes for its sender when it arrives."""
    keys = plan.flat.keys.tolist()
    items = np.empty(len(program.batch_item))
    for j, item in enumerate(program.batch_item.tolist()):
        key = keys[item if item >= 0 else ~item]
        items[j] = (model.send_call.get(key, model.typical_send) if item >= 0
                    else model.recv_call.get(key, model.typical_recv))
    seconds = np.array(plan.send_seconds, dtype=float)
    for p in np.flatnonzero(plan.flat.send_to >= 0).tolist():
        key = keys[p]
        if key in model.link:
            seconds[p] = model.link[key]
        elif key in model.bound:
            seconds[p] = min(seconds[p], model.bound[key])
    sender = seconds.copy()
    for p in np.flatnonzero(plan.flat.send_to >= 0).tolist():
        sender[p] = model.sender.get(keys[p], sender[p])
    return items, seconds, sender


def predict_with_messages(schedule, costs, hardware, runtime: str, model: MessageModel, *,
                          microbatch_size: float = 1.0) -> tuple[Result, ProgramRun]:
    """*schedule* as *runtime* runs it (its lowering, its link semantics), compute and dispatch from *costs*,
    every message's calls and link time from *model* (:func:`run_runtime_model`)."""
    return run_runtime_model(schedule, costs, hardware, runtime, messages=model, microbatch_size=microbatch_size)


def run_runtime_model(schedule, costs, hardware, runtime: str, *, post_overhead: float = 0.0,
                      messages: MessageModel | None = None, durations=None,
                      microbatch_size: float = 1.0) -> tuple[Result, ProgramRun]:
    """*schedule* lowered for *runtime* and run by the list scheduler (:func:`sim.engines.rendezvous.run_program`):
    each post holding its device *post_overhead* seconds, or, with *messages*, every operation's measured call,
    link and sender time; *durations*: float[n] per action in the schedule's flat order, instead of the costs'
    (None: the costs'). Returns the Result and the run (its program and wait spans)."""
    profile = get_runtime(runtime)
    plan = make_plan(schedule, costs, hardware)
    program = lower(schedule, profile.lowering(schedule), blocking_sends=not plan.hardware.overlap)
    kw = {}
    if durations is not None:
        plan = replace(plan, durations=np.asarray(durations, dtype=float), _views={})
    if messages is not None:
        items, seconds, sender = message_inputs(program, plan, messages)
        plan = replace(plan, send_seconds=seconds, _views={})
        kw = {"item_seconds": items, "sender_seconds": sender}
    ran = run_program(plan, program, eager=profile.eager, post_seconds=0.0 if messages is not None else post_overhead,
                      **kw)
    result = make_result(schedule, costs, hardware, ran.run, microbatch_size=microbatch_size)
    what = (f"every message's calls and link time as the trace measured them ({messages.steps} step(s))"
            if messages is not None else f"posts of {post_overhead * 1e6:.0f} us")
    result.notes.append(f"runtime {profile.name} ({profile.links} links, lowering {program.lowering}), {what}")
    return result, ran
