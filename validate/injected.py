"""A validation with injected variability (``validate --inject``): the specification checked, and the makespan's
predicted distribution compared with the measured one (issue 22).

The ranks draw each action's duration as the simulator's Monte Carlo draws it (:mod:`validate.rank.inject`; the
specification travels in :attr:`validate.request.RunRequest.inject`); the comparison itself is
:mod:`validate.compare.distributions`'.

The prediction is ``sim.monte_carlo`` of the same specification on the durations the ranks drew from (the emulated
workload's costs, or the baselines real stages were padded to), with the runtime's own time as the simulator's
*dispatch overhead*, a fixed cost per action that no factor scales (:attr:`sim.engines.plan.Plan.overhead`), and
the links' latency as the run itself shows it. Measured (K=4 M=8 emulated 1F1B, load ~0.3; issue 22's stop notes):

- the executor's own time per action (receive completion, ``isend``, tracing: 0.15-0.35 ms) happens whatever the
  drawn factor; folded into the costs it was scaled by the factors (a 1.5x straggler inflated it by half);
- the waits overshoot the drawn durations by 0.05 ms on average (the sleeper's last wake-up): a constant, not a
  factor;
- a message whose consumer waits for it arrives, from the producer's end to the consumer's next computation,
  0.58 ms later against the 0.08 ms link time of the ping-pong fit plus the consumer's overhead (0.34 ms in all):
  the sender's ``isend`` comes after its own bookkeeping and the blocked receiver wakes up; about seven such hops
  lie on the critical path. The ping-pong fit times a tight loop that has neither.

So the dispatch overhead of (stage, kind) is the executor's mean overhead plus the mean of realised minus drawn
durations, and the latency is the mean of (consumer start - producer end - consumer overhead - bytes / bandwidth)
over the hops where the consumer waited, all three over every timed run (means trimmed by a tenth at each end; a
fit on the median run alone moved the latency by 0.2 ms from one schedule to the next). These are runtime
constants, a dozen numbers against hundreds of runs; the random draws, and so the distribution's shape, are never
fitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from validate.compare.validation_report import ValidationReport
from validate.errors import ValidationError
from validate.predict.calibrate import OVERHEAD_COLUMNS

__all__ = ["MIN_ITERATIONS_TIMED", "PREDICTED_SAMPLES", "iterations_timed", "inject_spec", "injected_costs",
           "MeasuredRun", "runs_of_traces", "run_of_timeline", "runtime_terms", "predicted_distribution",
           "BLOCKED_MARGIN"]


MIN_ITERATIONS_TIMED = 30
"""Fewest timed runs a measured distribution is compared from: with fewer, a p99 is the largest value seen and the
KS distance's critical value is above 0.3."""

BLOCKED_MARGIN = 5e-4
"""A hop counts as one its consumer waited for when the producer ended this many seconds after the consumer's
previous computation (past the executor's own time around an action, 0.15-0.35 ms)."""


