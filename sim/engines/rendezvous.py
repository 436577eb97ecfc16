"""The list scheduler for lowered programs: explicit sends, receives and waits, eager or rendezvous links.

A :class:`sim.core.comm_lowering.CommProgram` says, per device, where each computation runs, where each
batch of point-to-point operations is posted, and where the device blocks on one. Times (seconds):

- a computation starts when its device is free and every input is there (the end of a producer on its
  device, or the end of the transfer carrying a remote producer's result); it spends its dispatch overhead
  (:attr:`sim.engines.plan.Plan.overhead`), then computes: ``start = ready + overhead``,
  ``end = ready + (overhead + duration)``;
- a post holds its device for the runtime's post overhead (*post_seconds*, the Python call that builds and posts
  a batch: ``torch.distributed.batch_isend_irecv`` and what leads to it), its operations are posted when it ends;
  then each operation's own call (*item_seconds*, per batch item; 0 unless given) holds the device in turn, the
  operation posted as its call returns: gloo's ``tcp::Pair::send`` / ``Pair::recv`` (gloo/transport/tcp/pair.cc)
  first take the pair's lock (which the device thread holds while it reads, and keeps while it waits for a core),
  then register the operation and write the data or the ready notice, so a call that takes milliseconds has
  spent them before its operation exists: of 513 messages a receiver waited for whose ``c10d::send`` took over
  1 ms (ten launches of the five schedules, gloo, 2-core machine, 26 Nov 2026), 510 arrived after that call
  returned and 3 while it ran (README, "A call posts as it returns"); an ingested trace measures every call
  (:mod:`validate.ingest.messages`);
  a wait ends when every transfer of its batch has ended (a receive) or its sender has learnt so (a send:
  *sender_seconds* after the transfer started, by default its own time; gloo completes a send when its device
  thread has written the data and run ``UnboundBuffer::handleSendCompletion``, which on a busy core can be
  milliseconds after, or before, the receiver has the data); posts and blocked waits are the device's communication
  calls (:attr:`ProgramRun.waits`, what :func:`validate.compare.idle.split_idle` counts as communication);
- a transfer on directed link (a, b) starts at the latest of: its send's post, the end of the previous transfer
  on that link (NCCL and gloo serve the point-to-point operations of a pair of ranks in posting order: the
  sender's send order is the link's queue order), and, under **rendezvous** semantics, its receive's post
  (gloo and NCCL move the data only once both sides have posted); under **eager** semantics the receive is
  taken as posted ahead. It holds the link for latency + bytes / bandwidth.

Why a walk gives the exact times: every time above is a maximum of earlier times plus a constant, and each
link's order is fixed by its sender's program, so the times do not depend on the order in which devices are
walked (as in :mod:`sim.engines.fastpath`, whose timeline this reproduces for the ``pipesim`` lowering under
eager semantics: ``tests/test_runtime_engines.py``). A device that cannot go on parks on the slot it needs and
is resumed when that slot is filled. A walk that ends with a device short of its last step is a deadlock:
the message names every stuck step (:func:`deadlock_message`). The simpy twin is
:func:`sim.engines.simpy_engine.run_simpy_program`; the two give identical floats.

The critical path ("who made it slow", :attr:`ProgramRun.critical_path`; Monte Carlo follows it in every sample).
The walk records, for each step and each transfer, which constraint set its start, and the path is followed back
from the item that ends last (the end that is :attr:`sim.results.timeline.EngineRun.makespan`; at a tie a
computation before a transfer, the first in device and program order) through those constraints to time 0:

- a computation starts at the latest of its device becoming free (the end of its previous step) and its inputs'
  ends; it holds the path for its dispatch overhead and its computation;
- a post starts when its device is free; it holds the path to its end where the path came from the device's next
  step, and up to the moment the operation the path came from was posted where it came from a transfer (the post
  call and the operations' calls before that one: they hold the device);
- a transfer starts at the latest of its send's post, its receive's post (rendezvous links only) and the end of
  the previous transfer on its link; it holds the path up to its arrival or, where the path came from the
  sender's wait, up to the sender's completion (*sender_seconds* after its start);
- a wait ends at the latest of its device becoming free and the completion of what it waits for; it holds
  nothing itself (its blocked time is the transfer's, counted there), the path goes on to what set its end.

Ties go to the constraint listed first: the device before an input or a transfer (as the eager kernel,
:func:`sim.engines.sampling._sample_kernel`: a device that was not idle keeps the path), a send's post before its
receive's post before the link (the eager kernel follows a transfer to its producer). Why this rule: every time
of the walk is a maximum of earlier times plus a constant (above), so following the maximising term back from the
last end gives a chain of items from time 0, each starting where the previous one ends: none of them has slack
(lengthen one and, ties aside, the makespan grows by as much), and their seconds (device seconds + link seconds)
sum to the makespan. Under rendezvous links this is where a late receive shows: a transfer set by its receive's
post sends the path to the receiver's device (whatever kept it from posting), not to the sender.

Slots: ``i`` is flat action i's end, ``n + p`` the end of the transfer carrying action p's result.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim import jit
from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST, STEP_WAIT, CommProgram
from sim.core.keys import ScheduleError
from sim.engines.plan import Plan
from sim.results.timeline import EngineRun

__all__ = ["ProgramRun", "CriticalPath", "run_program", "critical_path", "program_schedule", "deadlock_message",
           "pending_spans"]


class CriticalPath(NamedTuple):
    """Who held a run's critical path (module docstring, *The critical path*)."""

    on_path: np.ndarray
    """bool[K]: the device holds at least one computation or post of the path."""
    device_seconds: np.ndarray
    """float64[K]: seconds of the path the device held: its computations (dispatch overhead included) and its
    posts' calls up to the post the path continues from."""
    link_seconds: float
    """Seconds of the path spent in transfers (to the receiver's arrival, or to the sender's completion where
    the path leaves a send's wait)."""


