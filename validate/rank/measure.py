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
"""Seconds of a stage's forwards run on a GPU, at least, before its costs are timed; then on until the forward's
time has settled (:func:`spin_up`). On one H200 (26 Nov 2026) without a spin-up the noise floor read +-359% (mlp)
and +-230% (transformer) while the timed runs spread +-0.1%: the calibration of each stage alone before the runs
timed it several times slower than the one after them. 0.5 s fixed brought the mlp's floor to +-4.2%, but the
transformer's forward still timed 90.3 ms before the runs against 13.7 ms after (floor +-208%); running on until
the time settles, +-4.3% (forward 15.9 ms before, 14.4 ms after; mlp +-1.0%). Not the GPU's clock: in a slow
phase of 80 forwards (about 100 ms each) nvidia-smi read 1980 MHz and 11% utilization, so the host was the
bottleneck; what held it is not yet known."""

GPU_SPIN_UP_LIMIT = 10.0
"""Seconds at most of :func:`spin_up` (a stage whose forward never settles is timed as it is)."""

SETTLED = 0.05
"""The forward has settled when the median of its last five times is within this of the five before's."""


def spin_up(fn, clock, *, least: float = GPU_SPIN_UP_SECONDS, most: float = GPU_SPIN_UP_LIMIT) -> list[float]:
    """Run *fn(i)* for at least *least* seconds, then until its time settles (:data:`SETTLED`) or *most* seconds
    have passed; *clock()* returns a stop function giving the seconds since it was called (work finished:
    :func:`_timer`). Returns every run's seconds, in order."""
    times: list[float] = []
    spent = 0.0
    while spent < most:
        stop = clock()
        fn(len(times))
        times.append(stop())
        spent += times[-1]
        if spent >= least and len(times) >= 10:
            last, before = np.median(times[-5:]), np.median(times[-10:-5])
            if before > 0 and abs(last / before - 1) <= SETTLED:
                break
    return times


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
        spin_up(fwd, lambda: _timer(device))  # forwards only: a backward would keep a gradient per update group
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
