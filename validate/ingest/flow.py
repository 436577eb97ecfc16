"""Profiler traces of a real pipeline run -> one measured timeline (the simulator's schema). Needs no torch.

    from validate.ingest.flow import ingest
    ing = ingest(["rank0.json", "rank1.json.gz"], schedules.one_f_one_b(2, 4))
    ing.measured.timeline, ing.measured.metrics.bubble_fraction, ing.calibration.costs

The steps, each in its own module:

1. read the metadata of every trace (a short pass over its head): the rank is the trace's
   ``distributedInfo.rank`` (mapped through the process group of K ranks when the global ranks are
   not 0..K-1), else a ``rank<N>`` in the file name, else the caller's *ranks*;
2. stream each trace (:mod:`validate.ingest.reader`: one pass, only the events ingest uses) and
   reduce it at once to its actions and messages (:mod:`validate.ingest.actions`, naming forms
   there; runtimes that name none: :mod:`validate.ingest.infer`), so that one rank's events are in
   memory at a time (two, in two worker processes, for traces of 64 MB and more);
3. group them by profiled step (``ProfilerStep#N`` ranges, else the k-th occurrence of each
   action is step k); a step every rank recorded in full is *complete*;
4. pair sends with receives: by what they carry where the trace says it, otherwise in order
   (the k-th send of a rank to a peer carries the k-th result it computed for that peer; the k-th
   receive from a peer feeds the k-th computation that needs one from it: the runtimes post them in that
   order on each link, while across peers they need not: Megatron's interleaved steady state sends a
   backward's gradient before the forward's output it computed first);
5. put the ranks on one clock (:mod:`validate.ingest.clocks`);
6. check the chosen step against the schedule: every action of the schedule present, none
   extra, each on its stage's rank, each rank in the schedule's order, otherwise
   :class:`ScheduleMismatchError` naming them (none is guessed); ranks more than an hour apart on
   the common clock are refused (not one run, or a broken clock). PyTorch runs no optimizer step inside its schedule, so the schedule's ``U``
   actions are dropped (from the prediction too) unless the trace marks them (``--action-pattern``);
7. calibrate from every complete step (:mod:`validate.ingest.calibration`) and build the measured
   :class:`sim.results.result.Result` of the chosen step (``source="measured"``): rows start at the
   step's first computation, device = rank, transfer rows from the send's post to the receive's
   completion (to its estimated arrival where the runtime's wait found it already complete:
   :func:`_estimate_arrivals`); the schedule it carries is the order the ranks actually ran.

What is measured and what is inferred is listed in :attr:`Ingested.notes`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sim.errors import PipesimError
from sim.core.ir import Action, ActionKind, Schedule, ScheduleError, key_kind, transfer_op
from sim.results.result import Result, make_result
from sim.results.timeline import timeline_frame

from validate.ingest.actions import SOURCES, ActionRange, Message, RankRecords, compile_patterns
from validate.ingest.calibration import MessageSample, TraceCalibration, calibrate
from validate.ingest.call_overhead import NO_OVERHEAD, CallOverhead, call_overhead, spans_before_calls
from validate.ingest.clocks import CLOCK_MODES, ClockAlignment, ClockError, align_clocks
from validate.ingest.messages import MessageTimes, message_model, pending_spans
from validate.ingest.reader import TraceFile, rank_from_name, read_header
from validate.ingest.workers import read_ranks

__all__ = ["IngestError", "MissingRankError", "NoActionsError", "ScheduleMismatchError", "Ingested", "ingest",
           "ClockError", "CLOCK_MODES", "without_updates"]

_US = 1e-6  # seconds per microsecond
MAX_SPREAD_US = 3600e6
"""Ranks whose steps lie further apart than this (an hour) on the common clock are not one run."""
_KIND_TO_IR = {"F": ActionKind.F, "B": ActionKind.B, "I": ActionKind.B, "W": ActionKind.W, "U": ActionKind.U}


class IngestError(PipesimError):
    """Traces that cannot be turned into a measured timeline of the given schedule."""


class MissingRankError(IngestError):
    """The schedule has a rank no trace was given for (or two traces claim one rank)."""


class NoActionsError(IngestError):
    """A trace with no pipeline actions in any known naming form."""


class ScheduleMismatchError(IngestError):
    """The trace ran other actions than the schedule: missing, extra or misplaced ones are named."""


@dataclass(frozen=True, slots=True)
class Ingested:
    """The measured run of one step, everything measured from the traces, and what was inferred."""

    measured: Result
    """The chosen step as a Result (``source="measured"``); its schedule is the order that ran."""
    schedule: Schedule
    """The schedule it was checked against (U dropped when the trace has none): what to predict."""
    calibration: TraceCalibration
    """Costs and links measured over every complete step."""
    step: int
    steps: dict = field(default_factory=dict)
    """step -> measured Result of every complete step (the chosen one included)."""
    comm_spans: dict = field(default_factory=dict)
    """step -> {device: [(start, end) seconds]} spent inside communication calls (for :mod:`validate.compare.idle`)."""
    clock: ClockAlignment | None = None
    traces: tuple = ()
    """Path of the trace of each rank, in rank order."""
    forms: tuple = ()
    """Naming forms found: 'PP', 'single', 'pattern', 'overlap'."""
    order_differences: tuple = ()
    """Devices whose order differs from the schedule's, as sentences (ingest refuses such traces; kept for callers
    that build an Ingested themselves)."""
    notes: tuple = ()
    link_seconds: dict = field(default_factory=dict)
    """Producer key -> seconds its transfer took, for the messages of the chosen step whose receiver was already
    waiting when they were sent (those time the link itself)."""
    actions_measured: int = 0
    """Actions of the chosen step whose identity the trace names."""
    actions_inferred: int = 0
    """Actions of the chosen step numbered from the schedule's order (runtimes that name none)."""
    messages: dict = field(default_factory=dict)
    """step -> {producer key: :class:`validate.ingest.messages.MessageTimes`}: every paired host message's calls
    and completion (the runtime model's per-message inputs)."""
    call_overhead: CallOverhead = NO_OVERHEAD
    """The runtime's own time around each communication call (:mod:`validate.ingest.call_overhead`), which the
    message models charge every call."""
    before_calls: dict = field(default_factory=dict)
    """step -> {device: [(start, end) seconds]}: the time before each call that :attr:`call_overhead` measures where
    its form is ``before the call`` (empty otherwise): what :meth:`dispatch_spans` leaves out of the gaps."""

    def runs(self) -> list[tuple[Result, dict | None]]:
        """(measured Result, device -> communication-call spans or None) of every complete step, in step order:
        what the runtime model is calibrated from (:func:`validate.ingest.calibration.calibrate_runtime`)."""
        return [(self.steps[s], self.comm_spans.get(s)) for s in sorted(self.steps)]

    def dispatch_spans(self) -> dict:
        """step -> device -> the spans the dispatch overhead is not measured in: the communication calls and waits
        (:attr:`comm_spans`) and the time before each call that the call overhead already charges
        (:attr:`before_calls`, :func:`validate.ingest.call_overhead.spans_before_calls`)."""
        out = {}
        for s in sorted(set(self.comm_spans) | set(self.before_calls)):
            calls, before = self.comm_spans.get(s) or {}, self.before_calls.get(s) or {}
            out[s] = {d: sorted(list(calls.get(d, [])) + list(before.get(d, [])))
                      for d in sorted(set(calls) | set(before))}
        return out

    def dispatch_runs(self) -> list[tuple[Result, dict | None]]:
        """As :meth:`runs`, with :meth:`dispatch_spans` for the spans: what the dispatch overhead is calibrated
        from (:func:`validate.ingest.calibration.calibrate_runtime`'s *dispatch_runs*)."""
        spans = self.dispatch_spans()
        return [(self.steps[s], spans.get(s)) for s in sorted(self.steps)]

    def communication(self, step: int | None = None, runtime: str | None = None) -> dict:
        """device -> the spans of *step* (default: the chosen one) it spent in a communication call, and, given the
        *runtime* that ran (a name of :mod:`sim.model.runtimes`), with a send pending that the runtime waits for
        mid-step (:func:`validate.ingest.messages.pending_spans`): what the idle split counts as communication, by
        the rule a prediction under that runtime follows too (validate/compare/idle.py). None: the calls alone."""
        step = self.step if step is None else step
        calls = self.comm_spans.get(step) or {}
        pending = {}
        if runtime is not None:
            from sim.core.comm_lowering import lower
            from sim.model.runtimes import get_runtime

            program = lower(self.schedule, get_runtime(runtime).lowering(self.schedule))
            pending = pending_spans(self.messages.get(step, {}), program)
        return {d: sorted(list(calls.get(d, [])) + pending.get(d, [])) for d in sorted(set(calls) | set(pending))}

    def message_model(self, steps: Sequence[int] | None = None):
        """The :class:`validate.ingest.messages.MessageModel` of *steps* (default: the chosen step alone, a replay
        of its communication, its links queue-free; several steps: per message the median)."""
        return message_model(self.messages, [self.step] if steps is None else list(steps), self.call_overhead,
                             schedule=self.schedule)

    def to_dict(self) -> dict:
        return {"traces": list(self.traces), "step": self.step, "complete_steps": sorted(self.steps),
                "naming_forms": list(self.forms), "clock": None if self.clock is None else {
                    "shared": self.clock.shared, "method": self.clock.method,
                    "offsets_us": list(self.clock.offsets), "uncertainty_us": list(self.clock.uncertainty),
                    "violations": self.clock.violations},
                "order_differences": list(self.order_differences), "notes": list(self.notes),
                "actions_named": self.actions_measured, "actions_inferred": self.actions_inferred}