class ProgramRun:
    """What a program's walk gives: the engine run (as :class:`sim.results.timeline.EngineRun`) and, per device,
    the spans (start, end) it spent in communication calls (posts, blocked waits: :attr:`waits`) and the spans in
    which one of its sends was pending (:attr:`pending`, :func:`pending_spans`)."""

    __slots__ = ("run", "waits", "program", "_pending", "send_post", "recv_post", "_critical")

    def __init__(self, run: EngineRun, waits: dict[int, list[tuple[float, float]]], program: CommProgram,
                 pending=None, send_post=None, recv_post=None, critical=None) -> None:
        self.run = run
        self.waits = waits
        self.program = program
        # a dict, or a function that makes it: the spans are computed only when asked for (the idle split),
        # not for every sample of a Monte Carlo run, which never asks
        self._pending = pending if pending is not None else {}
        self.send_post = send_post
        """float[n] by flat action: when its result's send was posted (-1: never; None: not recorded)."""
        self.recv_post = recv_post
        """float[n]: when the receive of its result was posted (-1: never)."""
        # a function that follows the path, called when asked (Monte Carlo asks once per sample); None: an engine
        # that records no bounds (the simpy twin)
        self._critical = critical

    @property
    def critical_path(self) -> CriticalPath | None:
        """The run's critical path (module docstring), or None where the engine recorded no bounds."""
        if callable(self._critical):
            self._critical = self._critical()
        return self._critical

    @property
    def pending(self) -> dict[int, list[tuple[float, float]]]:
        """device -> the spans in which one of its sends that its program waits for mid-step was pending
        (:func:`pending_spans`)."""
        if callable(self._pending):
            self._pending = self._pending()
        return self._pending

    @property
    def communication(self) -> dict[int, list[tuple[float, float]]]:
        """device -> the spans it spent in a communication call or with a send pending: what
        :func:`validate.compare.idle.split_idle` counts as communication (its module docstring gives the rule,
        the same for a trace: :func:`validate.ingest.messages.pending_spans`)."""
        return {d: sorted(self.waits.get(d, []) + self.pending.get(d, []))
                for d in sorted(set(self.waits) | set(self.pending))}


