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

import functools

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations

NAME = "zb-h2"
SUMMARY = "ZB-H2: B/W split, 2(K-i)-1 warm-up forwards on stage i, W deferred: parallelogram, no bubble"
SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1, figure 4"
BUBBLE = ("(K-1)(F+B-2W) per iteration in steady state (0 for F=B=W); one iteration alone: "
          "(K-1)*max(F, F+B-2W)")
MEMORY = "up to 2K-1 micro-batches of activations on the first stage (ZB-H1 / 1F1B: K), freed after W"
CHUNKS = 1


def zb_h2_orders(devices: int, mbs: range) -> dict[int, list[Action]]:
    """One iteration of every stage, by list scheduling in unit time steps."""
    K, M = devices, len(mbs)
    finished: dict[tuple[ActionKind, int, int], int] = {}  # (kind, stage, j) -> finish step
    nf, nb, nw = [0] * K, [0] * K, [0] * K  # forwards, input-grads, weight-grads issued per stage
    orders: dict[int, list[Action]] = {i: [] for i in range(K)}
    step = 0
    while any(w < M for w in nw):
        for i in range(K):
            def done(kind: ActionKind, stage: int, j: int) -> bool:
                return finished.get((kind, stage, j), step + 1) <= step

            if nb[i] < nf[i] and (done(ActionKind.F, i, nb[i]) if i == K - 1 else done(ActionKind.B, i + 1, nb[i])):
                kind, j = ActionKind.B, nb[i]
                nb[i] += 1
            elif (nf[i] < M and (i == 0 or done(ActionKind.F, i - 1, nf[i]))
                  and nf[i] - nb[i] < 2 * (K - i) - 1 and nf[i] - nw[i] < 2 * K - 1):
                kind, j = ActionKind.F, nf[i]
                nf[i] += 1
            elif nw[i] < nb[i]:
                kind, j = ActionKind.W, nw[i]
                nw[i] += 1
            else:
                continue
            finished[(kind, i, j)] = step + 1
            orders[i].append(Action(i, kind, mbs[j]))
        step += 1
        assert step <= 6 * M * K + 2 * K, "zb-h2 list scheduler made no progress"
    return orders


def generate(cfg: PipelineConfig) -> Schedule:
    if cfg.chunks != 1:
        raise ConfigError(f"{NAME} places one stage per device; use --chunks 1 (got {cfg.chunks}), "
                          f"or zbv for two chunks per device")
    orders = functools.cache(lambda mbs: zb_h2_orders(cfg.devices, mbs))  # every device's order at once
    return flush_iterations(cfg, name=NAME, order=lambda d, mbs: orders(mbs)[d])
