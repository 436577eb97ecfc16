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
- The executor's own overhead per action (:func:`in_schedule_overhead`): in the last
  traced warm-up run, the host time the executor spent around each action on its own
  work (completing and posting receives, issuing the send, tracing; neither the action
  nor a wait for a message), averaged per stage and op. It is real time on the device's
  critical path that no stage cost contains: on this project's 2-core VM an ``isend``
  issued after a sleeping action takes 0.1-0.3 ms (waking an idle core), 1-2% of a
  20 ms action. Without a traced warm-up run, :func:`validate.rank.measure.executor_overhead` measures a
  one-device schedule of zero-cost actions instead (no communication: a lower bound).
  On CUDA the host issues work ahead of the device, so host overhead is not added.

Stage times used for the prediction (``calibration``): ``"schedule"`` (default) takes the
mean time (a tenth trimmed at each end) of each stage's F, B, W, R, U in a traced run of the schedule itself (the memory
and core sharing of that schedule included): the last warm-up run for the first timed run,
the timed run before it for every later one (:mod:`validate.predict.prediction`); ``"isolated"`` takes
the isolated measurements. Either way the executor overhead is added to every action's cost
(and the report says by how much). Sizes always come from the isolated measurement.
Units: seconds and bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.model.cost import StageCosts, save_costs
from sim.model.hardware import Hardware, save_hardware


__all__ = ["dispatch_overhead", "rendezvous_link_seconds", "post_call_seconds", "Calibration", "fit_link",
           "PING_SIZES", "assemble", "in_schedule_costs", "in_schedule_overhead", "with_overhead", "OVERHEAD_COLUMNS", "CALIBRATIONS",
           "WARMUP_RUN", "ZERO_COST"]

CALIBRATIONS = ("schedule", "isolated")
"""Where stage times come from: the traced warm-up run of the schedule itself, or each stage measured alone."""

PING_SIZES = [4, 16 << 10, 256 << 10, 1 << 20, 4 << 20]
"""Message sizes of the link ping-pong, bytes."""

WARMUP_RUN = "warm-up run"
"""Label of the last traced warm-up run, the default source of the in-schedule stage times and overhead."""
ZERO_COST = "zero-cost actions"
"""Label of the fallback overhead source: a one-device schedule of zero-cost actions (no communication)."""

OVERHEAD_COLUMNS = {"F": "forward", "B": "backward", "W": "weight", "R": "recompute", "U": "update"}
"""Op letter -> the cost column its executor overhead is added to (an unsplit B costs backward + weight
in the model, so its overhead goes to ``backward`` once)."""


@dataclass(slots=True, kw_only=True)
class Calibration:
    """What calibration measured; ``costs`` and ``hardware`` feed the simulator."""

    costs: StageCosts
    hardware: Hardware
    overhead: float
    """Executor overhead per action, seconds: the mean over the stages and ops of :attr:`overhead_per_stage`."""
    ping: list[tuple[int, float]] = field(default_factory=list)
    """(bytes, one-way seconds) of the ping-pong."""
    notes: list[str] = field(default_factory=list)
    overhead_included: bool = True
    """True: the overhead was added to the time columns of ``costs``; False: not added (CUDA, given costs)."""
    overhead_per_stage: dict[int, dict[str, float]] = field(default_factory=dict)
    """stage -> {cost column: seconds of executor overhead added to it} (empty when none was added)."""
    overhead_source: str = ""
    """Where the overhead was measured: ``"warm-up run"`` (the last one), ``"timed run N"`` (the rolling
    prediction of run N + 1) or ``"zero-cost actions"`` (no communication)."""

    def base_costs(self) -> StageCosts:
        """``costs`` without the executor overhead: what the stages themselves take."""
        if not self.overhead_included:
            return self.costs
        return with_overhead(self.costs, {s: {c: -v for c, v in per.items()} for s, per in self.overhead_per_stage.items()})

    def comments(self) -> list[str]:
        lines = ["written by pipesim validate calibration (validate/predict/calibrate.py)"]
        how = (f"added to every action's cost (measured in the {self.overhead_source})" if self.overhead_included
               else "not added")
        lines.append(f"executor overhead {self.overhead * 1e6:.1f} us per action on average, {how}")
        for n, t in self.ping:
            lines.append(f"ping-pong {n} bytes: {t * 1e6:.1f} us one way")
        lines += self.notes
        return lines

    def save(self, costs_path, hardware_path) -> None:
        save_costs(self.costs, costs_path, comments=self.comments())
        save_hardware(self.hardware, hardware_path)

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict(), "hardware": self.hardware.to_dict(), "overhead_s": self.overhead,
                "overhead_included": self.overhead_included, "overhead_source": self.overhead_source,
                "overhead_per_stage_s": {str(s): dict(v) for s, v in self.overhead_per_stage.items()},
                "ping": [list(p) for p in self.ping], "notes": list(self.notes)}


