"""GPipe: all forwards, then all backwards, then a flush and one update per stage.

Every stage keeps the activations of all M micro-batches until their backward,
unless re-materialization (``recompute``) keeps only the stage input and re-runs
the forward before each backward. Backwards run in reverse micro-batch order, as
in the paper's figure.

Bubble with uniform stages and free links (Huang et al. 2019, section 2.3):
(K-1)(F+B) idle per device out of (M+K-1)(F+B), i.e. bubble fraction (K-1)/(M+K-1).
"""

from __future__ import annotations

import numpy as np

from sim.core.config import PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations, forward_backward_grid

NAME = "gpipe"
SUMMARY = "GPipe: all forwards, all backwards, flush (optionally with re-materialization)"
SOURCE = "Huang et al., GPipe (NeurIPS 2019), sections 2.2-2.3 and figure 2(c)"
BUBBLE = "(K-1)/(M+K-1) of K x makespan"
MEMORY = "M micro-batches of activations on every stage (stage inputs only with recompute)"


def gpipe_order(stage: int, mbs: range) -> list[Action]:
    return [Action(stage, ActionKind.F, m) for m in mbs] + [Action(stage, ActionKind.B, m) for m in reversed(mbs)]


def gpipe_grid(K: int, M: int) -> np.ndarray:
    """Every stage's order as keys (K x 2M): F(j) at j, B(j) at 2M-1-j (backwards in reverse)."""
    j = np.arange(M)[None, :]
    return forward_backward_grid(K, M, j, 2 * M - 1 - j)


def generate(cfg: PipelineConfig) -> Schedule:
    return flush_iterations(cfg, name=NAME, grid=lambda M: gpipe_grid(cfg.devices, M))
