"""All K ranks in one process, one thread each, with queues for links: the executor without torch.distributed.

For tests and debugging: the same :class:`validate.rank.executor.Executor` and stage
runtimes as a real run, but messages travel through in-process FIFO queues (one
per sender, receiver and direction, matched in order like the process groups of
:mod:`validate.rank.comm`). Sends never block; a receive waits at most *timeout*
seconds and then raises, so a wrong schedule fails instead of hanging.

Timings from here are not measurements of anything (threads share the GIL); use
:func:`validate.run_validation` for those.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from sim.model.cost import StageCosts
from sim.core.ir import Action, Schedule

from validate.rank.executor import ActionFailed, Executor
from validate.request import RankResult, WorkloadSpec
from validate.rank.tracing import Tracer
from validate.rank.workloads import rank_setup

__all__ = ["run_in_process", "QueueComm"]


@dataclass(slots=True)
class _Done:
    def is_completed(self) -> bool:
        return True


class _Recv:
    def __init__(self, q: queue.Queue, buf: torch.Tensor, timeout: float) -> None:
        self.q, self.buf, self.timeout, self.done = q, buf, timeout, False

    def _take(self, block: bool) -> bool:
        if self.done:
            return True
        try:
            data = self.q.get(block=block, timeout=self.timeout if block else None)
        except queue.Empty:
            if block:
                raise TimeoutError(f"no message arrived within {self.timeout:g} s") from None
            return False
        if data.shape != self.buf.shape:
            raise RuntimeError(f"message of shape {tuple(data.shape)} received into a buffer of {tuple(self.buf.shape)}")
        self.buf.copy_(data)
        self.done = True
        return True

    def is_completed(self) -> bool:
        return self._take(block=False)

    def wait(self) -> None:
        self._take(block=True)


class QueueComm:
    """The part of :class:`validate.rank.comm.Comm` the executor uses, over in-process queues."""

    def __init__(self, rank: int, links: dict, timeout: float) -> None:
        self.rank, self.links, self.timeout = rank, links, timeout

    def isend(self, tensor: torch.Tensor, dst: int):
        self.links[(self.rank, dst)].put(tensor.clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int):
        return _Recv(self.links[(src, self.rank)], tensor, self.timeout)

    def wait(self, work) -> None:
        if isinstance(work, _Recv):
            work.wait()


def run_in_process(schedule: Schedule, spec: WorkloadSpec, *, costs: StageCosts | None = None,
                   timeout: float = 30.0, fail_at: str | None = None) -> dict:
    """Run *schedule* with K threads; returns ``{"ranks": [RankResult or None per rank], "errors": [...]}``.

    Each :class:`validate.request.RankResult` has one trace, and the update logs
    (gradient applied and weights after, per update of each stage), as in a real run.
    """
    K = schedule.devices
    schedule.validate()
    cpu = torch.device("cpu")
    links = {(a, b): queue.Queue() for a in range(K) for b in range(K) if a != b}
    results: list[RankResult | None] = [None] * K
    errors: list[ActionFailed] = []
    failing = None
    if fail_at:
        r, _, a = fail_at.partition(":")
        failing = (int(r), Action.parse(a))

    def rank_main(rank: int) -> None:
        setup = rank_setup(spec, schedule, rank, cpu, costs)
        tracer = Tracer(rank, cpu)
        ex = Executor(schedule, rank, setup.runtimes, QueueComm(rank, links, timeout), tracer, inputs=setup.inputs,
                      message_shape=setup.message_shape, device=cpu,
                      fail_at=failing[1] if failing and failing[0] == rank else None)
        try:
            ex.run()
        except ActionFailed as exc:
            errors.append(exc)
            return
        logs = {s: rt.update_log() for s, rt in setup.runtimes.items()}
        results[rank] = RankResult(rank=rank, traces=[tracer.finish()], calibration=None,
                                   grads={s: g for s, (g, _) in logs.items()},
                                   weights={s: w for s, (_, w) in logs.items()})

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(K)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 4)
    return {"ranks": results, "errors": errors}