def fit_link(ping: list[tuple[int, float]]) -> tuple[float, float]:
    """Fit of one-way time = latency + bytes / bandwidth; returns (latency s, bandwidth B/s).

    Least squares on *relative* residuals (weights 1/t): the sizes span 4 B to 4 MiB, and a plain
    fit lets a 5% wobble of the 4 MiB time (60 us) swamp the latency, which the small messages
    measure directly (seen: a fitted latency of 0.9 ms from a 4-byte time of 60 us).
    """
    n = np.array([p[0] for p in ping], dtype=float)
    t = np.array([p[1] for p in ping], dtype=float)
    slope, intercept = np.polyfit(n, t, 1, w=1.0 / np.maximum(t, 1e-12))
    latency = max(0.0, float(intercept))
    bandwidth = 1.0 / slope if slope > 0 else math.inf
    return latency, bandwidth


def in_schedule_costs(schedule, compute: list[tuple[int, float, float]]) -> dict[int, dict[str, float]]:
    """stage -> {op letter: mean seconds, a tenth trimmed at each end} of the actions a traced run recorded.

    Unsplit backwards are recorded as ``B_full`` (they cost backward + weight in the model).

    A mean, not the median, for the reason :func:`in_schedule_overhead` gives: the makespan is a sum
    of action times along the critical path, and on a machine shared with other work the times are
    skewed (a preempted transformer backward took 48-55 ms where most took 21 ms, in every run). On
    the 2-core VM, five launches of transformer GPipe and 1F1B (K=2, M=8; each run predicted from
    the run before it) with other processes busy beside them: median errors +9, +16, +21% with means
    against +43, +29, +30% with medians; on a quiet machine both within 1% of each other (24 Nov 2026).
    """
    split = schedule.split_backward
    samples: dict[int, dict[str, list[float]]] = {}
    for key, start, end in compute:
        a = schedule.action_of(key)
        op = a.kind.value if a.kind.value != "B" or (a.stage, a.mb) in split else "B_full"
        samples.setdefault(a.stage, {}).setdefault(op, []).append(end - start)
    means = {s: {op: _trimmed_mean(v) for op, v in ops.items()} for s, ops in samples.items()}
    for s, ops in samples.items():
        if {"B_full", "B", "W"} <= set(ops):
            means[s] = _pooled_backward(means[s], len(ops["B_full"]), min(len(ops["B"]), len(ops["W"])))
    return means


def _pooled_backward(means: dict[str, float], full: int, split: int) -> dict[str, float]:
    """A stage that runs whole backwards and split ones (DualPipeV: whole in its overlapped pairs, B and W apart
    near the end) has two estimates of one backward's time, B + W: *full* whole ones and *split* pairs of halves.
    The model costs a whole backward B + W, so both are pooled, weighted by how many each holds, and B and W keep
    the split ones' proportion. Taken apart, B and W came from one or two micro-batches each: DualPipeV at K=2,
    M=4 (mlp) had stage 1's W at 31.3 ms from its one split micro-batch and its whole backwards at 50.3-53.1 ms
    against B + W = 58.8; with its pairs run as units (:mod:`validate.rank.executor`) three runs came out -1.5,
    -1.5 and -1.6% (measured / predicted - 1) with B and W taken apart, +1.3, +0.4 and -0.0% pooled (26 Nov
    2026, load 0.9-1.3)."""
    halves = means["B"] + means["W"]
    if halves <= 0:
        return means
    total = (full * means["B_full"] + split * halves) / (full + split)
    return {**means, "B": total * means["B"] / halves, "W": total * means["W"] / halves, "B_full": total}


def with_overhead(costs: StageCosts, added: dict[int, dict[str, float]]) -> StageCosts:
    """*costs* with ``added[stage][column]`` seconds added to those time columns (executor overhead)."""
    if not added:
        return costs
    cols = costs.to_dict()
    for s, per in added.items():
        for col, extra in per.items():
            cols[col][s] += extra
    return StageCosts(**cols)