def without_updates(schedule: Schedule) -> Schedule:
    """*schedule* less its U actions (PyTorch's schedules run no optimizer step), its overlapped pairs kept (they
    were dropped until 26 Nov 2026: PyTorch's DualPipeV was then predicted with each pair's forward sending its
    result before the pair's backward ran, where ``_add_send_recv`` sends both after the pair)."""
    if not any(a.kind is ActionKind.U for a in schedule):
        return schedule
    kept = {d: [a for a in acts if a.kind is not ActionKind.U] for d, acts in schedule.actions.items()}
    return schedule.replace_actions(kept, overlapped=schedule.overlapped)


# -------------------------------------------------------------------------------------------- ranks
def _assign_ranks(traces: list[TraceFile], devices: int, ranks: Sequence[int] | None) -> list[TraceFile]:
    if ranks is not None:
        if len(ranks) != len(traces):
            raise MissingRankError(f"--ranks gives {len(ranks)} rank(s) for {len(traces)} trace(s); give one per trace")
        given = list(ranks)
        how = "--ranks"
    else:
        given = [t.rank for t in traces]
        how = "distributedInfo.rank"
        if any(r is None for r in given):
            given = [t.rank if t.rank is not None else rank_from_name(t.path) for t in traces]
            how = "distributedInfo.rank or the file name"
        missing = [t.path for t, r in zip(traces, given) if r is None]
        if missing:
            raise MissingRankError(f"cannot tell the rank of {missing[0]!r}: it has no distributedInfo.rank and no "
                                   f"'rank<N>' in its name; give --ranks (one per trace, in order)")
        if not all(0 <= r < devices for r in given) or len(set(given)) != len(given):
            given = _pipeline_ranks(traces, given, devices) or given
    by_rank: dict[int, TraceFile] = {}
    for t, r in zip(traces, given):
        if not 0 <= r < devices:
            raise MissingRankError(f"{t.path!r} is rank {r} ({how}) but the schedule has ranks 0..{devices - 1}")
        if r in by_rank:
            raise MissingRankError(f"{by_rank[r].path!r} and {t.path!r} are both rank {r} ({how}); give --ranks")
        by_rank[r] = t
    lost = [r for r in range(devices) if r not in by_rank]
    if lost:
        raise MissingRankError(f"no trace for rank(s) {lost}: the schedule has {devices} ranks and the traces cover "
                               f"{sorted(by_rank)}; give one trace per rank")
    return [by_rank[r] for r in range(devices)]


