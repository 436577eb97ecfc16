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

So the dispatch overhead of (stage, kind) is the executor's measured overhead plus the mean of realised minus drawn
durations, and the latency is the mean of (consumer start - producer end - consumer overhead - bytes / bandwidth)
over the hops where the consumer waited, both from the median timed run's timeline (the run the report shows).
These are runtime constants fitted on one run; the random draws are never fitted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from validate.compare.validation_report import ValidationReport
from validate.errors import ValidationError
from validate.predict.calibrate import OVERHEAD_COLUMNS

__all__ = ["MIN_ITERATIONS_TIMED", "PREDICTED_SAMPLES", "iterations_timed", "inject_spec", "injected_costs",
           "runtime_terms", "predicted_distribution", "BLOCKED_MARGIN"]


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


def runtime_terms(report: ValidationReport, base, spec, run: int):
    """(dispatch overhead stage -> {kind letter: seconds}, hop latency in seconds or None, notes) fitted on the
    report's measured run (module docstring). *base*: the costs the ranks drew from; *run*: that run's index among
    all runs of the ranks (warm-up included), the Monte Carlo sample whose draws it waited for."""
    from sim.core.ir import Action, ActionKind, key_stage
    from validate.rank.inject import Injector

    schedule = report.measured.schedule
    timeline = report.measured.timeline
    cal = report.calibration
    overhead = cal.overhead_per_stage if cal.overhead_included else {}
    injectors = {}
    for d in range(schedule.devices):
        injectors[d] = Injector(spec, d, schedule.devices, schedule.stages)
        for _ in range(run):
            injectors[d].next_run()
    compute = timeline[timeline["op"].isin([k.value for k in ActionKind])]
    excess: dict[tuple[int, str], list[float]] = {}
    start, end, device_of = {}, {}, {}
    for row in compute.itertuples(index=False):
        op, s, mb = str(row.op), int(row.stage), int(row.microbatch)
        kind = ActionKind(op)
        split = (s, mb) in schedule.split_backward
        drawn = injectors[schedule.placement[s]].seconds(base.cost(s, kind, split=split), s, "FBWRU".index(op), mb)
        excess.setdefault((s, op), []).append(float(row.end - row.start) - drawn)
        key = schedule.key(Action(s, kind, mb))
        start[key], end[key], device_of[key] = float(row.start), float(row.end), int(row.device)
    realised = {k: max(0.0, _trimmed_mean(v)) for k, v in excess.items()}
    dispatch: dict[int, dict[str, float]] = {}
    for (s, op), extra in realised.items():
        column = OVERHEAD_COLUMNS[op]
        dispatch.setdefault(s, {})[op] = overhead.get(s, {}).get(column, 0.0) + extra
    # hops the consumer waited for: its previous computation ended well before the producer did
    previous: dict[int, float | None] = {}
    for d in range(schedule.devices):
        last = None
        for key in sorted((k for k in start if device_of[k] == d), key=start.get):
            previous[key], last = last, end[key]
    hardware = cal.hardware
    compiled = schedule.compiled
    gaps = []
    for key in start:
        for dep in compiled.deps[key]:
            producer = ~dep if dep < 0 else None
            if producer is None or producer not in end or previous[key] is None:
                continue
            if end[producer] <= previous[key] + BLOCKED_MARGIN:
                continue
            s = int(key_stage(key, schedule.stages))
            op = schedule.action_of(key).kind.value
            src, dst = device_of[producer], device_of[key]
            wire = hardware.transfer_time(src, dst, base.send_bytes[min(s, int(key_stage(producer, schedule.stages)))])
            wire -= hardware.latency[src][dst]
            gaps.append(start[key] - end[producer] - overhead.get(s, {}).get(OVERHEAD_COLUMNS[op], 0.0) - wire)
    latency = max(0.0, _trimmed_mean(gaps)) if gaps else None
    all_excess = [x for v in excess.values() for x in v]
    notes = [f"dispatch overhead per action (executor's own time + realised minus drawn duration, not scaled by any "
             f"factor): mean {1e3 * np.mean([v for per in dispatch.values() for v in per.values()]):.3f} ms; "
             f"realised minus drawn: mean {1e3 * np.mean(all_excess):.3f} ms, "
             f"{sum(x > 1e-3 for x in all_excess)} of {len(all_excess)} actions over 1 ms (overruns)"]
    if latency is not None:
        fitted = hardware.latency[0][1] if schedule.devices > 1 else 0.0
        notes.append(f"hop latency {1e3 * latency:.3f} ms from {len(gaps)} hops a consumer waited for (the "
                     f"ping-pong fit: {1e3 * fitted:.3f} ms)")
    return dispatch, latency, notes


def predicted_distribution(report: ValidationReport, base, spec, warmup: int):
    """The Monte Carlo prediction of the makespan's distribution under the injected variability, against the timed
    runs. *base*: the durations the ranks drew from (:func:`injected_costs`); the runtime's time per action and the
    hop latency come from :func:`runtime_terms`. The distribution comes from another seed than the runs' (it must
    not replay the measured runs' own draws). Paired besides: stages move to the next draws after each run only,
    so timed run i drew exactly the simulator's sample *warmup* + i of the runs' seed, and each run is also
    compared with its own sample (a shift shows there as a median error, apart from sampling noise). Returns the
    report with its comparison, and the Monte Carlo run."""
    import sim
    from validate.compare.distributions import compare_distributions

    dispatch, latency, notes = runtime_terms(report, base, spec, warmup + report.median_run)
    costs = base.with_dispatch(dispatch)
    hardware = report.calibration.hardware
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
