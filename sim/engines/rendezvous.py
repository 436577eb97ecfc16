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
  operation posted as its call begins: gloo's ``tcp::Pair::send`` / ``Pair::recv`` (gloo/transport/tcp/pair.cc)
  register the operation, and write the data or the ready notice, under the pair's lock at the top of the call,
  and whatever else the call spends (waiting for that lock, which the device thread holds while it reads, or for
  a core) only keeps the calling thread busy; an ingested trace measures every call (:mod:`validate.ingest.messages`);
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

Slots: ``i`` is flat action i's end, ``n + p`` the end of the transfer carrying action p's result.
"""

from __future__ import annotations

import numpy as np

from sim import jit
from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST, CommProgram
from sim.core.keys import ScheduleError
from sim.engines.plan import Plan
from sim.results.timeline import EngineRun

__all__ = ["ProgramRun", "run_program", "program_schedule", "deadlock_message", "pending_spans"]


class ProgramRun:
    """What a program's walk gives: the engine run (as :class:`sim.results.timeline.EngineRun`) and, per device,
    the spans (start, end) it spent in communication calls (posts, blocked waits: :attr:`waits`) and the spans in
    which one of its sends was pending (:attr:`pending`, :func:`pending_spans`)."""

    __slots__ = ("run", "waits", "program", "_pending", "send_post", "recv_post")

    def __init__(self, run: EngineRun, waits: dict[int, list[tuple[float, float]]], program: CommProgram,
                 pending=None, send_post=None, recv_post=None) -> None:
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
    start, end, sent_start, sent_end, wait_start, wait_end, position, send_post, recv_post = out
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
                      np.asarray(send_post), np.asarray(recv_post))


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
            if op == STEP_COMPUTE:
                i = arg
                begin = t
                for j in range(dep_start[i], dep_start[i + 1]):
                    p = dep_slot[j]
                    at = ready[p]
                    if at < 0.0:
                        blocked = p
                        break
                    if at > begin:
                        begin = at
                if blocked < 0:
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
                t = t + post_seconds  # the call that posts the batch holds the device
                for j in range(batch_start[arg], batch_start[arg + 1]):
                    item = batch_item[j]
                    if item >= 0:
                        p = item
                        send_post[p] = t
                        lk = link[p]
                        if link_head[lk] < 0:
                            link_head[lk] = p
                        else:
                            queue_next[link_tail[lk]] = p
                        link_tail[lk] = p
                    else:
                        p = -item - 1
                        recv_post[p] = t
                        lk = link[p]
                    # start what this post lets start on the link, in its queue order
                    q = link_head[lk]
                    while q >= 0:
                        if send_post[q] < 0.0 or (not eager and recv_post[q] < 0.0):
                            break
                        t0 = link_free[lk]
                        if send_post[q] > t0:
                            t0 = send_post[q]
                        if not eager and recv_post[q] > t0:
                            t0 = recv_post[q]
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
                    t = t + item_seconds[j]  # the operation's own call (posted as it began)
                if t > began:
                    wait_start[s] = began
                    wait_end[s] = t
            else:  # STEP_WAIT
                until = t
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
                if blocked < 0:
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
    return start_out, end_out, sent_start, sent_end, wait_start, wait_end, position, send_post, recv_post


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
