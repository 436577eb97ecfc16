"""The validation report: a markdown page, its Gantt PNG, and the calibration files.

Files, under the output folder, named ``<schedule>_K<K>_M<M>_<workload>`` (plus ``_I<iterations>``
and ``_R<repeats>`` when those are not the defaults, so runs that differ do not overwrite each other):

- ``.md``: predicted vs measured makespan and bubble, per-action error, per-device
  utilization, correctness check, calibration used, caveats;
- ``.png``: ``sim.io.plots.gantt([predicted, measured])`` on one time axis;
- ``_costs.csv`` / ``_hardware.json``: the calibration, in the simulator's formats
  (``pipesim simulate --costs ... --hardware ...`` replays the prediction);
- ``_trace.json``: Chrome trace of both runs, when :mod:`sim.io.trace` is available.

Every file is written under a temporary name and renamed only when all are done,
so a failed run never leaves a report that looks complete. Times in the page are
milliseconds.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path

from sim.results.result import Result

__all__ = ["write_report", "format_summary", "format_markdown", "report_stem", "report_paths", "backend_tag",
           "write_comparison_report"]

DEFAULT_BACKEND = "gloo"
"""The backend of ``pipesim validate`` and :func:`validate.run.run_validations` when none is given: the one whose
report names carry no backend (:func:`backend_tag`)."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _verdict(d: dict) -> str:
    """One line on the makespan error: significant or within the noise floor."""
    lo, hi = d["makespan_error_range"]
    err = f"error {d['makespan_error']:+.1%} (median of {d['repeats']}; p10-p90 {lo:+.1%} .. {hi:+.1%})"
    if d["significant"]:
        return f"{err}, outside the measurement noise (±{d['noise']:.1%})"
    return f"{err}: not significant (within measurement noise ±{d['noise']:.1%})"


def _prediction_line(d: dict) -> str:
    """How the prediction was made; for the rolling prediction, the run the shown one came from and what the
    last warm-up run alone would have given (so the gain from predicting run by run is visible)."""
    line = d["calibration_source"] or "every timed run predicted from the same costs"
    if d["predicted_from"]:
        line += f"; the run shown (timed run {d['median_run'] + 1}) from {d['predicted_from']}"
    if d["makespan_error_from_warmup"] is not None:
        line += f"; every run predicted from the last warm-up run instead: error {d['makespan_error_from_warmup']:+.1%}"
    return line


def _failed_banner(d: dict) -> list[str]:
    c = d["check"]
    return [f"FAILED: the correctness check failed ({c['worst']}: relative difference {c['error']:.3g} > "
            f"tolerance {c['tolerance']:.3g})"]


def format_summary(report) -> str:
    """A few lines for the terminal; FAILED first when the correctness check failed."""
    d = report.to_dict()
    lines = _failed_banner(d) if report.failed else []
    lo, hi = d["measured_makespan_range"]
    lines += [
        f"validate {d['schedule']}: K={d['devices']} M={d['microbatches']} iterations={d['iterations']} "
        f"repeats={d['repeats']} workload={d['workload']} backend={d['backend']}",
        f"  makespan   predicted {_ms(d['predicted_makespan'])} ms   measured {_ms(d['measured_makespan'])} ms "
        f"(p10-p90 {_ms(lo)} .. {_ms(hi)})",
        f"  {_verdict(d)}",
        f"  prediction: {_prediction_line(d)}",
        f"  bubble     predicted {d['predicted_bubble_fraction']:.1%}   measured {d['measured_bubble_fraction']:.1%}",
        f"  per-action start error median {_ms(d['start_error_median'])} ms, worst {_ms(d['start_error_worst'])} ms",
        f"  gradients_match {d['gradients_match']}",
    ]
    lines += [f"  note: {n}" for n in d["notes"]]
    if d["paths"]:
        lines.append(f"  report: {d['paths'].get('report')}")
        lines.append(f"  replay: {d['replay']}")
    return "\n".join(lines)


