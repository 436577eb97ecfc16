"""ZB-H2: zero-bubble schedule that trades memory for a bubble-free steady state.

Like ZB-H1 the backward is split into B (input gradient, on the critical path) and
W (weight gradient, deferrable). Stage i runs 2(K-i)-1 forwards before its first B
(instead of K-i), so the warm-up bubble is filled with forwards, and W passes are
deferred to the tail so that the iteration becomes a parallelogram: stage i starts
at i*F and never waits (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024,
section 3.1 and figure 4). Since a stage's update only waits for its own gradients
(no global optimizer synchronization, the paper's section 4 "post-validation"),
consecutive iterations interlock and the steady-state time per iteration is
M(F+B+W) + (K-1)(F+B-2W), zero for F = B = W. One iteration alone takes
M(F+B+W) + (K-1) max(F, F+B-2W).

The order is built by a list scheduler over unit costs (F = B = W = 1) with the
paper's rules: a ready B first; else a forward while stage i has fewer than
2(K-i)-1 forwards without their B and fewer than 2K-1 micro-batches held; else a
pending W. Memory: up to 2K-1 micro-batches of activations (freed after W).
"""

from __future__ import annotations

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import NUM_KINDS, OP_B, OP_F, OP_W, Schedule
from sim.schedules.common import flush_iterations

NAME = "zb-h2"
SUMMARY = "ZB-H2: B/W split, 2(K-i)-1 warm-up forwards on stage i, W deferred: parallelogram, no bubble"
SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1, figure 4"
BUBBLE = ("(K-1)(F+B-2W) per iteration in steady state (0 for F=B=W); one iteration alone: "
          "(K-1)*max(F, F+B-2W)")
MEMORY = "up to 2K-1 micro-batches of activations on the first stage (ZB-H1 / 1F1B: K), freed after W"
CHUNKS = 1


def zb_h2_orders(devices: int, M: int) -> list[np.ndarray]:
    """One iteration of every stage over micro-batches 0..M-1, as keys, by list scheduling in unit time steps."""
    K = devices
    never = 6 * M * K + 2 * K + 2  # after the last step: "not finished yet"
    # finish step of F, B of (stage, j): flat lists (stage * M + j); W's are never waited on
    f_done, b_done = [never] * (K * M), [never] * (K * M)
    nf, nb, nw = [0] * K, [0] * K, [0] * K  # forwards, input-grads, weight-grads issued per stage
    orders: list[list[int]] = [[] for _ in range(K)]
    step = 0
    while any(w < M for w in nw):
        for i in range(K):  # every stage decides on what finished before this step (finish <= step)
            if nb[i] < nf[i] and (f_done[i * M + nb[i]] if i == K - 1 else b_done[(i + 1) * M + nb[i]]) <= step:
                kind, j = OP_B, nb[i]
                nb[i] += 1
                b_done[i * M + j] = step + 1
            elif (nf[i] < M and (i == 0 or f_done[(i - 1) * M + nf[i]] <= step)
                  and nf[i] - nb[i] < 2 * (K - i) - 1 and nf[i] - nw[i] < 2 * K - 1):
                kind, j = OP_F, nf[i]
                nf[i] += 1
                f_done[i * M + j] = step + 1
            elif nw[i] < nb[i]:
                kind, j = OP_W, nw[i]
                nw[i] += 1
            else:
                continue
            orders[i].append((j * K + i) * NUM_KINDS + kind)  # encode_key(i, kind, j, K)
        step += 1
        assert step <= 6 * M * K + 2 * K, "zb-h2 list scheduler made no progress"
    return [np.asarray(keys, dtype=np.int64) for keys in orders]


def generate(cfg: PipelineConfig) -> Schedule:
    if cfg.chunks != 1:
        raise ConfigError(f"{NAME} places one stage per device; use --chunks 1 (got {cfg.chunks}), "
                          f"or zbv for two chunks per device")
    return flush_iterations(cfg, name=NAME, grid=lambda M: np.stack(zb_h2_orders(cfg.devices, M)))
