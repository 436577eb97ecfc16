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
commit 077e6740, the version the ``read_file`` index holds; the 2021 engine that ran MT-NLG has the same stream),
kept in :mod:`sim.core.deepspeed_schedule` so that the ``deepspeed`` runtime's lowering reads the same stream;
:func:`execute` runs the streams of all stages with rendezvous (blocking, paired) transfers and reports the time
of the pipeline part of an iteration. The end-of-batch instructions (``ReduceTiedGrads``, ``ReduceGrads``,
``OptimizerStep``) are returned as names: their costs are the caller's (the data-parallel and tied-embedding
all-reduces, the optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.deepspeed_schedule import (BACKWARD, END_OF_BATCH, FORWARD, LOAD, PAIR, RECV_ACT, RECV_GRAD, SEND_ACT,
                                         SEND_GRAD, DeepSpeedScheduleError, Instruction, train_schedule)

# the stream's names are re-exported: callers of the executor read its instructions by them
__all__ = ["DeepSpeedScheduleError", "Instruction", "train_schedule", "execute", "PipelineTiming", "FORWARD",
           "BACKWARD", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD", "END_OF_BATCH"]


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
                    if other.name != PAIR[ins.name] or other.micro_batch != ins.micro_batch:
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