def in_schedule_overhead(schedule, overhead: list[tuple[int, float]]) -> dict[int, dict[str, float]]:
    """stage -> {cost column: mean seconds of executor overhead per action} from a traced run's
    :attr:`validate.rank.tracing.RankTrace.overhead` (column as :data:`OVERHEAD_COLUMNS`).

    A mean, not the median: what the prediction needs is the overhead summed along the critical path,
    and this overhead is skewed (an ``isend`` that wakes an idle core costs several times one that
    does not), so the median under-counts the sum. Trimmed by a tenth at each end (none below ten
    samples): one preemption of a few milliseconds in the warm-up run would otherwise be charged to
    every action of its kind.
    """
    samples: dict[int, dict[str, list[float]]] = {}
    for key, seconds in overhead:
        a = schedule.action_of(key)
        samples.setdefault(a.stage, {}).setdefault(OVERHEAD_COLUMNS[a.kind.value], []).append(max(0.0, seconds))
    return {s: {col: _trimmed_mean(v) for col, v in cols.items()} for s, cols in samples.items()}


def _trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    ordered = sorted(values)
    k = int(cut * len(ordered))
    return float(np.mean(ordered[k:len(ordered) - k]))


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
             overhead: float, emulated: bool, in_schedule: dict[int, dict[str, float]] | None = None,
             action_overhead: dict[int, dict[str, float]] | None = None, add_overhead: bool = True,
             traced_in: str = WARMUP_RUN) -> Calibration:
    """Costs and hardware from the measurements of every rank.

    *in_schedule*: per-stage (trimmed) means from a traced run of the schedule (:func:`in_schedule_costs`); when
    given, they replace the isolated times (sizes always come from the isolated measurement).
    *action_overhead*: the executor overhead per stage and cost column measured in that run
    (:func:`in_schedule_overhead`); without it the scalar *overhead* (zero-cost actions, no communication)
    is added to every time column. *add_overhead*: False on CUDA (host work overlaps the device's).
    *traced_in*: which run those two come from (:data:`WARMUP_RUN`, or ``"timed run N"`` for the rolling
    prediction of :mod:`validate.predict.prediction`); it names the source in the notes and ``overhead_source``.
    """
    stages = len(per_stage)
    notes = []
    if in_schedule and not emulated:
        iso_f = [per_stage[s]["forward"] for s in range(stages)]
        per_stage = {s: _merge_in_schedule(per_stage[s], in_schedule.get(s, {})) for s in range(stages)}
        notes.append(f"stage times: means of the traced {traced_in} of this schedule (isolated forward "
                     + ", ".join(f"{1e3 * a:.3g}" for a in iso_f) + " ms; in the schedule "
                     + ", ".join(f"{1e3 * per_stage[s]['forward']:.3g}" for s in range(stages)) + " ms)")
    elif not emulated:
        notes.append("stage times: each stage measured alone (median of repeats after warm-up)")
    time_cols = tuple(OVERHEAD_COLUMNS.values())
    if action_overhead:
        added = {s: {c: action_overhead.get(s, {}).get(c, 0.0) for c in time_cols} for s in range(stages)}
        source = traced_in
        measured = [v for per in action_overhead.values() for v in per.values()]
        typical = float(np.mean(measured)) if measured else 0.0
    else:
        added = {s: {c: overhead for c in time_cols} for s in range(stages)}
        source, typical = ZERO_COST, overhead
    if not add_overhead:
        added = {}
    cols = {c: [per_stage[s][c] for s in range(stages)] for c in per_stage[0]}
    if add_overhead:
        per_op = ", ".join(f"{col} {1e6 * max(per.get(col, 0.0) for per in added.values()):.0f}" for col in time_cols
                           if any(per.get(col, 0.0) for per in added.values()))
        notes.append(f"executor overhead per action added to every predicted action (mean {typical * 1e6:.0f} us; "
                     f"largest per stage: {per_op or 'none'} us), measured "
                     + (f"in the traced {traced_in}: the rank's own time around each action, neither computing "
                        "nor waiting for a message (posting receives, issuing the send, tracing)"
                        if source != ZERO_COST else "on zero-cost actions without communication (a lower bound)"))
    else:
        notes.append(f"executor overhead ({typical * 1e6:.0f} us per action on the host) not added: on GPUs the "
                     "host issues work ahead of the device")
    if emulated:
        notes.append("compute was emulated: stage times are the given costs, not measured")
    if ping:
        latency, bandwidth = fit_link(ping)
        notes.append(f"link fit (rank 0 <-> 1, assumed for every link): latency {latency * 1e6:.1f} us, "
                     f"bandwidth {bandwidth / 1e9:.3g} GB/s")
    else:
        latency, bandwidth = 0.0, math.inf
    hardware = Hardware(devices=devices, latency=latency, bandwidth=bandwidth)
    return Calibration(costs=with_overhead(StageCosts(**cols), added), hardware=hardware, overhead=typical,
                       ping=list(ping or []),
                       notes=notes, overhead_included=add_overhead, overhead_per_stage=added,
                       overhead_source=source)