def _shaped_ranks(paths: Sequence[str | os.PathLike], devices: int, ranks: Sequence[int] | None) -> list[TraceFile]:
    """The ``--shapes-from`` traces in rank order, their ranks told as the traces' are."""
    if len(paths) != devices:
        raise MissingRankError(f"--shapes-from gives {len(paths)} trace(s) for {devices} rank(s); give one per rank, "
                               f"each of one step profiled with record_shapes=True")
    try:
        return _assign_ranks([read_header(p) for p in paths], devices, ranks)
    except MissingRankError as exc:
        raise MissingRankError(f"--shapes-from: {exc}") from None


def _pipeline_ranks(traces: list[TraceFile], global_ranks: list[int], devices: int) -> list[int] | None:
    """Global ranks -> pipeline ranks through a process group of *devices* ranks holding exactly them."""
    wanted = set(global_ranks)
    for group in traces[0].process_groups:
        members = group.get("ranks")
        if isinstance(members, list) and len(members) == devices and set(members) == wanted:
            return [members.index(r) for r in global_ranks]
    return None


# -------------------------------------------------------------------------------------------- steps
def _complete_steps(records: list[RankRecords], schedule: Schedule) -> tuple[list[int], dict[int, int]]:
    """Steps every rank recorded in full (as many computations as the schedule gives it), and counts per step."""
    wanted = [sum(1 for a in schedule.actions[d] if a.kind is not ActionKind.U) for d in range(schedule.devices)]
    counts: dict[int, list[int]] = defaultdict(lambda: [0] * schedule.devices)
    for d, rec in enumerate(records):
        for a in rec.actions:
            counts[a.step][d] += 1
    complete = sorted(s for s, c in counts.items() if s >= 0 and all(c[d] >= wanted[d] for d in range(len(c))))
    return complete, {s: sum(c) for s, c in counts.items()}


def _pick_step(step: int | None, complete: list[int], counts: dict[int, int]) -> int:
    if step is not None:
        if step not in counts:
            raise IngestError(f"step {step} is not in the traces; they hold steps {sorted(counts)}")
        return step
    if complete:
        return complete[-1]
    return max(counts, key=lambda s: (counts[s], s))  # the fullest step; its mismatch will be named


# ------------------------------------------------------------------------------------ messages
def _pair_loose(rec: RankRecords, rank: int, placement: Sequence[int], stages: int) -> tuple[list[Message], str | None]:
    """Messages outside every range, given their payload in order (module docstring, step 4)."""
    if not rec.loose:
        return [], None
    producers = sorted((a for a in rec.actions if _consumer_rank(a, placement, stages) not in (None, rank)),
                       key=lambda a: a.compute_end)
    consumers = sorted((a for a in rec.actions if _producer_rank(a, placement, stages) not in (None, rank)),
                       key=lambda a: a.compute_start)
    sends = [m for m in rec.loose if m.direction == "send"]
    recvs = [m for m in rec.loose if m.direction == "recv"]
    sends, producers = _per_peer(sends, producers, lambda a: _consumer_rank(a, placement, stages))
    recvs, consumers = _per_peer(recvs, consumers, lambda a: _producer_rank(a, placement, stages))
    out = []
    problems = []
    if len(sends) == len(producers):
        out += [replace(m, producer=_payload(a), step=a.step) for m, a in zip(sends, producers)]
    elif sends:
        problems.append(f"{len(sends)} sends for {len(producers)} results other ranks need")
    if len(recvs) == len(consumers):
        # waited for right after it was posted, unless the trace shows the wait (Megatron's overlapped mode)
        out += [replace(m, producer=_source(a), step=a.step, wait_start=m.end if m.waited is None else
                        max(m.end, m.waited[0])) for m, a in zip(recvs, consumers)]
    elif recvs:
        problems.append(f"{len(recvs)} receives for {len(consumers)} computations that need one")
    note = None
    if problems:
        note = (f"rank {rank}: messages outside the action ranges could not be paired in order ("
                + "; ".join(problems) + "): their transfer rows are left out")
    return out, note


