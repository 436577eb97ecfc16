"""Predicted against measured: run a schedule for real, simulate it with calibrated costs, compare.

:func:`run_validation` is the whole flow behind ``pipesim validate``:

1. check the request before anything starts (workload, backend, GPUs, schedule);
2. launch K ranks (:mod:`validate.launch`): calibrate, warm up, run traced;
3. simulate the same Schedule object with the calibrated costs and link fit;
4. build the measured :class:`sim.result.Result` from the traced timeline
   (``source="measured"``), so both sides share one schema;
5. compare: makespan and bubble fraction, per-action start/end error (median and
   worst, matched by device, stage, micro-batch and kind), per-device utilization;
   check gradients (flush schedules) or weights (PipeDream, weight stashing)
   against a one-process reference (:mod:`validate.reference`);
6. write the report: markdown + PNG (both Gantts on one time axis) + costs CSV +
   hardware JSON, each written to a temporary name and renamed on success.

Units: seconds; errors relative to the prediction where marked relative.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sim import schedules
from sim.cost import StageCosts, load_costs, uniform
from sim.errors import real_number
from sim.files import check_writable_dir
from sim.hardware import Hardware, load_hardware
from sim.ir import Schedule
from sim.result import Result, make_result
from sim.simulate import simulate
from sim.timeline import compute_rows

from .calibrate import CALIBRATIONS, Calibration, assemble
from .errors import BACKENDS, ValidationError, check_names

__all__ = ["ValidationReport", "ValidationError", "run_validation", "run_validations", "check_request", "action_errors",
           "BACKENDS", "DEFAULT_EMULATED_COSTS"]

DEFAULT_EMULATED_COSTS = {"forward": 0.02, "backward": 0.04, "send_bytes": 65536.0}
"""Uniform costs of the emulated workload when no costs file is given (seconds, bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """Predicted and measured results of one schedule, and how far apart they are."""

    predicted: Result
    measured: Result
    calibration: Calibration
    workload: str
    backend: str
    start_error: tuple[float, float]
    """(median, worst) |measured - predicted| start of each action, seconds."""
    end_error: tuple[float, float]
    """(median, worst) |measured - predicted| end of each action, seconds."""
    gradients_match: bool | None
    """Flush schedules: gradients equal one-process training; PipeDream: weights equal weight stashing. None: not checked."""
    gradient_error: float | None
    """Largest absolute difference found by that check."""
    sync_drift: float | None = None
    """PipeDream: largest difference of its final weights from synchronous SGD, relative to the weights."""
    clock_uncertainty: float = 0.0
    """Largest clock-offset uncertainty between ranks, seconds (0 on one host)."""
    memory: list = field(default_factory=list)
    """Peak CUDA memory allocated per rank (bytes), or None per rank on CPU (not measured)."""
    paths: dict = field(default_factory=dict)
    """What was written: report, figure, costs, hardware."""

    @property
    def makespan_error(self) -> float:
        p, m = self.predicted.metrics.makespan, self.measured.metrics.makespan
        return (m - p) / p if p > 0 else math.inf

    def to_dict(self) -> dict:
        s, p, m = self.predicted.schedule, self.predicted.metrics, self.measured.metrics
        return {
            "schedule": s.name, "devices": s.devices, "stages": s.stages, "microbatches": s.microbatches,
            "iterations": s.iterations, "workload": self.workload, "backend": self.backend,
            "predicted_makespan": p.makespan, "measured_makespan": m.makespan, "makespan_error": self.makespan_error,
            "predicted_bubble_fraction": p.bubble_fraction, "measured_bubble_fraction": m.bubble_fraction,
            "predicted_utilization": p.device_utilization, "measured_utilization": m.device_utilization,
            "start_error_median": self.start_error[0], "start_error_worst": self.start_error[1],
            "end_error_median": self.end_error[0], "end_error_worst": self.end_error[1],
            "gradients_match": self.gradients_match, "gradient_error": self.gradient_error,
            "sync_drift": self.sync_drift, "clock_uncertainty": self.clock_uncertainty,
            "measured_peak_memory": self.memory, "calibration": self.calibration.to_dict(),
            "notes": list(self.measured.notes), "paths": dict(self.paths),
        }


# ------------------------------------------------------------------------------------------ checks
def check_request(*, workload: str, backend: str, devices: int) -> None:
    """Refuse, before anything starts, what cannot run: unknown workload or backend, NCCL without enough GPUs."""
    check_names(workload, backend)
    if backend == "nccl":
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ValidationError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo on CPU")
        if devices > gpus:
            raise ValidationError(f"--backend nccl runs one rank per GPU: {devices} devices asked, {gpus} GPU(s) "
                                  f"visible; lower --devices or use --backend gloo")


def _schedule(schedule, devices, microbatches, iterations, recompute, chunks) -> Schedule:
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
def action_errors(predicted: pd.DataFrame, measured: pd.DataFrame) -> tuple[tuple[float, float], tuple[float, float]]:
    """((median, worst) start error, (median, worst) end error) of the computations both timelines share."""
    keys = ["device", "stage", "microbatch", "op"]
    both = compute_rows(predicted)[keys + ["start", "end"]].merge(
        compute_rows(measured)[keys + ["start", "end"]], on=keys, suffixes=("_p", "_m"))
    if both.empty:
        return (0.0, 0.0), (0.0, 0.0)
    ds = (both["start_m"] - both["start_p"]).abs()
    de = (both["end_m"] - both["end_p"]).abs()
    return (float(ds.median()), float(ds.max())), (float(de.median()), float(de.max()))


def _correctness(schedule: Schedule, spec, ranks: list[dict]) -> tuple[bool | None, float | None, float | None, str]:
    from .reference import emulate_updates, max_difference, reference_grads
    if spec.name == "emulated":
        return None, None, None, "gradients not checked: compute was emulated"
    if schedule.updates_per_stage == 0:
        return None, None, None, "gradients not checked: the schedule has no updates (U)"
    grads = {s: log for r in ranks for s, log in r["grads"].items()}
    weights = {s: w for r in ranks for s, w in r["weights"].items()}
    if schedule.microbatches_per_update == schedule.microbatches:  # flush: one update per iteration
        ref = reference_grads(spec, schedule.stages, schedule.microbatches, 0)
        got = {s: grads[s][0] for s in ref}
        err, _ = max_difference(got, ref)
        ok = all(np.allclose(got[s][k].numpy(), ref[s][k].numpy(), rtol=1e-4, atol=1e-6) for s in ref for k in ref[s])
        what = "gradients of iteration 0 vs one-process training on the whole mini-batch"
        if schedule.iterations > 1:
            wref = emulate_updates(spec, schedule)
            werr, _ = max_difference(weights, wref)
            ok = ok and all(np.allclose(weights[s][k].numpy(), wref[s][k].numpy(), rtol=1e-4, atol=1e-5)
                            for s in wref for k in wref[s])
            err = max(err, werr)
            what += (f"; weights after {schedule.iterations} iterations vs a one-process emulation "
                     f"(each forward on the weight version the schedule gives it)")
        return ok, err, None, what
    ref = emulate_updates(spec, schedule, stash=True)
    err, _ = max_difference(weights, ref)
    ok = all(np.allclose(weights[s][k].numpy(), ref[s][k].numpy(), rtol=1e-4, atol=1e-5) for s in ref for k in ref[s])
    _, drift = max_difference(ref, emulate_updates(spec, schedule, stash=False))
    return ok, err, drift, (f"weights after {schedule.updates_per_stage} updates vs a one-process emulation of "
                            f"weight stashing; drift from synchronous SGD {drift:.3g} (relative)")


# --------------------------------------------------------------------------------------------- run
def run_validation(schedule: str | Schedule, devices: int = 2, microbatches: int = 4, **options) -> ValidationReport:
    """Run *schedule* on *devices* local processes, simulate it, compare, and write a report.

    *schedule*: a registered name or a :class:`~sim.ir.Schedule` (any placement and actions).
    Options as :func:`run_validations`.
    """
    return run_validations([schedule], devices, microbatches, **options)[0]


def run_validations(schedules_: Sequence[str | Schedule], devices: int = 2, microbatches: int = 4, *,
                    workload: str = "mlp", backend: str = "gloo", iterations: int = 1, recompute: bool = False,
                    chunks: int | None = None, costs=None, hardware=None,
                    output_dir: str | os.PathLike | None = "reports/validation", timeout: float = 300.0,
                    warmup: int = 2, threads: int = 1, fail_at: str | None = None,
                    workload_options: dict | None = None, calibration: str = "schedule") -> list[ValidationReport]:
    """Validate several schedules of the same K in one launch (one process group, one torch import per rank).

    *costs*: a costs CSV path or :class:`~sim.cost.StageCosts` to use instead of calibrating the stages
    (the emulated workload waits for exactly these; default for it: :data:`DEFAULT_EMULATED_COSTS`).
    *hardware*: a hardware JSON path or :class:`~sim.hardware.Hardware` instead of the link fit.
    *output_dir*: where the reports go (None: write nothing). *timeout*: seconds for the whole launch.
    *fail_at*: ``"RANK:ACTION"`` fault injection (applied to the first schedule).
    *warmup*: untraced-for-the-report iterations before the measured one (the last is timed for calibration).
    *calibration*: ``"schedule"`` (stage times from the last traced warm-up run of each schedule) or
    ``"isolated"`` (each stage measured alone); see :mod:`validate.calibrate`.
    """
    from .launch import launch
    from .workloads import WorkloadSpec

    check_names(workload, backend)
    if not 0 < real_number(timeout, "timeout") < math.inf:  # refused before any process starts
        raise ValidationError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    if output_dir is not None:
        check_writable_dir(output_dir)  # an unwritable report folder fails now, not after the run
    if calibration not in CALIBRATIONS:
        raise ValidationError(f"unknown calibration {calibration!r}; choose one of: {', '.join(CALIBRATIONS)}")
    if warmup < 1 and calibration == "schedule":
        raise ValidationError("calibration 'schedule' times the warm-up run: give warmup >= 1 or use 'isolated'")
    spec = WorkloadSpec(name=workload, **(workload_options or {}))
    scheds = [_schedule(s, devices, microbatches, iterations, recompute, chunks) for s in schedules_]
    if len({s.devices for s in scheds}) != 1:
        raise ValidationError("run_validations needs schedules with one number of devices; launch them separately")
    check_request(workload=workload, backend=backend, devices=scheds[0].devices)
    if isinstance(hardware, (str, os.PathLike)):
        hardware = load_hardware(hardware)
    jobs = []
    for i, sched in enumerate(scheds):
        given = _given_costs(costs, sched.stages)
        if workload == "emulated" and given is None:
            given = uniform(sched.stages, **DEFAULT_EMULATED_COSTS)
        if fail_at is not None and i == 0:
            _check_fail_at(fail_at, sched)
        jobs.append({"schedule": sched, "costs": given, "fail_at": fail_at if i == 0 else None})
    payload = {"jobs": jobs, "workload": spec.to_dict(), "backend": backend, "timeout": float(timeout),
               "threads": threads, "warmup": warmup, "calibrate": True}
    result = launch(payload, timeout=timeout)
    return [build_report(job["schedule"], spec, backend, dict(result, ranks=ranks), given_costs=job["costs"],
                         hardware=hardware, output_dir=output_dir, calibration=calibration)
            for job, ranks in zip(jobs, result["jobs"])]


def _check_fail_at(text: str, sched: Schedule) -> None:
    from sim.ir import Action
    rank, sep, action = text.partition(":")
    try:
        r, a = int(rank), Action.parse(action)
    except ValueError:
        raise ValidationError(f"--fail-at {text!r}: expected RANK:ACTION, e.g. 1:1B0") from None
    if not sep or not 0 <= r < sched.devices or a not in sched.actions[r]:
        raise ValidationError(f"--fail-at {text!r}: rank {rank} has no action {action} in this schedule")


def build_report(sched: Schedule, spec, backend: str, result: dict, *, given_costs: StageCosts | None,
                 hardware: Hardware | None, output_dir, calibration: str = "schedule") -> ValidationReport:
    """Everything after the run: calibration, prediction, measured Result, checks, report files."""
    from .tracing import measured_timeline
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    per_stage = {s: c for r in ranks for s, c in r["calibration"]["stages"].items()}
    in_schedule = None
    if calibration == "schedule":
        in_schedule = {s: c for r in ranks for s, c in (r["calibration"].get("in_schedule") or {}).items()}
    cal = assemble(per_stage, devices=sched.devices, ping=_ping(ranks[0]["calibration"]["ping"]),
                   overhead=ranks[0]["calibration"]["overhead"], emulated=spec.name == "emulated",
                   in_schedule=in_schedule)
    if given_costs is not None and spec.name != "emulated":
        cal = Calibration(costs=given_costs, hardware=cal.hardware, overhead=0.0, ping=cal.ping,
                          notes=cal.notes + ["stage costs from the given costs file, not measured"])
    if hardware is not None:
        cal = Calibration(costs=cal.costs, hardware=hardware, overhead=cal.overhead, ping=cal.ping,
                          notes=cal.notes + ["links from the given hardware file, not the ping-pong fit"])
    predicted = simulate(sched, cal.costs, cal.hardware, microbatch_size=spec.batch)
    timeline = measured_timeline(sched, [r["trace"] for r in ranks], result["offsets"])
    ok, err, drift, what = _correctness(sched, spec, ranks)
    memory = [r["memory"] for r in ranks]
    notes = [f"measured with torch.distributed ({backend}) on {', '.join(sorted({r['device'] for r in ranks}))}"]
    if spec.name == "emulated":
        notes.append("compute was EMULATED: every action waited for its cost from the costs file")
    if result["one_host"]:
        notes.append("one host: every rank read the same clock (perf_counter)")
    else:
        notes.append(f"clocks aligned by ping-pong with rank 0; uncertainty up to {max(result['uncertainty']) * 1e6:.0f} us")
    if all(m is None for m in memory):
        notes.append("memory not measured on CPU: the memory figures are the cost model's, over the measured timeline")
    else:
        notes.append("peak CUDA memory allocated per rank (MiB): "
                     + ", ".join("?" if m is None else f"{m / 2**20:.1f}" for m in memory)
                     + "; the memory panel is the cost model's")
    notes.append(what)
    measured = make_result(sched, cal.costs, cal.hardware, timeline, microbatch_size=spec.batch, source="measured",
                           notes=notes)
    start_err, end_err = action_errors(predicted.timeline, measured.timeline)
    report = ValidationReport(predicted=predicted, measured=measured, calibration=cal, workload=spec.name,
                              backend=backend, start_error=start_err, end_error=end_err, gradients_match=ok,
                              gradient_error=err, sync_drift=drift, clock_uncertainty=max(result["uncertainty"]),
                              memory=memory)
    if output_dir is not None:
        from .report import write_report
        paths = write_report(report, Path(output_dir))
        report = replace(report, paths=paths)
    return report


def _ping(ping) -> list[tuple[int, float]] | None:
    from .calibrate import PING_SIZES
    return list(zip(PING_SIZES, ping)) if ping else None


def run_validation_distributed(args) -> int:
    """The torchrun path: every rank runs its part; rank 0 compares and writes the report."""
    from .command import request_from_args
    from .workloads import WorkloadSpec
    from .worker import run_rank
    world = int(os.environ["WORLD_SIZE"])
    req = request_from_args(args, devices=world)
    check_request(workload=req["workload"], backend=req["backend"], devices=1)
    spec = WorkloadSpec(name=req["workload"], **req["workload_options"])
    sched = _schedule(req["schedule"], world, req["microbatches"], req["iterations"], req["recompute"], req["chunks"])
    given = _given_costs(req["costs"], sched.stages)
    if req["workload"] == "emulated" and given is None:
        given = uniform(sched.stages, **DEFAULT_EMULATED_COSTS)
    payload = {"jobs": [{"schedule": sched, "costs": given, "fail_at": req["fail_at"]}], "workload": spec.to_dict(),
               "backend": req["backend"], "timeout": req["timeout"], "threads": req["threads"], "warmup": 2,
               "calibrate": True}
    result = run_rank(payload)
    if result is not None:
        result = dict(result, ranks=result["jobs"][0])
        hardware = load_hardware(req["hardware"]) if req["hardware"] else None
        report = build_report(sched, spec, req["backend"], result, given_costs=given, hardware=hardware,
                              output_dir=req["output_dir"], calibration=req["calibration"])
        from .report import format_summary
        print(format_summary(report))
    return 0
