"""PipeDream: asynchronous 1F1B without flushes, with weight stashing.

All M x iterations micro-batches flow through one continuous 1F1B pipeline and
every stage updates its weights right after each backward (U after each B). A
micro-batch's backward must use the weights its forward used, so stage s keeps
up to K-s weight versions (weight stashing; Narayanan et al., PipeDream, SOSP 2019,
section 3.3). The warm-up bubble is paid once, not every iteration, so
utilization tends to 1 as iterations grow.
"""

from __future__ import annotations

from ..config import PipelineConfig
from ..ir import Action, ActionKind, Schedule
from .one_f_one_b import one_f_one_b_order

NAME = "pipedream"
SUMMARY = "PipeDream: asynchronous 1F1B, no flush, update after every backward, weight stashing"
SOURCE = "Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training (SOSP 2019)"
BUBBLE = "(K-1)/(N*M+K-1) over N iterations: warm-up and cool-down only once"
MEMORY = "min(K-s, M) micro-batches of activations and K-s weight versions on stage s"


def generate(cfg: PipelineConfig) -> Schedule:
    K, total = cfg.devices, cfg.microbatches * cfg.iterations
    actions: dict[int, list[Action]] = {}
    for d in range(K):
        order = []
        for a in one_f_one_b_order(d, K, range(total)):
            order.append(a)
            if a.kind is ActionKind.B:
                order.append(Action(d, ActionKind.U, a.mb))  # update u consumes micro-batch u's gradient
        actions[d] = order
    return Schedule.build(name=NAME, devices=K, microbatches=cfg.microbatches, iterations=cfg.iterations,
                          actions=actions)
