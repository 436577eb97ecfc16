"""DeepSpeed's pipeline engine as it ran MT-NLG 530B: its instruction stream, executed with its p2p semantics.

MT-NLG (Smith et al. 2022, arXiv 2201.11990, section 2.3) ran Megatron's layers on DeepSpeed's pipeline engine.
That engine does not follow Megatron's 1F1B loop: ``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule`` gives
every stage ``2 (M + p - 1)`` *steps*, each with at most one ForwardPass or BackwardPass, preceded by the step's
exchanges with ONE neighbour (a forward step talks to the previous stage, a backward step to the next), and the
engine (``pipe/engine.py`` ``_exec_schedule``) runs the instructions in order. Every exchange is a blocking
``dist.broadcast`` in a two-rank group (``pipe/p2p.py`` ``send``/``recv``; "The communication is blocking and must
be paired", schedule.py), so a send and its receive start together, when both sides reach them, and a stage's
two exchanges of a step run one after the other, never both ways at once as Megatron's ``batch_isend_irecv``.

:func:`train_schedule` is a line-by-line port of ``TrainSchedule.steps`` and ``_step_to_micro_batch`` (DeepSpeed
commit 077e6740, the version the ``read_file`` index holds; the 2021 engine that ran MT-NLG has the same stream);
:func:`execute` runs the streams of all stages with rendezvous (blocking, paired) transfers and reports the time
of the pipeline part of an iteration. The end-of-batch instructions (``ReduceTiedGrads``, ``ReduceGrads``,
``OptimizerStep``) are returned as names: their costs are the caller's (the data-parallel and tied-embedding
all-reduces, the optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import PipesimError

__all__ = ["DeepSpeedScheduleError", "Instruction", "train_schedule", "execute", "PipelineTiming"]

FORWARD, BACKWARD = "ForwardPass", "BackwardPass"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SendActivation", "RecvActivation", "SendGrad", "RecvGrad"
LOAD = "LoadMicroBatch"
END_OF_BATCH = ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep")
# which instruction of the neighbour a transfer pairs with (schedule.py's docstrings: "must be paired with")
_PAIR = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}


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


@dataclass(frozen=True, slots=True)
class PipelineTiming:
    makespan: float
    """Seconds from the first forward to the last stage's last instruction before ``ReduceTiedGrads``."""
    finish: tuple[float, ...]
    """Per stage, when its stream (up to the end-of-batch instructions) is done."""
    busy: tuple[float, ...]
    """Per stage, seconds of ForwardPass + BackwardPass."""
    transfers: int
    """Paired transfers executed (each a blocking broadcast)."""


def execute(forward: list[float], backward: list[float], transfer: list[float], micro_batches: int) -> PipelineTiming:
    """Run the TrainSchedule streams of ``len(forward)`` stages with blocking, paired transfers.

    *forward*/*backward*: seconds of a ForwardPass/BackwardPass per stage (with everything the engine does inside
    it: the recomputed forward under activation checkpointing, the partitioned tensors' all-gathers);
    *transfer*: seconds of one broadcast between stage s and s + 1 (``len = stages - 1``). A transfer starts when
    both of its stages reach it and occupies both until it ends (``dist.broadcast``, async_op=False, p2p.py).
    """
    stages = len(forward)
    if len(backward) != stages or len(transfer) != max(stages - 1, 0):
        raise DeepSpeedScheduleError(f"{stages} stages need {stages} backward times and {stages - 1} transfer "
                                     f"times (got {len(backward)}, {len(transfer)})")
    streams = [[i for step in train_schedule(stages, micro_batches, s) for i in step if i.name not in END_OF_BATCH]
               for s in range(stages)]
    clock, busy, pc = [0.0] * stages, [0.0] * stages, [0] * stages
    transfers = 0
    remaining = sum(len(s) for s in streams)
    while remaining:
        progressed = False
        for s in range(stages):
            while pc[s] < len(streams[s]):
                ins = streams[s][pc[s]]
                if ins.name in (FORWARD, BACKWARD):
                    d = forward[s] if ins.name == FORWARD else backward[s]
                    clock[s] += d
                    busy[s] += d
                elif ins.name == LOAD:
                    pass  # the data loader's copy: not modelled (a few MB from pinned memory)
                else:
                    peer = s + 1 if ins.name in (SEND_ACT, RECV_GRAD) else s - 1
                    if pc[peer] >= len(streams[peer]):
                        raise DeepSpeedScheduleError(f"stage {s}'s {ins.name}({ins.micro_batch}) has no partner")
                    other = streams[peer][pc[peer]]
                    if other.name != _PAIR[ins.name] or other.micro_batch != ins.micro_batch:
                        break  # the peer is not there yet: this stage blocks (a later pass may release it)
                    end = max(clock[s], clock[peer]) + transfer[min(s, peer)]
                    clock[s] = clock[peer] = end
                    pc[peer] += 1
                    remaining -= 1
                    transfers += 1
                pc[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked = [f"stage {s}: {streams[s][pc[s]].name}({streams[s][pc[s]].micro_batch})"
                       for s in range(stages) if pc[s] < len(streams[s])]
            raise DeepSpeedScheduleError("the instruction streams deadlock: " + "; ".join(blocked))
    return PipelineTiming(makespan=max(clock), finish=tuple(clock), busy=tuple(busy), transfers=transfers)