def pending_spans(program: CommProgram, flat, send_post, sent_start, sender_seconds) -> dict[int, list]:
    """device -> (post, its sender's completion ``sent_start + sender_seconds``) of each send it posted that its
    program waits for before a later computation (:meth:`sim.core.comm_lowering.CommProgram.waited_sends`). Only
    those: a receive a device waits for is an input of its next computation, which the idle split follows to its
    arrival; a receive posted ahead for a later computation, or a send waited for only at the step's end, does not
    hold the device up mid-step."""
    out: dict[int, list[tuple[float, float]]] = {}
    waited = program.waited_sends()
    for p, src in zip(np.flatnonzero(waited).tolist(), np.asarray(flat.device)[waited].tolist()):
        if send_post[p] >= 0:
            out.setdefault(src, []).append((float(send_post[p]), max(float(send_post[p]),
                                                                     float(sent_start[p] + sender_seconds[p]))))
    return {d: sorted(v) for d, v in out.items()}


def run_program(plan: Plan, program: CommProgram, *, eager: bool, post_seconds: float = 0.0,
                item_seconds=None, sender_seconds=None) -> ProgramRun:
    """The timeline of *plan* run as *program*; a stall raises :class:`ScheduleError` naming the stuck steps.
    *post_seconds*: how long each post holds its device; *item_seconds*: float[len(program.batch_item)], how long
    each operation's own call holds it (None: 0); *sender_seconds*: float[n], per transfer the time from its start
    to its sender's wait returning (None: the transfer's own time; module docstring)."""
    flat = plan.flat
    out = program_schedule(program, flat, plan.occupy, plan.overhead, plan.link, plan.send_seconds, plan.links,
                           eager, post_seconds, item_seconds, sender_seconds)
    start, end, sent_start, sent_end, wait_start, wait_end, position, send_post, recv_post = out[:9]
    step_begin, step_bound, tx_bound = out[9:]
    position = np.asarray(position)
    if (position < program.step_start[1:]).any():
        raise ScheduleError(deadlock_message(program, position, np.asarray(send_post), np.asarray(recv_post),
                                             eager=eager))
    run = EngineRun(plan.schedule, flat.keys, flat.device, flat.device_start, np.asarray(start), np.asarray(end),
                    np.asarray(plan.link), np.asarray(sent_start), np.asarray(sent_end), flat.send_to, plan.send_bytes)
    sender = check_sender_seconds(plan.send_seconds, sender_seconds)
    send_post, sent_start = np.asarray(send_post), np.asarray(sent_start)
    return ProgramRun(run, _wait_spans(program, np.asarray(wait_start), np.asarray(wait_end)), program,
                      lambda: pending_spans(program, flat, send_post, sent_start, sender),
                      np.asarray(send_post), np.asarray(recv_post),
                      lambda: critical_path(program, step_begin, step_bound, tx_bound, end, sent_start, sent_end))


def critical_path(program: CommProgram, step_begin, step_bound, tx_bound, end, sent_start, sent_end) -> CriticalPath:
    """Follow the bounds :func:`_walk` recorded back from the last end (:func:`_critical_path`; compiled where the
    walk is, by the same rule). Every argument is :func:`_walk`'s, by step or by flat action (*sent_end*: 0 where
    nothing is sent; not :attr:`EngineRun.sent_end`, which holds the sent ones only)."""
    kernel = jit.compiled(_critical_path) if len(end) >= jit.compile_min_actions() else _critical_path
    on_path, seconds, link_seconds = kernel(program.step_start, program.step_op, program.step_arg,
                                            np.asarray(step_begin), np.asarray(step_bound), np.asarray(tx_bound),
                                            np.asarray(end), np.asarray(sent_start), np.asarray(sent_end))
    return CriticalPath(on_path, seconds, float(link_seconds))


