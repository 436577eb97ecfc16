"""Actions of runtimes that do not name them: found from the op structure or the runtime's own functions,
numbered from the schedule's known order. Needs no torch.

Two sources, each giving one rank's computations in time order as *segments* (a kind, F or B, and a
CPU time span); :func:`match_order` then gives the k-th segment the rank's k-th action of the
schedule, checking the kinds one by one (the micro-batch and the stage are inferred from the order,
never guessed: the first segment whose kind differs from the schedule's is named and the trace refused).

**PyTorch's single-stage runtime with the profiler's defaults** (:func:`pytorch_segments`). torch 2.13's
``Schedule1F1B._step_microbatches`` (torch/distributed/pipelining/schedules.py) records no range of its
own: per micro-batch it calls ``forward_one_chunk`` and ``backward_one_chunk`` between batches of
point-to-point calls (``_batch_p2p``: ``c10d::send`` / ``c10d::recv_`` ops). The trace still shows the
structure on the pipeline thread (the one making those calls):

- a **backward** is a run of ``autograd::engine::evaluate_function: ...`` spans (the autograd engine's
  per-node events; on GPUs they run on the engine's device thread, any thread of the process counts);
- a **forward** is a run of the other top-level ops (``cpu_op``) of the pipeline thread (the model's
  ``aten::linear``, ``aten::relu``, the loss on the last stage, ...); ``record_function`` ranges are looked
  through, not taken as ops (a range of the user's may hold a forward with its receive and send);
- a **communication call** (any ``c10d::`` op: the point-to-point calls, and collectives such as a
  training loop's barrier or a data-parallel all-reduce) ends a run. The backend's ``gloo:send`` / ``gloo:recv`` spans are
  asynchronous (they last from the post to the completion and overlap the ops after them): they are
  neither nesting parents nor boundaries.

Runs of view and bookkeeping ops alone are not computations (:data:`BOOKKEEPING_OPS`: the input split
``aten::tensor_split`` that opens a step, ``PipelineScheduleSingle.step`` -> ``_split_inputs``; the
``aten::detach_`` after a backward, ``stage_backward``), and such ops are trimmed from a run's ends.
After a step's last backward the runtime scales the gradients (``scale_grads``: ``aten::div_``) and
merges the outputs (``_merge_outputs``: ``aten::cat``), and the training loop may step the optimizer:
forward-looking runs after the last backward are reported as left out, not counted. Two computations
of one kind back to back with nothing between them (possible only with one stage and no
communication) cannot be told apart: such a trace is refused.

**Megatron-LM** (:func:`megatron_segments`). Megatron profiles with
``torch.profiler.profile(..., record_shapes=True, with_stack=True)`` (megatron/training/training.py,
``--profile --use-pytorch-profiler``), so its Python functions are events: every
``forward_step(...)`` and ``backward_step(...)`` call of megatron/core/pipeline_parallel/schedules.py is
a ``python_function`` event named ``<path>(<line>): forward_step``. Each is one computation, measured;
which micro-batch (and, interleaved, which model chunk) it ran follows from the schedule's order
(``forward_backward_pipelining_without_interleaving``: warm-up forwards, then one forward and one
backward, then the cool-down backwards, as pipesim's ``1f1b``; the interleaved schedule as pipesim's
``interleaved-1f1b``). Its point-to-point calls are ``nccl:send a->b`` / ``nccl:recv a<-b``
(ProcessGroupNCCL's profiling titles), outside those functions, and are paired in order like the
single-stage runtime's.

Times: the trace's microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.ir import Action, ActionKind
from sim.errors import PipesimError

from validate.ingest.reader import Span

__all__ = ["Segment", "OrderMismatchError", "pytorch_segments", "megatron_segments", "match_order",
           "BOOKKEEPING_OPS", "pipeline_thread"]

BOOKKEEPING_OPS = frozenset({
    "aten::tensor_split", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind",
    "aten::detach", "aten::detach_", "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided",
    "aten::slice", "aten::select", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze", "aten::squeeze",
    "aten::alias", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::requires_grad_",
    "aten::zeros", "aten::zeros_like", "aten::ones_like", "aten::fill_", "aten::zero_", "aten::set_", "aten::resize_",
    "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::item", "aten::_local_scalar_dense",
})
"""Ops that move or view data, made by the runtime around the computations (module docstring)."""

_SEND = ("c10d::send",)
_RECV = ("c10d::recv_", "c10d::recv_any_source_")
_AUTOGRAD = "autograd::engine::evaluate_function"
_OP_CATS = ("cpu_op", "")
"""Categories of the events a forward is made of: operators. Not ``user_annotation``: gloo's asynchronous
``gloo:send`` / ``gloo:recv`` spans (and a user's ``record_function`` ranges) would swallow the ops after them."""
_CONTAINERS = ("ProfilerStep#",)


class OrderMismatchError(PipesimError):
    """A rank's computations, in time order, do not fit the schedule's order for that rank."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One computation found in a rank's trace."""

    kind: str
    """'F' or 'B'."""
    start: float
    """Microseconds (the trace's clock): start of its first op."""
    end: float
    pid: object
    tid: object
    ops: int
    """Top-level ops or autograd nodes in it (Megatron: 1, the function call)."""

    @property
    def thread(self) -> tuple:
        return (self.pid, self.tid)


def _is_comm(name: str) -> bool:
    return name in _SEND or name in _RECV


def pipeline_thread(spans: Sequence[Span]) -> tuple | None:
    """The thread that makes the point-to-point calls (else the one with the most CPU ops)."""
    counts: dict[tuple, int] = {}
    for s in spans:
        if _is_comm(s.name) or s.name.startswith(("nccl:send", "nccl:recv")):
            counts[s.thread] = counts.get(s.thread, 0) + 1
    if not counts:
        for s in spans:
            if s.cat == "cpu_op":
                counts[s.thread] = counts.get(s.thread, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _top_level(spans: Sequence[Span]) -> list[Span]:
    """Spans nested in no other span of the list (step marks excluded: they are containers)."""
    out = []
    end = -float("inf")
    for s in spans:  # sorted by start, longest first
        if s.name.startswith(_CONTAINERS):
            continue
        if s.start >= end:
            out.append(s)
            end = s.end
        elif s.end > end:  # overlapping without nesting: a clock tie; take it as a continuation
            end = s.end
    return out


def pytorch_segments(spans: Sequence[Span]) -> tuple[list[Segment], list[tuple[float, float]]]:
    """Computations of a rank that ran PyTorch's single-stage runtime without marks (module docstring).

    Returns the segments in time order and the communication calls of the pipeline thread (start, end)."""
    thread = pipeline_thread(spans)
    if thread is None:
        return [], []
    pid = thread[0]
    # ops only: a record_function range of the user's (``user_annotation``) may hold a whole forward with its
    # receive and send, and would hide them
    own = [s for s in spans if s.thread == thread and s.cat in _OP_CATS]
    top = _top_level(own)
    autograd = _top_level([s for s in spans if s.pid == pid and s.name.startswith(_AUTOGRAD)])
    tokens: list[tuple[float, float, str, Span]] = []
    comm = []
    for s in top:
        if s.name.startswith("c10d::"):  # point-to-point, and collectives (a barrier, a data-parallel all-reduce)
            tokens.append((s.start, s.end, "C", s))
            comm.append((s.start, s.end))
        elif not s.name.startswith(_AUTOGRAD):
            tokens.append((s.start, s.end, "F", s))
    for s in autograd:
        tokens.append((s.start, s.end, "B", s))
    for s in spans:  # a profiled step's edges end a run too (rank 0 may go from one step's end to the next's F)
        if s.name.startswith(_CONTAINERS) and s.pid == pid:
            tokens += [(s.start, s.start, "C", s), (s.end, s.end, "C", s)]
    tokens.sort(key=lambda t: (t[0], -t[1]))
    segments: list[Segment] = []
    run: list[tuple] = []

    def close() -> None:
        if not run:
            return
        kind = run[0][2]
        body = run
        if kind == "F":  # view and bookkeeping ops at either end are the runtime's, not the model's
            lo, hi = 0, len(body)
            while lo < hi and body[lo][3].name in BOOKKEEPING_OPS:
                lo += 1
            while hi > lo and body[hi - 1][3].name in BOOKKEEPING_OPS:
                hi -= 1
            body = body[lo:hi]
        if body:
            segments.append(Segment(kind, body[0][0], max(t[1] for t in body), pid, body[0][3].tid, len(body)))
        run.clear()

    for t in tokens:
        if t[2] == "C":
            close()
            continue
        if t[2] == "B" and run and run[0][2] == "F":
            close()
        elif t[2] == "F" and run and run[0][2] == "B" and t[0] >= max(r[1] for r in run):
            close()
        if t[2] == "F" and run and run[0][2] == "B":  # an op inside the backward's time: the engine's own
            continue
        run.append(t)
    close()
    return segments, comm


_MEGATRON = {"forward_step": "F", "backward_step": "B"}


def megatron_segments(spans: Sequence[Span]) -> list[Segment]:
    """Megatron-LM's ``forward_step`` / ``backward_step`` calls (``with_stack=True`` events), outermost only."""
    calls = []
    for s in spans:
        if s.cat != "python_function":
            continue
        func = s.name.rsplit(": ", 1)[-1].strip()
        kind = _MEGATRON.get(func)
        if kind is not None:
            calls.append((s, kind))
    out: list[Segment] = []
    end: dict[tuple, float] = {}
    for s, kind in sorted(calls, key=lambda c: (c[0].start, -c[0].end)):
        if s.start < end.get(s.thread, -float("inf")):
            continue  # nested in a call of the same thread (e.g. a wrapper of the same name)
        end[s.thread] = s.end
        out.append(Segment(kind, s.start, s.end, s.pid, s.tid, 1))
    return out


def _word(kind: str) -> str:
    return "a forward" if kind == "F" else "a backward"


def match_order(segments: Sequence[Segment], expected: Sequence[Action], *, rank: int, step: object,
                source: str, first_ts: float = 0.0) -> tuple[list[tuple[Action, Segment]], int]:
    """Give the k-th segment the k-th action of *expected* (the rank's order, without U).

    Forward-looking segments after the step's last backward are left out (module docstring); their count is
    returned. Raises :class:`OrderMismatchError` naming the first segment that does not fit.
    """
    kinds = ["F" if a.kind is ActionKind.F else "B" for a in expected]
    segs = list(segments)
    dropped = 0
    while kinds and kinds[-1] == "B" and segs and segs[-1].kind == "F":
        segs.pop()  # after the last backward: the runtime's scale_grads / merge, or the optimizer step
        dropped += 1
    where = f"rank {rank}, step {step}"
    for i, (seg, want) in enumerate(zip(segs, expected)):
        k = kinds[i]
        if seg.kind != k:
            raise OrderMismatchError(
                f"the trace does not fit the schedule's order ({source}): {where}: computation {i + 1} of the "
                f"trace is {_word(seg.kind)} (at {seg.start - first_ts:.0f} us) where the schedule runs {want} "
                f"({_word(k)}); give the schedule the run used (-s, -M, --from-pytorch)")
    if len(segs) != len(expected):
        nf = sum(1 for s in segs if s.kind == "F")
        more = len(segs) > len(expected)
        nxt = (f"computation {len(expected) + 1} ({_word(segs[len(expected)].kind)}) has no action left"
               if more else f"{expected[len(segs)]} and after have no computation")
        raise OrderMismatchError(
            f"the trace does not fit the schedule's order ({source}): {where}: the trace shows {len(segs)} "
            f"computations ({nf} forwards, {len(segs) - nf} backwards) where the schedule runs {len(expected)} on "
            f"this rank; {nxt}; give the schedule the run used (-s, -M, --from-pytorch)")
    return list(zip(expected, segs)), dropped
