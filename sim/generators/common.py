"""What flush schedules share: iterations laid back to back, each ending with a flush and the updates."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import PipelineConfig
from ..ir import Action, ActionKind, Schedule

__all__ = ["flush_iterations"]


def flush_iterations(cfg: PipelineConfig, *, name: str, order: Callable[[int, range], list[Action]],
                     placement: Sequence[int] | None = None) -> Schedule:
    """cfg.iterations iterations back to back; *order(device, mbs)* is one device's actions for one iteration.

    After its last backward of an iteration (the flush) every device updates each stage it
    holds, so the next iteration's forwards read the new weights.
    """
    K, M = cfg.devices, cfg.microbatches
    placement = tuple(range(K)) if placement is None else tuple(placement)
    actions: dict[int, list[Action]] = {d: [] for d in range(K)}
    for it in range(cfg.iterations):
        mbs = range(it * M, (it + 1) * M)
        for d in range(K):
            actions[d] += order(d, mbs)
            actions[d] += [Action(s, ActionKind.U, it) for s, p in enumerate(placement) if p == d]
    return Schedule.build(name=name, devices=K, microbatches=M, iterations=cfg.iterations, placement=placement,
                          actions=actions)