def _critical_path(step_start, step_op, step_arg, step_begin, step_bound, tx_bound, end, sent_start, sent_end):
    """(on_path bool[K], device seconds float[K], link seconds) of the path from the last end back to time 0.

    Nodes: step s (0 <= s < m) and transfer p (m + p). A node is reached at a time (its end; inside a post step,
    the moment the operation the path came from was posted; for a send's transfer left through its sender's
    wait, the sender's completion) and holds the path from its recorded start to that time; the next node is
    the one that set that start (:func:`_walk`), reached at that start. So the times telescope: the seconds sum
    to the makespan. Written as plain loops so numba can compile it."""
    K = len(step_start) - 1
    m = len(step_op)
    on_path = np.zeros(K, dtype=np.bool_)
    seconds = np.zeros(K)
    link_seconds = 0.0
    at = 0.0
    node = -1
    # the last end (EngineRun.makespan): a computation, the first in device and program order, before a transfer
    for s in range(m):
        if step_op[s] == STEP_COMPUTE and end[step_arg[s]] > at:
            at = end[step_arg[s]]
            node = s
    for p in range(len(sent_end)):
        if sent_end[p] > at:
            at = sent_end[p]
            node = m + p
    d = K - 1
    while node >= 0:
        if node < m:
            while step_start[d] > node:  # the step's device, scanned from the previous node's: the path
                d -= 1                   # mostly stays on one device, and moves to a neighbour when it leaves
            while step_start[d + 1] <= node:
                d += 1
            if step_op[node] != STEP_WAIT:  # a wait holds nothing: its blocked time is what it waited for
                on_path[d] = True
                seconds[d] += at - step_begin[node]
            at = step_begin[node]
            node = step_bound[node]
        else:
            p = node - m
            link_seconds += at - sent_start[p]
            at = sent_start[p]
            node = tx_bound[p]
    return on_path, seconds, link_seconds


def _wait_spans(program: CommProgram, wait_start: np.ndarray, wait_end: np.ndarray) -> dict[int, list]:
    spans: dict[int, list[tuple[float, float]]] = {}
    blocked = np.flatnonzero((program.step_op != STEP_COMPUTE) & (wait_end > wait_start))
    device = np.searchsorted(program.step_start, blocked, side="right") - 1
    for d, a, z in zip(device.tolist(), wait_start[blocked].tolist(), wait_end[blocked].tolist()):
        spans.setdefault(d, []).append((a, z))
    return spans


def program_schedule(program: CommProgram, flat, occupy, overhead, link, seconds, links: int, eager: bool,
                     post_seconds: float = 0.0, item_seconds=None, sender_seconds=None):
    """Run :func:`_walk` (compiled for large programs, over lists otherwise)."""
    items = check_item_seconds(program, item_seconds)
    sender = check_sender_seconds(seconds, sender_seconds)
    args = (program.step_start, program.step_op, program.step_arg, program.batch_start, program.batch_item,
            flat.dep_start, flat.dep_slot, np.asarray(occupy, dtype=float), np.asarray(overhead, dtype=float),
            np.asarray(link, dtype=np.int64), np.asarray(seconds, dtype=float), links, eager, float(post_seconds),
            items, sender)
    # the project's one rule for when compiling pays (sim.jit), counted in actions as for the other kernels
    kernel = jit.compiled(_walk) if len(flat.keys) >= jit.compile_min_actions() else None
    if kernel is None:
        kernel = _walk
        args = tuple(a.tolist() if isinstance(a, np.ndarray) else a for a in args)
    return kernel(*args)


def check_item_seconds(program: CommProgram, item_seconds) -> np.ndarray:
    """*item_seconds* as float[len(program.batch_item)] (zeros for None); a wrong length or a negative or
    non-finite entry raises ValueError (a caller's bug, not user input)."""
    if item_seconds is None:
        return np.zeros(len(program.batch_item))
    items = np.asarray(item_seconds, dtype=float)
    if items.shape != (len(program.batch_item),) or not np.isfinite(items).all() or (items < 0).any():
        raise ValueError(f"item_seconds must be {len(program.batch_item)} finite seconds >= 0, one per batch item")
    return items


def check_sender_seconds(seconds, sender_seconds) -> np.ndarray:
    """*sender_seconds* as float[n] (the transfers' own *seconds* for None); a wrong length or a negative or
    non-finite entry raises ValueError (a caller's bug)."""
    if sender_seconds is None:
        return np.array(seconds, dtype=float)
    sender = np.asarray(sender_seconds, dtype=float)
    if sender.shape != np.shape(seconds) or not np.isfinite(sender).all() or (sender < 0).any():
        raise ValueError(f"sender_seconds must be {len(seconds)} finite seconds >= 0, one per action")
    return sender


