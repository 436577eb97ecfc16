"""A stage of one pipeline copy in DP x PP: its update all-reduces the gradient with the other copies first.

Used by the worker when a request has replicas (:mod:`validate.dp` runs them); with padding, each action is also
emulated up to its cost (the same Sleeper as the emulated workload).
"""

from __future__ import annotations

import torch

from sim.core.ir import ActionKind

from validate.rank.comm import clock
from validate.rank.workloads import Sleeper

__all__ = ["ReplicatedStage"]


class ReplicatedStage:
    """A stage runtime of one copy: U all-reduces the update's gradient first; F/B/W/R padded to *costs*.

    Everything else (reset, logs, weights) is the wrapped runtime's.
    """

    def __init__(self, inner, stage: int, *, costs, comm, group, replicas: int, log: list) -> None:
        self.inner, self.stage, self.costs, self.comm = inner, stage, costs, comm
        self.group, self.replicas, self.log = group, replicas, log
        self.sleeper = Sleeper()  # waits precisely: time.sleep alone wakes 0.05-0.2 ms late

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _pad(self, started: float, kind: ActionKind, *, split: bool = False) -> None:
        """The emulated part: wait until the action has taken its cost (the real compute is shorter)."""
        if self.costs is None:
            return
        self.sleeper.until(started + self.costs.cost(self.stage, kind, split=split))

    def forward(self, mb, x, *, keep_graph=True):
        t0 = clock()
        out = self.inner.forward(mb, x, keep_graph=keep_graph)
        self._pad(t0, ActionKind.F)
        return out

    def backward(self, mb, grad_out, *, split):
        t0 = clock()
        out = self.inner.backward(mb, grad_out, split=split)
        self._pad(t0, ActionKind.B, split=split)
        return out

    def weight(self, mb):
        t0 = clock()
        self.inner.weight(mb)
        self._pad(t0, ActionKind.W)

    def recompute(self, mb):
        t0 = clock()
        self.inner.recompute(mb)
        self._pad(t0, ActionKind.R)

    def update(self, u):
        if self.group is not None:
            t0 = clock()
            acc = self.inner.grads.setdefault(u, {})
            weights = self.inner.versions[self.inner.current]
            names = list(weights)  # the module's order: the same on every copy
            for k in names:
                if k not in acc:
                    acc[k] = torch.zeros_like(weights[k]).detach()
            flat = torch.cat([acc[k].reshape(-1) for k in names])
            self.comm.all_reduce(flat, group=self.group)  # the real collective among the D copies of this stage
            flat /= self.replicas
            offset = 0
            for k in names:
                n = acc[k].numel()
                acc[k].copy_(flat[offset:offset + n].view_as(acc[k]))
                offset += n
            self.log.append((self.stage, t0, clock()))
        self.inner.update(u)
