"""PipeDream-2BW: 1F1B without flushes, double-buffered weights, gradients applied with delay one.

All M x iterations micro-batches flow through one continuous 1F1B pipeline (no
flush between batches). A batch is M micro-batches; each stage accumulates the
gradients of a batch and makes one new weight version per batch (U). Micro-batches
of batch t run forward and backward on version t-1, so the update after batch t
is W(t+1) = W(t) - lr * grad f(W(t-1)): gradients applied with delay one
(Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021,
section 3.1, equation (1)). In the order, U(s, t) is placed right before the
stage's first forward of batch t+2 (or at the end), so every micro-batch of a
batch reads the same version and a stage never holds more than two versions:
the one being read by batch t+1 and the freshly made one (double buffering).

Requirement: M >= K (the paper's m >= d), otherwise in-flight micro-batches of
three batches would need three versions.
"""

from __future__ import annotations

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import OP_B, OP_F, OP_U, Schedule
from sim.schedules.common import one_f_one_b_positions, stage_keys

NAME = "pipedream-2bw"
SUMMARY = "PipeDream-2BW: continuous 1F1B, one update per batch of M, two weight versions, delay-one gradients"
SOURCE = ("Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training (PipeDream-2BW), ICML 2021, "
          "section 3.1")
BUBBLE = "(K-1)(F+B)/(N*M) of the ideal time over N iterations: warm-up and cool-down only once, as PipeDream"
MEMORY = "min(K-s, M) micro-batches of activations and 2 weight versions on stage s (PipeDream: K-s versions)"
CHUNKS = 1


def generate(cfg: PipelineConfig) -> Schedule:
    if cfg.chunks != 1:
        raise ConfigError(f"{NAME} places one stage per device; use --chunks 1 (got {cfg.chunks})")
    K, M, N = cfg.devices, cfg.microbatches, cfg.iterations
    if M < K:
        raise ConfigError(f"{NAME} needs at least as many micro-batches per batch as devices (m >= d in the paper) "
                          f"to keep two weight versions, got M={M}, K={K}; use M >= {K}")
    # device d's 1F1B order over all L = M x N micro-batches (one_f_one_b_order(d, K, range(L)), as keys), with
    # U(d, t-2) inserted just before F(d, t M) for every batch t >= 2 and the last two updates at the end
    L = M * N
    warmup = np.minimum(K - np.arange(K) - 1, L)
    f_at, b_at = one_f_one_b_positions(warmup, L)  # K x L positions in the 2L-long 1F1B order
    batches = np.arange(2, N, dtype=np.int64)
    tail = np.arange(max(0, N - 2), N, dtype=np.int64)
    rows = []
    for d in range(K):
        order = np.empty(2 * L, dtype=np.int64)
        forwards = stage_keys(d, OP_F, np.arange(L), K)
        order[f_at[d]] = forwards
        order[b_at[d]] = forwards + (OP_B - OP_F)
        order = np.insert(order, f_at[d, batches * M], stage_keys(d, OP_U, batches - 2, K))
        rows.append(np.concatenate([order, stage_keys(d, OP_U, tail, K)]))
    device_start = np.zeros(K + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=device_start[1:])
    return Schedule.from_keys(name=NAME, devices=K, microbatches=M, iterations=N, keys=np.concatenate(rows),
                              device_start=device_start)
