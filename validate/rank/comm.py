"""Every torch.distributed call of the validator: process groups, P2P, clocks, gathering.

Rendezvous: RANK, WORLD_SIZE and LOCAL_RANK come from the environment. ``pipesim validate``
on one machine also sets ``PIPESIM_RENDEZVOUS_FILE`` (:data:`RENDEZVOUS_FILE`), a file in its
private temporary folder: the ranks meet through torch's ``FileStore`` there, and no store listens
on any network interface (torch's TCP store binds every interface and has no authentication:
issue 26 item 1). Without it (torchrun, several machines) rendezvous is ``env://``:
MASTER_ADDR and MASTER_PORT name the store torchrun's agent hosts.

Deadlock-free P2P. The executor sends with ``isend`` (never blocks the sender) and
receives the messages of one peer *in the order that peer sends them*. Messages
travelling "up" (to a higher rank) and "down" (to a lower rank) use two separate
process groups, so on NCCL (which matches P2P by order, not by tag, and runs all
operations between one pair on one stream) a pending send never queues in front of
a receive going the other way. With these two rules, any schedule that
``Schedule.validate()`` accepts (no deadlock when sends never block) runs without
deadlock.

No lazy communicator creation. NCCL creates a communicator for a (group, pair) the
first time the pair exchanges a message, and that creation blocks both ranks; with
K >= 3 ranks and lazy creation, ranks can block building different pairs and never
meet. Two rules make it impossible: ``init_process_group`` gets ``device_id`` (the
rank's GPU is bound and the default communicator made eagerly), and
:meth:`Comm.connect_all` exchanges one message on every pair of every P2P group in
one global order, (0,1), (0,2), ..., (1,2), ..., before anything else runs. Each such
exchange involves only its two ranks, and every rank walks the same order, so the
smallest pair not yet connected always has both its ranks waiting on it: no deadlock
(the argument of ordered lock acquisition). The same walk runs on gloo, where it is
harmless and cheap, so the CPU tests exercise it.

Clocks: every timestamp is ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, one
clock for all processes of one host). Across hosts, :func:`clock_offsets` estimates
each rank's offset to rank 0 by ping-pong (Cristian's algorithm: the round trip
with the smallest delay wins; uncertainty = half that round trip). Units: seconds.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from validate.request import RENDEZVOUS_FILE, ClockOffsets

__all__ = ["Comm", "PipelineView", "clock", "free_port", "RENDEZVOUS_FILE", "init_method"]


def init_method() -> str:
    """``file://PATH`` when the launcher named a rendezvous file (one machine), else ``env://`` (torchrun)."""
    path = os.environ.get(RENDEZVOUS_FILE)
    return f"file://{path}" if path else "env://"

clock = time.perf_counter


@dataclass(slots=True)
class PipelineView:
    """One pipeline copy of a DP x PP run: the executor's device numbers shifted to global ranks."""

    comm: Comm
    first: int

    def isend(self, tensor: torch.Tensor, dst: int):
        return self.comm.isend(tensor, self.first + dst)

    def irecv(self, tensor: torch.Tensor, src: int):
        return self.comm.irecv(tensor, self.first + src)

    def wait(self, work) -> None:
        self.comm.wait(work)