def _per_peer(messages: list[Message], actions: list[ActionRange],
              peer_of: Callable[[ActionRange], int | None]) -> tuple[list[Message], list[ActionRange]]:
    """*messages* and *actions* (each in order) reordered peer by peer, so that zipping them pairs the k-th message
    with a peer and the k-th action for that peer (module docstring, step 4). Unchanged where a message names no
    peer or a peer's counts differ: the plain order then, and its own check."""
    peers = [m.peer for m in messages]
    if not messages or any(p is None for p in peers):
        return messages, actions
    by_peer: dict[int, tuple[list, list]] = {}
    for m in messages:
        by_peer.setdefault(m.peer, ([], []))[0].append(m)
    for a in actions:
        p = peer_of(a)
        if p not in by_peer:
            return messages, actions
        by_peer[p][1].append(a)
    if any(len(ms) != len(acts) for ms, acts in by_peer.values()):
        return messages, actions
    return ([m for p in sorted(by_peer) for m in by_peer[p][0]],
            [a for p in sorted(by_peer) for a in by_peer[p][1]])


def _consumer_rank(a: ActionRange, placement: Sequence[int], stages: int) -> int | None:
    if a.kind == "F":
        return placement[a.stage + 1] if a.stage + 1 < stages else None
    if a.kind in ("B", "I"):
        return placement[a.stage - 1] if a.stage > 0 else None
    return None


def _producer_rank(a: ActionRange, placement: Sequence[int], stages: int) -> int | None:
    if a.kind == "F":
        return placement[a.stage - 1] if a.stage > 0 else None
    if a.kind in ("B", "I"):
        return placement[a.stage + 1] if a.stage + 1 < stages else None
    return None


def _payload(a: ActionRange) -> tuple[int, str, int]:
    return (a.stage, "F" if a.kind == "F" else "B", a.mb)


def _source(a: ActionRange) -> tuple[int, str, int]:
    return (a.stage - 1, "F", a.mb) if a.kind == "F" else (a.stage + 1, "B", a.mb)


# -------------------------------------------------------------------------------------------- ingest
def ingest(paths: Sequence[str | os.PathLike], schedule: Schedule, *, ranks: Sequence[int] | None = None,
           action_patterns: Sequence[str] = (), step: int | None = None, clock: str = "auto",
           microbatch_size: float = 1.0, source: str = "auto", progress: bool | None = False,
           shapes_from: Sequence[str | os.PathLike] | None = None) -> Ingested:
    """Turn one trace per rank into the measured run of *schedule* (see the module docstring).

    *ranks*: the rank of each path (default: from the traces or their names). *action_patterns*:
    extra regular expressions for other runtimes' action names. *step*: which profiled step to
    compare (default: the last complete one). *clock*: ``auto``, ``shared`` or ``pairs``. *source*:
    ``auto`` or ``megatron`` (:data:`validate.ingest.actions.SOURCES`). *progress*: a progress bar on
    stderr (None: when stderr is a terminal). *shapes_from*: one trace per rank of one step profiled with
    ``record_shapes=True`` (ranks told as for *paths*, *ranks* in the same order), whose messages' sizes and
    peers every step of *paths* takes (:mod:`validate.ingest.message_shapes`): *paths* may then be profiled
    without shapes, which keep every op's inputs alive and slow the steps they time.
    """
    if source not in SOURCES:
        raise IngestError(f"unknown action source {source!r}; choose one of {', '.join(SOURCES)}")
    if clock not in CLOCK_MODES:
        raise IngestError(f"unknown clock mode {clock!r}; choose one of {', '.join(CLOCK_MODES)}")
    if schedule.iterations != 1:
        raise IngestError(f"a profiled step is one iteration: give a schedule with one iteration "
                          f"(got {schedule.iterations})")
    patterns = compile_patterns(action_patterns)
    if not paths:
        raise MissingRankError("no traces given: give one trace per rank")
    headers = _assign_ranks([read_header(p) for p in paths], schedule.devices, ranks)
    shaped = None if shapes_from is None else _shaped_ranks(shapes_from, schedule.devices, ranks)
    traces, records = read_ranks(headers, schedule, without_updates(schedule).actions, patterns, source,
                                 progress=progress, shapes_from=shaped)
    _check_actions(traces, records, schedule, patterns, source)
    notes = _pair_messages(records, schedule)
    has_updates = any(a.kind == "U" for rec in records for a in rec.actions)
    target = schedule if has_updates else without_updates(schedule)
    if not has_updates and target is not schedule:
        notes.append("the trace has no optimizer step (PyTorch's schedules run none): U actions were left out of "
                     "the comparison and the prediction")
    complete, counts = _complete_steps(records, target)
    if not complete and step is None:
        _check_same_steps(records, traces)
    chosen = _pick_step(step, complete, counts)
    clocks = _align(traces, records, clock)
    notes += clocks.notes
    notes.append("profiled steps told apart by their ProfilerStep#N ranges" if any(r.steps_marked for r in records)
                 else "profiled steps told apart by the order of each action's occurrences (no ProfilerStep#N ranges)")
    per_step, calibration = _calibrate_steps(records, target, complete, chosen, clocks)
    results = {s: make_result(built["schedule"], calibration.costs, calibration.hardware, built["timeline"],
                              microbatch_size=microbatch_size, source="measured", notes=[])
               for s, built in per_step.items()}
    chosen_built = per_step[chosen]
    _check_order(chosen_built["schedule"], target)
    forms = sorted({f for rec in records for f in rec.forms})
    notes += _step_notes(chosen_built, chosen, len(complete), forms, records)
    named, inferred = _counted_actions(records, chosen)
    if inferred:
        notes.append(f"{inferred} of the {named + inferred} actions of step {chosen} were numbered from the schedule's "
                     f"order (their times measured, which micro-batch and stage they ran inferred); {named} were named "
                     f"by the trace")
    if shaped is not None:
        notes.append(f"the messages' sizes and peers copied from one step profiled with shapes (--shapes-from: "
                     f"{', '.join(t.path for t in shaped)}), call by call")
    # the first note is what a Gantt chart shows beside the measured run: keep it short
    measured = replace(results[chosen], notes=[f"ingested from profiler traces, step {chosen}"] + list(notes))
    results[chosen] = measured
    messages = {s: built["messages"] for s, built in per_step.items()}
    overhead = call_overhead([r for rec in records for r in rec.call_remainders], results, messages, target)
    before = spans_before_calls(results, messages, target) if overhead.form == "before the call" else {}
    return Ingested(measured=measured, schedule=target, calibration=calibration, step=chosen, steps=results,
                    comm_spans={s: built["comm_spans"] for s, built in per_step.items()}, clock=clocks,
                    messages=messages, call_overhead=overhead, before_calls=before,
                    traces=tuple(t.path for t in traces), forms=tuple(forms), order_differences=(),
                    notes=tuple(notes), link_seconds=chosen_built["link_seconds"], actions_measured=named,
                    actions_inferred=inferred)


