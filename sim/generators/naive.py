"""Naive model parallelism: one micro-batch in the whole pipeline at a time.

Each micro-batch runs forward through every stage, then backward through every
stage, before the next one enters; M > 1 is gradient accumulation without any
pipelining. One update per stage at the end of each iteration. Only one device
works at any moment, so utilization is 1/K (GPipe paper, figure 2b).
"""

from __future__ import annotations

from ..config import PipelineConfig
from ..ir import Action, ActionKind, Schedule

NAME = "naive"
SUMMARY = "naive model parallelism: one micro-batch at a time, no overlap"
SOURCE = "Huang et al., GPipe (2019), figure 2(b)"
BUBBLE = "1 - 1/K of every device's time is idle: utilization = 1/K"
MEMORY = "one micro-batch of activations per stage"


def generate(cfg: PipelineConfig) -> Schedule:
    K, M = cfg.devices, cfg.microbatches
    actions: dict[int, list[Action]] = {d: [] for d in range(K)}
    for it in range(cfg.iterations):
        for m in range(it * M, (it + 1) * M):
            for d in range(K):
                # device d: F then, once the gradient comes back, B; the next F waits for that B
                actions[d] += [Action(d, ActionKind.F, m), Action(d, ActionKind.B, m)]
        for d in range(K):
            actions[d].append(Action(d, ActionKind.U, it))
    return Schedule.build(name=NAME, devices=K, microbatches=M, iterations=cfg.iterations, actions=actions)
