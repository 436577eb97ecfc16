"""The user's own model as a validator workload: ``--workload package.module:function``.

The protocol (the README's "Your own model" section shows an example)::

    def pipeline(stages: int):
        ...
        return stage_modules, make_batch, loss

- ``stage_modules``: a list (or tuple) of exactly ``stages`` ``torch.nn.Module`` objects, stage s's
  module at index s. Stage s + 1 takes stage s's output; every output but the last stage's is one
  float32 tensor (it travels between processes: :class:`validate.rank.executor.Executor` receives
  into float32 buffers), of the same shape for every micro-batch.
- ``make_batch(m) -> (input, target)``: the data of micro-batch ``m`` (0, 1, 2, ...), a pure function
  of ``m``: every rank and the one-process reference call it and must see the same tensors. The
  input goes to stage 0 (any dtype: token ids are fine), the target to the loss. Its first
  dimension is the micro-batch size (samples).
- ``loss(output, target) -> scalar tensor``: the micro-batch's loss, a *mean* over its samples (as
  ``torch.nn.functional.cross_entropy`` gives by default). The validator scales it by 1/g (g
  micro-batches per update), as PyTorch's schedules scale gradients by the number of micro-batches,
  so an update trains on the mean over its mini-batch.

The function is called under ``torch.manual_seed(seed)`` (``--seed``, default 0), once per process, so
weights drawn from torch's default generator are the same on every rank and in the reference. It
must not read other random sources (numpy, ``random``, the clock) for weights: the pre-check builds
the model twice and refuses one whose weights differ.

Everything is checked once in the launching process, before any rank starts
(:func:`prepare`): the entry point's syntax, that the module imports and has the function, the
return type, the number of stages, that each stage takes the previous one's output (micro-batch 0
run through the chain), float32 boundaries, equal shapes over the micro-batches, a scalar loss with
a gradient, and deterministic weights and data. Each failure is one :class:`WorkloadError` line.
The boundary shapes found there travel in the :class:`validate.request.WorkloadSpec`, so ranks
allocate their receive buffers without running anything.

Module lookup: ``package.module`` is imported with the folder the command ran in first on
``sys.path`` (as ``python -m`` does; uvicorn and gunicorn do the same for ``module:app``), and the
ranks get that folder too (:attr:`WorkloadSpec.path`).
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import nn

from validate.errors import WorkloadError, is_entry_point
from validate.request import WorkloadSpec

__all__ = ["StagedModel", "load", "prepare", "stage_module", "microbatch", "loss_function", "stage_input", "stages_of",
           "prepare_for"]

_LOCK = threading.Lock()
_CACHE: dict[tuple, StagedModel] = {}
_INPUTS: dict[tuple, list[torch.Tensor]] = {}


class StagedModel(NamedTuple):
    """What the user's function returns (a plain 3-tuple is the same thing)."""

    stages: Sequence[nn.Module]
    """stage -> its module."""
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    """micro-batch -> (input of stage 0, target of the loss)."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """(last stage's output, target) -> the micro-batch's mean loss (a scalar)."""


def _function(spec: WorkloadSpec) -> Callable:
    if not is_entry_point(spec.name):
        raise WorkloadError(f"--workload {spec.name!r} is not an entry point: write package.module:function")
    module_name, _, attr = spec.name.partition(":")
    folder = spec.path or os.getcwd()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise WorkloadError(f"--workload {spec.name}: cannot import {module_name!r} ({exc}); run from the folder that "
                            f"holds it, or put it on PYTHONPATH") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failing at import is the user's error, named
        raise WorkloadError(f"--workload {spec.name}: importing {module_name!r} raised {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise WorkloadError(f"--workload {spec.name}: module {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise WorkloadError(f"--workload {spec.name}: {attr!r} is not a function (it is an {type(fn).__name__!r})")
    return fn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def load(spec: WorkloadSpec, stages: int) -> StagedModel:
    """The user's model for *stages* stages, built once per process (under ``torch.manual_seed(spec.seed)``)."""
    key = (spec.name, spec.path, spec.seed, stages)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _call(spec, stages)
        return _CACHE[key]


def _call(spec: WorkloadSpec, stages: int) -> StagedModel:
    fn = _function(spec)
    with torch.random.fork_rng(devices=[]):  # the caller's global RNG is left as it was
        torch.manual_seed(spec.seed)
        try:
            out = fn(stages)
        except Exception as exc:  # noqa: BLE001
            raise WorkloadError(f"--workload {spec.name}: calling it with stages={stages} raised "
                                f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(out, tuple) or len(out) != 3:
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else f"a {type(out).__name__}"
        raise WorkloadError(f"--workload {spec.name} returned {got}; it must return (stage_modules, make_batch, loss)")
    modules, batch, loss = out
    if isinstance(modules, nn.Module) or not isinstance(modules, Sequence):
        raise WorkloadError(f"--workload {spec.name}: stage_modules must be a list of {stages} nn.Module, "
                            f"got a {type(modules).__name__}")
    if len(modules) != stages:
        raise WorkloadError(f"--workload {spec.name} returned {len(modules)} stage module(s); the schedule has "
                            f"{stages} stages (the function gets stages={stages})")
    for s, m in enumerate(modules):
        if not isinstance(m, nn.Module):
            raise WorkloadError(f"--workload {spec.name}: stage {s} is a {type(m).__name__}, not an nn.Module")
    for label, f in (("make_batch", batch), ("loss", loss)):
        if not callable(f):
            raise WorkloadError(f"--workload {spec.name}: {label} must be callable, got a {type(f).__name__}")
    return StagedModel(tuple(modules), batch, loss)


def stages_of(spec: WorkloadSpec) -> int:
    """S, from the boundary shapes :func:`prepare` put into *spec* (S - 1 of them)."""
    return len(spec.boundaries) + 1


def stage_module(spec: WorkloadSpec, stage: int) -> nn.Module:
    """A fresh copy of *stage*'s module (callers move it and cast it: the cached model stays as built)."""
    return copy.deepcopy(load(spec, stages_of(spec)).stages[stage])


def microbatch(spec: WorkloadSpec, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of micro-batch *mb*, from the user's ``make_batch``."""
    return _batch(load(spec, stages_of(spec)), spec, mb)


def _batch(model: StagedModel, spec: WorkloadSpec, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        out = model.batch(mb)
    except Exception as exc:  # noqa: BLE001
        raise WorkloadError(f"--workload {spec.name}: make_batch({mb}) raised {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None
    if (not isinstance(out, tuple) or len(out) != 2
            or not all(isinstance(t, torch.Tensor) for t in out)):
        raise WorkloadError(f"--workload {spec.name}: make_batch({mb}) must return (input, target), two tensors; "
                            f"got {_describe(out)}")
    return out


def loss_function(spec: WorkloadSpec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The user's ``loss(output, target)`` (a micro-batch mean; callers scale it)."""
    return load(spec, stages_of(spec)).loss


def stage_input(spec: WorkloadSpec, stage: int) -> torch.Tensor:
    """What *stage* receives for micro-batch 0 (stage 0: its input): real data for the isolated calibration."""
    stages = stages_of(spec)
    key = (spec.name, spec.path, spec.seed, stages)
    with _LOCK:
        chain = _INPUTS.get(key)
    if chain is None:
        model = load(spec, stages)
        chain = [_batch(model, spec, 0)[0]]
        with torch.no_grad():
            for m in model.stages[:-1]:
                chain.append(m(chain[-1]))
        with _LOCK:
            _INPUTS[key] = chain
    return chain[stage]


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value[:4])})"
    return f"a {type(value).__name__}"


def prepare(spec: WorkloadSpec, stages: int, microbatches: int) -> WorkloadSpec:
    """Check the user's entry point for *stages* stages and *microbatches* micro-batches (see the module
    docstring); return *spec* with the folder to import from, the boundary shapes and the micro-batch size."""
    spec = spec if spec.path else replace(spec, path=os.getcwd())
    model = load(spec, stages)
    again = _call(spec, stages)  # a second build: weights from another random source would differ between ranks
    for s, (a, b) in enumerate(zip(model.stages, again.stages)):
        pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
        if pa.keys() != pb.keys() or any(not torch.equal(pa[k], pb[k]) for k in pa):
            raise WorkloadError(f"--workload {spec.name}: two builds with seed {spec.seed} gave different weights in "
                                f"stage {s}; draw them from torch's default generator (it is seeded), not numpy, "
                                f"random or the clock")
    x0, t0 = _batch(model, spec, 0)
    x0b, t0b = _batch(model, spec, 0)
    if not (torch.equal(x0, x0b) and torch.equal(t0, t0b)):
        raise WorkloadError(f"--workload {spec.name}: make_batch(0) returned different tensors on two calls; it must "
                            f"be a pure function of the micro-batch number (seed a torch.Generator with it)")
    for m in range(1, microbatches):
        x, t = _batch(model, spec, m)
        for what, a, b in (("input", x, x0), ("target", t, t0)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise WorkloadError(f"--workload {spec.name}: make_batch({m}) gives an {what} of {_describe(a)}, "
                                    f"micro-batch 0 {_describe(b)}; every micro-batch must have the same shape")
    if x0.dim() == 0:
        raise WorkloadError(f"--workload {spec.name}: the input is a scalar; its first dimension must be the samples")
    boundaries = []
    y = x0
    for s, m in enumerate(model.stages):
        try:
            with torch.no_grad():
                y_next = m(y)
        except Exception as exc:  # noqa: BLE001
            given = "the input of make_batch(0)" if s == 0 else f"stage {s - 1}'s output"
            raise WorkloadError(f"--workload {spec.name}: stage {s} cannot take {given}, {_describe(y)}: "
                                f"{type(exc).__name__}: {_first_line(exc)}") from None
        if not isinstance(y_next, torch.Tensor):
            raise WorkloadError(f"--workload {spec.name}: stage {s} returned {_describe(y_next)}; a stage returns one "
                                f"tensor")
        if s < stages - 1:
            if y_next.dtype != torch.float32:
                raise WorkloadError(f"--workload {spec.name}: stage {s} outputs {y_next.dtype}; tensors between stages "
                                    f"must be float32 (they are sent between processes as float32)")
            boundaries.append(tuple(y_next.shape))
        y = y_next
    loss = _loss(model, spec, stages, x0, t0)
    if loss.dim() != 0 or not loss.dtype.is_floating_point:
        raise WorkloadError(f"--workload {spec.name}: loss returned {_describe(loss)}; it must return a scalar "
                            f"(the micro-batch's mean loss)")
    if not loss.requires_grad:
        raise WorkloadError(f"--workload {spec.name}: the loss does not depend on any weight (no gradient); "
                            f"check that the stages have trainable parameters")
    return replace(spec, boundaries=tuple(boundaries), batch=int(x0.shape[0]))


def prepare_for(spec: WorkloadSpec, schedules: Sequence, options: dict) -> WorkloadSpec:
    """:func:`prepare` for the schedules of one launch; *options*: the workload options the user gave (sizes
    of the built-in workloads are refused: the model's sizes are set in its own code)."""
    sizes = sorted(k for k in options if k not in ("seed", "lr"))
    if sizes:
        raise WorkloadError(f"{', '.join('--' + k.replace('_', '-') for k in sizes)} do(es) not apply to "
                            f"--workload {spec.name}: your model's sizes are set in its own code")
    stages = sorted({s.stages for s in schedules})
    if len(stages) != 1:
        raise WorkloadError(f"--workload {spec.name}: the schedules have {stages} stages; your model is built for "
                            f"one number of stages, launch them separately")
    return prepare(spec, stages[0], max(s.total_microbatches for s in schedules))


def _loss(model: StagedModel, spec: WorkloadSpec, stages: int, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    y = x
    for m in model.stages:
        y = m(y)
    try:
        out = model.loss(y, target)
    except Exception as exc:  # noqa: BLE001
        raise WorkloadError(f"--workload {spec.name}: loss(output, target) raised {type(exc).__name__}: "
                            f"{_first_line(exc)} (output {_describe(y)}, target {_describe(target)})") from None
    if not isinstance(out, torch.Tensor):
        raise WorkloadError(f"--workload {spec.name}: loss returned {_describe(out)}; it must return a scalar tensor")
    return out
