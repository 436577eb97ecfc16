"""Calibration from a profiler trace: the simulator's costs and links, measured by PyTorch's own run.

Inputs are what :mod:`validate.ingest.flow` found in the traces, over every complete profiled step:

- the compute time of every action (its range less the wait for its input), per stage and kind:
  ``F`` forward, ``B`` full backward, ``I`` input gradient, ``W`` weight gradient, ``U`` update;
- every matched message: sender, receiver, bytes (when the trace recorded shapes), the time from
  the send being posted to the receive completing, and whether the receiver was already waiting
  when the send was posted.

Per stage and kind the costs take the **median**; the spread is kept as p10 / p90 and the
relative spread ``(p90 - p10) / median``. Mapping onto :class:`sim.model.cost.StageCosts`: forward =
median F; a split backward gives backward = median I and weight = median W; a full backward
gives backward = median B and weight = 0 (the simulator's unsplit backward costs backward +
weight); update = median U or 0; send_bytes = the median size of the messages crossing the
stage's boundary (0 when unknown). Memory sizes are not in a time trace and stay 0.

Links: only messages whose receiver was already waiting when the send was posted time the
link itself (otherwise the completion is when the receiver got round to asking). Their
one-way times are fitted by least squares to ``latency + bytes / bandwidth`` (the Hockney
model; Hockney 1994) when they have at least two sizes; with one size the bandwidth cannot
be told from the latency, so latency = their median and bandwidth = unlimited. Every link is
given the same fit (the per-link medians are reported beside it). Units: seconds, bytes.

The runtime model (``pipesim ingest --runtime NAME``, :func:`calibrate_runtime`): the runtime's own costs measured
from the same trace with the validator's functions (:mod:`validate.predict.calibrate`, as ``pipesim validate
--runtime torch`` does): the dispatch overhead per stage and kind (the trace's gaps), for rendezvous links the time
a message holds its link from the later of its two posts, and the time a call that only posts holds its device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim.model.cost import StageCosts, save_costs
from sim.files import atomic_paths
from sim.model.hardware import Hardware, save_hardware
from sim.model.runtimes import get_runtime
from sim.simulate import simulate_runtime

from validate.ingest.message_draws import DEFAULT_DRAWS, STALL_SECONDS, MessageDistributions, predict_drawn
from validate.ingest.messages import MessageModel, predict_with_messages
from validate.predict.calibrate import dispatch_overhead, post_call_seconds, rendezvous_link_seconds

__all__ = ["OpStats", "LinkFit", "TraceCalibration", "calibrate", "MessageSample", "RuntimeCalibration",
           "calibrate_runtime"]


@dataclass(frozen=True, slots=True)
class OpStats:
    """Durations of one (stage, kind) over the trace, seconds."""

    n: int
    median: float
    p10: float
    p90: float

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread (0 when the median is 0)."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> OpStats:
        v = np.asarray(values, dtype=float)
        return cls(n=len(v), median=float(np.median(v)), p10=float(np.percentile(v, 10)),
                   p90=float(np.percentile(v, 90)))


@dataclass(frozen=True, slots=True)
class MessageSample:
    """One matched message."""

    src: int
    dst: int
    boundary: int
    """The stage boundary it crosses (index into ``StageCosts.send_bytes``)."""
    nbytes: float | None
    seconds: float
    """From the send being posted to the receive completing (on the aligned clock)."""
    blocked: bool
    """The receiver was already waiting when the send was posted."""


@dataclass(frozen=True, slots=True)
class LinkFit:
    latency: float
    bandwidth: float
    samples: int
    """Messages used for the fit."""
    method: str
    per_link: dict = field(default_factory=dict)
    """(src, dst) -> (messages, median one-way seconds) of the messages used."""


@dataclass(frozen=True, slots=True)
class TraceCalibration:
    """Costs and hardware for the simulator, and how they were measured."""

    costs: StageCosts
    hardware: Hardware
    stats: dict
    """(stage, kind) -> :class:`OpStats`."""
    link: LinkFit
    notes: list[str] = field(default_factory=list)

    def comments(self) -> list[str]:
        lines = ["calibrated from torch.profiler traces by pipesim ingest (validate/ingest/calibration.py)",
                 "per stage and kind: median seconds (p10-p90, n) of the compute part of each action"]
        for (stage, kind), st in sorted(self.stats.items()):
            lines.append(f"stage {stage} {kind}: median {st.median:.6g} s (p10 {st.p10:.6g}, p90 {st.p90:.6g}, "
                         f"n={st.n}, spread {st.spread:.1%})")
        lines.append(f"links: {self.link.method}")
        return lines + list(self.notes)

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict(), "hardware": self.hardware.to_dict(),
                "stats": [{"stage": s, "kind": k, "n": st.n, "median_s": st.median, "p10_s": st.p10, "p90_s": st.p90,
                           "spread": st.spread} for (s, k), st in sorted(self.stats.items())],
                "link": {"latency_s": self.link.latency,
                         "bandwidth_Bps": None if math.isinf(self.link.bandwidth) else self.link.bandwidth,
                         "samples": self.link.samples, "method": self.link.method,
                         "per_link": [{"src": a, "dst": b, "messages": n, "median_s": t}
                                      for (a, b), (n, t) in sorted(self.link.per_link.items())]},
                "notes": list(self.notes)}

    def save(self, costs_path: str | Path, hardware_path: str | Path) -> None:
        """Write ``_costs.csv`` (with this provenance as comments) and ``_hardware.json``, both or neither."""
        with atomic_paths([costs_path, hardware_path]) as (costs_tmp, hardware_tmp):
            save_costs(self.costs, costs_tmp, comments=self.comments())
            save_hardware(self.hardware, hardware_tmp)


def calibrate(stages: int, devices: int, durations: Mapping[tuple[int, str], Sequence[float]],
              messages: Sequence[MessageSample] = ()) -> TraceCalibration:
    """Costs and hardware from the measured *durations* ((stage, kind) -> seconds) and *messages*."""
    stats = {key: OpStats.of(v) for key, v in durations.items() if len(v)}
    notes: list[str] = []
    cols = {c: [0.0] * stages for c in ("forward", "backward", "weight", "update", "send_bytes")}
    for s in range(stages):
        med = {k: stats[(s, k)].median for k in ("F", "B", "I", "W", "U") if (s, k) in stats}
        cols["forward"][s] = med.get("F", 0.0)
        if "I" in med or "W" in med:
            cols["backward"][s] = med.get("I", max(0.0, med.get("B", 0.0) - med.get("W", 0.0)))
            cols["weight"][s] = med.get("W", 0.0)
            if "B" in med:
                notes.append(f"stage {s}: full backward median {med['B'] * 1e3:.3g} ms; split I + W = "
                             f"{(cols['backward'][s] + cols['weight'][s]) * 1e3:.3g} ms (the model uses I + W)")
        else:
            cols["backward"][s] = med.get("B", 0.0)
        cols["update"][s] = med.get("U", 0.0)
    sizes: dict[int, list[float]] = {}
    for m in messages:
        if m.nbytes is not None and 0 <= m.boundary < stages:
            sizes.setdefault(m.boundary, []).append(m.nbytes)
    for b, v in sizes.items():
        cols["send_bytes"][b] = float(np.median(v))
    if messages and not sizes:
        notes.append("message sizes not recorded (profile with record_shapes=True): send_bytes = 0")
    missing = [s for s in range(stages) if (s, "F") not in stats]
    if missing:
        notes.append(f"stages {missing} have no measured forward: their costs are 0")
    link = fit_links(messages)
    hardware = Hardware(devices=devices, latency=link.latency, bandwidth=link.bandwidth)
    return TraceCalibration(costs=StageCosts(**cols), hardware=hardware, stats=stats, link=link, notes=notes)


def fit_links(messages: Sequence[MessageSample]) -> LinkFit:
    """One latency / bandwidth for every link from the messages whose receiver was waiting (module docstring)."""
    if not messages:
        return LinkFit(0.0, math.inf, 0, "no matched send/receive pairs in the trace: links taken as free")
    used = [m for m in messages if m.blocked]
    per_link: dict[tuple[int, int], list[float]] = {}
    for m in used:
        per_link.setdefault((m.src, m.dst), []).append(m.seconds)
    medians = {k: (len(v), float(np.median(v))) for k, v in per_link.items()}
    if not used:
        smallest = max(0.0, min(m.seconds for m in messages))
        return LinkFit(smallest, math.inf, 0, f"no receiver was waiting when its message was sent, so no message "
                                               f"timed the link; latency = the smallest posted-to-received time "
                                               f"{smallest * 1e6:.1f} us (an upper bound), bandwidth unlimited")
    seconds = np.array([m.seconds for m in used])
    sizes = np.array([m.nbytes if m.nbytes is not None else math.nan for m in used])
    known = ~np.isnan(sizes)
    if known.sum() >= 2 and len(set(sizes[known].tolist())) >= 2:
        slope, intercept = np.polyfit(sizes[known], seconds[known], 1)
        latency = max(0.0, float(intercept))
        bandwidth = 1.0 / slope if slope > 0 else math.inf
        bw_text = "unlimited" if math.isinf(bandwidth) else f"{bandwidth / 1e9:.3g} GB/s"
        return LinkFit(latency, bandwidth, int(known.sum()), f"least-squares fit of {int(known.sum())} messages: "
                       f"latency {latency * 1e6:.1f} us, bandwidth {bw_text}", medians)
    latency = float(np.median(seconds))
    size = f"{sizes[known][0]:.0f} bytes" if known.any() else "unknown size"
    return LinkFit(latency, math.inf, len(used), f"{len(used)} messages of one size ({size}): latency = their median "
                   f"one-way time {latency * 1e6:.1f} us (bandwidth cannot be told apart: unlimited)", medians)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCalibration:
    """A runtime model calibrated from a trace: which runtime, and the costs, links and post time it predicts with."""

    runtime: str
    """The profile's name (:mod:`sim.model.runtimes`)."""
    links: str
    """``"eager"`` or ``"rendezvous"``."""
    costs: StageCosts
    """The costs with the dispatch overhead in their dispatch columns."""
    hardware: Hardware
    """The links as the runtime's semantics charge them."""
    post_overhead: float
    """Seconds a call that posts a batch of sends and receives holds its device: the median call that only posted,
    plus the runtime's own time around a call where the messages measure it."""
    dispatch: dict
    """stage -> {kind letter: seconds} measured (empty when none was measured or the costs were given)."""
    link_samples: int
    """Messages timed from their later post (rendezvous links)."""
    post_samples: int
    """Communication calls that only posted."""
    notes: tuple = ()
    """What the trace could not calibrate, and what was kept as given."""
    messages: MessageModel | None = None
    """Every message's calls, link and sender times as the trace measured them (:mod:`validate.ingest.messages`);
    None: the model's post overhead and link fit instead."""
    draws: MessageDistributions | None = None
    """The message times' distributions over every profiled step (:mod:`validate.ingest.message_draws`): the
    prediction is the median of runs drawn from them; None: the post overhead and the links' fit."""

    def to_dict(self) -> dict:
        latency = self.hardware.latency[0][1] if self.hardware.devices > 1 else 0.0
        return {"runtime": self.runtime, "links": self.links,
                "dispatch_s": {str(s): dict(v) for s, v in self.dispatch.items()},
                "link_latency_s": latency, "link_samples": self.link_samples,
                "post_overhead_s": self.post_overhead, "post_samples": self.post_samples, "notes": list(self.notes),
                "messages": None if self.messages is None else self.messages.to_dict(),
                "message_draws": None if self.draws is None else self.draws.to_dict()}

    def predict(self, schedule, *, microbatch_size: float = 1.0):
        """(Result, :class:`sim.engines.rendezvous.ProgramRun`) of *schedule* under this runtime model: with the
        measured messages when there are any (a replay of their step's communication), else the median of runs
        drawn from the message times' distributions when there are any, else the post overhead and the links'
        fit."""
        if self.messages is not None and self.messages.send_call:
            return predict_with_messages(schedule, self.costs, self.hardware, self.runtime, self.messages,
                                     microbatch_size=microbatch_size)
        if self.draws is not None:
            return predict_drawn(schedule, self.costs, self.hardware, self.runtime, self.draws,
                                 microbatch_size=microbatch_size)[:2]
        return simulate_runtime(schedule, self.costs, self.hardware, runtime=self.runtime,
                                microbatch_size=microbatch_size, post_overhead=self.post_overhead)