def _counted_actions(records: list[RankRecords], step: int) -> tuple[int, int]:
    """(named, inferred) actions of *step*."""
    forms = [a.form for rec in records for a in rec.actions if a.step == step]
    inferred = sum(1 for f in forms if f in ("inferred", "megatron"))
    return len(forms) - inferred, inferred


def _check_order(ran: Schedule, target: Schedule) -> None:
    """Every rank ran its actions in the schedule's order (issue 26 item 6: -s gpipe on 1F1B traces is refused)."""
    differences = _order_differences(ran, target)
    if differences:
        more = f" (and {len(differences) - 1} more device(s))" if len(differences) > 1 else ""
        raise ScheduleMismatchError(f"the trace does not match schedule {target.name!r}: the ranks ran its actions in "
                                    f"another order: {differences[0]}{more}; give the schedule the run used")


def _check_same_steps(records: list[RankRecords], traces: list[TraceFile]) -> None:
    """Ranks whose ProfilerStep#N marks name different steps: say so instead of listing missing actions."""
    marked = [sorted({a.step for a in rec.actions if a.step >= 0}) for rec in records]
    if not all(rec.steps_marked for rec in records) or not all(marked):
        return
    if not set(marked[0]).intersection(*marked[1:]):
        per_rank = "; ".join(f"rank {r} ({traces[r].path}): {_steps_text(m)}" for r, m in enumerate(marked))
        raise IngestError(f"the traces are of different profiled steps, no step is on every rank: {per_rank}; give "
                          f"the traces of one profiling window (same ProfilerStep#N on every rank)")


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(f"ProfilerStep#{n}" for n in steps[:4])
    return shown + (f" and {len(steps) - 4} more" if len(steps) > 4 else "")


def _check_actions(traces: list[TraceFile], records: list[RankRecords], schedule: Schedule, patterns,
                   source: str) -> None:
    """Refuse records that cannot be the run of *schedule*: none at all, or on the wrong ranks."""
    for r, rec in enumerate(records):
        if rec.stageless:
            raise ScheduleMismatchError(
                f"the trace does not match schedule {schedule.name!r}: rank {r} recorded {rec.stageless} single-stage "
                f"'Forward i' / 'Backward i' ranges (ScheduleGPipe, one stage per rank) but the schedule places "
                f"stages {schedule.stages_of(r)} on it")
    for r, (t, rec) in enumerate(zip(traces, records)):
        if not rec.actions:
            extra = f" ({'; '.join(rec.notes + rec.unsplit)})" if rec.notes or rec.unsplit else ""
            if source == "megatron":
                raise NoActionsError(f"trace {t.path!r} (rank {r}) has no Megatron-LM forward_step / backward_step "
                                     f"events; profile with with_stack=True (Megatron's --profile "
                                     f"--use-pytorch-profiler does)")
            single = len(schedule.stages_of(r)) == 1
            raise NoActionsError(
                f"trace {t.path!r} (rank {r}) has no pipeline actions: no 'PP:<stage><F|B|I|W><mb>' or "
                f"'Forward i' / 'Backward i' ranges{', and no --action-pattern matched' if patterns else ''}{extra}"
                f"{', and no forward ops or autograd events to infer them from' if single else ''}; profile "
                f"torch.distributed.pipelining, read Megatron-LM with --from-megatron, or name your runtime's ranges "
                f"with --action-pattern")
    _check_placement(records, schedule)


