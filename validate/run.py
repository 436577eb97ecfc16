"""Predicted against measured: run a schedule for real, simulate it with calibrated costs, compare.

:func:`run_validation` is the whole flow behind ``pipesim validate``:

1. check the request before anything starts (workload, backend, GPUs, schedule);
2. size the real workloads on CPU so a forward takes about 10 ms (unless sizes are
   given), pin each rank to its own core when there are enough, note the load average;
3. launch K ranks (:mod:`validate.launch`): calibrate, warm up, ``repeats`` timed runs,
   calibrate again;
4. simulate the same Schedule object with the calibrated costs and link fit, once per timed
   run: with the in-schedule calibration each run is predicted from the traced run before it
   (the first from the last warm-up run; :mod:`validate.predict.prediction`), otherwise all from one;
5. build the measured :class:`sim.results.result.Result` of every timed run (``source="measured"``);
   the report shows the run of median makespan, with the prediction made for it;
6. compare: the makespan error of every run against its own prediction (median, p10-p90),
   and what the last warm-up run alone would have given; against the noise floor
   = the larger of the spread of the stage costs calibrated before and after the runs and
   the p10-p90 half-spread of the measured makespans: an error inside it is "not significant";
   bubble fraction, per-action start/end error, per-device utilization;
   check every update against a float64 one-process replay (:mod:`validate.correctness.checks`);
7. write the report: markdown + PNG + costs CSV + hardware JSON (+ the exact
   ``pipesim simulate`` command that replays the prediction), all or nothing.

Units: seconds; errors relative to the prediction where marked relative (``measured / predicted - 1``).
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from sim.schedules import registry as generators
from sim import schedules
from sim.model.cost import StageCosts, load_costs, uniform
from sim.errors import real_number
from sim.files import check_writable_dir
from sim.model.hardware import Hardware, load_hardware
from sim.core.ir import Schedule
from sim.results.result import make_result
from sim.simulate import simulate

from validate.compare.validation_report import NoiseFloor, ValidationReport, noise_floor
from validate import injected as injection
from validate.predict.calibrate import CALIBRATIONS, Calibration, assemble, with_overhead
from validate.compare.results import action_errors
from validate.correctness.checks import CorrectnessCheck, check_updates, powered_learning_rate, update_log_of
from validate.correctness.reference import reference_device
from validate.errors import BACKENDS, ValidationError, check_names
from validate.predict.prediction import TracedTimes, per_run_sources, predict_runs
from validate.predict.replay import replayed_makespans
from validate.request import (DEFAULT_REPEATS, DEFAULT_WARMUP, ClockOffsets, Job, RankResult,
                              RunRequest, WorkloadSpec)

# Imports: comparison -> calibrate, compare, checks, reference, request, (launch, environment, report); never
# worker or command (the worker imports this module for the torchrun path; command imports it to run).

__all__ = ["ValidationReport", "ValidationError", "run_validation", "run_validations", "check_request", "action_errors",
           "BACKENDS", "DEFAULT_EMULATED_COSTS", "build_report", "noise_floor", "NoiseFloor", "replay_command",
           "prepare_job", "schedule_of"]

DEFAULT_EMULATED_COSTS = {"forward": 0.02, "backward": 0.04, "send_bytes": 65536.0}
"""Uniform costs of the emulated workload when no costs file is given (seconds, bytes)."""


def check_request(*, workload: str, backend: str, devices: int) -> None:
    """Refuse, before anything starts, what cannot run: unknown workload or backend, NCCL without enough GPUs,
    the emulated workload on GPUs (its waits are host sleeps, which CUDA events on the device stream do not see)."""
    check_names(workload, backend)
    if backend == "nccl":
        if workload == "emulated":
            raise ValidationError("--workload emulated waits on the host, which CUDA events timing the GPU stream do "
                                  "not see; use --backend gloo for emulated runs, or a real workload on GPUs")
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ValidationError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo on CPU")
        if devices > gpus:
            raise ValidationError(f"--backend nccl runs one rank per GPU: {devices} devices asked, {gpus} GPU(s) "
                                  f"visible; lower --devices or use --backend gloo")


def schedule_of(schedule, devices, microbatches, iterations, recompute, chunks) -> Schedule:
    if isinstance(schedule, Schedule):
        return schedule.validate()
    return schedules.generate(schedule, devices, microbatches, iterations=iterations, recompute=recompute,
                              chunks=chunks)


def _given_costs(costs, stages: int) -> StageCosts | None:
    if costs is None:
        return None
    costs = costs if isinstance(costs, StageCosts) else load_costs(costs)
    if costs.stages != stages:
        raise ValidationError(f"the costs have {costs.stages} stages but the schedule has {stages}; give one row per stage")
    return costs


# --------------------------------------------------------------------------------------- comparing
def calibration_drift(sched: Schedule, costs: StageCosts | Sequence[StageCosts],
                      runs: Sequence[Sequence[tuple[int, float, float]]]) -> float:
    """How far the stage costs in the timed runs moved from the ones that predicted them, relative.

    *costs*: the costs the prediction used, one per run (the rolling prediction of
    :mod:`validate.predict.prediction`: each run's are those of the run before it) or one for all.
    Per stage: the compute time per micro-batch (F + B + W, trimmed means as in the in-schedule
    calibration, :func:`validate.predict.calibrate.in_schedule_costs`) of each timed run against the
    F + B + W of the costs that predicted that run, as a log ratio; the median over the runs,
    as ``max / min - 1`` (with one set of costs: the runs' median against it); the largest over
    the stages. When the machine's speed moved by this much between the calibration and the run
    it predicts, an error of that size is the machine, not the model.
    """
    from validate.predict.calibrate import in_schedule_costs
    per_run_costs = [costs] * len(runs) if isinstance(costs, StageCosts) else list(costs)
    if len(per_run_costs) != len(runs):
        raise ValidationError(f"calibration_drift: {len(per_run_costs)} costs for {len(runs)} runs; give one per "
                              "run or one for all")
    per_run = [in_schedule_costs(sched, list(compute)) for compute in runs]
    worst = 0.0
    for s in range(sched.stages):
        logs = []
        for ops, c in zip((r.get(s, {}) for r in per_run), per_run_costs):
            calibrated, measured = c.forward[s] + c.backward[s] + c.weight[s], ops.get("F", 0.0) + _full_backward(ops)
            if min(calibrated, measured) > 0:
                logs.append(math.log(measured / calibrated))
        if logs:  # the median of the log ratios: monotone, so one set of costs gives median(runs) / costs
            worst = max(worst, math.exp(abs(float(np.median(logs)))) - 1)
    return worst


def _full_backward(ops: dict[str, float]) -> float:
    """A stage's backward per micro-batch, B + W: from the unsplit backwards (``B_full``), the split ones
    (``B`` and ``W``), or the mean of both where a schedule splits only some (DualPipeV). Summing B_full
    and B + W counted the backward twice: a 67% "drift" on a run whose costs had not moved."""
    estimates = [ops["B_full"]] if "B_full" in ops else []
    if "B" in ops or "W" in ops:
        estimates.append(ops.get("B", 0.0) + ops.get("W", 0.0))
    return float(np.mean(estimates)) if estimates else 0.0

def replay_command(sched: Schedule, costs_path: str | None, hardware_path: str | None, *, chunks: int | None = None,
                   microbatch_size: int | None = None, schedule_file: str | None = None) -> str:
    """The ``pipesim simulate`` command that replays the prediction (every schedule flag included), ready to copy.

    *schedule_file*: the ``--schedule-file`` the run read its order from, as the user gave it: the command reads
    the same file (it fixes K, M and the order, so no schedule flag goes with it)."""
    if schedule_file is not None:
        parts = ["pipesim", "simulate", "--schedule-file", schedule_file]
    elif sched.name not in generators.names():
        return (f"(schedule {sched.name!r} is not a registered generator: save it with sim.schedule_io and give "
                f"--schedule-file; costs {costs_path}, hardware {hardware_path})")
    else:
        parts = ["pipesim", "simulate", "-s", sched.name, "-K", str(sched.devices), "-M", str(sched.microbatches)]
        if sched.iterations != 1:
            parts += ["--iterations", str(sched.iterations)]
        if sched.recomputed:
            parts.append("--recompute")
        if chunks is not None:
            parts += ["--chunks", str(chunks)]
    if costs_path:
        parts += ["--costs", costs_path]
    if hardware_path:
        parts += ["--hardware", hardware_path]
    return shlex.join(parts)  # every part shlex.quote'd: a path with spaces or quotes copies as one argument


# --------------------------------------------------------------------------------------------- run
def run_validation(schedule: str | Schedule, devices: int = 2, microbatches: int = 4, **options) -> ValidationReport:
    """Run *schedule* on *devices* local processes, simulate it, compare, and write a report.

    *schedule*: a registered name or a :class:`~sim.core.ir.Schedule` (any placement and actions).
    Options as :func:`run_validations`.
    """
    return run_validations([schedule], devices, microbatches, **options)[0]


def run_validations(schedules_: Sequence[str | Schedule], devices: int = 2, microbatches: int = 4, *,
                    workload: str = "mlp", backend: str = "gloo", iterations: int = 1, recompute: bool = False,
                    chunks: int | None = None, costs=None, hardware=None,
                    output_dir: str | os.PathLike | None = "reports/validation", timeout: float = 300.0,
                    max_time: float | None = None, warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS,
                    threads: int = 1, fail_at: str | None = None, workload_options: dict | None = None,
                    calibration: str = "schedule", probe: bool | None = None,
                    progress: Callable[[str], None] | None = None, inject: str | None = None,
                    iterations_timed: int | None = None, schedule_file: str | None = None) -> list[ValidationReport]:
    """Validate several schedules of the same K in one launch (one process group, one torch import per rank).

    *costs*: a costs CSV path or :class:`~sim.model.cost.StageCosts` to use instead of calibrating the stages
    (the emulated workload waits for exactly these; default for it: :data:`DEFAULT_EMULATED_COSTS`).
    *hardware*: a hardware JSON path or :class:`~sim.model.hardware.Hardware` instead of the link fit.
    *output_dir*: where the reports go (None: write nothing). *timeout*: seconds any one wait may take;
    *max_time*: seconds for the whole launch (None: no cap).
    *fail_at*: ``"RANK:ACTION"`` fault injection (applied to the first schedule).
    *warmup*: untimed runs before the timed ones (the last is traced for the in-schedule calibration).
    *repeats*: timed runs; the makespan error is their median, with its p10-p90 range.
    *calibration*: ``"schedule"`` (stage times traced in the schedule itself: each timed run predicted
    from the run before it, the first from the last warm-up run; :mod:`validate.predict.prediction`) or
    ``"isolated"`` (each stage measured alone); see :mod:`validate.predict.calibrate`.
    *probe*: size the real workload on CPU so a forward takes >= 10 ms (default: when *workload_options*
    gives no size; see :mod:`validate.environment`). *progress*: called with each progress line.
    *inject*: variability the emulated workload draws its waits from (:func:`validate.rank.inject.parse_inject`);
    the report then compares the measured distribution of the makespan with a Monte Carlo prediction
    (:mod:`validate.compare.distributions`). *iterations_timed*: timed runs for that distribution (>= 30; replaces
    *repeats*). *schedule_file*: the file the (first) schedule was read from, as the user named it: the
    report's replay command reads it (:func:`replay_command`).
    """
    from validate import environment
    from validate.launch import launch

    say = progress or (lambda line: None)
    _check_options(workload=workload, backend=backend, timeout=timeout, output_dir=output_dir,
                   calibration=calibration, warmup=warmup, repeats=repeats)
    injected = injection.inject_spec(inject, workload, workload_options)
    if iterations_timed is not None:
        repeats = injection.iterations_timed(iterations_timed)
    options = dict(workload_options or {})
    scheds = [schedule_of(s, devices, microbatches, iterations, recompute, chunks) for s in schedules_]
    if len({s.devices for s in scheds}) != 1:
        raise ValidationError("run_validations needs schedules with one number of devices; launch them separately")
    K = scheds[0].devices
    hardware = _hardware_for(hardware, K)
    spec, cores, notes = _workload_for(WorkloadSpec(name=workload, **options), scheds, options, backend=backend,
                                       threads=threads, probe=probe, say=say)
    jobs = [prepare_job(sched, spec, costs, fail_at if i == 0 else None) for i, sched in enumerate(scheds)]
    request = RunRequest(jobs=tuple(jobs), workload=spec, backend=backend, timeout=float(timeout), threads=threads,
                         warmup=warmup, repeats=repeats, calibrate=True, cores=cores, inject=injected)
    load_before = environment.load_average()
    say(f"launching {K} ranks ({backend}, {workload})")
    result = launch(request, timeout=timeout, max_time=max_time, progress=say)
    load = (load_before, environment.load_average())
    warning = environment.load_warning(*load, cpu=result.cpu)  # other work blamed only for its own CPU time
    run_notes = notes + ([warning] if warning else [])
    if injected is not None:
        run_notes.append(f"injected: {injected.describe()} (every action lasts a duration drawn as the simulator's Monte "
                         f"Carlo draws it, seed {injected.seed}; validate.rank.inject)")
    say("comparing")
    return [build_report(job.schedule, spec if job.lr is None else replace(spec, lr=job.lr), backend, ranks,
                         clocks=result.clocks, given_costs=job.costs, hardware=hardware, output_dir=output_dir,
                         calibration=calibration, load=load, extra_notes=run_notes, chunks=chunks, inject=injected,
                         warmup=warmup, schedule_file=schedule_file if i == 0 else None)
            for i, (job, ranks) in enumerate(zip(jobs, result.jobs))]


def _check_options(*, workload: str, backend: str, timeout, output_dir, calibration: str, warmup: int,
                   repeats: int) -> None:
    """Every option a run can refuse without building anything: before any process starts."""
    check_names(workload, backend)
    if not 0 < real_number(timeout, "timeout") < math.inf:
        raise ValidationError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    if output_dir is not None:
        check_writable_dir(output_dir)  # an unwritable report folder fails now, not after the run
    if calibration not in CALIBRATIONS:
        raise ValidationError(f"unknown calibration {calibration!r}; choose one of: {', '.join(CALIBRATIONS)}")
    if warmup < 1 and calibration == "schedule":
        raise ValidationError("calibration 'schedule' times the warm-up run: give warmup >= 1 or use 'isolated'")
    if repeats < 1:
        raise ValidationError(f"repeats must be >= 1, got {repeats}")


def _hardware_for(hardware, devices: int) -> Hardware | None:
    """The given hardware (a path or a Hardware), checked against the run's devices now, not after the run
    (issue 26, 9)."""
    if isinstance(hardware, (str, os.PathLike)):
        hardware = load_hardware(hardware)
    if hardware is not None and hardware.devices != devices:
        raise ValidationError(f"the hardware describes {hardware.devices} devices; the run has {devices}: give a "
                              f"hardware file for {devices} devices")
    return hardware


def _workload_for(spec: WorkloadSpec, scheds: Sequence[Schedule], options: dict, *, backend: str, threads: int,
                  probe: bool | None, say):
    """The workload the ranks run (the user's model checked here, or the built-in one sized by the probe), its
    memory checked against the machine before anything is built (issue 26, 4 and 10), and the cores to pin ranks
    to. Returns (spec, cores, notes)."""
    from validate import environment

    K = scheds[0].devices
    stages = max(s.stages for s in scheds)
    check_request(workload=spec.name, backend=backend, devices=K)
    environment.check_memory(spec, K, stages)
    if spec.user:  # the user's model: checked in this process, before any rank starts
        from validate.rank import user_model
        spec = user_model.prepare_for(spec, scheds, options)
        probe = False
    notes = []
    if probe is None:
        probe = not any(f in options for f in environment.SIZE_FIELDS.get(spec.name, ()))
    if probe and backend == "gloo" and spec.name != "emulated":
        say("sizing the workload (probe)")
        spec, note = environment.size_workload(spec, threads=threads)
        notes.append(note)
        environment.check_memory(spec, K, stages)
    cores, note = environment.pinning(K, backend)
    if note and (cores is not None or spec.name != "emulated"):
        notes.append(note)
    return spec, cores, notes


def prepare_job(sched: Schedule, spec: WorkloadSpec, costs=None, fail_at: str | None = None) -> Job:
    """The job of one schedule: its costs (the emulated workload's waits), fault, and a learning rate
    with which the correctness check has its power (see :func:`validate.correctness.checks.powered_learning_rate`)."""
    given = _given_costs(costs, sched.stages)
    if spec.name == "emulated" and given is None:
        given = uniform(sched.stages, **DEFAULT_EMULATED_COSTS)
    if fail_at is not None:
        _check_fail_at(fail_at, sched)
    powered = powered_learning_rate(spec, sched)
    return Job(schedule=sched, costs=given, fail_at=fail_at, lr=None if powered.lr == spec.lr else powered.lr)


def _check_fail_at(text: str, sched: Schedule) -> None:
    from sim.core.ir import Action
    rank, sep, action = text.partition(":")
    try:
        r, a = int(rank), Action.parse(action)
    except ValueError:
        raise ValidationError(f"--fail-at {text!r}: expected RANK:ACTION, e.g. 1:1B0") from None
    if not sep or not 0 <= r < sched.devices or a not in sched.actions[r]:
        raise ValidationError(f"--fail-at {text!r}: rank {rank} has no action {action} in this schedule")


def _ping(ping) -> list[tuple[int, float]] | None:
    from validate.predict.calibrate import PING_SIZES
    return list(zip(PING_SIZES, ping)) if ping else None


def build_report(sched: Schedule, spec: WorkloadSpec, backend: str, ranks: Sequence[RankResult], *,
                 clocks: ClockOffsets | None = None, given_costs: StageCosts | None, hardware: Hardware | None,
                 output_dir, calibration: str = "schedule", load: tuple[float, float] = (math.nan, math.nan),
                 extra_notes: Sequence[str] = (), chunks: int | None = None, inject=None,
                 warmup: int = DEFAULT_WARMUP, schedule_file: str | None = None) -> ValidationReport:
    """Everything after the run: calibration, prediction, measured Results, noise floor, check, report files.

    *ranks*: this job's :class:`RankResult` of every rank; *clocks*: the ranks' clock offsets (None: one host).
    *schedule_file*: the ``--schedule-file`` *sched* was read from (the replay command reads it again).
    """
    ranks = sorted(ranks, key=lambda r: r.rank)
    clocks = clocks or ClockOffsets.same_clock(len(ranks))
    emulated = spec.name == "emulated"
    # the in-schedule calibration follows the machine: each timed run from the one before it (validate.predict.prediction)
    rolling = calibration == "schedule" and given_costs is None and not emulated
    predictions = _predict(sched, spec, ranks, given_costs=given_costs, hardware=hardware, calibration=calibration,
                           rolling=rolling)
    timelines, makespans = _measure(sched, ranks, clocks)
    median_run = int(np.argsort(makespans)[(len(makespans) - 1) // 2])
    # the report shows the run of median makespan with the prediction made for it, and writes its calibration
    predicted, cal = predictions.results[median_run], predictions.calibrations[median_run]
    noise = _noise(sched, ranks, makespans, predictions, cal, emulated=emulated)
    check = check_updates(spec, sched, update_log_of(ranks), device=reference_device(backend))
    memory = [r.memory for r in ranks]
    notes = _notes(spec, backend, ranks, clocks, check, memory, extra_notes)
    measured = make_result(sched, cal.costs, cal.hardware, timelines[median_run], microbatch_size=spec.batch,
                           source="measured", notes=notes)
    start_err, end_err = action_errors(predicted.timeline, measured.timeline)
    report = ValidationReport(predicted=predicted, measured=measured, calibration=cal, workload=spec.label,
                              backend=backend, start_error=start_err, end_error=end_err, check=check,
                              makespans=tuple(makespans), predictions=predictions.makespans, median_run=median_run,
                              warmup_prediction=predictions.warmup_makespan if rolling else None,
                              calibration_source=predictions.source,
                              predicted_from=predictions.traced_in[median_run] if rolling else "",
                              noise_floor=noise, clocks=clocks, load=load, memory=memory)
    predicted_samples = None
    if inject is not None:
        report, predicted_samples = injection.predicted_distribution(
            report, injection.injected_costs(given_costs, ranks, report), inject, warmup, ranks)
    report = _write(report, sched, output_dir, chunks, schedule_file)
    if predicted_samples is not None and output_dir is not None:
        from validate.compare.distributions import write_distribution
        from validate.compare.report import report_stem
        # the report's own stem (schedule, K, M, workload, backend, repeats): two injected runs of one schedule at
        # other sizes, workloads or backends no longer write one pair of distribution files
        name = report_stem(report)
        written = write_distribution(report.distribution, predicted_samples.makespan, np.asarray(report.makespans),
                                     Path(output_dir), name, report.inject)
        report = replace(report, paths={**report.paths, **{k: str(v) for k, v in written.items()}})
    return report


def _predict(sched: Schedule, spec: WorkloadSpec, ranks: Sequence[RankResult], *, given_costs: StageCosts | None,
             hardware: Hardware | None, calibration: str, rolling: bool):
    """The prediction of every timed run, each from its own calibration (:func:`validate.predict.prediction.predict_runs`)."""
    cals = [r.calibration for r in ranks]
    per_stage = {s: c for cal in cals for s, c in cal.before.items()}
    on_host = all(r.device == "cpu" for r in ranks)  # on GPUs host work overlaps the device's
    emulated = spec.name == "emulated"

    def calibrated(traced: TracedTimes) -> Calibration:
        cal = assemble(per_stage, devices=sched.devices, ping=_ping(cals[0].ping), overhead=cals[0].overhead,
                       emulated=emulated, in_schedule=traced.stage_times if calibration == "schedule" else None,
                       action_overhead=traced.overhead, add_overhead=on_host, traced_in=traced.run)
        if given_costs is not None and not emulated:
            cal = replace(cal, costs=with_overhead(given_costs, cal.overhead_per_stage),
                          notes=cal.notes + ["stage costs from the given costs file, not measured (plus the executor "
                                             "overhead above)"])
        if hardware is not None:
            cal = replace(cal, hardware=hardware, notes=cal.notes + ["links from the given hardware file, not the "
                                                                     "ping-pong fit"])
        return cal

    return predict_runs(per_run_sources(sched, ranks, rolling=rolling), calibrated,
                        lambda cal: simulate(sched, cal.costs, cal.hardware, microbatch_size=spec.batch),
                        rolling=rolling)


def _measure(sched: Schedule, ranks: Sequence[RankResult], clocks: ClockOffsets):
    """The measured timeline of every timed run on rank 0's clock, and its makespan (seconds)."""
    from validate.rank.tracing import measured_timeline

    repeats = len(ranks[0].traces)
    timelines = [measured_timeline(sched, [r.traces[i] for r in ranks], list(clocks.offsets)) for i in range(repeats)]
    return timelines, [float(t["end"].max()) if len(t) else 0.0 for t in timelines]


def _noise(sched: Schedule, ranks: Sequence[RankResult], makespans: Sequence[float], predictions,
           cal: Calibration, *, emulated: bool) -> NoiseFloor:
    """The noise floor, with the runs' own action times replayed (:mod:`validate.predict.replay`)."""
    cals = [r.calibration for r in ranks]
    before = {s: c for c_ in cals for s, c in c_.before.items()}
    after = {s: c for c_ in cals for s, c in c_.after.items()}
    floor = noise_floor(makespans, before if not emulated else None, after)
    runs = [([c for r in ranks for c in r.traces[i].compute], [o for r in ranks for o in r.traces[i].overhead])
            for i in range(len(makespans))]
    # each run against the costs that predicted it (rolling: those of the run before it)
    in_runs = calibration_drift(sched, [c.base_costs() for c in predictions.calibrations],
                                [compute for compute, _ in runs])
    replayed = replayed_makespans(sched, [c.costs for c in predictions.calibrations], cal.hardware, runs,
                                  add_overhead=cal.overhead_included)
    shifts = [r / p - 1 for r, p in zip(replayed, predictions.makespans) if p > 0]
    return replace(floor, in_runs=in_runs, replay=float(np.median(shifts)) if shifts else 0.0,
                   replayed_makespans=tuple(replayed),
                   model_miss=float(np.median([m / r - 1 for m, r in zip(makespans, replayed) if r > 0] or [0.0])))


def _notes(spec: WorkloadSpec, backend: str, ranks: Sequence[RankResult], clocks: ClockOffsets,
           check: CorrectnessCheck, memory: list, extra_notes: Sequence[str]) -> list[str]:
    """What the measured Result says about how it was measured."""
    repeats = len(ranks[0].traces)
    devices = sorted({r.device for r in ranks})
    notes = [f"measured with torch.distributed ({backend}) on {', '.join(devices)}; {repeats} timed run(s) after "
             f"warm-up, the figures below are of the run of median makespan"]
    notes += [n for n in extra_notes if n]
    if spec.name == "emulated":
        notes.append("compute was EMULATED: every action waited for its cost from the costs file")
    if backend == "nccl":
        notes.append("compute and transfer rows: CUDA events on each rank's stream (a transfer runs from the send's "
                     "issue to the point the receiver's stream may use the data); clock offsets between ranks and "
                     "the issue order are host-side")
    else:
        notes.append("compute and transfer rows: host clock (perf_counter); a transfer runs from the isend to the "
                     "moment the receiver saw the message complete")
    hosts = len({r.host for r in ranks})
    if clocks.one_host:
        notes.append("one host (same boot id): every rank read the same clock (perf_counter)")
    else:
        notes.append(f"{hosts} hosts (boot ids): clocks aligned by ping-pong with rank 0; uncertainty up to "
                     f"{clocks.max_uncertainty * 1e6:.0f} us, drift between before and after the run "
                     f"{clocks.max_drift * 1e6:.0f} us")
    if all(m is None for m in memory):
        notes.append("memory not measured on CPU: the memory figures are the cost model's, over the measured timeline")
    else:
        notes.append("peak CUDA memory allocated per rank (MiB): "
                     + ", ".join("?" if m is None else f"{m / 2**20:.1f}" for m in memory)
                     + "; the memory panel is the cost model's")
    notes.append(f"correctness: {check.summary()}")
    return notes


def _write(report: ValidationReport, sched: Schedule, output_dir, chunks: int | None,
           schedule_file: str | None = None) -> ValidationReport:
    """The report with its replay command, and its files written into *output_dir* (None: nothing written)."""
    if output_dir is None:
        return replace(report, replay=replay_command(sched, "COSTS.csv", "HARDWARE.json", chunks=chunks,
                                                     schedule_file=schedule_file))
    from validate.compare.report import report_paths, write_report
    planned = report_paths(report, Path(output_dir))
    report = replace(report, replay=replay_command(sched, str(planned["costs"]), str(planned["hardware"]),
                                                   chunks=chunks, schedule_file=schedule_file))
    return replace(report, paths=write_report(report, Path(output_dir)))