def free_port() -> int:
    """A free TCP port on the loopback interface (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Comm:
    """One rank's process groups: ``up`` / ``down`` for P2P, ``control`` (gloo) for objects and clocks."""

    rank: int
    world: int
    backend: str
    timeout: float
    up: object = None
    down: object = None
    control: object = None

    @classmethod
    def from_env(cls, backend: str, timeout: float, device: torch.device | None = None) -> Comm:
        """Join the process group of RANK / WORLD_SIZE; on NCCL bind *device* and connect every pair eagerly."""
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        bind = {"device_id": device} if backend == "nccl" and device is not None else {}
        dist.init_process_group(backend=backend, init_method=init_method(), rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout), **bind)
        comm = cls(rank=rank, world=world, backend=backend, timeout=timeout)
        comm.up = dist.new_group(list(range(world)), backend=backend)
        comm.down = dist.new_group(list(range(world)), backend=backend)
        comm.control = None if backend == "gloo" else dist.new_group(list(range(world)), backend="gloo")
        comm.connect_all(device)
        return comm

    def pairs(self) -> list[tuple[int, int]]:
        """Every pair of ranks, in the one global order every rank walks."""
        return [(a, b) for a in range(self.world) for b in range(a + 1, self.world)]

    def connect_all(self, device: torch.device | None = None) -> list[tuple[str, int, int]]:
        """One message each way on every pair of the up and down groups, in :meth:`pairs` order.

        Returns what this rank did, ``[(group, a, b), ...]`` (for the tests of the order).
        """
        done = []
        buf = torch.zeros(1, device=device)
        for label, group in (("up", self.up), ("down", self.down)):
            for a, b in self.pairs():
                if self.rank not in (a, b):
                    continue
                sender, receiver = (a, b) if label == "up" else (b, a)
                if self.rank == sender:
                    dist.send(buf, dst=receiver, group=group)
                else:
                    dist.recv(buf, src=sender, group=group)
                done.append((label, a, b))
        return done

    def all_reduce(self, tensor: torch.Tensor, group=None) -> None:
        """Sum *tensor* over the ranks of *group* (default: every rank), in place."""
        dist.all_reduce(tensor, group=group)

    def data_parallel_groups(self, devices: int, replicas: int) -> list:
        """[p] -> the group of device p's D copies (ranks d*K + p); every rank must call this, in the same order."""
        return [dist.new_group([d * devices + p for d in range(replicas)], backend=self.backend)
                for p in range(devices)]

    def pipeline(self, first: int) -> PipelineView:
        """This rank as device ``rank - first`` of the pipeline on ranks first .. first+K-1 (DP x PP)."""
        return PipelineView(self, first)

    def _group(self, src: int, dst: int):
        return self.up if src < dst else self.down

    def isend(self, tensor: torch.Tensor, dst: int):
        return dist.isend(tensor, dst=dst, group=self._group(self.rank, dst))

    def irecv(self, tensor: torch.Tensor, src: int):
        return dist.irecv(tensor, src=src, group=self._group(src, self.rank))

    def wait(self, work) -> None:
        """Wait for a P2P operation, at most the run's timeout."""
        if self.backend == "gloo":
            work.wait(timedelta(seconds=self.timeout))
        else:
            work.wait()

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def gather(self, obj) -> list | None:
        """Every rank's *obj* on rank 0 (None elsewhere)."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def broadcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------- clocks
    def clock_offsets(self, host: str | None = None, rounds: int = 15) -> ClockOffsets:
        """Rank r's clock minus rank 0's, in seconds, with each estimate's uncertainty (every rank gets them).

        *host*: this rank's per-boot host id (:func:`validate.rank.worker.host_id`; hostnames repeat
        across containers). On one host every process reads the same clock and the offsets are
        exactly 0 (set PIPESIM_CLOCK_PINGPONG=1 to estimate them anyway, e.g. to test the estimate).
        """
        hosts = self.gather(host or socket.gethostname())
        one_host = self.broadcast(None if hosts is None else len(set(hosts)) == 1)
        if one_host and os.environ.get("PIPESIM_CLOCK_PINGPONG") != "1":
            return ClockOffsets.same_clock(self.world)
        buf = torch.zeros(1, dtype=torch.float64)
        best = [(float("inf"), 0.0)] * self.world  # rank -> (round trip, offset)
        for peer in range(1, self.world):
            for _ in range(rounds):
                if self.rank == 0:
                    t0 = clock()
                    dist.send(buf, dst=peer, group=self.control)
                    dist.recv(buf, src=peer, group=self.control)
                    t1 = clock()
                    rtt = t1 - t0
                    if rtt < best[peer][0]:
                        best[peer] = (rtt, float(buf[0]) - (t0 + t1) / 2)
                elif self.rank == peer:
                    dist.recv(buf, src=0, group=self.control)
                    buf[0] = clock()
                    dist.send(buf, dst=0, group=self.control)
        result = self.broadcast(best if self.rank == 0 else None)
        return ClockOffsets(offsets=tuple(r[1] if i else 0.0 for i, r in enumerate(result)),
                            uncertainty=tuple(r[0] / 2 if i else 0.0 for i, r in enumerate(result)), one_host=False)

    # -------------------------------------------------------- calibration
    def ping_pong(self, sizes: list[int], repeats: int = 10, device: torch.device | None = None) -> list[float] | None:
        """One-way time per message size between ranks 0 and 1 (the smallest half round trip), on rank 0."""
        if self.world < 2:
            return None
        out = []
        for n in sizes:
            buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
            times = []
            for i in range(repeats + 2):
                if self.rank == 0:
                    t0 = clock()
                    self.wait(self.isend(buf, 1))
                    self.wait(self.irecv(buf, 1))
                    if device is not None and device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if i >= 2:  # two warm-up rounds
                        times.append((clock() - t0) / 2)
                elif self.rank == 1:
                    self.wait(self.irecv(buf, 0))
                    if device is not None and device.type == "cuda":
                        torch.cuda.synchronize(device)
                    self.wait(self.isend(buf, 0))
            if self.rank == 0:  # the least disturbed round trip (as in clock_offsets): on a shared machine the
                out.append(min(times))  # median of ten still caught other processes' time slices (1 ms for 50 us)
        return out if self.rank == 0 else None
