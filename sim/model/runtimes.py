"""Runtime profiles: which runtime executes a schedule, and so where its sends and receives are posted.

A prediction is a model of the runtime that runs the schedule. Point-to-point transfers in gloo and NCCL
are rendezvous operations (the data moves once both sides have posted), and every runtime posts at its own
points. A profile names the lowering (:mod:`sim.core.comm_lowering`) and the link semantics the engines
honour (:mod:`sim.engines.rendezvous`):

============ ============ ====================================================================================
profile      links        posting points
============ ============ ====================================================================================
``pipesim``  eager        pipesim's executor: receives posted ahead, a send right after its producer; the
                          default, and today's model (a transfer starts when its producer ends)
``torch``    rendezvous   PyTorch's ``torch.distributed.pipelining`` (torch 2.13): ``ScheduleGPipe`` /
                          ``Schedule1F1B``'s own loops for orders of that shape, otherwise
                          ``_add_send_recv`` + ``_PipelineScheduleRuntime`` (interleaved, ZB, ZBV, DualPipeV)
``megatron`` rendezvous   Megatron-LM with megatron-core's defaults: ``forward_backward_pipelining_without_
                          interleaving``'s blocking ``send_forward_recv_backward`` / ``send_backward_recv_forward``
                          pairs; interleaved, one blocking batch after each forward + backward
``megatron-  rendezvous   Megatron-LM's training default for the interleaved schedule (``overlap_p2p_comm``): the
overlap``                 steady state posts without waiting; without model chunks the same as ``megatron``
``deepspeed`` rendezvous  DeepSpeed's pipeline engine (``TrainSchedule`` run by ``_exec_schedule``): each step's
                          exchanges with one neighbour, every send and receive a blocking broadcast, one after
                          the other; only its own 1F1B order, one stage per device
============ ============ ====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.core.keys import OP_B, OP_F, OP_U, key_kind
from sim.errors import PipesimError

if TYPE_CHECKING:
    from sim.core.ir import Schedule

__all__ = ["RuntimeProfile", "RUNTIMES", "DEFAULT_RUNTIME", "get_runtime", "UnknownRuntimeError", "LINK_SEMANTICS"]

LINK_SEMANTICS = ("eager", "rendezvous")


class UnknownRuntimeError(PipesimError):
    """A runtime name pipesim has no profile for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeProfile:
    """One runtime: its name, its link semantics, and how it posts communication."""

    name: str
    """What ``--runtime`` takes."""
    links: str
    """``"eager"``: a transfer starts when its send is posted (and its link is free); ``"rendezvous"``: also
    not before its receive is posted."""
    description: str
    """One line for reports."""
    source: str
    """The runtime source the lowering follows."""
    family: str
    """Whose code runs (``"pipesim"``, ``"torch"``, ``"megatron"``, ``"deepspeed"``): what a trace's action names
    tell; the profiles of one family are that runtime's modes."""
    overlap_p2p_comm: bool = False
    """Megatron-LM's ``ModelParallelConfig.overlap_p2p_comm`` (``batch_p2p_comm`` is its opposite), which this
    profile models; Megatron-LM turns it off without model chunks."""
    overlap_p2p_comm_warmup_flush: bool = False
    """Megatron-LM's ``overlap_p2p_comm_warmup_flush`` (only with ``overlap_p2p_comm``)."""

    def lowering(self, schedule: Schedule) -> str:
        """The :data:`sim.core.comm_lowering.LOWERINGS` entry that runs *schedule* under this runtime."""
        if self.family == "torch":
            return _torch_lowering(schedule)
        if self.overlap_p2p_comm and schedule.stages == schedule.devices:
            return "megatron"  # Megatron-LM turns overlap_p2p_comm (and the warm-up flush) off without model chunks
        return self.name

    @property
    def eager(self) -> bool:
        return self.links == "eager"

    @property
    def pairs_wait_as_one(self) -> bool:
        """Whether an overlapped pair starts as one unit, its forward waiting for its backward's inputs too (as
        pipesim's engines run it). Not PyTorch's: ``_PipelineScheduleRuntime`` performs an ``OVERLAP_F_B``
        action's sub-actions one by one, each waiting its own receive, and ``_add_send_recv`` appends both sends
        after the pair (schedules.py); :func:`sim.simulate.simulate_runtime` times such a runtime's pairs so."""
        return self.family != "torch"