def _walk(step_start, step_op, step_arg, batch_start, batch_item, dep_start, dep_slot, occupy, overhead, link,
          seconds, links, eager, post_seconds, item_seconds, sender_seconds):
    """Walk each device's steps as far as it can; park a blocked device on the slot it needs.

    Returns per action start and end, per transfer (by producer) start and end, per step the span of its
    communication call (a post's, a wait's), how far each device got, and per transfer when its send and its
    receive were posted (-1: not yet).
    Every time is >= 0, so -1 marks an unknown one. Written as plain loops so numba can compile it.
    """
    n = len(occupy)
    K = len(step_start) - 1
    m = len(step_op)
    ready = np.full(2 * n, -1.0)
    head = np.full(2 * n, -1, dtype=np.int64)  # slot -> first device parked on it
    next_waiting = np.full(K, -1, dtype=np.int64)  # device -> next device parked on the same slot
    start_out = np.zeros(n)
    end_out = np.zeros(n)
    sent_start = np.zeros(n)
    sent_end = np.zeros(n)
    wait_start = np.zeros(m)
    wait_end = np.zeros(m)
    send_post = np.full(n, -1.0)
    recv_post = np.full(n, -1.0)
    queue_next = np.full(n, -1, dtype=np.int64)  # transfer -> the next one posted on its link
    link_head = np.full(links, -1, dtype=np.int64)  # link -> first transfer not started yet
    link_tail = np.full(links, -1, dtype=np.int64)
    link_free = np.zeros(links)
    link_last = np.full(links, -1, dtype=np.int64)  # link -> the transfer that last started on it
    # what bound each start, for the critical path (_critical_path): per step its start and the node that set it
    # (a step s, a transfer m + p, -1: nothing, time 0), per transfer the node that set its start
    step_begin = np.zeros(m)
    step_bound = np.full(m, -1, dtype=np.int64)
    tx_bound = np.full(n, -1, dtype=np.int64)
    action_step = np.full(n, -1, dtype=np.int64)  # action -> its compute step
    send_step = np.full(n, -1, dtype=np.int64)  # transfer -> the step that posted its send
    recv_step = np.full(n, -1, dtype=np.int64)  # transfer -> the step that posted its receive
    device_free = np.zeros(K)
    position = np.zeros(K, dtype=np.int64)
    for d in range(K):
        position[d] = step_start[d]
    todo = np.zeros(K, dtype=np.int64)
    count = 0
    for d in range(K - 1, -1, -1):
        todo[count] = d
        count += 1
    while count > 0:
        count -= 1
        d = todo[count]
        s = position[d]
        last = step_start[d + 1]
        t = device_free[d]
        while s < last:
            op = step_op[s]
            arg = step_arg[s]
            blocked = -1
            previous = s - 1 if s > step_start[d] else -1  # the device's previous step: ends at t
            if op == STEP_COMPUTE:
                i = arg
                begin = t
                bound = previous
                for j in range(dep_start[i], dep_start[i + 1]):
                    p = dep_slot[j]
                    at = ready[p]
                    if at < 0.0:
                        blocked = p
                        break
                    if at > begin:  # strictly later: a tie stays with the device
                        begin = at
                        bound = action_step[p] if p < n else m + (p - n)
                if blocked < 0:
                    step_begin[s] = begin
                    step_bound[s] = bound
                    action_step[i] = s
                    start_out[i] = begin + overhead[i]
                    end = begin + occupy[i]
                    end_out[i] = end
                    ready[i] = end
                    t = end
                    w = head[i]
                    head[i] = -1
                    while w >= 0:
                        todo[count] = w
                        count += 1
                        w = next_waiting[w]
            elif op == STEP_POST:
                began = t
                step_begin[s] = began
                step_bound[s] = previous
                t = t + post_seconds  # the call that posts the batch holds the device
                for j in range(batch_start[arg], batch_start[arg + 1]):
                    t = t + item_seconds[j]  # the operation's own call, posted as it returns
                    item = batch_item[j]
                    if item >= 0:
                        p = item
                        send_post[p] = t
                        send_step[p] = s
                        lk = link[p]
                        if link_head[lk] < 0:
                            link_head[lk] = p
                        else:
                            queue_next[link_tail[lk]] = p
                        link_tail[lk] = p
                    else:
                        p = -item - 1
                        recv_post[p] = t
                        recv_step[p] = s
                        lk = link[p]
                    # start what this post lets start on the link, in its queue order
                    q = link_head[lk]
                    while q >= 0:
                        if send_post[q] < 0.0 or (not eager and recv_post[q] < 0.0):
                            break
                        # the latest constraint, ties in the order send's post, receive's post, link
                        t0 = send_post[q]
                        bound = send_step[q]
                        if not eager and recv_post[q] > t0:
                            t0 = recv_post[q]
                            bound = recv_step[q]
                        if link_free[lk] > t0:
                            t0 = link_free[lk]
                            bound = m + link_last[lk]
                        tx_bound[q] = bound
                        link_last[lk] = q
                        t1 = t0 + seconds[q]
                        link_free[lk] = t1
                        sent_start[q] = t0
                        sent_end[q] = t1
                        ready[n + q] = t1
                        w = head[n + q]
                        head[n + q] = -1
                        while w >= 0:
                            todo[count] = w
                            count += 1
                            w = next_waiting[w]
                        q = queue_next[q]
                        link_head[lk] = q
                        if q < 0:
                            link_tail[lk] = -1
                if t > began:
                    wait_start[s] = began
                    wait_end[s] = t
            else:  # STEP_WAIT
                until = t
                bound = previous
                for j in range(batch_start[arg], batch_start[arg + 1]):
                    item = batch_item[j]
                    p = item if item >= 0 else -item - 1
                    at = ready[n + p]
                    if at < 0.0:
                        blocked = n + p
                        break
                    if item >= 0:  # the sender learns of its send's completion on its own time
                        at = sent_start[p] + sender_seconds[p]
                    if at > until:
                        until = at
                        bound = m + p
                if blocked < 0:
                    step_begin[s] = until
                    step_bound[s] = bound
                    wait_start[s] = t
                    wait_end[s] = until
                    t = until
            if blocked >= 0:
                next_waiting[d] = head[blocked]
                head[blocked] = d
                break
            s += 1
        position[d] = s
        device_free[d] = t
    return (start_out, end_out, sent_start, sent_end, wait_start, wait_end, position, send_post, recv_post,
            step_begin, step_bound, tx_bound)


