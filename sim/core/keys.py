"""The one key codec: every action of a schedule as one integer, and the error a schedule that cannot run raises.

Hot paths (validation, engines, executor, traces) identify an action by one integer, so dependencies are integer
arithmetic; the codec and :class:`ScheduleError` live below everything else so that any layer can use them without
importing the schedule IR (:mod:`sim.core.ir`) or the engines.
"""

from __future__ import annotations

from sim.errors import PipesimError

__all__ = ["ScheduleError", "NUM_KINDS", "OP_F", "OP_B", "OP_W", "OP_R", "OP_U", "OP_SEND_F", "OP_SEND_B", "encode_key",
           "decode_key", "key_kind", "key_stage", "key_mb", "microbatch_shift", "transfer_op", "boundary_stage"]


class ScheduleError(PipesimError):
    """A schedule that cannot run: missing, duplicate or misplaced actions, or a deadlock."""


# ------------------------------------------------------------------ the one key codec
# Hot paths (validation, engines, executor, traces) identify an action by one integer,
#     key = (mb * S + stage) * NUM_KINDS + kind ordinal        (S: the schedule's stages)
# so dependencies are integer arithmetic. Every encode and decode goes through the
# functions below; they take Python ints or numpy integer arrays alike.
NUM_KINDS = 5
OP_F, OP_B, OP_W, OP_R, OP_U = range(NUM_KINDS)
"""Kind ordinals, in :class:`ActionKind` order; also the timeline's op codes of computations."""
OP_SEND_F, OP_SEND_B = NUM_KINDS, NUM_KINDS + 1
"""Timeline op codes of transfers: an activation forward, a gradient backward (see :mod:`sim.results.timeline`)."""


def encode_key(stage, kind, mb, stages: int):
    """The key of action (*stage*, *kind* ordinal, *mb*) in a schedule of *stages* stages."""
    return (mb * stages + stage) * NUM_KINDS + kind


def key_kind(key):
    """Kind ordinal (OP_F .. OP_U) of *key*."""
    return key % NUM_KINDS


def key_stage(key, stages: int):
    return (key // NUM_KINDS) % stages


def key_mb(key, stages: int):
    """Micro-batch of *key* (the update number for a U)."""
    return key // NUM_KINDS // stages


def decode_key(key: int, stages: int) -> tuple[int, int, int]:
    """(stage, kind ordinal, mb) of *key*."""
    rest, kind = divmod(key, NUM_KINDS)
    mb, stage = divmod(rest, stages)
    return stage, kind, mb


def microbatch_shift(count, stages: int):
    """What adding *count* to an action's micro-batch adds to its key (the same for every stage and kind)."""
    return count * stages * NUM_KINDS


def transfer_op(producer):
    """Timeline op code of the transfer carrying *producer*'s result: SEND_F for a forward, else SEND_B."""
    return OP_SEND_F + (key_kind(producer) != OP_F)  # arithmetic, so ints and arrays alike


def boundary_stage(producer, stages: int):
    """The stage boundary a transfer crosses, as the index of ``StageCosts.send_bytes`` it carries:
    F(s) sends s's activation (boundary s), B(s) sends the gradient of s's input (boundary s-1)."""
    stage = key_stage(producer, stages)
    return stage - (key_kind(producer) != OP_F)
