"""The comparison report of an ingested run against pipesim's prediction. Needs no torch.

Used by ``pipesim ingest`` and ``pipesim validate --runtime torch``. The figures and files are
the validator's comparison report (``compare_results`` / ``write_comparison_report``: markdown,
PNG with both Gantts on one time axis, one Chrome trace with both, JSON, the calibration as
``_costs.csv`` / ``_hardware.json``); this module adds what only a trace can say: the measured
idle time split into dependency / communication / gap (:mod:`validate.compare.idle`), the per-stage
spread of the trace's durations, the link fit, how the trace was read, and what was inferred; with a runtime model
(``pipesim ingest --runtime NAME``), which runtime predicted and the prediction with and without it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.results.result import Result

from validate.compare.results import compare_results  # the validator's comparison and report writer: one for every run
from validate.compare.report import write_comparison_report
from validate.compare.idle import CATEGORIES, IdleSplit, split_idle
from validate.ingest.calibration import RuntimeCalibration
from validate.ingest.flow import Ingested

__all__ = ["Comparison", "compare_ingested", "write_ingest_report", "report_stem", "format_summary",
           "standard_sections"]

_WHAT = {"dependency": "waiting for a dependency (the schedule's own bubble)",
         "communication": "waiting on communication", "gap": "gaps between actions (runtime overhead)"}


@dataclass(frozen=True, slots=True)
class Comparison:
    """An ingested run, its prediction, and how far apart they are."""

    predicted: Result
    ingested: Ingested
    summary: dict
    """compare_results' keys, plus idle split, calibration, ingestion details and notes."""
    idle_predicted: IdleSplit
    idle_measured: IdleSplit
    without: Result | None = None
    """The prediction without the runtime model (eager links, no dispatch), when *predicted* has one."""
    runtime: RuntimeCalibration | None = None
    """The runtime model *predicted* was simulated with (None: none, pipesim's eager model)."""


def report_stem(predicted: Result, suffix: str) -> str:
    s = predicted.schedule
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", s.name)
    return f"{name}_K{s.devices}_M{s.microbatches}_{suffix}"


def compare_ingested(ingested: Ingested, predicted: Result, *, extra: dict | None = None,
                     runtime: RuntimeCalibration | None = None, without: Result | None = None,
                     predicted_waits: dict | None = None) -> Comparison:
    """Compare *predicted* with the chosen step of *ingested*.

    *runtime*: the runtime model *predicted* was simulated with, *without*: the prediction without it, and
    *predicted_waits*: device -> the spans the prediction spent in communication calls or with an operation pending
    (:attr:`sim.engines.rendezvous.ProgramRun.communication`; the trace's side: :meth:`Ingested.communication`)."""
    measured = ingested.measured
    # the trace's communication by the prediction's rule: its calls, and the sends its runtime waits for mid-step
    # (the runtime the run used: the modelled one, or the "runtime" named in *extra* by validate --runtime torch)
    ran = runtime.runtime if runtime is not None else (extra or {}).get("runtime")
    idle_m = split_idle(measured, ingested.communication(runtime=ran))
    idle_p = split_idle(predicted, predicted_waits)
    s = predicted.schedule
    summary = {"schedule": s.name, "devices": s.devices, "stages": s.stages, "microbatches": s.microbatches}
    summary.update(compare_results(predicted, measured))
    summary["idle"] = {"predicted": idle_p.to_dict(), "measured": idle_m.to_dict()}
    summary["calibration"] = ingested.calibration.to_dict()
    summary["ingest"] = ingested.to_dict()
    summary.update(extra or {})
    summary["notes"] = list(ingested.notes) + list((extra or {}).get("notes", []))
    summary.setdefault("runtime", None)  # the runtime model the prediction used (None: pipesim's eager model)
    if runtime is not None:
        summary["runtime"] = runtime.runtime
        summary["runtime_model"] = runtime.to_dict()
        summary["runtime_model"]["makespan_error_steps"] = _step_errors(ingested, predicted)
        if without is not None:
            p0, m = without.metrics.makespan, measured.metrics.makespan
            summary["runtime_model"]["without"] = {
                "makespan": p0, "makespan_error": (m - p0) / p0 if p0 > 0 else math.inf,
                "makespan_error_steps": _step_errors(ingested, without),
                "bubble_fraction": without.metrics.bubble_fraction, "idle": split_idle(without).to_dict()}
    return Comparison(predicted=predicted, ingested=ingested, summary=summary, idle_predicted=idle_p,
                      idle_measured=idle_m, without=without, runtime=runtime)


def _step_errors(ingested: Ingested, predicted: Result) -> dict:
    """The makespan error of *predicted* against every complete profiled step: step -> (measured - p) / p."""
    p = predicted.metrics.makespan
    return {str(s): (r.metrics.makespan - p) / p if p > 0 else math.inf for s, r in sorted(ingested.steps.items())}


