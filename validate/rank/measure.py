"""What a rank measures of itself for the calibration: each stage's costs and sizes alone, and the executor's own
time per action. The rest of the calibration (fits, in-schedule times, assembling costs) is
:mod:`validate.predict.calibrate`'s, on rank 0.

Units: seconds and bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sim import schedules
from sim.model.cost import StageCosts

from validate.rank.workloads import EmulatedStage, TorchStage, WorkloadSpec, calibration_tensors

__all__ = ["measure_stage", "executor_overhead"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device, repeats: int, warmup: int) -> float:
    import time
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn(i)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


GPU_SPIN_UP_SECONDS = 0.5
"""Seconds of a stage's forwards run on a GPU before its costs are timed. On one H200 (26 Nov 2026) the noise
floor read +-359% (mlp) and +-230% (transformer) while the timed runs spread +-0.1%; its likely largest part
compares the calibration of each stage alone before the runs (the first work on the card) with the one after them.
The likely cause, not yet confirmed: an idle GPU runs slow clocks (345 MHz idle, 1980 MHz under load, seen on these
H200s) and takes time to raise them. Not yet re-measured with the spin-up
(tests/test_validate_run.py::test_the_calibrations_before_and_after_the_runs_time_the_same_gpu checks it where a
GPU is present)."""


def _spin_up(device: torch.device, fn, seconds: float = GPU_SPIN_UP_SECONDS) -> None:
    import time
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        fn(i)
        _sync(device)
        i += 1


def measure_stage(rt, spec: WorkloadSpec, *, repeats: int = 9, warmup: int = 2) -> dict[str, float]:
    """One stage's costs (seconds) and sizes (bytes); leaves the runtime reset."""
    if isinstance(rt, EmulatedStage):
        c, s = rt.costs, rt.stage
        return {col: getattr(c, col)[s] for col in c.to_dict()}
    assert isinstance(rt, TorchStage)
    device = rt.device
    x, g = calibration_tensors(spec, rt.stage, rt.last)  # the user's model: stage 0 may take token ids
    x, g = x.to(device), None if g is None else g.to(device)
    base = 10_000  # micro-batch numbers far from the real ones

    def fwd(i):
        rt.forward(base + i, x)
        rt.inflight.pop(base + i)

    if device.type == "cuda":
        _spin_up(device, fwd)  # forwards only: a backward would keep a gradient per update group
    forward = _median_time(fwd, device, repeats, warmup)
    rt.count_saved = True  # only here: counting costs a Python call per saved tensor
    out = rt.forward(base, x)
    rt.count_saved = False
    act_bytes = rt.activation_bytes
    rt.inflight.pop(base)

    def full(i):
        rt.forward(base + i, x)
        t = _timer(device)
        rt.backward(base + i, g, split=False)
        return t()

    def split(i):
        rt.forward(base + i, x)
        t = _timer(device)
        rt.backward(base + i, g, split=True)
        tb = t()
        t = _timer(device)
        rt.weight(base + i)
        return tb, t()

    def recompute(i):
        rt.forward(base + i, x, keep_graph=False)
        t = _timer(device)
        rt.recompute(base + i)
        tr = t()
        rt.backward(base + i, g, split=False)
        return tr

    full_t = _median_of(full, warmup, repeats)
    split_t = [split(i) for i in range(warmup + repeats)][warmup:]
    b = float(np.median([t[0] for t in split_t]))
    w = float(np.median([t[1] for t in split_t]))
    r = _median_of(recompute, warmup, repeats)
    u = _median_time(lambda i: rt.update(i), device, repeats, 1)
    rt.reset()
    params = sum(p.numel() * p.element_size() for p in rt.versions[0].values())
    in_bytes = x.numel() * x.element_size()
    # the unsplit backward must cost B + W in the model: keep B + W = full, split in the measured proportion
    scale = full_t / (b + w) if b + w > 0 else 1.0
    return {"forward": forward, "backward": b * scale, "weight": w * scale, "recompute": r, "update": u,
            "send_bytes": 0.0 if rt.last else float(out.numel() * out.element_size()),
            "activation_bytes": float(act_bytes), "checkpoint_bytes": float(in_bytes),
            "weight_bytes": float(params), "grad_bytes": float(params), "optimizer_bytes": 0.0}


def _timer(device):
    import time
    _sync(device)
    t0 = time.perf_counter()

    def stop():
        _sync(device)
        return time.perf_counter() - t0
    return stop


def _median_of(fn, warmup: int, repeats: int) -> float:
    return float(np.median([fn(i) for i in range(warmup + repeats)][warmup:]))


def executor_overhead(actions: int = 64) -> float:
    """Seconds the executor adds per action (dispatch and tracing) around zero-cost actions."""
    import time

    from validate.rank.executor import Executor
    from validate.rank.tracing import Tracer
    M = actions // 2
    sched = schedules.gpipe(1, M)
    costs = StageCosts(forward=[0.0], backward=[0.0])
    cpu = torch.device("cpu")
    rt = EmulatedStage(stage=0, costs=costs, device=cpu, last=True)
    best = math.inf
    for _ in range(3):
        ex = Executor(sched, 0, {0: rt}, None, Tracer(0, cpu), inputs=lambda m: None, message_shape=lambda k: (1,),
                      device=cpu)
        t0 = time.perf_counter()
        ex.run()
        best = min(best, (time.perf_counter() - t0) / len(sched))
    return best
