"""Measure per-layer costs of a real ``torch.nn.Sequential`` (the input of :mod:`sim.model.partition`).

    python -c "import torch; from validate.predict.profile_layers import profile_sequential; \\
               from sim.model.layers import save_layers; \\
               m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]); \\
               save_layers(profile_sequential(m, torch.randn(32, 512)), 'layers.csv')"

Each layer is timed on its own with the output of the previous layer as input:
forward = median wall time of ``layer(x)``; backward = median time of
``autograd.grad`` of that output (random upstream gradient) with respect to the
input and the layer's parameters; on CUDA the device is synchronised before and after
every timing. activation_bytes = bytes of the output;
parameter_bytes = bytes of the parameters. Units: seconds, bytes. Needs torch
(the simulator side, :mod:`sim.model.layers`, does not).
"""

from __future__ import annotations

import statistics
import time

import torch

from sim.model.layers import LayerCosts

from validate.errors import ValidationError

__all__ = ["profile_sequential"]


def _sync(device: torch.device) -> None:
    """On CUDA, wait for the device: kernels are asynchronous, a host clock around a launch times the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, repeats: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def profile_sequential(model: torch.nn.Sequential, example: torch.Tensor, *, repeats: int = 5,
                       warmup: int = 2) -> LayerCosts:
    """Per-layer forward/backward seconds and bytes of *model* on the micro-batch *example*."""
    if not isinstance(model, torch.nn.Sequential):
        raise TypeError(f"profile_sequential needs a torch.nn.Sequential, got {type(model).__name__}")
    if repeats < 1 or warmup < 0:
        raise ValidationError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    names, forward, backward, act, params = [], [], [], [], []
    x = example.detach()
    for i, layer in enumerate(model):
        inp = x.detach().requires_grad_(x.is_floating_point())
        with torch.no_grad():
            forward.append(_median_time(lambda: layer(inp), repeats, warmup, x.device))
        out = layer(inp)
        grad = torch.randn_like(out)
        wrt = [inp] + [p for p in layer.parameters() if p.requires_grad]
        wrt = [t for t in wrt if t.requires_grad]

        def run_backward():
            o = layer(inp)
            _sync(inp.device)
            t0 = time.perf_counter()
            torch.autograd.grad(o, wrt, grad, allow_unused=True)
            _sync(inp.device)
            return time.perf_counter() - t0

        for _ in range(warmup):
            run_backward()
        backward.append(statistics.median(run_backward() for _ in range(repeats)) if wrt else 0.0)
        names.append(f"{i}:{type(layer).__name__}")
        act.append(float(out.numel() * out.element_size()))
        params.append(float(sum(p.numel() * p.element_size() for p in layer.parameters())))
        x = out.detach()
    return LayerCosts(forward=forward, backward=backward, activation_bytes=act, parameter_bytes=params, names=names)