def _median_error(errors: dict) -> str:
    values = sorted(errors.values())
    if not values:
        return "n/a"
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return f"{median:+.1%} ({len(values)} steps)"


def write_ingest_report(comparison: Comparison, folder, *, stem: str, title: str,
                        sections: Sequence[tuple[str, str]] = (), costs=None, hardware=None) -> dict[str, Path]:
    """Write the report files; *costs* / *hardware* default to the trace's calibration."""
    cal = comparison.ingested.calibration
    return write_comparison_report(comparison.predicted, comparison.ingested.measured, folder=folder, stem=stem,
                                   title=title, summary=comparison.summary,
                                   sections=list(sections) + standard_sections(comparison),
                                   costs=cal.costs if costs is None else costs,
                                   hardware=cal.hardware if hardware is None else hardware,
                                   comm_spans=comparison.ingested.communication(
                                       runtime=comparison.summary.get("runtime")))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def standard_sections(c: Comparison) -> list[tuple[str, str]]:
    runtime = [("Runtime model", _runtime_section(c))] if c.runtime is not None else []
    return runtime + [("Idle time: where the bubble goes", _idle_section(c)),
            ("Calibration from the trace", _calibration_section(c)),
            ("How the trace was read", _ingest_section(c))]


def _error(measured: float, predicted: float) -> str:
    return f"{(measured - predicted) / predicted:+.1%}" if predicted > 0 else "n/a"


def _runtime_section(c: Comparison) -> str:
    """Which runtime predicted, what it was calibrated with, and the prediction with and without it."""
    r, m = c.runtime, c.ingested.measured.metrics
    lines = [f"Predicted as the `{r.runtime}` runtime executes the schedule ({r.links} links; `--runtime {r.runtime}`, "
             f"`sim/model/runtimes.py`), with its own costs measured from this trace (`validate/ingest/calibration.py`, "
             f"`calibrate_runtime`):", ""]
    per_action = [(s, k, v) for s, per in sorted(r.dispatch.items()) for k, v in sorted(per.items())]
    lines.append("- dispatch overhead (the trace's gaps): " + (", ".join(
        f"stage {s} {k} {v * 1e6:.0f} us" for s, k, v in per_action) if per_action else "none measured"))
    if r.hardware.devices > 1:
        how = (f"timed from the later post of {r.link_samples} messages" if r.link_samples
               else "the trace's link fit")
        lines.append(f"- link: latency {r.hardware.latency[0][1] * 1e6:.0f} us per message ({how})")
    lines.append(f"- post: {r.post_overhead * 1e6:.0f} us per posted batch of sends and receives "
                 f"({r.post_samples} calls that only posted)")
    lines += [f"- {n}" for n in r.notes]
    model = c.summary.get("runtime_model", {})
    lines += ["", f"| prediction | makespan (ms) | error vs step {c.ingested.step} | median error over the complete "
                  f"steps | bubble |", "|---|---:|---:|---:|---:|",
              f"| with the `{r.runtime}` runtime model | {_ms(c.predicted.metrics.makespan)} | "
              f"{_error(m.makespan, c.predicted.metrics.makespan)} | "
              f"{_median_error(model.get('makespan_error_steps', {}))} | {c.predicted.metrics.bubble_fraction:.1%} |"]
    if c.without is not None:
        w = c.without.metrics
        lines.append(f"| without (eager links, the trace's link fit, no dispatch) | {_ms(w.makespan)} | "
                     f"{_error(m.makespan, w.makespan)} | "
                     f"{_median_error(model.get('without', {}).get('makespan_error_steps', {}))} | "
                     f"{w.bubble_fraction:.1%} |")
    lines.append(f"| measured (step {c.ingested.step}) | {_ms(m.makespan)} | | | {m.bubble_fraction:.1%} |")
    return "\n".join(lines)


def _idle_section(c: Comparison) -> str:
    p, m = c.idle_predicted, c.idle_measured
    lines = ["Idle time of all devices (K x makespan less the computations), split by what the device waited for "
             "(definitions in `validate/compare/idle.py`):", "",
             "| idle time | predicted (ms) | predicted share | measured (ms) | measured share |",
             "|---|---:|---:|---:|---:|"]
    for cat in CATEGORIES:
        lines.append(f"| {_WHAT[cat]} | {_ms(p.total(cat))} | {p.fraction(cat):.1%} | {_ms(m.total(cat))} | "
                     f"{m.fraction(cat):.1%} |")
    lines.append(f"| **bubble (all idle time)** | {_ms(sum(p.total(k) for k in CATEGORIES))} | "
                 f"{sum(p.fraction(k) for k in CATEGORIES):.1%} | {_ms(sum(m.total(k) for k in CATEGORIES))} | "
                 f"{sum(m.fraction(k) for k in CATEGORIES):.1%} |")
    lines += ["", "Measured, per device (ms):", "", "| device | busy | dependency | communication | gap |",
              "|---|---:|---:|---:|---:|"]
    for d in range(m.devices):
        lines.append(f"| {d} | {_ms(m.busy[d])} | {_ms(m.dependency[d])} | {_ms(m.communication[d])} | "
                     f"{_ms(m.gap[d])} |")
    lines += ["", "- dependency: an input of the next computation was still being computed (or the device had "
              "nothing left: the drain); an ideal runtime would wait too.",
              "- communication: the inputs were computed but not yet received, or the device was inside a "
              "send/receive call.",
              "- gap: everything was there and the device was not communicating, yet it did not compute: the "
              "runtime's own time (dispatch, bookkeeping, the profiler)."]
    return "\n".join(lines)


