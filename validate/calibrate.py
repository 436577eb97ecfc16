"""Calibration: measure what the simulator needs, on the machine the schedule will run on.

- Stage costs: F, B (input gradient), W (weight gradient), the unsplit backward,
  R and U of every real stage module, timed through the same stage runtime the
  executor calls (warm-up runs, then the median of repeats), one rank at a time so
  that ranks sharing a CPU do not slow each other down. On GPUs each timing
  synchronizes the device.
- Sizes: bytes a stage sends (its output), bytes its forward saves for the backward
  (``saved_tensors_hooks``), its input (kept under recompute), its parameters.
- Links: one-way time between ranks 0 and 1 by ping-pong at several message sizes,
  fitted by least squares to ``latency + bytes / bandwidth`` (every link is assumed
  to be like this one).
- The executor's own overhead per action: a one-device schedule of zero-cost
  emulated actions, run through :class:`validate.executor.Executor` with tracing.

Stage times used for the prediction (``calibration``): ``"schedule"`` (default) takes the
median time of each stage's F, B, W, R, U in the last traced warm-up run of the schedule
itself (they include the executor's overhead and the memory and core sharing of that
schedule); ``"isolated"`` takes the isolated measurements plus the executor overhead.
Sizes always come from the isolated measurement. Units: seconds and bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from sim import schedules
from sim.cost import StageCosts, save_costs
from sim.hardware import Hardware, save_hardware

from .workloads import EmulatedStage, TorchStage, WorkloadSpec, boundary_shape

__all__ = ["Calibration", "measure_stage", "fit_link", "executor_overhead", "PING_SIZES", "assemble",
           "in_schedule_costs", "CALIBRATIONS"]

CALIBRATIONS = ("schedule", "isolated")
"""Where stage times come from: the traced warm-up run of the schedule itself, or each stage measured alone."""

PING_SIZES = [4, 16 << 10, 256 << 10, 1 << 20, 4 << 20]
"""Message sizes of the link ping-pong, bytes."""


@dataclass(slots=True, kw_only=True)
class Calibration:
    """What calibration measured; ``costs`` and ``hardware`` feed the simulator."""

    costs: StageCosts
    hardware: Hardware
    overhead: float
    """Executor overhead per action, seconds (included in ``costs``)."""
    ping: list[tuple[int, float]] = field(default_factory=list)
    """(bytes, one-way seconds) of the ping-pong."""
    notes: list[str] = field(default_factory=list)
    overhead_included: bool = True
    """True: ``overhead`` was added to every time column (isolated times); False: measured times contain it."""

    def comments(self) -> list[str]:
        lines = ["written by pipesim validate calibration (validate/calibrate.py)"]
        how = "added to every time column" if self.overhead_included else "already inside the measured times"
        lines.append(f"executor overhead {self.overhead * 1e6:.1f} us per action, {how}")
        for n, t in self.ping:
            lines.append(f"ping-pong {n} bytes: {t * 1e6:.1f} us one way")
        lines += self.notes
        return lines

    def save(self, costs_path, hardware_path) -> None:
        save_costs(self.costs, costs_path, comments=self.comments())
        save_hardware(self.hardware, hardware_path)

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict(), "hardware": self.hardware.to_dict(), "overhead_s": self.overhead,
                "ping": [list(p) for p in self.ping], "notes": list(self.notes)}


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


def measure_stage(rt, spec: WorkloadSpec, *, repeats: int = 9, warmup: int = 2) -> dict[str, float]:
    """One stage's costs (seconds) and sizes (bytes); leaves the runtime reset."""
    if isinstance(rt, EmulatedStage):
        c, s = rt.costs, rt.stage
        return {col: getattr(c, col)[s] for col in c.to_dict()}
    assert isinstance(rt, TorchStage)
    device = rt.device
    shape = boundary_shape(spec)
    gen = torch.Generator().manual_seed(12345)
    x = torch.randn(shape, generator=gen).to(device)
    g = None if rt.last else torch.randn(shape, generator=gen).to(device)
    base = 10_000  # micro-batch numbers far from the real ones

    def fwd(i):
        rt.forward(base + i, x)
        rt.inflight.pop(base + i)

    forward = _median_time(fwd, device, repeats, warmup)
    out = rt.forward(base, x)
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


