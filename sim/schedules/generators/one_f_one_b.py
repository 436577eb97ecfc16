"""1F1B with a flush (PipeDream-Flush, DAPPLE): bounded activation memory, GPipe's bubble.

Stage s runs a warm-up of min(K-s-1, M) forwards, then alternates one forward
and one backward, then drains the remaining backwards (cool-down), flushes and
updates. At most min(K-s, M) micro-batches are in flight on stage s, instead of
GPipe's M; the bubble is the same (K-1)/(M+K-1) with uniform stages
(Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training, 2021;
Fan et al., DAPPLE, 2021).
"""

from __future__ import annotations

import numpy as np

from sim.core.config import PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations, forward_backward_grid, one_f_one_b_positions

NAME = "1f1b"
SUMMARY = "1F1B / PipeDream-Flush (DAPPLE): warm-up, one-forward-one-backward, cool-down, flush"
SOURCE = "Narayanan et al., PipeDream-2BW/Flush (ICML 2021); Fan et al., DAPPLE (PPoPP 2021)"
BUBBLE = "(K-1)/(M+K-1) of K x makespan, as GPipe"
MEMORY = "min(K-s, M) micro-batches of activations on stage s"


def one_f_one_b_order(stage: int, devices: int, mbs: range) -> list[Action]:
    """Warm-up, steady 1F1B and cool-down of one stage over the micro-batches *mbs*."""
    warmup = min(devices - stage - 1, len(mbs))
    forwards = [Action(stage, ActionKind.F, m) for m in mbs]
    backwards = [Action(stage, ActionKind.B, m) for m in mbs]
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards):
        order += [f, b]
    order += backwards[len(mbs) - warmup:]
    return order


def one_f_one_b_grid(K: int, M: int) -> np.ndarray:
    """Every stage's order as keys (K x 2M), the same as :func:`one_f_one_b_order` for each stage."""
    warmup = np.minimum(K - np.arange(K) - 1, M)
    return forward_backward_grid(K, M, *one_f_one_b_positions(warmup, M))


def generate(cfg: PipelineConfig) -> Schedule:
    return flush_iterations(cfg, name=NAME, grid=lambda M: one_f_one_b_grid(cfg.devices, M))