def _pair_messages(records: list[RankRecords], schedule: Schedule) -> list[str]:
    """Messages the runtime did not name paired with the actions that sent and received them; the notes."""
    notes: list[str] = []
    for r, rec in enumerate(records):
        loose, note = _pair_loose(rec, r, schedule.placement, schedule.stages)
        rec.messages = rec.messages + loose
        if note:
            notes.append(note)
        notes += [n for n in rec.notes if n not in notes]
        if rec.unsplit:
            notes.append(f"rank {r}: {len(rec.unsplit)} overlapped pair(s) could not be split into their forward and "
                         f"backward (e.g. {rec.unsplit[0]}): their actions are missing")
        host = sum(1 for m in rec.messages if m.gpu_span is None) if rec.gpu else 0
        if host:
            notes.append(f"rank {r}: {host} of its {len(rec.messages)} messages show no NCCL kernel: their times are "
                         f"the host's (the call's post and return), not the GPU's")
        if rec.left_out:
            notes.append(f"rank {r}: {rec.left_out} run(s) of ops after a step's last backward left out (the runtime's "
                         f"scale_grads and output merge, the optimizer step)")
    return notes


def _calibrate_steps(records: list[RankRecords], target: Schedule, complete: list[int], chosen: int,
                     clocks: ClockAlignment):
    """Each complete step built on one clock, and the costs calibrated over all of them (the chosen step must
    match the schedule: a mismatch is refused, naming it)."""
    per_step: dict[int, dict] = {}
    durations: dict[tuple[int, str], list[float]] = defaultdict(list)
    samples: list[MessageSample] = []
    for s in sorted(set(complete) | {chosen}):
        built = _build_step(records, target, s, clocks)
        if s == chosen:
            _raise_mismatch(built["missing"], built["extra"], target)
        elif built["missing"] or built["extra"]:
            continue
        per_step[s] = built
        for (stage, kind), secs in built["durations"].items():
            durations[(stage, kind)] += secs
        samples += built["samples"]
    return per_step, calibrate(target.stages, target.devices, durations, samples)


def _step_notes(built: dict, chosen: int, complete: int, forms: list[str], records: list[RankRecords]) -> list[str]:
    """What the report says about the chosen step: steps used, unpaired messages, how actions were named, clocks."""
    notes = []
    if complete > 1:
        notes.append(f"the traces hold {complete} complete steps; all of them calibrate the costs")
    if built["unpaired"]:
        notes.append(f"{built['unpaired']} message(s) of step {chosen} have no transfer row (no completion time or no "
                     f"partner in the trace)")
    notes.append(_measured_note(forms, records))
    if built["early_starts"]:
        notes.append(f"{built['early_starts']} action(s) of step {chosen} start before an input of theirs was computed: "
                     f"the ranks' clocks disagree (try --clock pairs) or the trace names actions wrongly")
    return notes


def _check_placement(records: list[RankRecords], schedule: Schedule) -> None:
    for r, rec in enumerate(records):
        for a in rec.actions:
            if not 0 <= a.stage < schedule.stages:
                raise ScheduleMismatchError(
                    f"the trace does not match schedule {schedule.name!r}: rank {r} ran stage {a.stage} "
                    f"({a.stage}{a.kind}{a.mb}) but the schedule has stages 0..{schedule.stages - 1}; give the "
                    f"schedule the run used (--chunks for several stages per rank)")
            if schedule.placement[a.stage] != r:
                raise ScheduleMismatchError(
                    f"the trace does not match schedule {schedule.name!r}: stage {a.stage} ran on rank {r} but the "
                    f"schedule places it on rank {schedule.placement[a.stage]} (a V-shaped or interleaved run needs "
                    f"that schedule)")


def _raise_mismatch(missing: list[Action], extra: list[Action], schedule: Schedule) -> None:
    if not missing and not extra:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} action(s) of the schedule missing from the trace ("
                     + " ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "") + ")")
    if extra:
        parts.append(f"{len(extra)} action(s) in the trace that the schedule does not have ("
                     + " ".join(map(str, extra[:8])) + (" ..." if len(extra) > 8 else "") + ")")
    raise ScheduleMismatchError(f"the trace does not match schedule {schedule.name!r} (K={schedule.devices}, "
                                f"S={schedule.stages}, M={schedule.microbatches}): " + "; ".join(parts))


def _align(traces: list[TraceFile], records: list[RankRecords], mode: str) -> ClockAlignment:
    base0 = traces[0].base_ns
    shift = [(t.base_ns - base0) / 1000.0 for t in traces]  # microseconds
    pairs = []
    for key, (send, recv, src, dst) in _pairs(records).items():
        if recv.complete is not None:
            pairs.append((src, dst, _send_time(send) + shift[src], recv.complete + shift[dst]))
    hosts = {t.host for t in traces}
    shared = mode == "shared" or (mode == "auto" and len(hosts) == 1)
    if mode == "auto" and None in hosts and len(hosts) == 1:
        shared = True  # traces that name no host: taken as one host (say so)
    aligned = align_clocks(pairs, len(traces), shared=shared)
    offsets = tuple(o + s for o, s in zip(aligned.offsets, shift))
    notes = list(aligned.notes)
    if shared and None in hosts:
        notes.append("the traces name no host: taken to share one clock (use --clock pairs for several hosts)")
    return replace(aligned, offsets=offsets, notes=notes)