def fit_link(ping: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of one-way time = latency + bytes / bandwidth; returns (latency s, bandwidth B/s)."""
    n = np.array([p[0] for p in ping], dtype=float)
    t = np.array([p[1] for p in ping], dtype=float)
    slope, intercept = np.polyfit(n, t, 1)
    latency = max(0.0, float(intercept))
    bandwidth = 1.0 / slope if slope > 0 else math.inf
    return latency, bandwidth


def executor_overhead(actions: int = 64) -> float:
    """Seconds the executor adds per action (dispatch and tracing) around zero-cost actions."""
    import time

    from .executor import Executor
    from .tracing import Tracer
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


def in_schedule_costs(schedule, compute: list[tuple[int, float, float]]) -> dict[int, dict[str, float]]:
    """stage -> {op letter: median seconds} of the actions a traced warm-up run recorded.

    Unsplit backwards are recorded as ``B_full`` (they cost backward + weight in the model).
    """
    split = schedule.split_backward
    samples: dict[int, dict[str, list[float]]] = {}
    for key, start, end in compute:
        a = schedule.action_of(key)
        op = a.kind.value if a.kind.value != "B" or (a.stage, a.mb) in split else "B_full"
        samples.setdefault(a.stage, {}).setdefault(op, []).append(end - start)
    return {s: {op: float(np.median(v)) for op, v in ops.items()} for s, ops in samples.items()}


def _merge_in_schedule(iso: dict[str, float], ctx: dict[str, float]) -> dict[str, float]:
    """Isolated measurements, with every time the warm-up run measured replaced by that one."""
    out = dict(iso)
    if "F" in ctx:
        out["forward"] = ctx["F"]
    if "B_full" in ctx:  # keep B + W = the full backward, split in the isolated proportion
        total = iso["backward"] + iso["weight"]
        share = iso["backward"] / total if total > 0 else 1.0
        out["backward"], out["weight"] = ctx["B_full"] * share, ctx["B_full"] * (1 - share)
    if "B" in ctx:
        out["backward"] = ctx["B"]
    if "W" in ctx:
        out["weight"] = ctx["W"]
    if "R" in ctx:
        out["recompute"] = ctx["R"]
    if "U" in ctx:
        out["update"] = ctx["U"]
    return out


def assemble(per_stage: dict[int, dict[str, float]], *, devices: int, ping: list[tuple[int, float]] | None,
             overhead: float, emulated: bool, in_schedule: dict[int, dict[str, float]] | None = None) -> Calibration:
    """Costs and hardware from the measurements of every rank.

    *in_schedule*: per-stage medians from the traced warm-up run (:func:`in_schedule_costs`); when given,
    they replace the isolated times (sizes always come from the isolated measurement).
    """
    stages = len(per_stage)
    notes = []
    if in_schedule and not emulated:
        iso_f = [per_stage[s]["forward"] for s in range(stages)]
        per_stage = {s: _merge_in_schedule(per_stage[s], in_schedule.get(s, {})) for s in range(stages)}
        notes.append("stage times: medians of the traced warm-up run of this schedule (isolated forward "
                     + ", ".join(f"{1e3 * a:.3g}" for a in iso_f) + " ms; in the schedule "
                     + ", ".join(f"{1e3 * per_stage[s]['forward']:.3g}" for s in range(stages)) + " ms)")
        overhead_added = 0.0  # the warm-up run's times already include the executor's overhead
    else:
        overhead_added = overhead
        if not emulated:
            notes.append("stage times: each stage measured alone (median of repeats after warm-up)")
    cols = {c: [per_stage[s][c] for s in range(stages)] for c in per_stage[0]}
    for c in ("forward", "backward", "weight", "recompute", "update"):
        cols[c] = [v + overhead_added for v in cols[c]]
    if emulated:
        notes.append("compute was emulated: stage times are the given costs, not measured")
    if ping:
        latency, bandwidth = fit_link(ping)
        notes.append(f"link fit (rank 0 <-> 1, assumed for every link): latency {latency * 1e6:.1f} us, "
                     f"bandwidth {bandwidth / 1e9:.3g} GB/s")
    else:
        latency, bandwidth = 0.0, math.inf
    hardware = Hardware(devices=devices, latency=latency, bandwidth=bandwidth)
    return Calibration(costs=StageCosts(**cols), hardware=hardware, overhead=overhead, ping=list(ping or []),
                       notes=notes, overhead_included=overhead_added > 0)
