"""Where a device's idle time goes: the schedule's own bubble, communication, or runtime overhead.

Works on any :class:`sim.results.result.Result` (simulated, measured by the validator, ingested from a
trace); needs no torch. A device is *idle* at time ``t`` in ``[0, makespan]`` when none of its
computations (F, B, W, R, U rows of the timeline) runs. Each idle instant is put in exactly one
of three categories, judged against ``N``, the next computation the device runs after ``t``:

**dependency** (waiting for a dependency: the schedule's own bubble)
    ``t`` is before every input of ``N`` has been *computed*: some producer of ``N`` (the
    actions :meth:`sim.core.ir.Schedule.dependencies` names, on any device) had not finished yet.
    Idle time after a device's last computation (the drain, waiting for the others to finish)
    is counted here too: the device has nothing left that the schedule lets it do. This is the
    bubble an ideal runtime on ideal links would still have. A producer that finished late
    because *its* device lost time shows up here downstream: the category says where the time
    was lost, not why the producer was late.

**communication** (waiting on communication)
    every producer of ``N`` had finished, but its result had not yet *arrived*: ``t`` lies
    before the end of the transfer row carrying a producer's result to this device. Also any
    other idle instant the device spent inside a communication call (posting a send or a
    receive), or with one of its sends pending that its runtime waits for before a later
    computation (from the send's post to its sender's completion), when the caller passes those
    intervals (*comm_spans*). One rule for both sides (issue 27), each from its own data: a trace
    gives its calls and, per message, its post and its sender's completion
    (:meth:`validate.ingest.flow.Ingested.communication`), a prediction its engine's posts and
    completions (:attr:`sim.engines.rendezvous.ProgramRun.communication`). Not a prediction's
    blocked waits alone: a trace records no span for a wait on a send (torch 2.13 on gloo:
    ``c10d::send`` and ``gloo:send`` only), so a sender waiting out its own send was
    communication in the prediction and gap in the trace (``tests/test_idle_rule.py``). With
    hardware that does not overlap communication and compute, a simulated device's own sends
    count as such calls.

**gap** (gaps between actions: runtime overhead)
    everything ``N`` needs had arrived and the device was not inside a communication call,
    yet it did not compute: the runtime's own time (Python dispatch, bookkeeping, the
    profiler). A simulation has none.

So per device: busy + dependency + communication + gap = makespan (computations of one
device never overlap). Without transfer rows (a trace without p2p events) the in-flight
part of communication cannot be seen and lands in *gap*. Units: seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.core.ir import Action, ActionKind
from sim.results.result import Result
from sim.results.timeline import compute_rows, transfer_rows

__all__ = ["IdleSplit", "split_idle", "action_gaps", "mean_split", "CATEGORIES"]

CATEGORIES = ("dependency", "communication", "gap")


@dataclass(frozen=True, slots=True)
class IdleSplit:
    """Seconds of idle time per device and category (see the module docstring)."""

    makespan: float
    busy: tuple[float, ...]
    dependency: tuple[float, ...]
    communication: tuple[float, ...]
    gap: tuple[float, ...]

    @property
    def devices(self) -> int:
        return len(self.busy)

    def total(self, category: str) -> float:
        return float(sum(getattr(self, category)))

    def fraction(self, category: str) -> float:
        """Share of K x makespan (so the three fractions add up to the bubble fraction)."""
        whole = self.devices * self.makespan
        return self.total(category) / whole if whole > 0 else 0.0

    def to_dict(self) -> dict:
        out = {"makespan": self.makespan, "busy": list(self.busy)}
        for c in CATEGORIES:
            out[c] = list(getattr(self, c))
            out[f"{c}_total"] = self.total(c)
            out[f"{c}_fraction"] = self.fraction(c)
        return out


def split_idle(result: Result, comm_spans: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> IdleSplit:
    """Split every device's idle time of *result* into the three categories.

    *comm_spans*: device -> intervals (seconds, on the timeline's clock) the device spent inside
    communication calls or with a waited send pending; None: none known (for a simulation without
    overlap: its own sends). A prediction under a runtime model passes
    :attr:`sim.engines.rendezvous.ProgramRun.communication`, a trace
    :meth:`validate.ingest.flow.Ingested.communication` (the module docstring's rule).
    """
    schedule = result.schedule
    busy, dep, comm, gap = ([0.0] * schedule.devices for _ in range(4))
    for d, _action, b, dependency, (waiting, inside), runtime in _idle_before_actions(result, comm_spans):
        busy[d] += b
        dep[d] += dependency
        comm[d] += waiting
        comm[d] += inside
        gap[d] += runtime
    return IdleSplit(makespan=result.metrics.makespan, busy=tuple(busy), dependency=tuple(dep),
                     communication=tuple(comm), gap=tuple(gap))


def mean_split(splits: Sequence[IdleSplit]) -> dict:
    """Over several runs (profiled steps, or a prediction's draws): per category the mean and standard deviation
    of its share of K x makespan (``<category>_fraction``, ``<category>_fraction_sd``), and how many runs."""
    out: dict = {"runs": len(splits)}
    for c in CATEGORIES:
        values = [s.fraction(c) for s in splits]
        mean = sum(values) / len(values) if values else 0.0
        out[f"{c}_fraction"] = mean
        out[f"{c}_fraction_sd"] = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5 if values else 0.0
    return out


def action_gaps(result: Result, comm_spans: Mapping[int, Sequence[tuple[float, float]]] | None = None
                ) -> list[tuple[Action, float]]:
    """Each computation of *result* with the *gap* idle time just before it (seconds): the runtime's own time
    between the moment everything the action needs had arrived and its start, outside communication calls.
    What calibrates the dispatch overhead (:func:`validate.predict.calibrate.dispatch_overhead`)."""
    return [(action, runtime) for _d, action, _b, _dep, _comm, runtime in _idle_before_actions(result, comm_spans)
            if action is not None]


def _idle_before_actions(result: Result, comm_spans):
    """Per computation (device, action, busy, dependency, (communication: waiting for an arrival, inside calls),
    gap) before it, in each device's order; then per device one row (device, None, 0, drain, (0, 0), 0) for the
    idle time after its last computation."""
    schedule, tl = result.schedule, result.timeline
    makespan = result.metrics.makespan
    comp = compute_rows(tl)
    ends: dict[tuple, float] = {}
    rows: dict[int, list[tuple[float, float, Action]]] = {d: [] for d in range(schedule.devices)}
    for dev, stage, op, mb, start, end in zip(comp["device"].tolist(), comp["stage"].tolist(),
                                               comp["op"].astype(str).tolist(), comp["microbatch"].tolist(),
                                               comp["start"].tolist(), comp["end"].tolist()):
        action = Action(stage, ActionKind(op), mb)
        ends[action] = end
        rows[dev].append((start, end, action))
    sends = transfer_rows(tl)
    arrivals: dict[tuple, float] = {}  # (producer, destination device) -> arrival
    for op, stage, mb, dst, end in zip(sends["op"].astype(str).tolist(), sends["stage"].tolist(),
                                       sends["microbatch"].tolist(), sends["dst"].tolist(), sends["end"].tolist()):
        producer = Action(stage, ActionKind.F if op == "SEND_F" else ActionKind.B, mb)
        arrivals[(producer, dst)] = max(end, arrivals.get((producer, dst), end))
    if comm_spans is None and not result.hardware.overlap:
        comm_spans = {}
        for src, start, end in zip(sends["src"].tolist(), sends["start"].tolist(), sends["end"].tolist()):
            comm_spans.setdefault(src, []).append((start, end))
    calls = {d: _union(spans) for d, spans in (comm_spans or {}).items()}
    for d, spans in rows.items():
        spans.sort(key=lambda r: r[0])
        free = 0.0  # end of the device's latest computation so far
        for start, end, action in spans:
            dependency, communication, runtime = 0.0, (0.0, 0.0), 0.0
            if start > free:
                computed, arrived = free, free
                for p in schedule.dependencies(action):
                    done = ends.get(p)
                    if done is None:
                        continue
                    computed = max(computed, done)
                    arrived = max(arrived, done, arrivals.get((p, d), done) if schedule.device_of(p) != d else done)
                computed, arrived = min(computed, start), min(max(arrived, computed), start)
                inside = _covered(calls.get(d, ()), arrived, start)
                dependency, communication, runtime = computed - free, (arrived - computed, inside), \
                    start - arrived - inside
            yield d, action, end - start, dependency, communication, runtime
            free = max(free, end)
        yield d, None, 0.0, max(0.0, makespan - free), (0.0, 0.0), 0.0  # the drain


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Length of [a, b] covered by the (disjoint, sorted) *spans*."""
    if b <= a:
        return 0.0
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in spans if hi > a and lo < b)
