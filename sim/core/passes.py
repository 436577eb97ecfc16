"""Lowering passes: pure Schedule -> Schedule functions, each testable on its own."""

from __future__ import annotations

import numpy as np

from sim.core.ir import OP_B, OP_R, Schedule, key_kind

__all__ = ["add_recompute", "lower"]


def add_recompute(schedule: Schedule) -> Schedule:
    """Insert R(s,m) right before every B(s,m): re-materialization (GPipe paper, section 2.3).

    Between F and B a stage then keeps only its input (checkpoint_bytes); the
    activations come back during R, just before they are needed.
    """
    if schedule.recomputed:
        return schedule
    keys, device_start, fused = schedule.keys_array, schedule.device_start, schedule.fused
    backwards = np.flatnonzero(key_kind(keys) == OP_B)
    # R goes right before its B; before the whole pair when the B is the second half of an overlapped pair
    insert_at = np.where(np.isin(backwards, fused + 1), backwards - 1, backwards)  # unique: a pair starts with F
    inserted = np.sort(insert_at)
    new_position = np.arange(len(keys)) + np.searchsorted(inserted, np.arange(len(keys)), side="right")
    out = np.empty(len(keys) + len(backwards), dtype=np.int64)
    out[new_position] = keys
    out[new_position[insert_at] - 1] = keys[backwards] + (OP_R - OP_B)  # R(s, m): same stage and micro-batch
    shifted = device_start + np.searchsorted(inserted, device_start, side="left")
    return schedule.replace_keys(out, shifted, name=f"{schedule.name}+recompute", fused=new_position[fused])


def lower(schedule: Schedule, *, recompute: bool = False) -> Schedule:
    """The passes every generated schedule goes through, in order, then validation."""
    if recompute:
        schedule = add_recompute(schedule)
    return schedule.validate()
