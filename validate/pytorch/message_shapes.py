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

The validator needs shapes only for the messages: their sizes (``Input Dims``, ``Input type``) and peers
(``Concrete Inputs``) on the point-to-point calls and their backend spans (:mod:`validate.ingest.actions`). A
static schedule makes the same calls in the same order every step, so the validator profiles one step with shapes
first and the timed steps without; :func:`copy_message_shapes` gives the k-th call of each name in every timed
step the arguments of the k-th call of that name in the shaped step, and refuses steps whose calls differ.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from sim.errors import PipesimError

__all__ = ["SHAPE_ARGS", "MessageShapesError", "carries_a_message", "copy_message_shapes"]

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


def _host_ranges(events: Iterable[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") != _DEVICE_COPY]


def _message_events(events: Iterable[dict]) -> list[dict]:
    return sorted((e for e in _host_ranges(events) if carries_a_message(str(e.get("name", "")))),
                  key=lambda e: e["ts"])


def _by_name(events: Iterable[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        grouped[e["name"]].append(e)
    return grouped


def copy_message_shapes(shaped_events: list[dict], events: list[dict]) -> int:
    """Give the message events of every ``ProfilerStep#N`` in *events* (a Chrome trace's ``traceEvents``, changed in
    place) the :data:`SHAPE_ARGS` of the same calls in *shaped_events* (the events of one step profiled with
    ``record_shapes=True``): the k-th event of a name in a step gets the k-th of that name there. Returns how many
    events got them. Raises :class:`MessageShapesError` naming the first step whose calls differ (another set of
    names, or another count of one)."""
    reference = {name: [e.get("args", {}) for e in group]
                 for name, group in _by_name(_message_events(shaped_events)).items()}
    steps = sorted(((int(m[1]), e) for e in _host_ranges(events)
                    for m in [_STEP.match(str(e.get("name", "")))] if m), key=lambda s: s[1]["ts"])
    messages = _message_events(events)
    copied = 0
    for number, step in steps:
        start, end = step["ts"], step["ts"] + step.get("dur", 0)
        inside = _by_name(e for e in messages if start <= e["ts"] <= end)
        counts = {name: len(group) for name, group in sorted(inside.items())}
        wanted = {name: len(args) for name, args in sorted(reference.items())}
        if counts != wanted:
            raise MessageShapesError(
                f"profiled step {number} made other point-to-point calls than the step profiled with shapes "
                f"({counts} against {wanted}): its messages' sizes and peers cannot be copied")
        for name, group in inside.items():
            for event, args in zip(group, reference[name]):
                shaped = {k: args[k] for k in SHAPE_ARGS if k in args}
                event["args"] = {**event.get("args", {}), **shaped}
                copied += 1
    return copied
