"""Every torch.distributed call of the validator: process groups, P2P, clocks, gathering.

Rendezvous is ``env://``: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
come from the environment, set by ``pipesim validate`` (one machine) or by torchrun
(several machines).

Deadlock-free P2P. The executor sends with ``isend`` (never blocks the sender) and
receives the messages of one peer *in the order that peer sends them*. Messages
travelling "up" (to a higher rank) and "down" (to a lower rank) use two separate
process groups, so on NCCL (which matches P2P by order, not by tag, and runs all
operations between one pair on one stream) a pending send never queues in front of
a receive going the other way. With these two rules, any schedule that
``Schedule.validate()`` accepts (no deadlock when sends never block) runs without
deadlock.

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

__all__ = ["Comm", "clock", "free_port"]

clock = time.perf_counter


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
    def from_env(cls, backend: str, timeout: float) -> Comm:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        comm = cls(rank=rank, world=world, backend=backend, timeout=timeout)
        comm.up = dist.new_group(list(range(world)), backend=backend)
        comm.down = dist.new_group(list(range(world)), backend=backend)
        comm.control = None if backend == "gloo" else dist.new_group(list(range(world)), backend="gloo")
        return comm

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
    def clock_offsets(self, rounds: int = 15) -> tuple[list[float], list[float], bool]:
        """(offset[r], uncertainty[r], one_host): rank r's clock minus rank 0's, in seconds.

        On one host every process reads the same clock and the offsets are exactly 0
        (set PIPESIM_CLOCK_PINGPONG=1 to estimate them anyway, e.g. to test the estimate).
        """
        hosts = self.gather(socket.gethostname())
        one_host = self.broadcast(None if hosts is None else len(set(hosts)) == 1)
        if one_host and os.environ.get("PIPESIM_CLOCK_PINGPONG") != "1":
            return [0.0] * self.world, [0.0] * self.world, True
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
        return [r[1] if i else 0.0 for i, r in enumerate(result)], [r[0] / 2 if i else 0.0 for i, r in enumerate(result)], False

    # -------------------------------------------------------- calibration
    def ping_pong(self, sizes: list[int], repeats: int = 10, device: torch.device | None = None) -> list[float] | None:
        """One-way time per message size between ranks 0 and 1 (median of half round trips), on rank 0."""
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
            if self.rank == 0:
                times.sort()
                out.append(times[len(times) // 2])
        return out if self.rank == 0 else None
