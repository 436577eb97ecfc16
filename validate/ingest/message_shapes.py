"""The messages' sizes and peers for steps profiled without ``record_shapes``, copied from one step profiled with it.

With ``record_shapes=True`` PyTorch's profiler keeps every recorded op's input tensors alive until it stops
(``TorchOpStorage``'s inputs and outputs: pytorch/pytorch#133444; the option's docstring, since #59469, warns of
"extra tensor copies"). In a training step that includes each micro-batch's weight gradient, which
``AccumulateGrad`` then cannot take over as the parameter's gradient and copies instead. Measured on ScheduleGPipe,
K=2, M=8, width 2048, batch 128 (26 Nov 2026, load 1.4-1.9): a rank held 0.27 GB more after each profiled step (one
2048 x 2048 float gradient per layer and micro-batch), its steps grew from 0.74 to 0.83 s over a profiler cycle,
and the first cycle's last step took 1.0-1.4 s (its backward matrix products twice as long); profiled without
shapes, memory stayed flat and every step took 0.71-0.77 s. Paired launches of the five schedules at that size
(README, "Shapes from a step of their own"): every target met in 6 of 10 rows, against 3 of 10 with shapes.

Ingest needs shapes only for the messages: their sizes (``Input Dims``, ``Input type``) and peers
(``Concrete Inputs``) on the point-to-point calls and their backend spans (:mod:`validate.ingest.actions`). A
static schedule makes the same calls in the same order every step, so one step profiled with shapes serves every
step profiled without: the k-th call of each name in a step gets the arguments of the k-th call of that name in the
shaped step, and a step whose calls differ is refused by number. ``pipesim validate --runtime torch`` profiles so
(:func:`copy_message_shapes` on the rank's raw events, ``validate.pytorch.runtime.merge_traces``), and ``pipesim
ingest --shapes-from`` reads a user's traces so (:func:`copy_message_shapes_to_spans` on the streamed spans).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from sim.errors import PipesimError

__all__ = ["SHAPE_ARGS", "MessageShapesError", "carries_a_message", "copy_message_shapes",
           "copy_message_shapes_to_spans"]

SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
"""The arguments ``record_shapes=True`` adds to an event (torch 2.13's Chrome trace export)."""

_MESSAGE_OP = re.compile(r"^(c10d::(send|recv_|recv_any_source_)|(gloo|nccl):(send|recv)( .*)?)$")
"""The point-to-point calls and their backend spans (ProcessGroupNCCL titles carry the ranks: ``nccl:send 0->1``),
the names :mod:`validate.ingest.actions` reads a message from."""

_STEP = re.compile(r"^ProfilerStep#(\d+)$")

_DEVICE_COPY = "gpu_user_annotation"
"""Kineto's GPU-side copy of a host range (a ``ProfilerStep#N``, an ``nccl:send 0->1``): on the device's clock, so
not in its host step's window; ingest leaves these out of the messages too (validate.ingest.actions)."""


class MessageShapesError(PipesimError):
    """A profiled step's point-to-point calls are not those of the step profiled with shapes."""


def carries_a_message(name: str) -> bool:
    """Whether an event of this name is a point-to-point call or its backend span."""
    return _MESSAGE_OP.match(name) is not None


# A host range of either form, reduced to what the copy reads: (name, start, end, the range itself). Device copies
# (cat gpu_user_annotation) are left out.
_Range = tuple[str, float, float, object]


def _event_ranges(events: Iterable[dict]) -> list[_Range]:
    """A Chrome trace's complete events (``ph`` X, microseconds)."""
    return [(str(e.get("name", "")), e["ts"], e["ts"] + e.get("dur", 0), e) for e in events
            if e.get("ph") == "X" and e.get("cat") != _DEVICE_COPY]


def _span_ranges(spans: Iterable) -> list[_Range]:
    """The spans of :func:`validate.ingest.reader.read_trace`."""
    return [(s.name, s.start, s.end, s) for s in spans if s.cat != _DEVICE_COPY]


def _steps(ranges: Sequence[_Range]) -> list[tuple[int, float, float]]:
    """The ``ProfilerStep#N`` ranges, in time order: (N, start, end)."""
    return sorted(((int(m[1]), start, end) for name, start, end, _ in ranges for m in [_STEP.match(name)] if m),
                  key=lambda s: s[1])


def _messages(ranges: Sequence[_Range]) -> list[_Range]:
    return sorted((r for r in ranges if carries_a_message(r[0])), key=lambda r: r[1])


def _by_name(ranges: Iterable[_Range]) -> dict[str, list[_Range]]:
    grouped: dict[str, list[_Range]] = defaultdict(list)
    for r in ranges:
        grouped[r[0]].append(r)
    return grouped


def _copy(shaped: list[_Range], ranges: list[_Range], args_of: Callable[[object], dict],
          give: Callable[[object, dict], None]) -> int:
    """The copy of both forms: the shaped step's calls (its first ``ProfilerStep#N`` where it has any, else all of
    its calls) onto every step of *ranges*. *args_of* reads a range's arguments, *give* sets them."""
    shaped_steps = _steps(shaped)
    if shaped_steps:
        _, first, last = shaped_steps[0]
        shaped = [r for r in shaped if first <= r[1] <= last]
    reference = {name: [args_of(r[3]) for r in group] for name, group in _by_name(_messages(shaped)).items()}
    wanted = {name: len(args) for name, args in sorted(reference.items())}
    messages = _messages(ranges)
    copied = 0
    for number, start, end in _steps(ranges):
        inside = _by_name(r for r in messages if start <= r[1] <= end)
        counts = {name: len(group) for name, group in sorted(inside.items())}
        if counts != wanted:
            raise MessageShapesError(
                f"profiled step {number} made other point-to-point calls than the step profiled with shapes "
                f"({counts} against {wanted or 'none'}): its messages' sizes and peers cannot be copied")
        for name, group in inside.items():
            for r, args in zip(group, reference[name]):
                give(r[3], {**args_of(r[3]), **{k: args[k] for k in SHAPE_ARGS if k in args}})
                copied += 1
    return copied


def copy_message_shapes(shaped_events: list[dict], events: list[dict]) -> int:
    """Give the message events of every ``ProfilerStep#N`` in *events* (a Chrome trace's ``traceEvents``, changed in
    place) the :data:`SHAPE_ARGS` of the same calls in *shaped_events* (the events of one step profiled with
    ``record_shapes=True``; of its first ``ProfilerStep#N`` where it has several): the k-th event of a name in a step
    gets the k-th of that name there. Returns how many events got them. Raises :class:`MessageShapesError` naming
    the first step whose calls differ (another set of names, or another count of one)."""
    return _copy(_event_ranges(shaped_events), _event_ranges(events), lambda e: e.get("args", {}),
                 lambda e, args: e.__setitem__("args", args))


def copy_message_shapes_to_spans(shaped_spans: Sequence, spans: Sequence) -> int:
    """:func:`copy_message_shapes` for the spans :func:`validate.ingest.reader.read_trace` streams (their ``args``
    replaced): ``pipesim ingest --shapes-from``."""
    def give(span, args: dict) -> None:
        span.args = args

    return _copy(_span_ranges(shaped_spans), _span_ranges(spans), lambda s: s.args, give)
