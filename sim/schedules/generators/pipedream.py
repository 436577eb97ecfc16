"""PipeDream: asynchronous 1F1B without flushes, with weight stashing.

All M x iterations micro-batches flow through one continuous 1F1B pipeline and
every stage updates its weights right after each backward (U after each B). A
micro-batch's backward must use the weights its forward used, so stage s keeps
up to K-s weight versions (weight stashing; Narayanan et al., PipeDream, SOSP 2019,
section 3.3). The warm-up bubble is paid once, not every iteration, so
utilization tends to 1 as iterations grow.
"""

from __future__ import annotations

import numpy as np

from sim.core.config import PipelineConfig
from sim.core.ir import OP_B, OP_F, OP_U, Schedule
from sim.schedules.common import one_f_one_b_positions, stage_keys

NAME = "pipedream"
SUMMARY = "PipeDream: asynchronous 1F1B, no flush, update after every backward, weight stashing"
SOURCE = "Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training (SOSP 2019)"
BUBBLE = "(K-1)/(N*M+K-1) over N iterations: warm-up and cool-down only once"
MEMORY = "min(K-s, M) micro-batches of activations and K-s weight versions on stage s"


def generate(cfg: PipelineConfig) -> Schedule:
    """One continuous 1F1B over all M x iterations micro-batches, U(d, j) right after every B(d, j).

    In the 1F1B order (:func:`sim.schedules.common.one_f_one_b_positions`) F(j), j >= w, has j-w
    backwards before it and B(j) has j; each of those is now followed by its U, which shifts them.
    """
    K, total = cfg.devices, cfg.microbatches * cfg.iterations
    warmup = np.minimum(K - np.arange(K) - 1, total)
    f_at, b_at = one_f_one_b_positions(warmup, total)
    j = np.arange(total)[None, :]
    f_at = f_at + np.maximum(j - warmup[:, None], 0)
    b_at = b_at + j
    stage = np.arange(K)[:, None]
    rows = np.empty((K, 3 * total), dtype=np.int64)
    for kind, at in ((OP_F, f_at), (OP_B, b_at), (OP_U, b_at + 1)):  # update u consumes micro-batch u's gradient
        np.put_along_axis(rows, at, np.broadcast_to(stage_keys(stage, kind, j, K), (K, total)), axis=1)
    return Schedule.from_keys(name=NAME, devices=K, microbatches=cfg.microbatches, iterations=cfg.iterations,
                              keys=rows.ravel(), device_start=np.arange(K + 1, dtype=np.int64) * 3 * total)