def deadlock_message(program: CommProgram, position: np.ndarray, send_post: np.ndarray, recv_post: np.ndarray, *,
                     eager: bool) -> str:
    """Words for a stalled walk: per stuck device, its step and what it waits for (a result not computed, a
    transfer whose other side never posts)."""
    schedule = program.schedule
    flat = schedule.compiled.flat
    n = len(flat.keys)
    lines = []
    for d in range(program.devices):
        s = int(position[d])
        if s >= program.step_start[d + 1]:
            continue
        op, arg = int(program.step_op[s]), int(program.step_arg[s])
        what = program.step_text(op, arg)
        if op == STEP_COMPUTE:
            slots = flat.dep_slot[flat.dep_start[arg]:flat.dep_start[arg + 1]].tolist()
            needs = [p - n for p in slots if p >= n]
            reason = "its inputs"
        else:
            needs = [i if i >= 0 else ~i for i in program.batch(arg)]
            reason = "its batch"
        missing = []
        for p in needs:
            if send_post[p] < 0:
                missing.append(f"{program.item_text(p)} (never posted)")
            elif not eager and recv_post[p] < 0:
                missing.append(f"{program.item_text(~p)} (never posted)")
        lines.append(f"device {d} stuck at {what}, waiting on {reason}"
                     + (f": {', '.join(missing)}" if missing else ""))
    return (f"schedule {schedule.name!r} deadlocks under the {program.lowering} runtime's posting order "
            f"({'eager' if eager else 'rendezvous'} links): " + "; ".join(lines) + "\n" + _grid(program, position))


def _grid(program: CommProgram, position: np.ndarray, width: int = 12) -> str:
    rows = []
    for d in range(program.devices):
        steps = program.steps(d)
        pos = int(position[d] - program.step_start[d])
        lo = max(0, pos - width // 2)
        cells = [program.step_text(op, arg) for op, arg in steps[lo:lo + width]]
        if pos < len(steps):
            cells[pos - lo] = f"[{cells[pos - lo]}]"
        rows.append(f"  device {d}: {'... ' if lo else ''}{' '.join(cells)}"
                    f"{' ...' if lo + width < len(steps) else ''}{'  <-- stuck' if pos < len(steps) else ''}")
    return "\n".join(rows)
