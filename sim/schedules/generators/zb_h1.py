"""ZB-H1: 1F1B with the backward split into B (input gradient) and W (weight gradient).

Only B is on the critical path between stages, so each stage sends its input
gradient upstream as soon as it can and runs the W passes later, where 1F1B
would idle. Stage i keeps 1F1B's warm-up of K-i-1 forwards and its F/B
alternation, but runs each W i steps late (stage 0 at once, the last stage K-1
steps late); the delayed W passes fill the cool-down bubbles. Activations are
freed after W, so every stage holds at most K micro-batches: 1F1B's peak on the
first stage (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, section 3.1
and figure 3).

Bubble with uniform stages and free links, F, B, W being the three parts:
(K-1)(F+B-W) per device per iteration, against 1F1B's (K-1)(F+B+W), for M >= K.
With a link latency L (small against the stage costs) and M >= 2K, stage 0 has no
slack between its first B and its last W, so both the first and the last
micro-batch's round trips (K-1 links down, K-1 back) are on the critical path:
+4(K-1)L.
"""

from __future__ import annotations

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import OP_B, OP_F, OP_W, Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations, stage_keys

NAME = "zb-h1"
SUMMARY = "ZB-H1: 1F1B with B/W split; W passes delayed i steps on stage i fill the cool-down bubble"
SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1, figure 3"
BUBBLE = "(K-1)(F+B-W) per iteration for M >= K (1F1B: (K-1)(F+B+W)); F, B, W = forward, input-grad, weight-grad"
MEMORY = "at most K micro-batches of activations on every stage (1F1B's peak), freed after W"
CHUNKS = 1


def zb_h1_order(stage: int, devices: int, mbs: range) -> list[Action]:
    """One iteration of stage *stage*: warm-up, F B (W delayed by *stage*), cool-down, pending W."""
    def act(kind: ActionKind, j: int) -> Action:
        return Action(stage, kind, mbs[j])

    M = len(mbs)
    warmup = min(devices - stage - 1, M)
    order = [act(ActionKind.F, j) for j in range(warmup)]
    weights = 0  # W passes issued so far
    for j in range(M):
        if j + warmup < M:
            order.append(act(ActionKind.F, j + warmup))
        order.append(act(ActionKind.B, j))
        if j >= stage:  # W of micro-batch j - stage: `stage` passes late
            order.append(act(ActionKind.W, weights))
            weights += 1
    order += [act(ActionKind.W, j) for j in range(weights, M)]
    return order


def generate(cfg: PipelineConfig) -> Schedule:
    if cfg.chunks != 1:
        raise ConfigError(f"{NAME} places one stage per device; use --chunks 1 (got {cfg.chunks}), "
                          f"or zbv for two chunks per device")
    return flush_iterations(cfg, name=NAME, grid=lambda M: zb_h1_grid(cfg.devices, M))


def zb_h1_grid(K: int, M: int) -> np.ndarray:
    """Every stage's order as keys (K x 3M), the same as :func:`zb_h1_order` for each stage.

    Stage d: w = min(K-d-1, M) forwards; then step j emits F(j+w) if j+w < M, B(j), and W(j-d) if j >= d;
    then the W passes not yet issued. A step's first position is w plus what the earlier steps emitted.
    """
    d = np.arange(K)[:, None]
    j = np.arange(M)[None, :]
    w = np.minimum(K - d - 1, M)
    has_f, has_w = (j + w < M).astype(np.int64), (j >= d).astype(np.int64)
    step_start = w + np.cumsum(has_f + 1 + has_w, axis=1) - (has_f + 1 + has_w)
    out = np.empty((K, 3 * M), dtype=np.int64)
    rows = np.broadcast_to(d, (K, M))
    warm = np.broadcast_to(j < w, (K, M))  # warm-up forwards at 0..w-1; the others in their step (below)
    out[rows[warm], np.broadcast_to(j, (K, M))[warm]] = stage_keys(rows, OP_F, j, K)[warm]
    later = np.broadcast_to(j + w < M, (K, M))  # step j's forward is F(j + w)
    out[rows[later], np.broadcast_to(step_start, (K, M))[later]] = stage_keys(rows, OP_F, j + w, K)[later]
    out[rows, np.broadcast_to(step_start + has_f, (K, M))] = stage_keys(rows, OP_B, j, K)
    in_step = np.broadcast_to(has_w.astype(bool), (K, M))
    out[rows[in_step], (step_start + has_f + 1)[in_step]] = stage_keys(rows, OP_W, j - d, K)[in_step]
    issued = np.maximum(M - d, 0)  # W passes issued inside the steps; the rest trail in order, at the end
    tail = np.broadcast_to(j >= issued, (K, M))
    out[rows[tail], np.broadcast_to(2 * M + j, (K, M))[tail]] = stage_keys(rows, OP_W, j, K)[tail]
    return out
