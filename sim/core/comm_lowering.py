"""A schedule lowered to explicit communication: where each device posts its sends and receives, and where it waits.

A :class:`sim.core.ir.Schedule` says which computations each device runs and in which order; the transfers
between devices are derived. A runtime decides *when* each side of a transfer is posted: PyTorch's
runtimes post a receive just before the action that needs it (or where ``_add_send_recv`` puts it),
Megatron-LM pairs a send with the next receive from the same peer and blocks on both, pipesim's own
executor keeps its receives posted ahead. This module turns a schedule into that *program*, per device an
ordered list of steps:

=========== ==========================================================================================
``COMPUTE`` run one action (its index in :attr:`sim.core.compiled.Compiled.flat`)
``POST``    post a *batch* of point-to-point operations at once (``torch.distributed.batch_isend_irecv``):
            sends (``SEND_F`` activations, ``SEND_B`` gradients) and receives (``RECV_F``, ``RECV_B``)
``WAIT``    block until every operation of a batch has completed (a batch completes when all its do)
=========== ==========================================================================================

A compute also waits for the transfers that carry its inputs (PyTorch's multi-stage runtime waits for a
receive right before the computation that consumes it, ``_PipelineScheduleRuntime._step_microbatches``).
Transfers are identified by their producer's flat index (each result travels to at most one other device).

The program is data: :meth:`CommProgram.to_text` prints it in PyTorch's notation (``0F0 0SEND_F0 1RECV_F0``, a
batch as ``0SEND_F1+0RECV_B0``, a wait as ``WAIT(0SEND_F1+0RECV_B0)``), :meth:`CommProgram.to_pytorch` gives
the per-rank action lists ``_add_send_recv`` produces (waits are implicit there). The engines
(:mod:`sim.engines.rendezvous`) run it under eager or rendezvous link semantics.

The lowerings, each with the runtime source it follows (reimplemented from the rules, not copied):

- :func:`lower_pipesim`: pipesim's executor (``validate/rank/executor.py``): a send is posted right after its
  producer (and waited at once when the hardware does not overlap communication); receives are posted ahead
  (the executor keeps one outstanding ``irecv`` per peer), so under the eager semantics they never delay.
- :func:`lower_torch_gpipe`: ``torch.distributed.pipelining.schedules.ScheduleGPipe._step_microbatches``
  (torch 2.13): receive batch posted and waited just before each action, sends fired after it, every
  forward send waited before the first backward, every backward send at the end.
- :func:`lower_torch_1f1b`: ``Schedule1F1B._step_microbatches``: warm-up forwards (receive, compute, wait the
  previous send, fire this one except the last), then ``fwd_send_bwd_recv`` and ``bwd_send_fwd_recv``
  batches waited at once around each backward and forward, the left-over backward send fired after the
  loop, cool-down backwards waiting their previous send.
- :func:`lower_torch_multi`: ``_add_send_recv`` (the compute-only order lowered rank by rank, a receive put on
  the receiving rank when its sender's action is scheduled; an overlapped pair's sends after the pair) run by
  ``_PipelineScheduleRuntime._step_microbatches`` (sends fired and waited at the end, receives waited by the
  consuming computation).
- :func:`lower_megatron`: Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
  (``forward_backward_pipelining_without_interleaving``) over ``p2p_communication.py``: between two
  computations the previous one's sends and the next one's receives; with the same peer they form one batch
  (``send_forward_recv_backward``, ``send_backward_recv_forward``), otherwise the send goes first
  (``send_forward`` then ``recv_forward``); every batch is waited at once (``_communicate`` with
  ``wait_on_reqs=True``, the default without ``overlap_p2p_comm``).
- :func:`lower_deepspeed`: DeepSpeed's pipeline engine (``deepspeed/runtime/pipe/engine.py`` ``_exec_schedule``
  running ``schedule.py`` ``TrainSchedule``, :mod:`sim.core.deepspeed_schedule`): each stage's instructions in
  order, every ``RecvActivation`` / ``RecvGrad`` / ``SendActivation`` / ``SendGrad`` its own batch waited at once
  (a blocking ``dist.broadcast`` in a two-rank group, ``pipe/p2p.py``), so a stage's exchanges run one after the
  other. Only TrainSchedule's own order (1F1B, one stage per device) is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim.core import deepspeed_schedule as ds
from sim.core.keys import OP_B, OP_F, OP_U, ScheduleError, encode_key, key_kind, key_mb, key_stage

if TYPE_CHECKING:
    from sim.core.ir import Schedule

__all__ = ["CommProgram", "ProgramBuilder", "STEP_COMPUTE", "STEP_POST", "STEP_WAIT", "LOWERINGS", "lower",
           "lower_pipesim", "lower_torch_gpipe", "lower_torch_1f1b", "lower_torch_multi", "lower_megatron",
           "lower_deepspeed", "LoweringError"]

STEP_COMPUTE, STEP_POST, STEP_WAIT = 0, 1, 2
"""Step codes of a device program (see the module docstring)."""


class LoweringError(ScheduleError):
    """A schedule a runtime cannot run as given (its order is not the one that runtime's loop executes)."""


@dataclass(frozen=True, slots=True, eq=False)
class CommProgram:
    """Per device, the steps a runtime takes; arrays in CSR form (``int64``).

    Batch items: ``p >= 0`` sends the result of flat action *p*; ``~p`` (negative) receives it.
    """

    schedule: Schedule
    lowering: str
    """Which lowering made it (a key of :data:`LOWERINGS`)."""
    step_start: np.ndarray
    """int64[K+1]: device d's steps are step_op/step_arg[step_start[d]:step_start[d+1]]."""
    step_op: np.ndarray
    """int64[m]: STEP_COMPUTE, STEP_POST or STEP_WAIT."""
    step_arg: np.ndarray
    """int64[m]: the flat action index (compute) or the batch number (post, wait)."""
    batch_start: np.ndarray
    """int64[nb+1]: batch b's items are batch_item[batch_start[b]:batch_start[b+1]]."""
    batch_item: np.ndarray
    """int64: p (send the result of flat action p) or ~p (receive it)."""
    _waited: list = field(default_factory=list, repr=False)
    """:meth:`waited_sends`' answer once asked (a list, so the frozen program can keep it): every walk of the
    program asks, and a Monte Carlo run walks it once per sample."""

    @property
    def devices(self) -> int:
        return len(self.step_start) - 1

    def steps(self, device: int) -> list[tuple[int, int]]:
        lo, hi = int(self.step_start[device]), int(self.step_start[device + 1])
        return list(zip(self.step_op[lo:hi].tolist(), self.step_arg[lo:hi].tolist()))

    def batch(self, b: int) -> list[int]:
        return self.batch_item[self.batch_start[b]:self.batch_start[b + 1]].tolist()

    def waited_sends(self) -> np.ndarray:
        """bool[n] by flat action: its result's send is waited for by a WAIT step that a computation of the same
        device follows, so its sender may block on it mid-step (``ScheduleGPipe`` and ``Schedule1F1B``'s batches,
        Megatron's); the multi-stage runtime waits for its sends only once the step's actions are done
        (``_PipelineScheduleRuntime._step_microbatches``: ``_wait_batch_p2p`` on ``send_ops`` after the loop,
        torch 2.13 ``torch/distributed/pipelining/schedules.py``)."""
        if self._waited:
            return self._waited[0]
        out = np.zeros(len(self.schedule.compiled.flat.keys), dtype=bool)
        for d in range(self.devices):
            seen: list[int] = []  # sends waited for since the device's last computation
            for op, arg in self.steps(d):
                if op == STEP_WAIT:
                    seen += [i for i in self.batch(arg) if i >= 0]
                elif op == STEP_COMPUTE and seen:
                    out[seen] = True
                    seen = []
        out.flags.writeable = False  # shared by every caller
        self._waited.append(out)
        return out

    def item_text(self, item: int) -> str:
        """``0SEND_F3`` (the sending stage's send) or ``1RECV_F3`` (the receiving stage's receive), as torch prints
        ``_Action(stage, SEND_F, mb)`` and ``_Action(stage + 1, RECV_F, mb)``."""
        flat, S = self.schedule.compiled.flat, self.schedule.stages
        p = item if item >= 0 else ~item
        key = int(flat.keys[p])
        forward = key_kind(key) == OP_F
        stage, mb = int(key_stage(key, S)), int(key_mb(key, S))
        if item >= 0:
            return f"{stage}SEND_{'F' if forward else 'B'}{mb}"
        return f"{stage + 1 if forward else stage - 1}RECV_{'F' if forward else 'B'}{mb}"

    def step_text(self, op: int, arg: int) -> str:
        if op == STEP_COMPUTE:
            return str(self.schedule.action_of(int(self.schedule.compiled.flat.keys[arg])))
        batch = "+".join(self.item_text(i) for i in self.batch(arg))
        return batch if op == STEP_POST else f"WAIT({batch})"

    def to_text(self) -> str:
        """One line per device: ``0: 0F0 0SEND_F0 1RECV_B0 WAIT(1RECV_B0) 0B0 ...``."""
        return "\n".join(f"{d}: " + " ".join(self.step_text(op, arg) for op, arg in self.steps(d))
                         for d in range(self.devices))

    def to_pytorch(self) -> dict[int, list[str]]:
        """rank -> actions in PyTorch's lowered notation (``_add_send_recv``'s output): computations and the
        operations of each posted batch in order; waits are implicit in PyTorch's runtime, so left out."""
        out: dict[int, list[str]] = {}
        for d in range(self.devices):
            row = out[d] = []
            for op, arg in self.steps(d):
                if op == STEP_COMPUTE:
                    row.append(self.step_text(op, arg))
                elif op == STEP_POST:
                    row.extend(self.item_text(i) for i in self.batch(arg))
        return out


# ------------------------------------------------------------------ what every lowering needs
class ProgramBuilder:
    """Appends steps per device and numbers batches: what every lowering uses, and how a program for a runtime
    pipesim has no profile for is written by hand (``tests/test_runtime_engines.py`` builds one that deadlocks)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        flat = schedule.compiled.flat
        self.flat = flat
        n = len(flat.keys)
        self.n = n
        self.steps: list[list[tuple[int, int]]] = [[] for _ in range(schedule.devices)]
        self.batches: list[list[int]] = []
        # the flat actions whose results arrive at action i: remote input slots are n + producer
        self.receives: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for slot in flat.dep_slot[flat.dep_start[i]:flat.dep_start[i + 1]].tolist():
                if slot >= n:
                    self.receives[i].append(slot - n)
        fused = set(schedule.fused.tolist())
        self.pair_first = fused
        self.pair_second = {i + 1 for i in fused}
        for i in self.pair_second:  # a pair's inputs are the pair's forward's (merged in sim.core.compiled)
            self.receives[i] = []

    def actions(self, device: int) -> range:
        return range(int(self.flat.device_start[device]), int(self.flat.device_start[device + 1]))

    def sends(self, i: int) -> list[int]:
        return [i] if self.flat.send_to[i] >= 0 else []

    def flat_text(self, i: int) -> str:
        """Flat action *i* as the schedule prints it (``1F3``)."""
        return str(self.schedule.action_of(int(self.flat.keys[i])))

    def peer(self, item: int) -> int:
        """The other device of a send (item >= 0) or a receive (~p)."""
        flat = self.flat
        return int(flat.send_to[item]) if item >= 0 else int(flat.device[~item])

    def compute(self, d: int, i: int) -> None:
        self.steps[d].append((STEP_COMPUTE, i))

    def post(self, d: int, items: Sequence[int], *, wait: bool = False) -> int | None:
        """Post *items* as one batch on device *d* (nothing for no items); *wait*: block on it at once."""
        if not items:
            return None
        b = len(self.batches)
        self.batches.append(list(items))
        self.steps[d].append((STEP_POST, b))
        if wait:
            self.steps[d].append((STEP_WAIT, b))
        return b

    def wait(self, d: int, b: int | None) -> None:
        if b is not None:
            self.steps[d].append((STEP_WAIT, b))

    def build(self, lowering: str) -> CommProgram:
        counts = [len(s) for s in self.steps]
        step_start = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=step_start[1:])
        ops = np.array([op for s in self.steps for op, _ in s], dtype=np.int64)
        args = np.array([arg for s in self.steps for _, arg in s], dtype=np.int64)
        sizes = [len(b) for b in self.batches]
        batch_start = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=batch_start[1:])
        items = np.array([i for b in self.batches for i in b], dtype=np.int64)
        program = CommProgram(self.schedule, lowering, step_start, ops, args, batch_start, items)
        _check_matching(program)
        return program


def _check_matching(program: CommProgram) -> None:
    """Every transfer is sent once and received once, and on every directed link the receives are posted in the
    order of the sends: NCCL and gloo match point-to-point operations between two ranks in posting order (no
    tags in PyTorch's pipelining), so another order would pair a send with the wrong receive."""
    flat = program.schedule.compiled.flat
    sent = np.flatnonzero(flat.send_to >= 0)
    order: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    sends, recvs = set(), set()
    for d in range(program.devices):
        for op, arg in program.steps(d):
            if op != STEP_POST:
                continue
            for item in program.batch(arg):
                p = item if item >= 0 else ~item
                link = (int(flat.device[p]), int(flat.send_to[p]))
                if item >= 0:
                    assert p not in sends and d == link[0], f"send of {p} posted twice or on the wrong device"
                    sends.add(p)
                    order.setdefault(link, ([], []))[0].append(p)
                else:
                    assert p not in recvs and d == link[1], f"receive of {p} posted twice or on the wrong device"
                    recvs.add(p)
                    order.setdefault(link, ([], []))[1].append(p)
    assert sends == recvs == set(sent.tolist()), "a transfer without its send or its receive"
    for (src, dst), (s, r) in order.items():
        if s != r:
            first = next(k for k in range(len(s)) if s[k] != r[k])
            raise LoweringError(
                f"{program.lowering}: device {dst} posts its receives from device {src} in another order than the "
                f"sends (send {program.item_text(s[first])} meets receive {program.item_text(~r[first])}); "
                f"point-to-point operations between two ranks match in posting order")


# ------------------------------------------------------------------ the lowerings
def lower_pipesim(schedule: Schedule, *, blocking_sends: bool = False) -> CommProgram:
    """pipesim's executor: receives posted ahead (listed first), each send right after its producer (an overlapped
    pair's sends after the pair, as one batch), waited at once only when sends block the device."""
    b = ProgramBuilder(schedule)
    send_to = b.flat.send_to
    for d in range(schedule.devices):
        acts = b.actions(d)
        # pre-posted: the executor keeps a receive outstanding per peer, in the order that peer sends (the flat
        # order is each sender's action order)
        for p in np.flatnonzero(send_to == d).tolist():
            b.post(d, [~p])
        for i in acts:
            b.compute(d, i)
            if i in b.pair_first:
                continue
            sends = b.sends(i - 1) + b.sends(i) if i in b.pair_second else b.sends(i)
            b.post(d, sends, wait=blocking_sends)
    return b.build("pipesim")


def lower_torch_gpipe(schedule: Schedule, *, blocking_sends: bool = False) -> CommProgram:
    """``ScheduleGPipe._step_microbatches``: receive batch posted and waited before each action, send fired after it;
    the forward sends waited before the first backward, the backward sends at the end."""
    b = ProgramBuilder(schedule)
    kinds = key_kind(schedule.compiled.flat.keys)
    for d in range(schedule.devices):
        pending: list[int | None] = []
        updates: list[int] = []
        in_forward = True
        for i in b.actions(d):
            if in_forward and kinds[i] == OP_B:  # "Wait for all forward sends to finish"
                for batch in pending:
                    b.wait(d, batch)
                pending, in_forward = [], False
            if kinds[i] == OP_U:  # the optimizer step runs after the schedule's loop
                updates.append(i)
                continue
            b.post(d, [~p for p in b.receives[i]], wait=True)
            b.compute(d, i)
            pending.append(b.post(d, b.sends(i), wait=blocking_sends))
        for batch in pending:
            b.wait(d, batch)
        for i in updates:
            b.compute(d, i)
    return b.build("torch-gpipe")


def lower_torch_1f1b(schedule: Schedule, *, blocking_sends: bool = False) -> CommProgram:
    """``Schedule1F1B._step_microbatches`` on each device's order: leading forwards are the warm-up, then
    backward/forward pairs, then the remaining backwards (anything else is not what that loop runs)."""
    b = ProgramBuilder(schedule)
    kinds = key_kind(schedule.compiled.flat.keys)
    for d in range(schedule.devices):
        acts = list(b.actions(d))
        tail = []  # the optimizer updates: torch runs them after step(), outside the schedule's loop
        while acts and kinds[acts[-1]] == OP_U:
            tail.insert(0, acts.pop())
        order = "".join("F" if kinds[i] == OP_F else "B" if kinds[i] == OP_B else "?" for i in acts)
        warmup = len(order) - len(order.lstrip("F"))
        steady = 0
        while order.startswith("BF", warmup + 2 * steady):
            steady += 1
        rest = order[warmup + 2 * steady:]
        if "?" in order or not warmup or rest.strip("B") or not rest:
            raise LoweringError(f"torch's Schedule1F1B runs warm-up forwards, then backward/forward pairs, then "
                                f"backwards; device {d} of {schedule.name!r} runs {order[:40]}"
                                f"{'...' if len(order) > 40 else ''}: simulate it with another runtime")
        recv = lambda i: [~p for p in b.receives[i]]  # noqa: E731
        send_work = None
        fwd_sends: list[int] = []
        for j, i in enumerate(acts[:warmup]):
            b.post(d, recv(i), wait=True)  # _wait_batch_p2p(_batch_p2p(fwd_recvs))
            b.compute(d, i)
            b.wait(d, send_work)  # "Clear previous chunk's forward sends"
            send_work = None
            fwd_sends = b.sends(i)
            if j != warmup - 1:  # the last warm-up send is fused with the first backward's receive
                send_work = b.post(d, fwd_sends, wait=blocking_sends)
                fwd_sends = []
        k = warmup
        bwd_sends: list[int] = []
        while True:  # 1B1F
            i = acts[k]
            b.post(d, fwd_sends + recv(i), wait=True)  # fwd_send_bwd_recv
            b.compute(d, i)
            bwd_sends = b.sends(i)
            k += 1
            if k >= warmup + 2 * steady:
                break
            i = acts[k]
            b.post(d, bwd_sends + recv(i), wait=True)  # bwd_send_fwd_recv
            b.compute(d, i)
            fwd_sends = b.sends(i)
            k += 1
        send_work = b.post(d, bwd_sends, wait=blocking_sends)
        for i in acts[k:]:  # cool-down
            b.post(d, recv(i), wait=True)
            b.compute(d, i)
            b.wait(d, send_work)
            send_work = b.post(d, b.sends(i), wait=blocking_sends)
        b.wait(d, send_work)
        for i in tail:
            b.compute(d, i)
    return b.build("torch-1f1b")


def lower_torch_multi(schedule: Schedule, *, blocking_sends: bool = False) -> CommProgram:
    """``_add_send_recv`` + ``_PipelineScheduleRuntime``: ranks lowered in turn, one computation each; a computation
    is placed only once the receives of its remote inputs are on its rank; after it, its send on its rank and the
    matching receive on the receiver's rank. Sends are fired and waited at the end; a computation waits its
    receives. No rank progressing in a round is a schedule that cannot be lowered."""
    b = ProgramBuilder(schedule)
    K = schedule.devices
    queues = {d: list(b.actions(d)) for d in range(K)}
    heads = {d: 0 for d in range(K)}
    posted: set[int] = set()  # transfers whose receive is on the receiving rank's list
    sends_of: dict[int, list[int | None]] = {d: [] for d in range(K)}
    while any(heads[d] < len(queues[d]) for d in range(K)):
        progress = False
        for d in range(K):  # "go in order of ranks"
            if heads[d] >= len(queues[d]):
                continue
            i = queues[d][heads[d]]
            parts = [i, i + 1] if i in b.pair_first else [i]  # a pair's inputs are listed on its forward
            if not all(p in posted for p in b.receives[i]):
                continue
            for part in parts:
                b.compute(d, part)
            for part in parts:
                for p in b.sends(part):
                    sends_of[d].append(b.post(d, [p], wait=blocking_sends))
                    b.post(int(b.flat.send_to[p]), [~p])
                    posted.add(p)
            heads[d] += len(parts)
            progress = True
        if not progress:
            stuck = ", ".join(str(schedule.action_of(int(b.flat.keys[queues[d][heads[d]]]))) for d in range(K)
                              if heads[d] < len(queues[d]))
            raise LoweringError(f"torch's _add_send_recv cannot lower {schedule.name!r}: no rank can place its next "
                                f"action ({stuck}) before its input's receive")
    for d in range(K):  # "Mostly these operations should have finished long ago"
        for batch in sends_of[d]:
            b.wait(d, batch)
    return b.build("torch-multi")


def lower_megatron(schedule: Schedule, *, blocking_sends: bool = True) -> CommProgram:
    """Megatron-LM: between two computations, the previous one's sends and the next one's receives; those with the
    same peer form one batch (send first), the others go alone, sends first; every batch is waited at once
    (Megatron's sends always block: *blocking_sends* changes nothing). Model chunks (more stages than devices) run
    ``forward_backward_pipelining_with_interleaving``'s exchanges (:func:`_lower_megatron_interleaved`)."""
    if schedule.stages != schedule.devices:
        return _lower_megatron_interleaved(schedule)
    b = ProgramBuilder(schedule)
    for d in range(schedule.devices):
        pending: list[int] = []
        for i in b.actions(d):
            if i in b.pair_second:
                b.compute(d, i)
                pending += b.sends(i)
                continue
            _megatron_exchange(b, d, pending, [~p for p in b.receives[i]])
            b.compute(d, i)
            pending = b.sends(i)
        _megatron_exchange(b, d, pending, [])
    return b.build("megatron")


def megatron_schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """``get_schedule_table`` of Megatron's interleaved schedule: forward virtual micro-batch k runs
    ``(micro-batch, model chunk) = table[k]``; the micro-batches go in groups of *group*
    (``microbatch_group_size_per_vp_stage``, by default the pipeline size), each group through every chunk."""
    table = []
    for first in range(0, microbatches, group):
        last = microbatches if first + group >= microbatches else first + group
        table += [(mb, chunk) for chunk in range(chunks) for mb in range(first, last)]
    return table


def _lower_megatron_interleaved(schedule: Schedule, *, overlap: bool = False,
                                warmup_flush: bool = False) -> CommProgram:
    """``forward_backward_pipelining_with_interleaving`` (megatron-core 0.16), rank r of K with C chunks, stage
    ``c x K + r``, total = C x M virtual micro-batches; warm-up ``min((K - r - 1) x 2 + (C - 1) x K, total)``
    forwards (all of them, then every backward, when that reaches total), a steady state of one forward and one
    backward, a cool-down of backwards; ``recv_forward`` before the first forward.

    With megatron-core's defaults (*overlap* False: ``batch_p2p_comm`` on, ``overlap_p2p_comm`` off) every exchange
    is one batch waited at once: after each warm-up forward ``send_forward_recv_forward``, the last one also
    receiving the first backward's gradient (``send_forward_backward_recv_forward_backward``); after each steady
    forward + backward ONE batch of both results' sends and the next receives (a forward's output waits for the
    backward after it); after each cool-down backward ``send_backward_recv_backward``. Within a batch: send to
    previous, receive from previous, send to next, receive from next (``_batched_p2p_ops``).

    With Megatron-LM's training default for this schedule (*overlap*: ``overlap_p2p_comm`` on, ``batch_p2p_comm``
    off) the warm-up and cool-down exchanges still block, the last warm-up forward is followed by a posted, not
    waited, receive of the first gradient, and the steady state posts without waiting: after the forward
    ``send_forward_recv_forward`` (``pp_post_forward``), then the previous forward send is waited; before the
    backward the oldest pending gradient receive is waited (``pp_pre_backward``); after it
    ``send_backward_recv_backward`` and the previous backward send is waited (``pp_post_backward``); before the next
    forward the oldest pending activation receive (``pp_pre_forward``); the cool-down waits the gradient receives
    still pending before its backwards, the last backward send after it. Operations of one call are posted in
    ``_p2p_ops``' order: an even rank sends to next, receives from previous, sends to previous, receives from next;
    an odd rank receives from previous, sends to next, receives from next, sends to previous.

    With *warmup_flush* as well (Megatron-LM's ``--overlap-p2p-communication-warmup-flush``,
    ``overlap_p2p_comm_warmup_flush``) the warm-up and cool-down post without waiting too: before each warm-up
    forward the oldest pending activation receive is waited (not before the first, nor on the pipeline's first
    stage) and, on every rank but the first, the next one posted alone; after the forward its send (the first rank:
    with that receive), then the previous forward send waited. The cool-down mirrors it with gradients: the last rank
    posts the next receive with its send, the others before the backward.

    What an exchange receives (``recv_tensor_from_previous_stage``): on a rank with a previous rank (forward) or a
    next one (backward), the input of the next virtual micro-batch; on the leading rank (rank 0 forward, rank K-1
    backward), the tensor the ending rank sent at its K-1 earlier virtual micro-batch, if that was not the last
    chunk's. Megatron's own checks refuse M < K and M not a multiple of K, as this does; an order other than
    Megatron's is refused naming the first difference."""
    K, S, M = schedule.devices, schedule.stages, schedule.microbatches
    C = S // K
    why = f"megatron's interleaved schedule ({schedule.name!r}, K={K}, {S} stages, M={M})"
    if S % K or list(schedule.placement) != [s % K for s in range(S)]:
        raise LoweringError(f"{why}: Megatron places model chunk c of rank r as stage c x K + r; placement "
                            f"{list(schedule.placement)} is not that")
    if K <= 2 and not overlap:
        # _batched_p2p_ops posts send-to-previous before send-to-next; with two ranks both are the one peer, whose
        # batch receives from previous (the activation) before from next (the gradient): the two pair crosswise.
        # Earlier megatron-core releases refused this shape in initialize_model_parallel; 0.16 runs it, and the
        # step's gradients come out wrong (tests/test_validate_megatron.py measures it)
        raise LoweringError(f"{why}: with 2 pipeline ranks Megatron's batched exchanges pair a gradient with an "
                            f"activation on the one link; it needs more than 2 (earlier Megatron releases refused it)")
    if M < K or M % K:
        raise LoweringError(f"{why}: Megatron runs the interleaved schedule with micro-batches a multiple of the "
                            f"pipeline size (microbatch_group_size_per_vp_stage = K); M={M} is not")
    if len(schedule.fused):
        raise LoweringError(f"{why}: Megatron's interleaved schedule runs no overlapped pairs")
    table = megatron_schedule_table(M, C, K)
    total = C * M
    b = ProgramBuilder(schedule)
    index = {key: i for i, key in enumerate(b.flat.keys.tolist())}
    updates = any(key_kind(k) == OP_U for k in index)
    for r in range(K):
        warmup = min((K - r - 1) * 2 + (C - 1) * K, total)
        steady = total - warmup
        acts = list(b.actions(r))
        at = 0
        for it in range(schedule.iterations):
            def flat(stage: int, kind: int, mb: int) -> int:
                key = encode_key(stage, kind, it * M + mb, S)
                if key not in index:
                    raise LoweringError(f"{why}: rank {r} runs {'F' if kind == OP_F else 'B'} of stage {stage}, "
                                        f"micro-batch {it * M + mb}, which the schedule does not have")
                return index[key]

            def fwd(k: int) -> int:
                mb, c = table[k]
                return flat(c * K + r, OP_F, mb)

            def bwd(k: int) -> int:
                mb, c = table[k]
                return flat((C - 1 - c) * K + r, OP_B, mb)

            def recv_forward(k: int) -> list[int]:  # received in the exchange after forward k
                if r > 0:
                    mb, c = table[k + 1]
                    return [~flat(c * K + r - 1, OP_F, mb)]
                if k < K - 1 or table[k - (K - 1)][1] == C - 1:
                    return []
                mb, c = table[k - (K - 1)]
                return [~flat(c * K + K - 1, OP_F, mb)]

            def recv_backward(k: int) -> list[int]:  # received in the exchange after backward k
                if r < K - 1:
                    mb, c = table[k + 1]
                    return [~flat((C - 1 - c) * K + r + 1, OP_B, mb)]
                if k < K - 1 or table[k - (K - 1)][1] == C - 1:  # backward chunk 0 sends nothing back
                    return []
                mb, c = table[k - (K - 1)]
                return [~flat((C - 1 - c) * K, OP_B, mb)]

            def first_gradient() -> list[int]:  # the first backward's input, from the next rank
                mb, c = table[0]
                return [~flat((C - 1 - c) * K + r + 1, OP_B, mb)] if r != K - 1 else []

            def run(i: int) -> None:
                nonlocal at
                if at >= len(acts) or acts[at] != i:
                    got = b.flat_text(acts[at]) if at < len(acts) else "nothing"
                    raise LoweringError(f"{why}: rank {r}'s action {at + 1} is {got} where Megatron runs "
                                        f"{b.flat_text(i)}")
                b.compute(r, i)
                at += 1

            if r > 0:  # recv_forward, blocking
                b.post(r, [~flat(table[0][1] * K + r - 1, OP_F, table[0][0])], wait=True)
            if overlap:
                _megatron_overlapped(b, r, warmup, steady, total, fwd, bwd, recv_forward, recv_backward,
                                     first_gradient, run, first_stage=lambda k: r == 0 and table[k][1] == 0,
                                     last_stage=lambda k: r == K - 1 and table[k][1] == 0,
                                     warmup_flush=warmup_flush and (r > 0, r < K - 1))
            else:
                _megatron_batched(b, r, warmup, steady, total, fwd, bwd, recv_forward, recv_backward,
                                  first_gradient, run)
            if updates:
                for stage in range(r, S, K):
                    run(index[encode_key(stage, OP_U, it, S)])
        if at != len(acts):
            raise LoweringError(f"{why}: rank {r} runs {b.flat_text(acts[at])} after Megatron's last action")
    return b.build(("megatron-overlap-flush" if warmup_flush else "megatron-overlap") if overlap else "megatron")


def _megatron_batched(b: ProgramBuilder, r: int, warmup: int, steady: int, total: int, fwd, bwd, recv_forward,
                      recv_backward, first_gradient, run) -> None:
    """One iteration of rank *r* with megatron-core's defaults (:func:`_lower_megatron_interleaved`)."""
    def exchange(sent_back: int | None, recv_prev: list[int], sent_on: int | None, recv_next: list[int]) -> None:
        items = (b.sends(sent_back) if sent_back is not None else []) + recv_prev \
            + (b.sends(sent_on) if sent_on is not None else []) + recv_next  # _batched_p2p_ops' order
        b.post(r, items, wait=True)

    for k in range(warmup):
        run(fwd(k))
        recv_next = first_gradient() if k == warmup - 1 and warmup < total else []
        exchange(None, recv_forward(k) if k != total - 1 else [], fwd(k), recv_next)
    for j in range(steady):
        run(fwd(j + warmup))
        run(bwd(j))
        exchange(bwd(j), recv_forward(j + warmup) if j != steady - 1 else [], fwd(j + warmup), recv_backward(j))
    if warmup == total:  # every forward in the warm-up: recv_backward before the cool-down
        b.post(r, first_gradient(), wait=True)
    for k in range(steady, total):
        run(bwd(k))
        exchange(bwd(k), [], None, recv_backward(k) if k != total - 1 else [])


def _megatron_overlapped(b: ProgramBuilder, r: int, warmup: int, steady: int, total: int, fwd, bwd, recv_forward,
                         recv_backward, first_gradient, run, *, first_stage, last_stage, warmup_flush=False) -> None:
    """One iteration of rank *r* with ``overlap_p2p_comm`` (:func:`_lower_megatron_interleaved`). *first_stage(k)*:
    forward k is the pipeline's first stage (no receive to wait); *last_stage(k)*: backward k is its last.
    *warmup_flush*: False, or (whether the rank has a previous rank, whether it has a next one) with
    ``overlap_p2p_comm_warmup_flush``."""
    even = r % 2 == 0
    flush = bool(warmup_flush)
    has_prev, has_next = warmup_flush if flush else (False, False)

    def oldest(pending: list[int], what: str) -> int:
        if not pending:  # Megatron asserts it ("should have registered recv handle")
            raise LoweringError(f"megatron's interleaved schedule with overlap_p2p_comm_warmup_flush: rank {r} waits "
                                f"for {what} that no call posted")
        return pending.pop(0)

    def post(send_next: int | None, recv_prev: list[int], send_prev: int | None, recv_next: list[int], *,
             wait: bool) -> tuple[int | None, int | None]:
        """One ``_p2p_ops`` call: each operation its own handle (posted in the rank's order); returns the send's and
        the receive's batch (None where there is none)."""
        ops = [("send", b.sends(send_next) if send_next is not None else []), ("recv", recv_prev),
               ("send", b.sends(send_prev) if send_prev is not None else []), ("recv", recv_next)]
        if not even:
            ops = [ops[1], ops[0], ops[3], ops[2]]
        posted = {kind: None for kind in ("send", "recv")}
        batches = []
        for kind, items in ops:
            if items:
                posted[kind] = b.post(r, items)
                batches.append(posted[kind])
        if wait:
            for batch in batches:
                b.wait(r, batch)
        return posted["send"], posted["recv"]

    pending_forward: list[int] = []   # receives of activations posted and not yet waited (recv_prev_wait_handles)
    pending_backward: list[int] = []  # of gradients (recv_next_wait_handles)
    last_send_next = last_send_prev = None
    for k in range(warmup):  # blocking send_forward_recv_forward; after the last, the first gradient posted
        if not flush:
            run(fwd(k))
            post(fwd(k), recv_forward(k) if k != total - 1 else [], None, [], wait=True)
        else:  # the next activation's receive posted ahead, the forward's send posted without waiting
            if not first_stage(k) and k != 0:
                b.wait(r, oldest(pending_forward, f"the activation of warm-up forward {k}"))
            recv_prev = recv_forward(k) if k != total - 1 else []
            if has_prev:
                _, got = post(None, recv_prev, None, [], wait=False)
                if got is not None:
                    pending_forward.append(got)
            run(fwd(k))
            sent, got = post(fwd(k), [] if has_prev else recv_prev, None, [], wait=False)
            b.wait(r, last_send_next)
            last_send_next = sent
            if got is not None:
                pending_forward.append(got)
        if k == warmup - 1 and warmup < total:
            _, got = post(None, [], None, first_gradient(), wait=False)
            if got is not None:
                pending_backward.append(got)
    for j in range(steady):
        fk = j + warmup
        if not first_stage(fk) and pending_forward:  # pp_pre_forward
            b.wait(r, pending_forward.pop(0))
        run(fwd(fk))
        sent, got = post(fwd(fk), recv_forward(fk) if j != steady - 1 else [], None, [], wait=False)  # pp_post_forward
        b.wait(r, last_send_next)
        last_send_next = sent
        if got is not None:
            pending_forward.append(got)
        if not last_stage(j) and pending_backward:  # pp_pre_backward
            b.wait(r, pending_backward.pop(0))
        run(bwd(j))
        sent, got = post(None, [], bwd(j), recv_backward(j), wait=False)  # pp_post_backward
        b.wait(r, last_send_prev)
        last_send_prev = sent
        if got is not None:
            pending_backward.append(got)
    if warmup == total:  # every forward in the warm-up: recv_backward before the cool-down
        post(None, [], None, first_gradient(), wait=True)
    for k in range(steady, total):  # blocking send_backward_recv_backward
        if not last_stage(k) and k != 0 and (pending_backward or flush):
            b.wait(r, oldest(pending_backward, f"the gradient of cool-down backward {k}"))
        recv_next = recv_backward(k) if k != total - 1 else []
        if not flush:
            run(bwd(k))
            post(None, [], bwd(k), recv_next, wait=True)
            continue
        if has_next:  # the next gradient's receive posted ahead, the backward's send without waiting
            _, got = post(None, [], None, recv_next, wait=False)
            if got is not None:
                pending_backward.append(got)
        run(bwd(k))
        sent, got = post(None, [], bwd(k), [] if has_next else recv_next, wait=False)
        b.wait(r, last_send_prev)
        last_send_prev = sent
        if got is not None:
            pending_backward.append(got)
    b.wait(r, last_send_prev)  # the last forward send is never waited (megatron-core 0.16 leaves its handle)


def _megatron_exchange(b: ProgramBuilder, d: int, sends: list[int], recvs: list[int]) -> None:
    paired = [s for s in sends if any(b.peer(r) == b.peer(s) for r in recvs)]
    for s in sends:
        if s not in paired:
            b.post(d, [s], wait=True)  # send_forward / send_backward: blocking
    for s in paired:
        b.post(d, [s] + [r for r in recvs if b.peer(r) == b.peer(s)], wait=True)  # send_X_recv_Y
    for r in recvs:
        if not any(b.peer(r) == b.peer(s) for s in paired):
            b.post(d, [r], wait=True)  # recv_forward / recv_backward


def lower_deepspeed(schedule: Schedule, *, blocking_sends: bool = True) -> CommProgram:
    """DeepSpeed's pipeline engine: each stage walks ``TrainSchedule``'s instructions
    (:func:`sim.core.deepspeed_schedule.train_schedule`), a receive or a send posted alone and waited at once (the
    blocking broadcast holds the sender too: *blocking_sends* changes nothing), a pass computed; the optimizer
    update after the stream (the end-of-batch ``OptimizerStep``), one stream per iteration. DeepSpeed runs no other
    order: a schedule whose per-device order is not TrainSchedule's is refused (:func:`_deepspeed_order`)."""
    expected = _deepspeed_order(schedule)
    b = ProgramBuilder(schedule)
    index = {key: i for i, key in enumerate(b.flat.keys.tolist())}
    S, M = schedule.stages, schedule.microbatches

    def flat(stage: int, kind: int, mb: int) -> int:
        return index[encode_key(stage, kind, mb, S)]

    for stage, d in enumerate(schedule.placement):
        for it in range(schedule.iterations):
            for step in ds.train_schedule(S, M, stage):
                for ins in step:
                    if ins.micro_batch is None or ins.name == ds.LOAD:
                        continue  # the end-of-batch reductions (not modelled) and the data loader's copy
                    mb = it * M + ins.micro_batch
                    if ins.name == ds.FORWARD:
                        b.compute(d, flat(stage, OP_F, mb))
                    elif ins.name == ds.BACKWARD:
                        b.compute(d, flat(stage, OP_B, mb))
                    elif ins.name == ds.RECV_ACT:  # the previous stage's activation
                        b.post(d, [~flat(stage - 1, OP_F, mb)], wait=True)
                    elif ins.name == ds.SEND_ACT:
                        b.post(d, [flat(stage, OP_F, mb)], wait=True)
                    elif ins.name == ds.RECV_GRAD:  # the next stage's input gradient
                        b.post(d, [~flat(stage + 1, OP_B, mb)], wait=True)
                    else:  # SendGrad
                        b.post(d, [flat(stage, OP_B, mb)], wait=True)
            for key in expected[stage][it]:
                if key_kind(key) == OP_U:
                    b.compute(d, index[key])
    return b.build("deepspeed")


def _deepspeed_order(schedule: Schedule) -> list[list[list[int]]]:
    """Per stage, per iteration, the keys DeepSpeed's engine runs: TrainSchedule's passes, then the update (where
    the schedule has updates); a :class:`LoweringError` naming the first difference where *schedule* runs another
    order (the engine has no interleaving, split backward, separate recomputation or overlapped pairs)."""
    why = f"deepspeed's engine runs its own TrainSchedule (1F1B, one stage per device); {schedule.name!r} is not it"
    S, K, M = schedule.stages, schedule.devices, schedule.microbatches
    if S != K or sorted(schedule.placement) != list(range(K)):
        raise LoweringError(f"{why}: it has {S} stages on {K} devices; simulate it with --runtime torch or pipesim")
    if len(schedule.fused):
        raise LoweringError(f"{why}: it overlaps forward/backward pairs; simulate it with --runtime torch")
    if schedule.recomputed:
        raise LoweringError(f"{why}: it recomputes forwards as separate actions; DeepSpeed's activation "
                            f"checkpointing recomputes inside BackwardPass: count the recompute in the backward's cost")
    updates = schedule.updates_per_stage
    keys, starts = schedule.keys_array.tolist(), schedule.device_start.tolist()
    out = []
    for stage, d in enumerate(schedule.placement):
        per_iteration = []
        for it in range(schedule.iterations):
            passes = [encode_key(stage, OP_F if i.name == ds.FORWARD else OP_B, it * M + i.micro_batch, S)
                      for step in ds.train_schedule(S, M, stage) for i in step if i.name in (ds.FORWARD, ds.BACKWARD)]
            per_iteration.append(passes + ([encode_key(stage, OP_U, it, S)] if updates else []))
        want = [k for keys_of_it in per_iteration for k in keys_of_it]
        got = keys[starts[d]:starts[d + 1]]
        if got != want:
            first = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
            around = slice(max(first - 2, 0), first + 3)  # a few actions either side of the first difference
            runs, would = (" ".join(str(schedule.action_of(k)) for k in ks[around]) or "nothing" for ks in (got, want))
            raise LoweringError(f"{why}: device {d} runs {runs} where TrainSchedule runs {would} (from action "
                                f"{first}); simulate it with --runtime torch or pipesim")
        out.append(per_iteration)
    return out


LOWERINGS: dict[str, Callable[..., CommProgram]] = {
    "pipesim": lower_pipesim,
    "torch-gpipe": lower_torch_gpipe,
    "torch-1f1b": lower_torch_1f1b,
    "torch-multi": lower_torch_multi,
    "megatron": lower_megatron,
    "megatron-overlap": lambda schedule, blocking_sends=True: _lower_megatron_interleaved(schedule, overlap=True),
    "megatron-overlap-flush": lambda schedule, blocking_sends=True: _lower_megatron_interleaved(
        schedule, overlap=True, warmup_flush=True),
    "deepspeed": lower_deepspeed,
}
"""Lowering name -> function (schedule, blocking_sends=...) -> :class:`CommProgram`."""


def lower(schedule: Schedule, lowering: str, *, blocking_sends: bool = False) -> CommProgram:
    """*schedule* lowered by *lowering* (a key of :data:`LOWERINGS`)."""
    return LOWERINGS[lowering](schedule, blocking_sends=blocking_sends)