def _estimate_arrivals(end: list[float], found_complete: Sequence[tuple[int, float, float]],
                       link_seconds: dict[int, float], t0: float) -> None:
    """Set the end of each transfer row whose receive the runtime's wait found already complete (*found_complete*:
    row, later post and completion, trace microseconds) to its estimated arrival: the later of its two posts (here
    the calls' starts; the runtime model counts from their returns, :attr:`validate.ingest.messages.MessageTimes.
    posted`: counting from the returns here too was worse, 4.4% -> 4.8% mean |error| over 50 runs paired on
    the same traces, 26 Nov 2026) plus the median link time of the step's messages timed exactly (*link_seconds*:
    their receiver waited from before the send), never after the completion the trace shows.

    Why: on gloo a receive completes when the runtime waits for it (``c10d::recv_`` posts it; the work's end is
    recorded by its ``wait()``), so a message that was already there when the multi-stage runtime waited shows
    the wait's start as its completion. Taken as the arrival, the idle time before that wait reads as "waiting
    for data" although the data was there: in DualPipeV at 1-ms actions (K=2, gloo) 26.3 of the 28.0 ms per step
    so counted lay before a wait that found its message complete (interleaved-1f1b 10.8 of 35.0, zbv 2.9 of
    12.0; the single-stage runtimes wait inside the consuming range, 0). The idle split then counts that time as
    the runtime's own (or inside its calls), and the dispatch overhead, calibrated from the same split, includes
    it: paired on the same traces of three launches, DualPipeV's error went from +12.9 / +19.3 / +17.5% to
    +3.3 / +7.5 / +7.8% and its worst idle-split part from 14.7 / 14.2 / 15.2 to 7.8 / 7.0 / 9.4 points;
    interleaved-1f1b and zbv moved by at most 0.6 points, gpipe and 1f1b not at all (README, "A receive the
    runtime's wait found complete"; 26 Nov 2026, load 1.0-1.1). GPU transfers keep their NCCL kernels' end, a
    real arrival."""
    if not found_complete:
        return
    exact = sorted(link_seconds.values())
    link_us = exact[len(exact) // 2] / _US if exact else 0.0
    for row, later_post, complete in found_complete:
        end[row] = (max(later_post, min(complete, later_post + link_us)) - t0) * _US


def _send_time(m: Message) -> float:
    return m.gpu_span[0] if m.gpu_span is not None else m.start


def _pairs(records: list[RankRecords]) -> dict[tuple, tuple[Message, Message, int, int]]:
    """(producer, step) -> (send, receive, src rank, dst rank) for every message both ends of which are known."""
    sends, recvs = {}, {}
    for r, rec in enumerate(records):
        for m in rec.messages:
            if m.producer is None:
                continue
            (sends if m.direction == "send" else recvs)[(m.producer, m.step)] = (m, r)
    return {key: (s, recvs[key][0], src, recvs[key][1]) for key, (s, src) in sends.items() if key in recvs}


def _build_step(records: list[RankRecords], schedule: Schedule, step: int, clocks: ClockAlignment) -> dict:
    """The timeline of one step, its durations and message samples, and what is missing or extra."""
    off = clocks.offsets
    found: dict[Action, tuple[int, float, float]] = {}
    extra: list[Action] = []
    durations: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r, rec in enumerate(records):
        for a in rec.actions:
            if a.step != step:
                continue
            action = Action(a.stage, _KIND_TO_IR[a.kind], a.mb)
            if action in found:
                extra.append(action)
                continue
            found[action] = (r, a.compute_start + off[r], a.compute_end + off[r])
            durations[(a.stage, a.kind)].append((a.compute_end - a.compute_start) * _US)
    expected = set(schedule)
    missing = sorted(expected - set(found))
    extra = sorted(set(extra) | (set(found) - expected))
    if missing or extra:
        return {"missing": missing, "extra": extra}
    t0 = min(start for _, start, _ in found.values())
    _check_spread(found, t0, step)
    device, key, op, start, end, src, dst, nbytes = ([] for _ in range(8))
    for action, (r, a, b) in found.items():
        k = schedule.key(action)
        device.append(r), key.append(k), op.append(key_kind(k)), start.append((a - t0) * _US)
        end.append((b - t0) * _US), src.append(-1), dst.append(-1), nbytes.append(0.0)
    samples, unpaired = [], 0
    link_seconds: dict[int, float] = {}
    found_complete: list[tuple[int, float, float]] = []  # (row, later post, completion) in trace microseconds
    calls: dict[int, MessageTimes] = {}  # key -> the message's calls, for the runtime model (validate.ingest.messages)
    at = lambda x, r: (x + off[r] - t0) * _US  # noqa: E731  (microseconds of rank r -> seconds of this step)
    for (producer, s), (send, recv, a_rank, b_rank) in _pairs(records).items():
        if s != step:
            continue
        p_stage, p_kind, p_mb = producer
        action = Action(p_stage, ActionKind.F if p_kind == "F" else ActionKind.B, p_mb)
        if recv.complete is None or action not in found:
            unpaired += 1
            continue
        k = schedule.key(action)
        t_send = _send_time(send) + off[a_rank]
        t_done = recv.complete + off[b_rank]
        size = send.nbytes if send.nbytes is not None else recv.nbytes
        times = None
        if send.gpu_span is None:  # host calls; a GPU's kernels are timed by their own spans
            times = calls[k] = MessageTimes(send_call=(at(send.start, a_rank), at(send.end, a_rank)),
                                            recv_call=(at(recv.start, b_rank), at(recv.end, b_rank)),
                                            complete=at(recv.complete, b_rank),
                                            send_done=None if send.send_done is None else at(send.send_done, a_rank),
                                            wait_start=None if recv.wait_start is None else at(recv.wait_start, b_rank))
        if times is not None and times.wait_start is not None and not times.blocked:
            # the runtime's wait found it complete: gloo's receive completes when its wait returns, so the
            # completion is only a bound, and the idle time before the wait is not a wait for this message
            # (found_complete below, where its arrival is estimated)
            found_complete.append((len(end), max(t_send, recv.start + off[b_rank]), t_done))
        device.append(a_rank), key.append(k), op.append(transfer_op(k)), start.append((t_send - t0) * _US)
        end.append((max(t_done, t_send) - t0) * _US), src.append(a_rank), dst.append(b_rank)
        nbytes.append(size or 0.0)
        blocked = recv.wait_start is not None and recv.wait_start + off[b_rank] <= t_send
        if blocked:
            link_seconds[k] = max(0.0, t_done - t_send) * _US
        samples.append(MessageSample(src=a_rank, dst=b_rank, boundary=p_stage - (p_kind != "F"), nbytes=size,
                                     seconds=max(0.0, t_done - t_send) * _US, blocked=blocked))
    unpaired += sum(1 for rec in records for m in rec.messages if m.step == step and m.producer is None)
    _estimate_arrivals(end, found_complete, link_seconds, t0)
    timeline = timeline_frame(schedule, device=device, key=key, op=op, start=start, end=end, src=src, dst=dst,
                              nbytes=nbytes)
    order = {d: [] for d in range(schedule.devices)}
    for action, (r, a, _) in sorted(found.items(), key=lambda kv: (kv[1][1], kv[1][2])):
        order[r].append(action)
    try:
        ran = schedule.replace_actions(order).validate()
    except ScheduleError as exc:  # the measured order deadlocks: clocks not aligned well enough
        raise IngestError(f"the measured order of step {step} cannot run as a schedule ({str(exc).splitlines()[0]}); "
                          f"are the ranks' clocks aligned? try --clock pairs") from None
    early = sum(1 for action, (r, a, _) in found.items() for p in schedule.dependencies(action)
                if p in found and a < found[p][2] - 1.0)  # 1 us: the traces' resolution
    on_gpu = any(a.on_gpu for rec in records for a in rec.actions)
    for r, acts in order.items():  # one rank's pipeline thread runs one computation at a time
        spans = [found[a][1:] for a in acts]
        clash = next((i for i in range(1, len(spans)) if spans[i][0] < spans[i - 1][1] - 1.0), None)
        if clash is not None and not on_gpu:
            raise IngestError(f"rank {r}: {acts[clash - 1]} and {acts[clash]} overlap in time in step {step}, which "
                              f"one pipeline thread cannot do; are two runs or two threads' marks in one trace?")
    comm = {}
    for r, rec in enumerate(records):
        comm[r] = [((a + off[r] - t0) * _US, (b + off[r] - t0) * _US) for a, b in rec.comm_spans]
    return {"missing": [], "extra": [], "timeline": timeline, "schedule": ran, "durations": durations,
            "samples": samples, "comm_spans": comm, "unpaired": unpaired, "early_starts": early,
            "link_seconds": link_seconds, "messages": calls}


def _check_spread(found: dict, t0: float, step: int) -> None:
    """Ranks whose first action lies more than :data:`MAX_SPREAD_US` after the first rank's: not one run."""
    firsts: dict[int, float] = {}
    for r, start, _ in found.values():
        firsts[r] = min(firsts.get(r, start), start)
    late = max(firsts, key=firsts.get)
    if firsts[late] - t0 > MAX_SPREAD_US:
        early = min(firsts, key=firsts.get)
        raise ClockError(f"step {step}: rank {late} starts {(firsts[late] - t0) / 3600e6:.3g} hours after rank {early} "
                         f"on the common clock: these traces are not of one run, or a rank's clock (ts, "
                         f"baseTimeNanoseconds) is wrong")


def _order_differences(ran: Schedule, schedule: Schedule) -> list[str]:
    out = []
    for d in range(schedule.devices):
        want, got = list(schedule.actions[d]), list(ran.actions[d])
        if want != got:
            i = next(i for i, (a, b) in enumerate(zip(want, got)) if a != b)
            out.append(f"device {d} ran {' '.join(map(str, got[i:i + 6]))} where the schedule has "
                       f"{' '.join(map(str, want[i:i + 6]))} (from position {i})")
    return out


def _measured_note(forms: list[str], records: list[RankRecords]) -> str:
    parts = {"PP": "the multi-stage runtime's PP:<action> ranges", "single": "'Forward i' / 'Backward i' ranges",
             "pattern": "--action-pattern matches", "overlap": "overlapped pairs split at their first autograd event",
             "inferred": "runs of forward ops and of autograd events between communication calls (numbered from the "
                         "schedule's order)",
             "megatron": "Megatron-LM's forward_step / backward_step calls (numbered from the schedule's order)"}
    where = "GPU kernels (CUDA events of the profiler)" if any(r.gpu for r in records) else "host timestamps"
    return ("measured: every action's start and end (" + ", ".join(parts[f] for f in forms) + f") on {where}; "
            "inferred: the wait for an input inside a range (ends when its receive completed), the arrival of a "
            "message the runtime's wait found already complete (its later call's start plus the median exact link "
            "time), which message carries what, the clock alignment across hosts, the costs and links (medians of the "
            "trace)")
