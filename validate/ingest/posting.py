"""What a Megatron-LM trace posted, batch by batch, held against the ``megatron`` lowering: does the runtime model post
where Megatron does?

Megatron profiles with ``with_stack=True`` (``megatron/training/training.py``, ``--use-pytorch-profiler``), so every
group of point-to-point operations is a ``python_function`` event, a call of ``p2p_communication.py``
``_batched_p2p_ops`` (``batch_p2p_comm``, megatron-core's default) or ``_p2p_ops`` (with ``overlap_p2p_comm``),
holding the ``c10d::send`` / ``c10d::recv_`` ops it posted, each with its peer (the op's ``dstRank`` / ``srcRank``
input, a rank of the pipeline group). Per rank and profiled step the trace gives one sequence: each computation
(``forward_step`` / ``backward_step``, as :func:`validate.ingest.infer.megatron_segments` reads them) as ``F`` or
``B``, each batch as the
``(send or receive, peer)`` of its operations in posting order. The lowered program
(:func:`sim.core.comm_lowering.lower_megatron`) gives the same from its ``COMPUTE`` and ``POST`` steps, posts with
no step between them taken as one call (``_p2p_ops`` gives each operation its own handle). A call with no
operations posts nothing (Megatron makes one at the end of the interleaved cool-down: ``send_backward_recv_backward``
with nothing to send or receive) and is left out on both sides.

Equal sequences on every rank and step mean the model posts every send and receive at Megatron's point, in Megatron's
batches and order; the first difference is named otherwise. Needs no torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST, CommProgram
from sim.core.keys import OP_F, OP_U, key_kind

from validate.ingest.reader import Keep, Span, read_trace

__all__ = ["PostingCheck", "posted_sequences", "program_sequence", "check_posting"]

_BATCH = (": _batched_p2p_ops", ": _p2p_ops")
"""The calls that post a group of operations: ``batch_p2p_comm``'s batch, or ``_p2p_ops``' isend / irecv (each its
own handle, ``overlap_p2p_comm``)."""
_COMPUTE = {": forward_step": "F", ": backward_step": "B"}
_OPS = {"c10d::send": "send", "c10d::recv_": "receive"}


@dataclass(frozen=True, slots=True)
class PostingCheck:
    """The lowering's posting sequences against the trace's, over every rank and profiled step."""

    matches: bool
    ranks: int
    steps: int
    """Profiled steps compared on every rank."""
    difference: str | None = None
    """The first difference, in words (None when every sequence is equal)."""

    def line(self) -> str:
        if self.matches:
            return (f"posting points: the megatron lowering posts every batch of sends and receives where the trace "
                    f"does, with the same operations in the same order ({self.ranks} ranks x {self.steps} profiled "
                    f"steps)")
        return f"posting points: the megatron lowering differs from the trace: {self.difference}"

    def to_dict(self) -> dict:
        return {"matches": self.matches, "ranks": self.ranks, "steps": self.steps, "difference": self.difference}


def posted_sequences(spans: Sequence[Span]) -> dict[int, list]:
    """Profiled step -> the sequence of one rank's trace (module docstring): ``"F"`` / ``"B"`` per computation and a
    tuple of ``("send" | "receive", peer)`` per batch that posted anything."""
    steps = sorted((s for s in spans if s.name.startswith("ProfilerStep#")), key=lambda s: s.start)
    out: dict[int, list] = {}
    for step in steps:
        number = int(step.name.removeprefix("ProfilerStep#"))
        inside = sorted((s for s in spans if step.start <= s.start <= step.end and s is not step),
                        key=lambda s: (s.start, -s.end))
        sequence: list = []
        compute_end = -float("inf")
        batch_end, batch = -float("inf"), None
        for s in inside:
            if s.cat == "python_function":
                kind = next((k for suffix, k in _COMPUTE.items() if s.name.endswith(suffix)), None)
                if kind is not None and "schedules.py" in s.name:
                    if s.start >= compute_end:  # outermost only (a wrapper of the same name nests inside)
                        sequence.append(kind)
                        compute_end = s.end
                elif s.name.endswith(_BATCH):
                    batch, batch_end = [], s.end
                    sequence.append(batch)
            elif s.name in _OPS and batch is not None and s.start <= batch_end:
                inputs = s.args.get("Concrete Inputs") or []
                peer = int(inputs[2]) if len(inputs) > 2 and str(inputs[2]).lstrip("-").isdigit() else -1
                batch.append((_OPS[s.name], peer))
        out[number] = [tuple(x) if isinstance(x, list) else x for x in sequence if x != []]
    return out


def program_sequence(program: CommProgram, device: int) -> list:
    """The same sequence for *device* of the lowered program (its updates left out: the traces hold none)."""
    flat = program.schedule.compiled.flat
    out: list = []
    previous = None
    for op, arg in program.steps(device):
        if op == STEP_COMPUTE:
            kind = key_kind(int(flat.keys[arg]))
            if kind != OP_U:
                out.append("F" if kind == OP_F else "B")
        elif op == STEP_POST:
            items = tuple(("send", int(flat.send_to[i])) if i >= 0 else ("receive", int(flat.device[~i]))
                          for i in program.batch(arg))
            if out and isinstance(out[-1], tuple) and previous == STEP_POST:
                out[-1] += items  # posted back to back: one call
            else:
                out.append(items)
        previous = op
    return out


def _text(x) -> str:
    if isinstance(x, str):
        return f"a {'forward' if x == 'F' else 'backward'}"
    return "a batch of " + " + ".join(f"{kind} {'to' if kind == 'send' else 'from'} {peer}" for kind, peer in x)


def check_posting(paths: Sequence[str | os.PathLike], program: CommProgram) -> PostingCheck:
    """Hold each rank's trace (*paths*, in rank order) against *program*'s sequence for that rank, every profiled
    step (module docstring)."""
    keep = Keep(python=(*_BATCH, *_COMPUTE))
    steps = None
    for rank, path in enumerate(paths):
        trace = read_trace(path, keep=keep)
        expected = program_sequence(program, rank)
        sequences = posted_sequences(trace.spans)
        steps = len(sequences) if steps is None else min(steps, len(sequences))
        for number, got in sorted(sequences.items()):
            if got == expected:
                continue
            i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            there = _text(got[i]) if i < len(got) else "nothing"
            model = _text(expected[i]) if i < len(expected) else "nothing"
            return PostingCheck(False, len(paths), len(sequences), f"rank {rank}, step {number}, item {i + 1}: the "
                                f"trace has {there} where the lowering has {model}")
    return PostingCheck(True, len(paths), steps or 0)