def iterations_timed(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_ITERATIONS_TIMED:
        raise ValidationError(f"--iterations-timed must be an integer >= {MIN_ITERATIONS_TIMED} (a distribution needs "
                              f"that many timed runs), got {n!r}")
    return n


def inject_spec(inject, workload: str, workload_options):
    """The parsed ``--inject`` (None without one): the emulated workload draws its waits, real stages are padded to
    drawn durations (:mod:`validate.rank.inject`)."""
    if not inject:
        return None
    from validate.rank.inject import parse_inject

    return parse_inject(inject, seed=int(dict(workload_options or {}).get("seed", 0)))


def injected_costs(given_costs, ranks, report: ValidationReport):
    """The durations the ranks drew from: the emulated workload's costs (*given_costs*), or, for real stages, the
    baselines they were padded to (:attr:`validate.request.StageCalibration.padded`) with the calibrated sizes."""
    from sim.model.cost import DISPATCH_COLUMNS, StageCosts

    padded = {s: per for r in ranks if r.calibration is not None for s, per in r.calibration.padded.items()}
    if not padded:
        return given_costs
    columns = report.calibration.costs.to_dict()
    for column in OVERHEAD_COLUMNS.values():
        columns[column] = [padded[s][column] for s in range(len(columns[column]))]
    for column in DISPATCH_COLUMNS:
        columns.pop(column, None)
    return StageCosts(**columns)


PREDICTED_SAMPLES = 4000
"""Monte Carlo samples of a predicted distribution (its quantiles' errors are small beside those of 30 runs)."""


def _trimmed_mean(values, cut: float = 0.1) -> float:
    """Mean without the largest and smallest *cut* of the values (one preempted action must not set a constant
    charged to every action; a mean, not a median, because what the makespan sums is the mean)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    k = int(cut * len(ordered))
    return float(ordered[k:len(ordered) - k].mean()) if len(ordered) else 0.0


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One timed run as :func:`runtime_terms` reads it."""

    sample: int
    """The Monte Carlo sample whose draws the run waited for (its index among all runs, warm-up included)."""
    actions: dict[int, tuple[int, float, float]]
    """action key -> (device, start, end) of its computation, seconds on one clock."""
    overhead: tuple[tuple[int, float], ...] = ()
    """(action key, seconds of the executor's own time around it), as traced."""


def runs_of_traces(ranks, offsets, first: int) -> list[MeasuredRun]:
    """Every timed run of *ranks* (:class:`validate.request.RankResult`) on rank 0's clock (*offsets*: each rank's
    clock minus rank 0's); run i waited for sample *first* + i."""
    runs = []
    for i in range(len(ranks[0].traces)):
        actions, overhead = {}, []
        for r in ranks:
            trace, off = r.traces[i], offsets[r.rank]
            for key, start, end in trace.compute:
                actions[key] = (r.rank, start - off, end - off)
            overhead += trace.overhead
        runs.append(MeasuredRun(first + i, actions, tuple(overhead)))
    return runs


def run_of_timeline(schedule, timeline, sample: int) -> MeasuredRun:
    """A measured timeline (:mod:`sim.results.timeline` schema) as a :class:`MeasuredRun` without overhead records."""
    from sim.core.ir import Action, ActionKind

    rows = timeline[timeline["op"].isin([k.value for k in ActionKind])]
    actions = {schedule.key(Action(int(r.stage), ActionKind(str(r.op)), int(r.microbatch))):
               (int(r.device), float(r.start), float(r.end)) for r in rows.itertuples(index=False)}
    return MeasuredRun(sample, actions)


def runtime_terms(schedule, runs: list[MeasuredRun], base, spec, hardware, overhead=None):
    """(dispatch overhead stage -> {kind letter: seconds}, hop latency in seconds or None, notes) fitted on the
    measured *runs* (module docstring). *base*: the costs the ranks drew from; *hardware*: the calibrated links
    (their bandwidth stays); *overhead*: stage -> {cost column: seconds} of the executor's own time, used where the
    runs carry no overhead records (else their trimmed mean)."""
    from sim.core.ir import key_kind, key_stage
    from validate.predict.calibrate import in_schedule_overhead
    from validate.rank.inject import Injector

    records = [o for run in runs for o in run.overhead]
    if records:
        overhead = in_schedule_overhead(schedule, records)
    overhead = overhead or {}
    S = schedule.stages
    excess: dict[tuple[int, str], list[float]] = {}
    gaps = []
    compiled = schedule.compiled
    for run in runs:
        injectors = {}
        for d in range(schedule.devices):
            injectors[d] = Injector(spec, d, schedule.devices, S)
            for _ in range(run.sample):
                injectors[d].next_run()
        previous: dict[int, float | None] = {}
        for d in range(schedule.devices):
            last = None
            for key in sorted((k for k, v in run.actions.items() if v[0] == d), key=lambda k: run.actions[k][1]):
                previous[key], last = last, run.actions[key][2]
        for key, (device, start, end) in run.actions.items():
            action = schedule.action_of(key)
            s, op = action.stage, action.kind.value
            split = (s, action.mb) in schedule.split_backward
            drawn = injectors[device].seconds(base.cost(s, action.kind, split=split), s, int(key_kind(key)), action.mb)
            excess.setdefault((s, op), []).append(end - start - drawn)
            for dep in compiled.deps[key]:
                if dep >= 0 or ~dep not in run.actions or previous[key] is None:
                    continue
                producer = ~dep
                src, _, produced = run.actions[producer]
                if produced <= previous[key] + BLOCKED_MARGIN:  # the consumer did not wait for this one
                    continue
                boundary = min(s, int(key_stage(producer, S)))  # F(s-1) -> F(s) and B(s+1) -> B(s) cross boundary
                wire = hardware.transfer_time(src, device, base.send_bytes[boundary]) - hardware.latency[src][device]
                gaps.append(start - produced - overhead.get(s, {}).get(OVERHEAD_COLUMNS[op], 0.0) - wire)
    dispatch: dict[int, dict[str, float]] = {}
    for (s, op), values in excess.items():
        realised = max(0.0, _trimmed_mean(values))
        dispatch.setdefault(s, {})[op] = overhead.get(s, {}).get(OVERHEAD_COLUMNS[op], 0.0) + realised
    latency = max(0.0, _trimmed_mean(gaps)) if gaps else None
    all_excess = [x for v in excess.values() for x in v]
    notes = [f"dispatch overhead per action (executor's own time + realised minus drawn duration, not scaled by any "
             f"factor), fitted on {len(runs)} run(s): mean "
             f"{1e3 * np.mean([v for per in dispatch.values() for v in per.values()]):.3f} ms; realised minus drawn: "
             f"mean {1e3 * np.mean(all_excess):.3f} ms, {sum(x > 1e-3 for x in all_excess)} of {len(all_excess)} "
             f"actions over 1 ms (overruns)"]
    if latency is not None:
        fitted = hardware.latency[0][1] if schedule.devices > 1 else 0.0
        notes.append(f"hop latency {1e3 * latency:.3f} ms from {len(gaps)} hops a consumer waited for (the "
                     f"ping-pong fit: {1e3 * fitted:.3f} ms)")
    return dispatch, latency, notes


def predicted_distribution(report: ValidationReport, base, spec, warmup: int, ranks=None):
    """The Monte Carlo prediction of the makespan's distribution under the injected variability, against the timed
    runs. *base*: the durations the ranks drew from (:func:`injected_costs`); the runtime's time per action and the
    hop latency come from :func:`runtime_terms`, fitted on every timed run of *ranks* (their traces; without them,
    on the run the report shows). The distribution comes from another seed than the runs' (it must not replay the
    measured runs' own draws). Paired besides: stages move to the next draws after each run only, so timed run i
    drew exactly the simulator's sample *warmup* + i of the runs' seed, and each run is also compared with its own
    sample (a shift shows there as a median error, apart from sampling noise). Returns the report with its
    comparison, and the Monte Carlo run."""
    import sim
    from validate.compare.distributions import compare_distributions

    cal = report.calibration
    schedule = report.measured.schedule
    if ranks:
        runs = runs_of_traces(sorted(ranks, key=lambda r: r.rank), list(report.clocks.offsets), warmup)
    else:
        runs = [run_of_timeline(schedule, report.measured.timeline, warmup + report.median_run)]
    dispatch, latency, notes = runtime_terms(schedule, runs, base, spec, cal.hardware,
                                             cal.overhead_per_stage if cal.overhead_included else {})
    costs = base.with_dispatch(dispatch)
    hardware = cal.hardware
    if latency is not None:
        hardware = replace(hardware, latency=latency)
    predicted = report.predicted
    mc = sim.monte_carlo(predicted.schedule, costs, hardware, samples=PREDICTED_SAMPLES,
                         variability=spec.variability(), seed=spec.seed + 1_000_003,
                         microbatch_size=predicted.microbatch_size)
    measured = np.asarray(report.makespans)
    same_draws = sim.monte_carlo(predicted.schedule, costs, hardware, samples=warmup + len(measured),
                                 variability=spec.variability(), seed=spec.seed,
                                 microbatch_size=predicted.microbatch_size).makespan[warmup:]
    comparison = compare_distributions(mc.makespan, measured, paired=same_draws, notes=tuple(notes))
    return replace(report, distribution=comparison, inject=spec.describe()), mc
