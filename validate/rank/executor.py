"""The executor: one rank runs its action list of a :class:`sim.core.ir.Schedule`, literally.

No schedule is implemented here. The rank walks ``schedule.actions[rank]`` in order;
before each action it receives the inputs that the schedule's derived dependencies
(:attr:`sim.core.ir.Compiled.deps`, ``~p`` = produced on another device) say come from
elsewhere; it runs the action through a ``{ActionKind: handler}`` table; and if
another device consumes the result (:attr:`sim.core.ir.Compiled.sends`) it sends it with
``isend``. When the consumer is on the same device (interleaved and V-shaped
placements) the tensor is handed over locally, no send.

An overlapped pair (:attr:`sim.core.ir.Schedule.fused`: DualPipe's forward of one micro-batch
with the backward of another) runs as the schedule defines it and as DualPipe's own
``_forward_backward_chunk`` and PyTorch's ``OVERLAP_F_B`` run it: the inputs of both halves
are received first, the halves run (one after the other: a CPU rank has one stream), and
both results are sent when the pair ends. Sending the forward's result between the halves
ran another schedule than the one predicted: DualPipeV at K=2, M=4 (mlp) measured 3.7-5.0%
shorter than predicted in every run (26 Nov 2026), its next stage starting on that result
50-60 ms before the pair's end.

Messages from one peer are received in the order that peer sends them (its action
order), one receive posted ahead per peer so data lands while the rank computes.
Together with never-blocking sends this runs every schedule that passes
``Schedule.validate()`` without deadlock (see :mod:`validate.rank.comm`).

Overhead. Between two actions the rank does work of its own: it completes receives and
posts the next ones, issues the ``isend`` of the result (on a 2-core VM an ``isend``
after a sleeping action costs 0.1-0.3 ms, the waking of an idle core), and traces. The
tracer records, per action, the time of one loop turn minus the handler's time minus the
time blocked waiting for a message: the executor's *overhead* for that action, which the
prediction adds to the action's cost (:func:`validate.predict.calibrate.in_schedule_overhead`).

Handlers (stage runtimes from :mod:`validate.rank.workloads`):

- F: forward; keeps the graph, or only the input when the schedule has R for it.
- R: forward again under grad, on the weights the F used.
- B: ``torch.autograd.grad`` w.r.t. the stage input (and the weights too unless the
  schedule has a W for this micro-batch, then the graph is kept for W).
- W: the weight gradient, accumulated.
- U: SGD step on the accumulated gradient (a new weight version: PipeDream's stash).
"""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Callable

import torch

from sim.core.ir import Action, ActionKind, Schedule, key_stage

from validate.rank.comm import Comm, clock
from validate.rank.tracing import Tracer

__all__ = ["Executor", "ActionFailed", "InjectedFault"]


class ActionFailed(RuntimeError):
    """An action raised on a rank; names the rank and the action."""

    def __init__(self, rank: int, action: Action | None, message: str) -> None:
        self.rank, self.action, self.message = rank, action, message
        where = f"at action {action}" if action is not None else "before its first action"
        super().__init__(f"rank {rank} failed {where}: {message}")


class InjectedFault(RuntimeError):
    """Raised on purpose by ``--fail-at RANK:ACTION`` (tests of the failure path).

    With PIPESIM_FAULT=kill in the environment the rank kills itself (SIGKILL) instead.
    """


