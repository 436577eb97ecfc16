"""GPipe: all forwards, then all backwards, then a flush and one update per stage.

Every stage keeps the activations of all M micro-batches until their backward,
unless re-materialization (``recompute``) keeps only the stage input and re-runs
the forward before each backward. Backwards run in reverse micro-batch order, as
in the paper's figure.

Bubble with uniform stages and free links (Huang et al. 2019, section 2.2):
(K-1)(F+B) idle per device out of (M+K-1)(F+B), i.e. bubble fraction (K-1)/(M+K-1).
"""

from __future__ import annotations

from ..config import PipelineConfig
from ..ir import Action, ActionKind, Schedule

NAME = "gpipe"
SUMMARY = "GPipe: all forwards, all backwards, flush (optionally with re-materialization)"
SOURCE = "Huang et al., GPipe (NeurIPS 2019), section 2.2 and figure 2(c)"
BUBBLE = "(K-1)/(M+K-1) of K x makespan"
MEMORY = "M micro-batches of activations on every stage (stage inputs only with recompute)"


def generate(cfg: PipelineConfig) -> Schedule:
    K, M = cfg.devices, cfg.microbatches
    actions: dict[int, list[Action]] = {d: [] for d in range(K)}
    for it in range(cfg.iterations):
        mbs = range(it * M, (it + 1) * M)
        for d in range(K):
            actions[d] += [Action(d, ActionKind.F, m) for m in mbs]
            actions[d] += [Action(d, ActionKind.B, m) for m in reversed(mbs)]
            actions[d].append(Action(d, ActionKind.U, it))
    return Schedule.build(name=NAME, devices=K, microbatches=M, iterations=cfg.iterations, actions=actions)
