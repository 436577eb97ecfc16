"""Lowering passes: pure Schedule -> Schedule functions, each testable on its own."""

from __future__ import annotations

from .ir import Action, ActionKind, Schedule

__all__ = ["add_recompute", "lower"]


def add_recompute(schedule: Schedule) -> Schedule:
    """Insert R(s,m) right before every B(s,m): re-materialization (GPipe paper, section 2.3).

    Between F and B a stage then keeps only its input (checkpoint_bytes); the
    activations come back during R, just before they are needed.
    """
    if schedule.recomputed:
        return schedule
    actions = {}
    for device, acts in schedule.actions.items():
        out: list[Action] = []
        for a in acts:
            if a.kind is ActionKind.B:
                out.append(Action(a.stage, ActionKind.R, a.mb))
            out.append(a)
        actions[device] = out
    return schedule.replace_actions(actions, name=f"{schedule.name}+recompute")


def lower(schedule: Schedule, *, recompute: bool = False) -> Schedule:
    """The passes every generated schedule goes through, in order, then validation."""
    if recompute:
        schedule = add_recompute(schedule)
    return schedule.validate()
