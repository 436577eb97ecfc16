"""``pipesim validate --runtime torch|megatron``: PyTorch's or Megatron-LM's own runtime measured, ingested and
compared with pipesim.

    pipesim validate --runtime torch -s 1f1b -K 2 -M 8                       # Schedule1F1B, gloo on CPU
    pipesim validate --runtime torch -s interleaved-1f1b -K 2 -M 4 --chunks 2 --json
    pipesim validate --runtime torch -s zbv -K 4 -M 8 --workload transformer --backend nccl
    pipesim validate --runtime megatron -s interleaved-1f1b -K 4 -M 8       # megatron-core's own schedule

    from validate.pytorch.validation import run_torch_validations
    [v] = run_torch_validations(["gpipe"], 2, 4, workload="mlp", output_dir="reports/validation")
    v.summary["makespan_error"], v.summary["idle"]["measured"]["gap_fraction"]

The flow: map the schedule name to its PyTorch class (:mod:`validate.pytorch.schedules`, refused with
one line when PyTorch has none); run the class on K local processes under torch.profiler
(:mod:`validate.pytorch.runtime`); ingest the traces (:mod:`validate.ingest.flow`) against the order the
class executes; calibrate costs and links from every profiled step; simulate that schedule with
them; compare the profiled step whose makespan is the median, report the makespan error of every
step (median and p10-p90), every step replayed from its own measurements (:mod:`validate.ingest.step_replay`:
the model's error step by step) and the measured idle split; write the report
(:mod:`validate.ingest.report`) plus each rank's raw trace (``<stem>_rank<r>.json.gz``, for Perfetto
or ``pipesim ingest``). For Megatron (:mod:`validate.pytorch.megatron`) the same, its traces read by their
``forward_step`` / ``backward_step`` calls, the ``megatron`` profile predicting, and the profile's posting points
held against the batches the ranks posted (:mod:`validate.ingest.posting`).
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim.model.cost import StageCosts, load_costs
from sim.model.runtimes import get_runtime
from sim.schedules import generate
from sim.files import atomic_path, check_output_dir
from sim.model.hardware import Hardware, load_hardware
from sim.simulate import simulate

from validate.environment import SIZE_FIELDS, check_memory, pinning, size_workload
from validate.launch import end_watchdog, start_watchdog
from validate.errors import ValidationError, check_names
from validate.ingest.flow import ingest, without_updates
from validate.ingest.report import Comparison, compare_ingested, format_summary, write_ingest_report
from validate.compare.distributions import median_interval
from validate.compare.idle import mean_split, split_idle
from validate.compare.report import backend_tag
from validate.ingest.calibration import calibrate_runtime
from validate.ingest.posting import check_posting
from validate.ingest.step_replay import replay_steps
from validate.ingest.message_draws import STALL_SECONDS, message_distributions, predict_drawn, sender_evidence
from validate.pytorch.megatron import megatron_version
from validate.pytorch.schedules import (RUNTIME_CLASS, TORCH_CLASSES, pytorch_schedule, schedule_file_key,
                                        schedule_file_plan, torch_class_for)

__all__ = ["TorchValidation", "run_torch_validations", "run_command", "torch_report_stem"]

_RUNNER = {"torch": "PyTorch's runtime", "megatron": "Megatron-LM's runtime",
           "megatron-overlap": "Megatron-LM's runtime (overlap_p2p_comm)",
           "megatron-overlap-flush": "Megatron-LM's runtime (overlap_p2p_comm, overlap_p2p_comm_warmup_flush)"}


@dataclass(frozen=True, slots=True)
class TorchValidation:
    """One PyTorch schedule class run, ingested and compared."""

    name: str
    cls: str
    comparison: Comparison
    step_seconds: tuple
    """Wall time of ``step()`` without the profiler (slowest rank), per timed step."""
    paths: dict = field(default_factory=dict)

    @property
    def summary(self) -> dict:
        return self.comparison.summary

    def to_dict(self) -> dict:
        out = dict(self.summary)
        out["paths"] = {k: str(v) for k, v in self.paths.items()}
        return out


def run_torch_validations(names: Sequence[str], devices: int = 2, microbatches: int = 4, *,
                          chunks: int | None = None, workload: str = "mlp", workload_options: dict | None = None,
                          backend: str = "gloo", steps: int | None = None, warmup: int = 2, timed: int = 3,
                          timeout: float = 300.0, threads: int = 1,
                          costs: str | os.PathLike | StageCosts | None = None,
                          hardware: str | os.PathLike | Hardware | None = None,
                          output_dir: str | os.PathLike | None = "reports/validation",
                          schedule_file: str | None = None, runtime: str = "torch") -> list[TorchValidation]:
    """Run each schedule's PyTorch class on *devices* local processes (one launch), ingest, compare, report.

    *runtime*: ``torch`` (PyTorch's schedule classes) or ``megatron`` (Megatron-LM's schedule functions,
    :mod:`validate.pytorch.megatron`: ``1f1b`` and ``interleaved-1f1b``, predicted with the ``megatron`` profile).

    *costs* / *hardware*: predict with these instead of the trace's calibration. *steps*: profiled steps per
    schedule (the validator's ``--repeats``); None: as many as fill about a second, 5 to 40
    (:func:`validate.pytorch.runtime.profiled_steps_for`), so that the median step is known within a few percent.
    As for pipesim's executor (:mod:`validate.environment`): on CPU, when *workload_options* gives no size,
    a probe grows the workload until one stage forward takes >= 10 ms (below that the profile measures the
    OS more than the model), and each rank is pinned to its own core when K fits the usable cores.
    *output_dir*: where the reports go (None: write nothing). *schedule_file*: run the order saved there (one name
    in *names*, its label) in PyTorch's runtime (:func:`validate.pytorch.schedules.schedule_file_plan`).
    """
    from validate.rank.workloads import WorkloadSpec

    check_names(workload, backend)
    if runtime not in _RUNNER:
        raise ValidationError(f"unknown runtime {runtime!r}: {', '.join(_RUNNER)}")
    megatron = get_runtime(runtime).family == "megatron"
    if megatron:
        from validate.pytorch.megatron import check_megatron
        for name in names:
            # one line: no function, a refused shape, not installed
            check_megatron(name, devices, microbatches, overlap=get_runtime(runtime).overlap_p2p_comm)
        if schedule_file is not None:
            raise ValidationError("--schedule-file runs in PyTorch's runtime (--runtime torch); Megatron-LM runs its "
                                  "own 1F1B and interleaved orders")
    if workload == "emulated":
        raise ValidationError(f"the {runtime} runtime runs real stage modules: use --workload mlp or transformer "
                              "(the emulated workload has no modules for PyTorch's schedules)")
    if (steps is not None and steps < 1) or warmup < 1:
        raise ValidationError(f"the {runtime} runtime needs at least one warm-up and one profiled step")
    spec = WorkloadSpec(name=workload, **(workload_options or {}))
    setup_notes = []
    sized = any(f in (workload_options or {}) for f in SIZE_FIELDS.get(workload, ()))
    if backend == "gloo" and not spec.user and not sized:
        spec, note = size_workload(spec, threads=threads)
        setup_notes.append(note)
    cores, note = pinning(devices, backend)
    if note:
        setup_notes.append(note)
    jobs, plans = [], []
    for name in names:
        extra = {}
        if schedule_file is not None:  # a saved order: PyTorch's runtime loads its CSV
            cls = RUNTIME_CLASS
            schedule, extra["csv"], notes = schedule_file_plan(schedule_file, devices)
            key, digest = schedule_file_key(schedule_file)  # the reports of two files never share a name
            source = {"schedule_file": str(schedule_file), "schedule_file_sha256": digest}
        elif megatron:  # its order is pipesim's 1f1b / interleaved-1f1b (validate/ingest/infer.py)
            from validate.pytorch.megatron import megatron_function
            cls = megatron_function(name, devices)
            schedule = without_updates(generate(name, devices, microbatches, chunks=chunks))
            notes, key, source = [], name, {}
            extra["runtime"] = runtime
        else:
            cls = torch_class_for(name)
            schedule, notes = pytorch_schedule(cls, devices, microbatches, chunks=chunks)
            key, source = next(k for k, v in TORCH_CLASSES.items() if v == cls), {}
        jobs.append({"name": f"job{len(jobs)}", "cls": cls, "microbatches": schedule.microbatches,
                     "placement": list(schedule.placement), **extra})
        plans.append((name, cls, schedule, notes, key, source))
    check_memory(spec, devices, max(p[2].stages for p in plans))  # before anything is built (issue 26 items 4, 10)
    if spec.user:  # the user's model, checked here before any rank starts (validate.rank.user_model)
        from validate.rank.user_model import prepare_for
        spec = prepare_for(spec, [p[2] for p in plans], dict(workload_options or {}))
    if megatron:  # one message shape between every pair of stages, or one line now
        from validate.pytorch.megatron import boundary_numel
        boundary_numel(spec)
    _check_backend(backend, devices)
    given_costs = load_costs(costs) if isinstance(costs, (str, os.PathLike)) else costs
    given_hw = load_hardware(hardware) if isinstance(hardware, (str, os.PathLike)) else hardware
    for _, _, schedule, *_ in plans:  # given files are checked before anything starts
        if given_costs is not None and given_costs.stages != schedule.stages:
            raise ValidationError(f"the costs have {given_costs.stages} stages; {schedule.name} has {schedule.stages}")
        if given_hw is not None and given_hw.devices != schedule.devices:
            raise ValidationError(f"the hardware describes {given_hw.devices} devices; the run has {schedule.devices}")
    if output_dir is not None:
        check_output_dir(output_dir)
    from validate.pytorch.runtime import run_torch_schedules

    out = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pipesim-torch-") as tmp:
        watchdog = start_watchdog(Path(tmp))  # removes the folder should this process be SIGKILLed (issue 26, 10)
        try:
            runs = run_torch_schedules(jobs, workload=spec.to_dict(), backend=backend, warmup=warmup, timed=timed,
                                       profiled=steps, timeout=timeout, threads=threads, workdir=tmp, cores=cores)
        finally:
            end_watchdog(watchdog)
        load = (load_before, os.getloadavg()[0])
        for job, (name, cls, schedule, notes, key, source) in zip(jobs, plans):
            run = dict(runs[job["name"]], load=load)
            out.append(_compare(name, cls, schedule, notes + setup_notes, run, spec, backend, given_costs, given_hw,
                                output_dir, key=key, source=source, runtime=runtime))
    return out


def _check_backend(backend: str, devices: int) -> None:
    if backend != "nccl":
        return
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < devices:
        raise ValidationError(f"--backend nccl runs one rank per GPU: {devices} ranks asked, {gpus} GPU(s) visible; "
                              f"use --backend gloo on CPU")


def _band(drawn: np.ndarray, measured: list[float]) -> dict:
    """The predicted spread against the measured one: p10, p50 and p90 of the draws' makespans and of the profiled
    steps', and the error (measured / predicted - 1) at p10 and at p90. The makespan error's p10..p90 compares every
    step with one prediction, so it cannot be narrower than the steps' own spread; this asks whether the model's
    draws spread as the steps do (seconds)."""
    q = (10, 50, 90)
    pred = [float(np.percentile(drawn, x)) for x in q]
    meas = [float(np.percentile(measured, x)) for x in q]
    return {"predicted_makespan_quantiles": dict(zip(("p10", "p50", "p90"), pred)),
            "measured_makespan_quantiles": dict(zip(("p10", "p50", "p90"), meas)),
            "band_error": [meas[0] / pred[0] - 1 if pred[0] > 0 else math.inf,
                           meas[2] / pred[2] - 1 if pred[2] > 0 else math.inf]}


def _gradient_check(spec, schedule, paths, backend: str):
    """The step's gradients of every rank (:func:`validate.pytorch.runtime.run_torch_schedules`) against float64
    one-process training (:func:`validate.correctness.checks.check_step_gradients`)."""
    import torch

    from validate.correctness.checks import CorrectnessCheck, check_step_gradients
    from validate.correctness.reference import reference_device
    if not paths:
        return CorrectnessCheck(passed=None, what="gradients not checked: the ranks kept none")
    got = {}
    for path in paths:
        got.update(torch.load(path, weights_only=True))
    return check_step_gradients(spec, schedule.stages, schedule.microbatches, got, device=reference_device(backend))


def _compare(name: str, cls: str, schedule, notes: list[str], run: dict, spec, backend: str,
             given_costs: StageCosts | None, given_hw: Hardware | None, output_dir, *, key: str,
             source: dict, runtime: str = "torch") -> TorchValidation:
    """*key*: the reports' name before ``_K<K>``: the pipesim name of *cls*, or a schedule file's
    (:func:`validate.pytorch.schedules.schedule_file_key`); *source*: the file and its digest (empty for a class).
    *runtime*: which ran (``torch`` or ``megatron``): how the traces are read and which profile predicts."""
    megatron = get_runtime(runtime).family == "megatron"
    ing = ingest(run["traces"], schedule, microbatch_size=spec.batch, source="megatron" if megatron else "auto")
    costs = ing.calibration.costs if given_costs is None else given_costs
    hw = ing.calibration.hardware if given_hw is None else given_hw
    # without the runtime model: eager links, no dispatch (the prediction before issue 27)
    plain = simulate(schedule, costs, hw, microbatch_size=spec.batch)
    # with it: the torch profile's posting points on rendezvous links, the dispatch overhead, link and post times
    # the trace shows over every profiled step: the one calibration ingest uses (validate.ingest.calibration).
    # No per-message replay here (one prediction is compared with every step): the message times are drawn from
    # their distributions over the profiled steps (validate.ingest.message_draws).
    model = calibrate_runtime(ing.runs(), costs, hw, runtime, costs_given=given_costs is not None,
                                hardware_given=given_hw is not None, dispatch_runs=ing.dispatch_runs(),
                                draws=message_distributions(ing.messages, results=ing.steps, schedule=ing.schedule,
                                                             spans=ing.dispatch_spans(), overhead=ing.call_overhead))
    if model.draws is not None:
        predicted, program_run, drawn_spans, drawn_splits = predict_drawn(schedule, model.costs, model.hardware,
                                                                          model.runtime, model.draws,
                                                                          microbatch_size=spec.batch)
    else:
        (predicted, program_run), drawn_splits = model.predict(schedule, microbatch_size=spec.batch), None
        drawn_spans = np.array([predicted.metrics.makespan])
    # and every step replayed from its own measurements (validate.ingest.step_replay): the model's error step by
    # step, which the steps' spread around their median does not bound (given costs: their dispatch columns kept)
    replays = replay_steps(ing, model.costs, model.hardware, runtime, microbatch_size=spec.batch,
                           own_dispatch=given_costs is None, plain_costs=costs, plain_hardware=hw)
    p = predicted.metrics.makespan
    spans = {s: r.metrics.makespan for s, r in ing.steps.items()}
    errors = sorted((m - p) / p for m in spans.values()) if p > 0 else [math.inf]
    p0 = plain.metrics.makespan
    errors_plain = sorted((m - p0) / p0 for m in spans.values()) if p0 > 0 else [math.inf]
    median_step = sorted(spans, key=lambda s: (spans[s], s))[(len(spans) - 1) // 2]
    headline = [f"ingested from profiler traces, step {median_step}"]  # the chosen step's note, for this step
    ing = replace(ing, step=median_step, measured=replace(ing.steps[median_step],
                                                          notes=headline + list(ing.measured.notes[1:])))
    step_seconds = tuple(run["step_seconds"])
    measured_median = float(np.median(list(spans.values())))
    # how well the profiled steps pin their own median down: the error is judged against it, so its uncertainty is
    # part of the answer (a few steps of a noisy run leave it +-10% wide)
    median_lo, median_hi, coverage = median_interval(list(spans.values()))
    unprofiled = float(np.median(step_seconds)) if step_seconds else math.nan
    runner = (f"Megatron-LM's {cls} (megatron-core {megatron_version()}, {backend})" if megatron else
              f"PyTorch's {cls} (torch.distributed.pipelining, {backend})")
    notes = [f"measured: {runner} under torch.profiler; no pipesim executor involved"] + notes
    cores = os.cpu_count() or 1
    if max(run["load"]) > cores:
        notes.append(f"the machine was busy (1-minute load average {run['load'][0]:.1f} before, {run['load'][1]:.1f} "
                     f"after, on {cores} cores): ranks shared cores with other work, so measured times move with it")
    if given_costs is not None:
        notes.append("predicted with the given costs, not the trace's calibration")
    if given_hw is not None:
        notes.append("predicted with the given hardware, not the trace's link fit")
    # Megatron's trace shows its batches (with_stack): the lowering is held against what the ranks posted
    posting = check_posting(run["traces"], program_run.program) if megatron else None
    check = _gradient_check(spec, schedule, run.get("grads"), backend)
    notes.append(f"correctness: {check.summary()}")
    extra = {**source, "runtime": runtime, ("megatron_function" if megatron else "torch_class"): cls,
             "workload": spec.name, "backend": backend,
             "gradients_match": check.passed, "check": check.to_dict(),
             "profiled_steps": len(spans), "step_makespans": [spans[s] for s in sorted(spans)],
             "compared_step": median_step,
             "makespan_error_median": float(np.median(errors)),
             "makespan_error_median_interval": [median_lo / p - 1, median_hi / p - 1] if p > 0 else [math.inf] * 2,
             "median_interval_coverage": coverage,
             "makespan_error_range": [float(np.percentile(errors, 10)), float(np.percentile(errors, 90))],
             **_band(drawn_spans, list(spans.values())),
             "step_replays": replays.to_dict(),
             "unprofiled_step_seconds": list(step_seconds),
             "profiler_overhead": measured_median / unprofiled if unprofiled and unprofiled > 0 else None,
             "load_average": list(run["load"]),
             **({"posting": posting.to_dict()} if posting is not None else {}),
             "runtime_model": {
                 **model.to_dict(), "lowering": program_run.program.lowering,
                 "sender_evidence": sender_evidence(ing),
                 "without": {"makespan": p0, "makespan_error_median": float(np.median(errors_plain)),
                             "makespan_error_range": [float(np.percentile(errors_plain, 10)),
                                                      float(np.percentile(errors_plain, 90))]}},
             "notes": notes}
    comparison = compare_ingested(ing, predicted, extra=extra)
    # the prediction's calls and pending operations are communication, as the trace's are (validate/compare/idle.py)
    idle_p = split_idle(predicted, program_run.communication)
    comparison.summary["idle"]["predicted"] = idle_p.to_dict()
    # one step's split against one draw's moves by 5-15 points between steps at 1-ms actions: the means over every
    # profiled step and over every draw, each by the same rule (validate/compare/idle.py), are what is compared
    comparison.summary["idle"]["measured_mean"] = mean_split(
        [split_idle(ing.steps[k], ing.communication(k, runtime=runtime)) for k in sorted(ing.steps)])
    comparison.summary["idle"]["predicted_mean"] = mean_split(drawn_splits or [idle_p])
    comparison = replace(comparison, idle_predicted=idle_p)
    extra["runtime_model"]["without"]["idle"] = split_idle(plain).to_dict()
    validation = TorchValidation(name=name, cls=cls, comparison=comparison, step_seconds=step_seconds)
    if output_dir is None:
        return validation
    s = schedule
    stem = torch_report_stem(key, s, spec.label, backend, runtime)
    what = (f"- function: `megatron.core.pipeline_parallel.schedules.{cls}` (megatron-core {megatron_version()}) for "
            f"pipesim's `{name}`; the prediction simulates pipesim's `{name}`, the order this function executes"
            if megatron else
            f"- class: `torch.distributed.pipelining.{cls}` for pipesim's `{name}`; the prediction simulates the order "
            f"this class executes")
    section = (_RUNNER[runtime], "\n".join([
        f"{what} ({s.stages} stages on {s.devices} ranks, placement {list(s.placement)})",
        *([f"- schedule file: `{source['schedule_file']}` (SHA-256 {source['schedule_file_sha256']})"]
          if source else []),
        f"- profiled steps: {len(spans)}; makespan per step (ms): "
        + ", ".join(f"{spans[k] * 1e3:.3f}" for k in sorted(spans)) + f"; compared: step {median_step} (the median)",
        f"- makespan error over the steps: median {extra['makespan_error_median']:+.1%} "
        f"({_interval_words(extra)}), p10-p90 "
        f"{extra['makespan_error_range'][0]:+.1%} .. {extra['makespan_error_range'][1]:+.1%}",
        _runtime_model_line(extra["runtime_model"], p, runtime),
        f"- {replays.line()}",
        *([f"- {posting.line()}"] if posting is not None else []),
        f"- step() without the profiler (slowest rank, median of {len(step_seconds)}): {unprofiled * 1e3:.3f} ms; "
        f"profiled makespan / unprofiled step = "
        + (f"{extra['profiler_overhead']:.2f}" if extra["profiler_overhead"] else "n/a"),
        "- raw traces (open in https://ui.perfetto.dev, or read again with `pipesim ingest`): "
        + ", ".join(f"`{stem}_rank{r}.json.gz`" for r in range(s.devices)),
    ]))
    kept = {}
    for r, trace in enumerate(ing.traces):  # each rank's raw trace, kept beside the report
        target = Path(output_dir) / f"{stem}_rank{r}.json.gz"
        with atomic_path(target) as tmp, open(trace, "rb") as src, gzip.open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        kept[f"trace_rank{r}"] = target
    comparison = replace(comparison, ingested=replace(ing, traces=tuple(str(p) for p in kept.values())))
    comparison.summary["ingest"]["traces"] = [str(p) for p in kept.values()]
    paths = write_ingest_report(comparison, output_dir, stem=stem, sections=[section],
                                title=f"{_RUNNER[runtime]} vs prediction: {name} ({cls}), K={s.devices}, "
                                      f"M={s.microbatches}, {spec.name}",
                                # what reproduces the prediction (simulate --costs, --hardware, --runtime NAME)
                                costs=model.costs, hardware=model.hardware)
    paths.update(kept)
    return replace(validation, comparison=comparison, paths=paths)


# --------------------------------------------------------------------------------------------- command line
def run_command(args: argparse.Namespace) -> int:
    """``pipesim validate --runtime torch|megatron`` (options: :func:`sim.cli.validate.add_validate_options`)."""
    from sim.cli.options import print_json

    runtime = getattr(args, "runtime", "torch")
    schedule_file = getattr(args, "schedule_file", None)
    if get_runtime(runtime).family == "megatron":
        from validate.pytorch.megatron import check_megatron
        # one line, before anything starts
        check_megatron(args.schedule, args.devices, args.microbatches, overlap=get_runtime(runtime).overlap_p2p_comm)
        if schedule_file is not None:
            raise ValidationError("--schedule-file runs in PyTorch's runtime (--runtime torch); Megatron-LM runs its "
                                  "own 1F1B and interleaved orders (-s 1f1b, -s interleaved-1f1b)")
    elif schedule_file is None:
        torch_class_for(args.schedule)  # a schedule PyTorch lacks: one line, before anything starts
    refused = [flag for flag, bad in (("--iterations", args.iterations != 1), ("--recompute", args.recompute),
                                      ("--calibration isolated", getattr(args, "calibration", "schedule") != "schedule"),
                                      ("--fail-at", getattr(args, "fail_at", None) is not None)) if bad]
    if refused:
        raise ValidationError(f"{', '.join(refused)} do(es) not apply to --runtime {runtime}: its schedules run one "
                              f"iteration per step without recompute, calibrated from their own trace")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ValidationError(f"--runtime {runtime} needs torch: pip install 'pipesim[validate]'") from None
    sizes = ("width", "depth", "batch", "d_model", "heads", "seq", "seed")
    [v] = run_torch_validations(
        [args.schedule], args.devices, args.microbatches, chunks=args.chunks, workload=args.workload,
        workload_options={k: getattr(args, k) for k in sizes if getattr(args, k, None) is not None}, backend=args.backend,
        steps=getattr(args, "repeats", None), timeout=args.timeout, threads=args.threads,
        costs=args.costs, hardware=args.hardware, output_dir=args.output, schedule_file=schedule_file,
        runtime=runtime)
    if getattr(args, "html", None) and v.paths.get("html"):  # the page written beside the report, copied
        from sim.io.pages import write_page
        write_page(Path(v.paths["html"]).read_text(encoding="utf-8"), args.html)
    if args.json:
        print_json(v.to_dict())
    else:
        s = v.summary
        print(format_summary(v.comparison, v.paths, command=f"validate --runtime {runtime} ({v.cls}):"))
        print(f"  makespan error over {s['profiled_steps']} profiled steps: median {s['makespan_error_median']:+.1%} "
              f"({_interval_words(s)}; p10 {s['makespan_error_range'][0]:+.1%}, p90 "
              f"{s['makespan_error_range'][1]:+.1%})")
        r = s["step_replays"]
        print(f"  each step replayed from its own measurements: median {r['makespan_error_median']:+.1%} (p10 "
              f"{r['makespan_error_range'][0]:+.1%}, p90 {r['makespan_error_range'][1]:+.1%}); without the runtime "
              f"model {r['without']['makespan_error_median']:+.1%}")
        print(f"  gradients_match {s.get('gradients_match')}")
    return 3 if v.summary.get("gradients_match") is False else 0  # sim.cli.validate.EXIT_CHECK_FAILED


def _interval_words(summary: dict) -> str:
    """The median error's confidence interval in words, e.g. ``90% interval of the median step +1.2% .. +5.9%``."""
    lo, hi = summary["makespan_error_median_interval"]
    return f"{summary['median_interval_coverage']:.0%} interval of the median step {lo:+.1%} .. {hi:+.1%}"


def torch_report_stem(key: str, schedule, workload: str, backend: str, runtime: str = "torch") -> str:
    """The name of the files of one ``--runtime torch|megatron`` report:
    ``<key>_K<K>_M<M>_<workload>[_<backend>]_<runtime>``, the backend marked as pipesim's runtime marks it
    (:func:`validate.compare.report.backend_tag`: gloo's names as they always were), so that a gloo and an nccl run,
    or PyTorch's and Megatron's, never write one report and one set of rank traces."""
    return f"{key}_K{schedule.devices}_M{schedule.microbatches}_{workload}{backend_tag(backend)}_{runtime}"


def _runtime_model_line(model: dict, predicted: float, runtime: str = "torch") -> str:
    """The report's line on what the runtime model changes: the prediction with and without it."""
    without = model["without"]
    per_action = [v for per in model["dispatch_s"].values() for v in per.values()]
    dispatch = (f"dispatch overhead {min(per_action) * 1e6:.0f}-{max(per_action) * 1e6:.0f} us per action over "
                f"every step"
                if per_action else "no dispatch overhead")
    draws = model.get("message_draws")
    per_step = ("each run's computation durations (drawn from their stage and kind's) and dispatch overhead from "
                "one profiled step, every step as many runs, the run of median makespan of 64")
    collided = (f"; the calls that collide with an unexpected message drawn from the {draws['collided_calls']} that "
                f"did" if draws and draws.get("collided_calls") is not None else "")
    around = draws.get("call_overhead") if draws else None
    if around and around["form"] != "none":  # validate.ingest.call_overhead
        collided += (f"; every send call {around['send_s'] * 1e6:.0f} us and every receive {around['recv_s'] * 1e6:.0f}"
                     f" us longer for the runtime's own time around it (measured as "
                     + ("the rest of its communication ranges" if around["form"] == "range"
                        else "the time before each call") + ")")
    comm = (f"every message's calls and link time drawn from the {draws['messages']} messages of the profiled steps "
            f"(link median {draws['link_median_s'] * 1e6:.0f} us, mean {draws['link_mean_s'] * 1e6:.0f} us, p90 "
            f"{draws['link_p90_s'] * 1e6:.0f} us, counted from the later call's return; a drawn stall over "
            f"{STALL_SECONDS * 1e3:g} ms holds its pair of ranks{collided}), {per_step}"
            if draws and draws["messages"] else
            f"no messages; {per_step}"
            if draws else
            f"rendezvous links of {model['link_latency_s'] * 1e6:.0f} us per message from {model['link_samples']} "
            f"messages timed from their later post, {model['post_overhead_s'] * 1e6:.0f} us per posted batch from "
            f"{model['post_samples']} calls that only posted")
    return (f"- runtime model: `--runtime {runtime}` ({model['lowering']} posting points, {comm}, {dispatch} from the "
            f"trace's gaps): predicted {predicted * 1e3:.3f} ms; without it "
            f"(eager links, the trace's link fit, no dispatch) "
            f"{without['makespan'] * 1e3:.3f} ms, median error {without['makespan_error_median']:+.1%} (p10-p90 "
            f"{without['makespan_error_range'][0]:+.1%} .. {without['makespan_error_range'][1]:+.1%})")
