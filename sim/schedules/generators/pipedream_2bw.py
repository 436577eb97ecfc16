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

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.generators.one_f_one_b import one_f_one_b_order

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
    actions: dict[int, list[Action]] = {}
    for d in range(K):
        order: list[Action] = []
        for a in one_f_one_b_order(d, K, range(M * N)):
            batch = a.mb // M
            if a.kind is ActionKind.F and a.mb % M == 0 and batch >= 2:
                order.append(Action(d, ActionKind.U, batch - 2))  # version made from batch t-2 serves batch t
            order.append(a)
        order += [Action(d, ActionKind.U, t) for t in range(max(0, N - 2), N)]
        actions[d] = order
    return Schedule.build(name=NAME, devices=K, microbatches=M, iterations=N, actions=actions)
