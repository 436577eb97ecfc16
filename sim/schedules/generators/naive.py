"""Naive model parallelism: one micro-batch in the whole pipeline at a time.

Each micro-batch runs forward through every stage, then backward through every
stage, before the next one enters; M > 1 is gradient accumulation without any
pipelining. One update per stage at the end of each iteration. Only one device
works at any moment, so utilization is 1/K (GPipe paper, figure 2b).
"""

from __future__ import annotations

import numpy as np

from sim.core.config import PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations, forward_backward_grid

NAME = "naive"
SUMMARY = "naive model parallelism: one micro-batch at a time, no overlap"
SOURCE = "Huang et al., GPipe (2019), figure 2(b)"
BUBBLE = "1 - 1/K of every device's time is idle: utilization = 1/K"
MEMORY = "one micro-batch of activations per stage"


def naive_order(stage: int, mbs: range) -> list[Action]:
    # F then, once the gradient comes back, B; the next micro-batch's F waits for that B
    return [Action(stage, kind, m) for m in mbs for kind in (ActionKind.F, ActionKind.B)]


def naive_grid(K: int, M: int) -> np.ndarray:
    """Every stage's order as keys (K x 2M): F(j) at 2j, B(j) at 2j+1."""
    j = np.arange(M)[None, :]
    return forward_backward_grid(K, M, 2 * j, 2 * j + 1)


def generate(cfg: PipelineConfig) -> Schedule:
    return flush_iterations(cfg, name=NAME, grid=lambda M: naive_grid(cfg.devices, M))