def calibrate_runtime(runs, costs: StageCosts, hardware: Hardware, runtime: str, *, costs_given: bool = False,
                      hardware_given: bool = False, messages: MessageModel | None = None,
                      draws: MessageDistributions | None = None, dispatch_runs=None) -> RuntimeCalibration:
    """The *runtime* model of a prediction from *costs* / *hardware* (the trace's calibration, or given files) and
    *runs*: pairs (measured :class:`sim.results.result.Result` of a step, device -> its communication-call spans or
    None), every complete profiled step (:meth:`validate.ingest.flow.Ingested.runs`).

    What the trace allows is measured, as ``pipesim validate --runtime torch`` does
    (``validate/pytorch/validation.py``, ``_compare``): the dispatch overhead from its gaps
    (:func:`validate.predict.calibrate.dispatch_overhead`; given costs keep their own dispatch columns); for
    rendezvous links, the link time from the messages timed from their later post
    (:func:`~validate.predict.calibrate.rendezvous_link_seconds`: their median less the bytes' time at the fitted
    bandwidth, never below the trace's fit, which times only messages whose receiver was waiting and so is a lower
    bound; eager links keep the fit, which times exactly what they charge); the post time as the median of the calls
    that only posted (:func:`~validate.predict.calibrate.post_call_seconds`), plus the runtime's own time around a
    call where *messages* or *draws* carry it (:mod:`validate.ingest.call_overhead`). A trace without communication calls
    (action patterns, Megatron's ranges alone) gives no link or post samples: those stay as they were, and the notes
    say so.

    *messages*: every message's measured calls and times (:meth:`validate.ingest.flow.Ingested.message_model`):
    :meth:`RuntimeCalibration.predict` then runs them instead of the post overhead and the link fit (only under
    rendezvous links, whose posts the calls are; ignored with given hardware). *draws*: the message times'
    distributions (:func:`validate.ingest.message_draws.message_distributions`): the prediction for steps not
    replayed, as ``validate --runtime torch`` makes (same conditions). *dispatch_runs*: the pairs the dispatch overhead
    is measured from, when their spans differ from *runs*' (:meth:`validate.ingest.flow.Ingested.dispatch_runs`: the
    time before each call that the call overhead charges left out as well); None: *runs*."""
    profile = get_runtime(runtime)
    notes: list[str] = []
    runs = list(runs)
    if not any(spans for _, spans in runs):
        notes.append("the trace records no communication calls: the dispatch overhead counts waits inside them as "
                     "gaps, and no link or post time could be measured")
    dispatch = {} if costs_given else dispatch_overhead(runs if dispatch_runs is None else list(dispatch_runs))
    modeled_costs = costs.with_dispatch(dispatch) if dispatch else costs
    if costs_given:
        notes.append("dispatch overhead: the given costs' dispatch columns (not measured from the trace)")
    samples = rendezvous_link_seconds(runs) if not profile.eager else []
    modeled_hw = hardware
    if hardware_given:
        notes.append("links: the given hardware (not measured from the trace)")
    elif samples and hardware.devices > 1:
        bandwidth = hardware.bandwidth[0][1]
        sizes = [b for b in modeled_costs.send_bytes if b > 0]
        moved = float(np.median(sizes)) / bandwidth if sizes and math.isfinite(bandwidth) else 0.0
        latency = max(float(np.median(samples)) - moved, hardware.latency[0][1], 0.0)
        modeled_hw = Hardware(devices=hardware.devices, latency=latency, bandwidth=bandwidth,
                              memory_capacity=hardware.memory_capacity, overlap=hardware.overlap)
    elif not profile.eager and hardware.devices > 1:
        notes.append("links: no message could be timed from its later post; the trace's link fit is used")
    posts = post_call_seconds(runs)
    # the runtime's own time around a call (validate/ingest/call_overhead.py), which the messages and draws charge
    # every call: a posting call holds its device that much longer too (a batch posts one send or one receive in
    # the multi-stage runtime; their mean)
    if draws is not None:
        around = (draws.call_overhead.send + draws.call_overhead.recv) / 2
    elif messages is not None:
        around = (messages.send_overhead + messages.recv_overhead) / 2
    else:
        around = 0.0
    if messages is not None and (profile.eager or hardware_given or not messages.send_call):
        messages = None
    if draws is not None and (profile.eager or hardware_given):
        draws = None
    if draws is not None and costs_given and draws.compute:  # the given costs, not the trace's durations
        draws = replace(draws, compute=None, dispatch=None,
                        by_step=draws.by_step and {k: replace(v, compute=None, dispatch=None)
                                                   for k, v in draws.by_step.items()})
        if not draws.messages:
            draws = None
    if draws is not None:
        drawn_compute = (", each computation's duration from those of its stage and kind, and the dispatch overhead, "
                         "in one profiled step (every step as many runs)")
        notes.append((f"communication: each message's calls and link time drawn from the {draws.messages} messages "
                      f"of every profiled step ({draws.observed} timed exactly, the rest bounded by their wait; a "
                      f"drawn stall over {STALL_SECONDS * 1e3:g} ms holds its pair of ranks)"
                      + (drawn_compute if draws.compute else "") if draws.messages
                      else f"no messages: {drawn_compute[2:]}")
                     + f"; the prediction is the run of median makespan of {DEFAULT_DRAWS} "
                       f"(validate/ingest/message_draws.py)"
                     + (f"; {draws.call_overhead.describe()}, charged to every call" if draws.call_overhead.samples
                        else ""))
    if messages is not None:
        notes.append(f"communication: every message's send and receive calls, link time and sender completion as "
                     f"the trace measured them ({len(messages.send_call)} messages, {len(messages.link)} link times "
                     f"measured, from {messages.steps} step(s)); gloo's multi-ms calls are the calling thread "
                     f"waiting for the pair's lock or a core, which the schedule does not determine "
                     f"(validate/ingest/messages.py)"
                     + (f"; every send call {messages.send_overhead * 1e6:.0f} us and every receive "
                        f"{messages.recv_overhead * 1e6:.0f} us longer for the runtime's own time around the call "
                        f"(validate/ingest/call_overhead.py)" if messages.send_overhead or messages.recv_overhead
                        else ""))
    return RuntimeCalibration(runtime=profile.name, links=profile.links, costs=modeled_costs, hardware=modeled_hw,
                              post_overhead=float(np.median(posts)) + around if posts else 0.0, dispatch=dispatch,
                              link_samples=len(samples), post_samples=len(posts), notes=tuple(notes),
                              messages=messages, draws=draws)