class Executor:
    """Runs one rank's action list. *runtimes*: stage -> stage runtime of this rank."""

    def __init__(self, schedule: Schedule, rank: int, runtimes: dict, comm: Comm | None, tracer: Tracer | None, *,
                 inputs: Callable[[int], torch.Tensor | None], message_shape: Callable[[int], tuple[int, ...]],
                 device: torch.device, fail_at: Action | None = None) -> None:
        compiled = schedule.compiled
        self.schedule, self.rank, self.runtimes, self.comm = schedule, rank, runtimes, comm
        self.tracer, self.inputs, self.message_shape, self.device = tracer, inputs, message_shape, device
        self.fail_at = fail_at
        self.keys = compiled.keys[rank]
        self.deps = compiled.deps
        self.sends = compiled.sends
        # src rank -> producer keys it sends to us, in its action order
        self.expected = {src: deque(k for k in compiled.keys[src] if compiled.sends.get(k) == rank)
                         for src in range(schedule.devices) if src != rank}
        self.values: dict[int, torch.Tensor] = {}  # producer key -> tensor waiting for its consumer here
        self.pending: dict[int, tuple[int, object, torch.Tensor]] = {}  # src -> (producer key, work, buffer)
        self.outgoing: list[tuple[object, torch.Tensor]] = []  # sends in flight (buffers kept alive)
        # the forward of each overlapped pair on this rank -> the backward it runs with (the next key)
        fused = set(compiled.flat.keys[schedule.fused].tolist())
        self.paired = {int(k): int(self.keys[i + 1]) for i, k in enumerate(self.keys[:-1]) if int(k) in fused}
        self.current: Action | None = None
        self.blocked = 0.0  # seconds the current action waited for messages (excluded from its overhead)
        self.handlers: dict[ActionKind, Callable[[Action], torch.Tensor | None]] = {
            ActionKind.F: self._forward,
            ActionKind.B: self._backward,
            ActionKind.W: self._weight,
            ActionKind.R: self._recompute,
            ActionKind.U: self._update,
        }

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        """Run every action of this rank; raises :class:`ActionFailed` naming the action on any error."""
        try:
            for src in self.expected:
                self._post(src)
            action_of = self.schedule.action_of
            held: list[tuple[int, torch.Tensor]] = []  # a pair's forward result, sent when the pair ends
            for key in map(int, self.keys):
                action = self.current = action_of(key)
                if action == self.fail_at:
                    if os.environ.get("PIPESIM_FAULT") == "kill":  # die without a word, as a crashed rank does
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise InjectedFault(f"fault injected at {action} (--fail-at {self.rank}:{action})")
                entered = clock()
                self.blocked = 0.0
                # a pair starts once the inputs of both its halves are here
                for needed in (key, self.paired[key]) if key in self.paired else (key,):
                    for dep in self.deps[needed]:
                        if dep < 0:
                            self._receive(~dep)
                self._poll()
                started = self.tracer.begin() if self.tracer else None
                h0 = clock()
                out = self.handlers[action.kind](action)
                h1 = clock()
                if self.tracer:
                    self.tracer.end(key, started)
                if out is not None:
                    held.append((key, out))
                if key not in self.paired:  # not the first half of a pair: its result, and the pair's, go now
                    for done, result in held:
                        self._deliver(done, result)
                    held.clear()
                if self.tracer:  # the rank's own time around this action, neither computing nor waiting
                    self.tracer.overhead(key, clock() - entered - (h1 - h0) - self.blocked)
            self.current = None
            for work, _ in self.outgoing:
                self.comm.wait(work)
            self.outgoing.clear()
        except ActionFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure must name the rank and action
            raise ActionFailed(self.rank, self.current, f"{type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------- handlers
    def _forward(self, a: Action) -> torch.Tensor:
        if a.stage == 0:
            x = self.inputs(a.mb)
        else:
            x = self.values.pop(self.schedule.key(Action(a.stage - 1, ActionKind.F, a.mb)))
        keep = (a.stage, a.mb) not in self.schedule.recomputed
        out = self.runtimes[a.stage].forward(a.mb, x, keep_graph=keep)
        return out if a.stage < self.schedule.stages - 1 else None

    def _backward(self, a: Action) -> torch.Tensor | None:
        grad_out = None
        if a.stage < self.schedule.stages - 1:
            grad_out = self.values.pop(self.schedule.key(Action(a.stage + 1, ActionKind.B, a.mb)))
        split = (a.stage, a.mb) in self.schedule.split_backward
        return self.runtimes[a.stage].backward(a.mb, grad_out, split=split)

    def _weight(self, a: Action) -> None:
        self.runtimes[a.stage].weight(a.mb)

    def _recompute(self, a: Action) -> None:
        self.runtimes[a.stage].recompute(a.mb)

    def _update(self, a: Action) -> None:
        self.runtimes[a.stage].update(a.mb)

    # -------------------------------------------------------- communication
    def _deliver(self, key: int, out: torch.Tensor) -> None:
        dst = self.sends.get(key)
        if dst is None:  # the consumer is on this device: hand over, no send
            self.values[key] = out
            return
        buf = out.detach().contiguous()
        if self.tracer:
            self.tracer.sent(key, dst, buf.numel() * buf.element_size())
        self.outgoing.append((self.comm.isend(buf, dst), buf))
        if len(self.outgoing) > 64:
            self.outgoing = [(w, b) for w, b in self.outgoing if not w.is_completed()]

    def _post(self, src: int) -> None:
        queue = self.expected[src]
        if not queue:
            self.pending.pop(src, None)
            return
        key = queue.popleft()
        buf = torch.empty(self.message_shape(key), dtype=torch.float32, device=self.device)
        self.pending[src] = (key, self.comm.irecv(buf, src), buf)

    def _complete(self, src: int, at: float | None, *, waited: bool = False) -> None:
        key, work, buf = self.pending[src]
        if not waited:  # exactly once per receive: gloo's wait consumes a completion (a second one blocks);
            self.comm.wait(work)  # on NCCL it orders the rank's stream after the receive
        self.values[key] = buf
        if self.tracer:
            self.tracer.arrived(key, at)
        self._post(src)

    def _receive(self, producer: int) -> None:
        """Make the result of *producer* (made on another rank) available, receiving in the sender's order."""
        if producer in self.values:
            return
        src = self.schedule.placement[key_stage(producer, self.schedule.stages)]
        while producer not in self.values:
            if src not in self.pending:
                raise RuntimeError(f"no message left from rank {src} for {self.schedule.action_of(producer)}")
            _, work, _ = self.pending[src]
            waiting = clock()
            self.comm.wait(work)
            arrived = clock()
            self.blocked += arrived - waiting  # the message's time, not the executor's (see run's overhead)
            self._complete(src, arrived, waited=True)

    def _poll(self) -> None:
        """Record arrivals that completed while this rank was computing."""
        for src in list(self.pending):
            while src in self.pending and self.pending[src][1].is_completed():
                self._complete(src, clock())
