"""Lowering passes: pure Schedule -> Schedule functions, each testable on its own."""

from __future__ import annotations

import numpy as np

from .ir import OP_B, OP_R, Schedule, key_kind

__all__ = ["add_recompute", "lower"]


def add_recompute(schedule: Schedule) -> Schedule:
    """Insert R(s,m) right before every B(s,m): re-materialization (GPipe paper, section 2.3).

    Between F and B a stage then keeps only its input (checkpoint_bytes); the
    activations come back during R, just before they are needed.
    """
    if schedule.recomputed:
        return schedule
    keys, device_start = schedule.keys_array, schedule.device_start
    is_b = key_kind(keys) == OP_B
    before = np.cumsum(is_b)  # backwards up to and including each position: each gains an R in front
    out = np.empty(len(keys) + int(before[-1] if len(before) else 0), dtype=np.int64)
    at = np.arange(len(keys)) + before
    out[at] = keys
    out[at[is_b] - 1] = keys[is_b] + (OP_R - OP_B)  # R(s, m) right before B(s, m)
    shifted = device_start + np.concatenate([[0], before])[device_start]
    return schedule.replace_keys(out, shifted, name=f"{schedule.name}+recompute")


def lower(schedule: Schedule, *, recompute: bool = False) -> Schedule:
    """The passes every generated schedule goes through, in order, then validation."""
    if recompute:
        schedule = add_recompute(schedule)
    return schedule.validate()