def _torch_lowering(schedule: Schedule) -> str:
    """Which PyTorch runtime executes *schedule*'s order: ``ScheduleGPipe``'s loop for one stage per rank running
    every forward before every backward, ``Schedule1F1B``'s for warm-up forwards, backward/forward pairs and
    backwards; ``_PipelineScheduleRuntime`` otherwise (the multi-stage classes, ``schedules.py``)."""
    if schedule.stages != schedule.devices or schedule.split_backward or schedule.recomputed or len(schedule.fused):
        return "torch-multi"
    kinds = key_kind(schedule.keys_array)
    gpipe = one_f_one_b = True
    starts = schedule.device_start.tolist()
    for d in range(schedule.devices):
        # F and B only, then the optimizer updates (torch runs those after step(), outside the loop)
        order = "".join("F" if k == OP_F else "B" if k == OP_B else "U" if k == OP_U else "?"
                        for k in kinds[starts[d]:starts[d + 1]].tolist()).rstrip("U")
        if "U" in order or "?" in order:
            return "torch-multi"
        forwards = len(order) - len(order.lstrip("F"))
        gpipe &= not order[forwards:].count("F")
        steady = 0
        while order.startswith("BF", forwards + 2 * steady):
            steady += 1
        rest = order[forwards + 2 * steady:]
        one_f_one_b &= bool(forwards) and bool(rest) and not rest.strip("B")
    if gpipe:
        return "torch-gpipe"
    return "torch-1f1b" if one_f_one_b else "torch-multi"


RUNTIMES: dict[str, RuntimeProfile] = {p.name: p for p in (
    RuntimeProfile(name="pipesim", family="pipesim", links="eager",
                   description="pipesim's executor: receives posted ahead, sends right after their producer",
                   source="validate/rank/executor.py"),
    RuntimeProfile(name="torch", family="torch", links="rendezvous",
                   description="PyTorch's torch.distributed.pipelining: receives posted just before the consuming "
                               "action (ScheduleGPipe, Schedule1F1B) or where _add_send_recv puts them",
                   source="torch/distributed/pipelining/schedules.py (torch 2.13): ScheduleGPipe._step_microbatches, "
                          "Schedule1F1B._step_microbatches, _add_send_recv, _PipelineScheduleRuntime"),
    RuntimeProfile(name="megatron", family="megatron", links="rendezvous",
                   description="Megatron-LM (megatron-core's defaults): blocking send/receive batches "
                               "(send_forward_recv_backward, send_backward_recv_forward; interleaved: one batch after "
                               "each forward + backward)",
                   source="megatron/core/pipeline_parallel/schedules.py "
                          "(forward_backward_pipelining_without_interleaving, _with_interleaving), "
                          "p2p_communication.py (_communicate, _batched_p2p_ops)"),
    RuntimeProfile(name="megatron-overlap", family="megatron", overlap_p2p_comm=True, links="rendezvous",
                   description="Megatron-LM's training default for the interleaved schedule (overlap_p2p_comm): the "
                               "steady state's exchanges posted without waiting, each receive waited before the next "
                               "computation of its kind; without model chunks as megatron",
                   source="megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_with_"
                          "interleaving: pp_pre_forward, pp_post_forward, pp_pre_backward, pp_post_backward), "
                          "p2p_communication.py (_p2p_ops), megatron/training/arguments.py "
                          "(--no-overlap-p2p-communication)"),
    RuntimeProfile(name="megatron-overlap-flush", family="megatron", overlap_p2p_comm=True,
                   overlap_p2p_comm_warmup_flush=True, links="rendezvous",
                   description="Megatron-LM with --overlap-p2p-communication-warmup-flush: as megatron-overlap, the "
                               "warm-up and cool-down exchanges posted without waiting too, the next receive posted "
                               "before each of their computations; without model chunks as megatron",
                   source="megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_with_"
                          "interleaving, overlap_p2p_comm_warmup_flush), megatron/training/arguments.py "
                          "(--overlap-p2p-communication-warmup-flush)"),
    RuntimeProfile(name="deepspeed", family="deepspeed", links="rendezvous",
                   description="DeepSpeed's pipeline engine: TrainSchedule's steps, each send and receive a blocking "
                               "broadcast with one neighbour, one after the other",
                   source="deepspeed/runtime/pipe/schedule.py (TrainSchedule), engine.py (_exec_schedule), "
                          "p2p.py (send, recv)"),
)}
"""Name -> profile."""

DEFAULT_RUNTIME = "pipesim"


def get_runtime(name: str | RuntimeProfile) -> RuntimeProfile:
    """The profile called *name*; an unknown name is one line listing the known ones."""
    if isinstance(name, RuntimeProfile):
        return name
    profile = RUNTIMES.get(str(name).strip().lower()) if isinstance(name, str) else None
    if profile is None:
        raise UnknownRuntimeError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")
    return profile