def _calibration_section(c: Comparison) -> str:
    cal = c.ingested.calibration
    lines = ["Compute time of each action (its range less the wait for its input), over every complete profiled "
             "step. The prediction uses the medians; `_costs.csv` / `_hardware.json` hold them in the simulator's "
             "formats.", "", "| stage | kind | n | median (ms) | p10 (ms) | p90 (ms) | spread (p90-p10)/median |",
             "|---|---|---:|---:|---:|---:|---:|"]
    names = {"F": "F (forward)", "B": "B (full backward)", "I": "I (input gradient)", "W": "W (weight gradient)",
             "U": "U (update)"}
    order = {k: i for i, k in enumerate(names)}
    for (stage, kind), st in sorted(cal.stats.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
        lines.append(f"| {stage} | {names[kind]} | {st.n} | {_ms(st.median)} | {_ms(st.p10)} | {_ms(st.p90)} | "
                     f"{st.spread:.1%} |")
    lines += ["", f"Links: {cal.link.method}."]
    if cal.link.per_link:
        lines.append("Per link (messages whose receiver was waiting): " + ", ".join(
            f"{a}->{b}: {n} x {t * 1e6:.0f} us" for (a, b), (n, t) in sorted(cal.link.per_link.items())) + ".")
    lines += [f"- {n}" for n in cal.notes]
    return "\n".join(lines)


def _ingest_section(c: Comparison) -> str:
    ing = c.ingested
    lines = [f"- rank {r}: `{p}`" for r, p in enumerate(ing.traces)]
    lines.append(f"- naming forms found: {', '.join(ing.forms)}")
    if ing.actions_inferred:
        lines.append(f"- actions of step {ing.step}: {ing.actions_measured} named by the trace, {ing.actions_inferred} "
                     f"numbered from the schedule's order (times measured; micro-batch and stage inferred)")
    lines.append(f"- profiled steps complete on every rank: {sorted(ing.steps)}; compared: step {ing.step}")
    if len(ing.steps) > 1:
        spans = [r.metrics.makespan for r in ing.steps.values()]
        lines.append("- makespan over those steps: " + ", ".join(_ms(s) for s in spans) + " ms")
    if ing.clock is not None:
        worst = max(ing.clock.uncertainty) if ing.clock.uncertainty else 0.0
        lines.append(f"- clocks: {ing.clock.method}" + ("" if ing.clock.shared else f" (worst ±{worst:.0f} us)"))
    if ing.order_differences:
        lines += ["- the ranks ran another order than the schedule given (the prediction is of the given schedule):"]
        lines += [f"  - {d}" for d in ing.order_differences]
    lines += [f"- {n}" for n in c.summary["notes"] if n not in lines]
    return "\n".join(lines)


def format_summary(c: Comparison, paths: dict | None = None, *, command: str = "ingest") -> str:
    """A few lines for the terminal."""
    s = c.summary
    m = c.idle_measured
    err = s["makespan_error"]
    lines = [f"{command} {s['schedule']}: K={s['devices']} S={s['stages']} M={s['microbatches']}, step {c.ingested.step}",
             f"  makespan   predicted {_ms(s['predicted_makespan'])} ms   measured {_ms(s['measured_makespan'])} ms   "
             f"error {'n/a' if not math.isfinite(err) else f'{err:+.1%}'}",
             f"  bubble     predicted {s['predicted_bubble_fraction']:.1%}   measured {s['measured_bubble_fraction']:.1%}"
             f" = dependency {m.fraction('dependency'):.1%} + communication {m.fraction('communication'):.1%} + "
             f"gap {m.fraction('gap'):.1%}",
             f"  per-action start error median {_ms(s['start_error_median'])} ms, worst {_ms(s['start_error_worst'])} ms",
             *([f"  actions    {c.ingested.actions_measured} named by the trace, {c.ingested.actions_inferred} inferred "
                f"from the op structure and the schedule's order"] if c.ingested.actions_inferred else [])]
    if c.runtime is not None:
        without = (f"; without it {_ms(c.without.metrics.makespan)} ms, error "
                   f"{_error(s['measured_makespan'], c.without.metrics.makespan)}" if c.without is not None else "")
        lines.append(f"  runtime    {c.runtime.runtime} ({c.runtime.links} links, dispatch and links from the trace)"
                     f"{without}")
    if paths:
        lines.append(f"  report: {paths.get('report')}")
    return "\n".join(lines)
