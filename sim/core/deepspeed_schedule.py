"""DeepSpeed's pipeline ``TrainSchedule``: the instruction stream each stage executes, ported line by line.

``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule`` gives every stage ``2 (M + p - 1)`` *steps*, each with at
most one ForwardPass or BackwardPass, preceded by the step's exchanges with ONE neighbour (a forward step talks to
the previous stage, a backward step to the next); the engine (``pipe/engine.py`` ``_exec_schedule``) runs the
instructions in order, every exchange a blocking, paired ``dist.broadcast`` in a two-rank group (``pipe/p2p.py``).

:func:`train_schedule` is a line-by-line port of ``TrainSchedule.steps`` and ``_step_to_micro_batch`` (DeepSpeed
commit 077e6740). It lives here, below the models, because two layers read it: the ``deepspeed`` runtime's
lowering (:func:`sim.core.comm_lowering.lower_deepspeed`) and the published-runs executor
(:mod:`sim.model.deepspeed_pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import PipesimError

__all__ = ["DeepSpeedScheduleError", "Instruction", "train_schedule", "FORWARD", "BACKWARD", "SEND_ACT", "RECV_ACT",
           "SEND_GRAD", "RECV_GRAD", "LOAD", "END_OF_BATCH", "PAIR"]

FORWARD, BACKWARD = "ForwardPass", "BackwardPass"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SendActivation", "RecvActivation", "SendGrad", "RecvGrad"
LOAD = "LoadMicroBatch"
END_OF_BATCH = ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep")
# which instruction of the neighbour a transfer pairs with (schedule.py's docstrings: "must be paired with")
PAIR = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}


class DeepSpeedScheduleError(PipesimError):
    """The instruction streams cannot be executed (bad sizes, or a pairing that would deadlock)."""


@dataclass(frozen=True, slots=True)
class Instruction:
    name: str
    micro_batch: int | None = None
    """The micro-batch the instruction works on (DeepSpeed names a buffer; buffer = micro-batch mod buffers)."""


def _even(x: int) -> bool:
    return x % 2 == 0


def _step_to_micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """``TrainSchedule._step_to_micro_batch``: even stages run forwards on even steps, odd stages on odd steps;
    the other parity is a backward step. Stage s runs the forward of micro-batch m at step 2m + s and its
    backward at step 2m + 2p - 1 - s."""
    if _even(step) and _even(stage):
        return step // 2 - stage // 2, True
    if not _even(step) and not _even(stage):
        return (step - 1) // 2 - stage // 2, True
    if _even(step) and not _even(stage):
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def train_schedule(stages: int, micro_batches: int, stage: int) -> list[list[Instruction]]:
    """The steps of ``TrainSchedule(micro_batches, stages, stage_id).steps()``, in order."""
    if stages < 1 or micro_batches < 1 or not 0 <= stage < stages:
        raise DeepSpeedScheduleError(f"a TrainSchedule needs stages >= 1, micro-batches >= 1 and 0 <= stage < "
                                     f"stages (got {stages}, {micro_batches}, {stage})")

    def valid(m: int) -> bool:
        return 0 <= m < micro_batches

    prev_stage_ok, next_stage_ok = stage - 1 >= 0, stage + 1 < stages
    total = 2 * (micro_batches + stages - 1)
    out: list[list[Instruction]] = []
    prev = -1
    for step in range(total):
        m, forward = _step_to_micro_batch(step, stage, stages)
        cmds: list[Instruction] = []
        # exchange (schedule.py: a forward step receives its input, then sends the previous step's gradient; a
        # backward step sends the previous step's output, then receives its gradient)
        if forward:
            if valid(m) and prev_stage_ok:
                cmds.append(Instruction(RECV_ACT, m))
            if valid(prev) and prev_stage_ok:
                cmds.append(Instruction(SEND_GRAD, prev))
        else:
            if valid(prev) and next_stage_ok:
                cmds.append(Instruction(SEND_ACT, prev))
            if valid(m) and next_stage_ok:
                cmds.append(Instruction(RECV_GRAD, m))
        if (stage == 0 or stage == stages - 1) and forward and valid(m):
            cmds.append(Instruction(LOAD, m))
        if valid(m):
            cmds.append(Instruction(FORWARD if forward else BACKWARD, m))
        if step == total - 1:
            cmds.extend(Instruction(name) for name in END_OF_BATCH)
        prev = m
        out.append(cmds)
    return out