def format_markdown(report, figure_name: str | None) -> str:
    d = report.to_dict()
    p, m = report.predicted.metrics, report.measured.metrics
    out = []
    if report.failed:
        out += ["**" + _failed_banner(d)[0] + "**", ""]
    out += [f"# Validation: {d['schedule']}, K={d['devices']}, M={d['microbatches']}, {d['iterations']} iteration(s), "
            f"{d['repeats']} timed run(s)",
            "", f"Workload `{d['workload']}`, backend `{d['backend']}`. Predicted = `sim.simulate` with the "
            "calibrated costs below; measured = the same Schedule object run by `validate` with torch.distributed "
            "(the timed run of median makespan is drawn, with the prediction made for it).", "",
            f"Prediction: {_prediction_line(d)}.", ""]
    if d["workload"] == "emulated":
        out += ["**Compute was emulated**: each action waited for its cost; only scheduling and communication are real.", ""]
    if figure_name:
        out += [f"![predicted and measured Gantt]({figure_name})", "", _page_link(figure_name), ""]
    lo, hi = d["measured_makespan_range"]
    out += ["| figure | predicted | measured |", "|---|---:|---:|",
            f"| makespan (ms) | {_ms(p.makespan)} | {_ms(d['measured_makespan'])} (p10-p90 {_ms(lo)} .. {_ms(hi)}) |",
            f"| bubble fraction | {p.bubble_fraction:.1%} | {m.bubble_fraction:.1%} |",
            f"| throughput (samples/s) | {p.throughput:.4g} | {m.throughput:.4g} |", "",
            f"Makespan {_verdict(d)}. Noise floor, the largest of: stage costs moved by "
            f"{d['noise_parts'].get('stage_costs', 0):.1%} between the calibrations before and after the timed runs; "
            f"in the timed runs by {d['noise_parts'].get('in_runs', 0):.1%} from the costs that predicted each of "
            f"them; replaying each timed run's own action times (compute and executor overhead) through the "
            f"simulator moves its prediction by {d['noise_parts'].get('replay', 0):+.1%} (median; the machine, not the "
            f"model: the model itself misses {d['noise_parts'].get('model_miss', 0):+.1%}), plus the run-to-run spread; "
            f"the measured makespans spread by ±{d['noise_parts'].get('makespans', 0):.1%} (half p10-p90).", "",
            "| timed run | measured (ms) | predicted (ms) | error |", "|---:|---:|---:|---:|"]
    for i, (meas, pred) in enumerate(zip(d["measured_makespans"], d["predicted_makespans"])):
        shown = " (shown)" if i == d["median_run"] else ""
        out.append(f"| {i + 1}{shown} | {_ms(meas)} | {_ms(pred)} | {meas / pred - 1:+.1%} |" if pred > 0 else
                   f"| {i + 1}{shown} | {_ms(meas)} | {_ms(pred)} | - |")
    out += ["",
            f"Per-action error (matched by device, stage, micro-batch, kind): start median {_ms(d['start_error_median'])} ms, "
            f"worst {_ms(d['start_error_worst'])} ms; end median {_ms(d['end_error_median'])} ms, worst "
            f"{_ms(d['end_error_worst'])} ms.", "",
            "| device | predicted utilization | measured utilization | measured peak memory |", "|---|---:|---:|---:|"]
    for k in range(report.predicted.schedule.devices):
        mem = report.memory[k] if k < len(report.memory) else None
        out.append(f"| {k} | {p.device_utilization[k]:.1%} | {m.device_utilization[k]:.1%} | "
                   f"{'not measured (CPU)' if mem is None else f'{mem / 2**20:.1f} MiB'} |")
    out += ["", "## Correctness", "", f"gradients_match: **{d['gradients_match']}**. {report.check.summary()}."]
    cal = report.calibration
    out += ["", "## Calibration used", "", "| stage | F (ms) | B (ms) | W (ms) | R (ms) | U (ms) | sent (bytes) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    c = cal.costs
    for s in range(c.stages):
        out.append(f"| {s} | {_ms(c.forward[s])} | {_ms(c.backward[s])} | {_ms(c.weight[s])} | {_ms(c.recompute[s])} | "
                   f"{_ms(c.update[s])} | {c.send_bytes[s]:.0f} |")
    out += [""] + [f"- {line}" for line in cal.comments()[1:]]
    if d["replay"]:
        out += ["", "Replay the prediction:", "", "```", d["replay"], "```"]
    out += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(out) + "\n"


def backend_tag(backend: str) -> str:
    """What the report names add for *backend*: nothing for gloo (the default, so its names stay as they always
    were), ``_<backend>`` for any other, so that a gloo and an nccl run of one schedule in one folder never write
    the same files (both runtimes' names: :func:`report_stem`, :mod:`validate.pytorch.validation`)."""
    return "" if backend == DEFAULT_BACKEND else f"_{backend}"


def report_stem(report) -> str:
    """``<schedule>_K<K>_M<M>_<workload>``, plus ``_<backend>`` (:func:`backend_tag`), ``_I<iterations>`` and
    ``_R<repeats>`` when not the default."""
    from validate.request import DEFAULT_REPEATS
    s = report.predicted.schedule
    stem = f"{s.name.replace('+', '-')}_K{s.devices}_M{s.microbatches}_{report.workload}{backend_tag(report.backend)}"
    if s.iterations != 1:
        stem += f"_I{s.iterations}"
    repeats = len(report.makespans) or 1
    if repeats != DEFAULT_REPEATS:
        stem += f"_R{repeats}"
    return stem


def report_paths(report, folder: Path) -> dict[str, Path]:
    stem = report_stem(report)
    return {"report": folder / f"{stem}.md", "figure": folder / f"{stem}.png",
            "costs": folder / f"{stem}_costs.csv", "hardware": folder / f"{stem}_hardware.json"}


def write_report(report, folder: Path) -> dict[str, str]:
    """Write every file of the report (temporary names, renamed at the end); returns name -> path."""
    import matplotlib.pyplot as plt

    from sim.files import atomic_paths, check_output_dir
    from sim.io.plots import gantt
    s = report.predicted.schedule
    folder = check_output_dir(folder)
    final = report_paths(report, folder)
    try:
        trace = importlib.import_module("sim.io.trace")
    except ImportError:
        trace = None
    if trace is not None:
        final["trace"] = folder / f"{report_stem(report)}_trace.json"
    final["html"] = folder / f"{report_stem(report)}.html"
    titles = [f"predicted: {s.name} (simulated with calibrated costs)",
              f"measured: {s.name} on {report.backend}" + (" (compute emulated)" if report.workload == "emulated" else "")]
    fig = gantt([report.predicted, report.measured], titles=titles)
    with atomic_paths(list(final.values())) as temps:  # all renamed into place, or none (sim.files)
        tmp = dict(zip(final, temps))
        try:
            fig.savefig(tmp["figure"], dpi=110, format="png")
        finally:
            plt.close(fig)
        report.calibration.save(tmp["costs"], tmp["hardware"])
        if trace is not None:
            trace.write_trace(trace.chrome_trace([report.predicted, report.measured],
                                                 names=["predicted", "measured"]), tmp["trace"])
        tmp["html"].write_text(_page(report.predicted, report.measured, titles, format_summary(report)),
                               encoding="utf-8")
        tmp["report"].write_text(format_markdown(report, final["figure"].name))
    return {k: str(v) for k, v in final.items()}


def _page_link(figure_name: str) -> str:
    """The markdown line pointing at the interactive page written beside the figure (stem.png -> stem.html)."""
    page = figure_name.rsplit(".", 1)[0] + ".html"
    return f"Interactive version: [{page}]({page}) (zoom, hover each action for its times and wait split)."


def _page(predicted: Result, measured: Result, titles: Sequence[str], summary: str,
          comm_spans: dict | None = None) -> str:
    """The interactive page of a report: both timelines on one zoomable axis, each action's wait split on hover
    (sim.io.pages); *summary*: the report's terminal lines, shown above the charts."""
    from sim.io.pages import timeline_page

    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    return timeline_page([predicted, measured], titles=list(titles), heading=lines[0] if lines else titles[0],
                         notes=lines[1:], comm_spans=[None, comm_spans])

# ----------------------------------------------------- any two Results (ingest, --runtime torch)
def write_comparison_report(predicted: Result, measured: Result, *, folder, stem: str, title: str, summary: dict,
                            sections: Sequence[tuple[str, str]] = (), costs=None, hardware=None,
                            comm_spans: dict | None = None) -> dict[str, Path]:
    """Write stem.md, stem.png (both Gantts on one time axis), stem.html (the same, interactive: zoom, hover, each
    action's wait split; *comm_spans*: the measured devices' time inside communication calls), stem_trace.json
    (both in one Chrome trace), stem.json (*summary*) and, when given, stem_costs.csv / stem_hardware.json; all or
    none. Returns {"report", "figure", "html", "trace", "json"[, "costs", "hardware"]} -> path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.files import strict_json
    from sim.model.cost import save_costs
    from sim.files import atomic_paths, check_output_dir
    from sim.model.hardware import save_hardware
    from sim.io.plots import gantt
    from sim.io.trace import chrome_trace

    folder = check_output_dir(folder)
    paths = {"report": folder / f"{stem}.md", "figure": folder / f"{stem}.png", "html": folder / f"{stem}.html",
             "trace": folder / f"{stem}_trace.json", "json": folder / f"{stem}.json"}
    if costs is not None:
        paths["costs"] = folder / f"{stem}_costs.csv"
    if hardware is not None:
        paths["hardware"] = folder / f"{stem}_hardware.json"
    titles = [f"predicted: {predicted.schedule.name}", f"measured: {measured.schedule.name}"]
    fig = gantt([predicted, measured], titles=titles)
    with atomic_paths(list(paths.values())) as tmps:
        tmp = dict(zip(paths, tmps))
        try:
            fig.savefig(tmp["figure"], dpi=110, format="png")
        finally:
            plt.close(fig)
        tmp["trace"].write_text(json.dumps(chrome_trace([predicted, measured], names=["predicted", "measured"]),
                                           allow_nan=False, separators=(",", ":")))
        tmp["json"].write_text(json.dumps(strict_json(summary), indent=2, allow_nan=False) + "\n")
        tmp["html"].write_text(_page(predicted, measured, titles, title, comm_spans), encoding="utf-8")
        if costs is not None:
            save_costs(costs, tmp["costs"])
        if hardware is not None:
            save_hardware(hardware, tmp["hardware"])
        tmp["report"].write_text(_comparison_markdown(title, summary, paths["figure"].name, sections))
    return paths


def _comparison_markdown(title: str, summary: dict, figure: str, sections: Sequence[tuple[str, str]]) -> str:
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    out = [f"# {title}", "", f"![predicted and measured Gantt]({figure})", "", _page_link(figure), "",
           "| figure | predicted | measured |", "|---|---:|---:|",
           f"| makespan (ms) | {ms(summary['predicted_makespan'])} | {ms(summary['measured_makespan'])} "
           f"({summary['makespan_error']:+.1%}) |",
           f"| bubble fraction | {summary['predicted_bubble_fraction']:.1%} | {summary['measured_bubble_fraction']:.1%} |",
           "", f"Per-action error: start median {ms(summary['start_error_median'])} ms, worst "
           f"{ms(summary['start_error_worst'])} ms; end median {ms(summary['end_error_median'])} ms, worst "
           f"{ms(summary['end_error_worst'])} ms.", ""]
    for heading, body in sections:
        out += [f"## {heading}", "", body.rstrip(), ""]
    return "\n".join(out)