def dispatch_overhead(runs) -> dict[int, dict[str, float]]:
    """stage -> {kind letter: mean seconds of runtime gap before one action of that kind}, over *runs*: pairs
    (measured :class:`sim.results.result.Result`, its communication-call spans or None).

    The gap before an action is the idle time after everything it needs had arrived, outside communication calls
    (:func:`validate.compare.idle.action_gaps`): the runtime's own time (Python dispatch, bookkeeping, the
    profiler). It becomes the costs' dispatch columns (:meth:`sim.model.cost.StageCosts.with_dispatch`), which the
    engines charge before each action. A mean, not a median, for :func:`in_schedule_overhead`'s reason: the
    makespan sums these along the critical path.
    """
    from validate.compare.idle import action_gaps

    sums: dict[tuple[int, str], float] = {}
    counts: dict[tuple[int, str], int] = {}
    for result, spans in runs:
        for action, gap in action_gaps(result, spans):
            key = (action.stage, action.kind.value)
            sums[key] = sums.get(key, 0.0) + max(gap, 0.0)
            counts[key] = counts.get(key, 0) + 1
    out: dict[int, dict[str, float]] = {}
    for (stage, kind), total in sorted(sums.items()):
        out.setdefault(stage, {})[kind] = total / counts[(stage, kind)]
    return out


def rendezvous_link_seconds(runs) -> list[float]:
    """Seconds each message of *runs* held its link under rendezvous semantics: from the later of its send's post
    and its receive's post to its arrival (what :mod:`sim.engines.rendezvous` charges as latency + bytes /
    bandwidth). *runs*: pairs (measured :class:`sim.results.result.Result`, device -> communication-call spans).

    A message's send post is its transfer row's start. Its receive post is read from the receiver's communication
    calls: the start of the call during which it arrived (the receive a runtime posts and then waits on, as
    PyTorch's single-stage loops do); a message that arrived outside every call (its receive was posted earlier
    and waited on by the consuming computation) gives no sample. Why not the link fit of the trace calibration
    alone: that fit times only messages whose receiver was already waiting, and a runtime that posts its receives
    late (``ScheduleGPipe``, ``Schedule1F1B``) mostly moves the others, whose cost on gloo includes waking the
    sender's side (measured: 2-3 x the fit on the 2-core machine).
    """
    from sim.results.timeline import transfer_rows

    samples: list[float] = []
    for result, spans in runs:
        if not spans:
            continue
        calls = {d: sorted(v) for d, v in spans.items()}
        sends = transfer_rows(result.timeline)
        for dst, posted, arrived in zip(sends["dst"].tolist(), sends["start"].tolist(), sends["end"].tolist()):
            covering = [a for a, b in calls.get(dst, ()) if a <= arrived <= b]
            if not covering:
                continue
            start = max(posted, max(covering))
            if arrived > start:
                samples.append(arrived - start)
    return samples


def post_call_seconds(runs) -> list[float]:
    """Durations of the communication calls of *runs* that only posted: none of their device's messages completed
    while they ran (no receive arrived, no send was waited for). What a runtime's call that posts a batch costs its
    device (:mod:`sim.engines.rendezvous`'s *post_seconds*). *runs*: pairs (measured Result, device -> call spans);
    calls outside the run's own [0, makespan] (other profiled steps on the same clock) are left out."""
    from sim.results.timeline import transfer_rows

    samples: list[float] = []
    for result, spans in runs:
        if not spans:
            continue
        makespan = result.metrics.makespan
        sends = transfer_rows(result.timeline)
        arrivals: dict[int, list[float]] = {}  # device -> when one of its messages completed (in or out)
        for src, dst, arrived in zip(sends["src"].tolist(), sends["dst"].tolist(), sends["end"].tolist()):
            arrivals.setdefault(dst, []).append(arrived)
            arrivals.setdefault(src, []).append(arrived)
        for d, calls in spans.items():
            times = np.sort(np.asarray(arrivals.get(d, []), dtype=float))
            for a, b in calls:
                if not (0.0 <= a and b <= makespan and b > a):
                    continue
                inside = np.searchsorted(times, b, side="right") - np.searchsorted(times, a, side="left")
                if inside == 0:
                    samples.append(b - a)
    return samples
