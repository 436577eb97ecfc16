"""The validation report: a markdown page, its Gantt PNG, and the calibration files.

Files, under the output folder, named ``<schedule>_K<K>_M<M>_<workload>``:

- ``.md``: predicted vs measured makespan and bubble, per-action error, per-device
  utilization, correctness check, calibration used, caveats;
- ``.png``: ``sim.plots.gantt([predicted, measured])`` on one time axis;
- ``_costs.csv`` / ``_hardware.json``: the calibration, in the simulator's formats
  (``pipesim simulate --costs ... --hardware ...`` replays the prediction);
- ``_trace.json``: Chrome trace of both runs, when :mod:`sim.trace` is available.

Every file is written under a temporary name and renamed only when all are done,
so a failed run never leaves a report that looks complete. Times in the page are
milliseconds.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from sim.files import atomic_paths, check_output_dir

__all__ = ["write_report", "format_summary", "format_markdown"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def format_summary(report) -> str:
    """A few lines for the terminal."""
    d = report.to_dict()
    lines = [
        f"validate {d['schedule']}: K={d['devices']} M={d['microbatches']} iterations={d['iterations']} "
        f"workload={d['workload']} backend={d['backend']}",
        f"  makespan   predicted {_ms(d['predicted_makespan'])} ms   measured {_ms(d['measured_makespan'])} ms   "
        f"error {d['makespan_error']:+.1%}",
        f"  bubble     predicted {d['predicted_bubble_fraction']:.1%}   measured {d['measured_bubble_fraction']:.1%}",
        f"  per-action start error median {_ms(d['start_error_median'])} ms, worst {_ms(d['start_error_worst'])} ms",
        f"  gradients_match {d['gradients_match']}",
    ]
    lines += [f"  note: {n}" for n in d["notes"]]
    if d["paths"]:
        lines.append(f"  report: {d['paths'].get('report')}")
    return "\n".join(lines)


def format_markdown(report, figure_name: str | None) -> str:
    d = report.to_dict()
    p, m = report.predicted.metrics, report.measured.metrics
    out = [f"# Validation: {d['schedule']}, K={d['devices']}, M={d['microbatches']}, {d['iterations']} iteration(s)",
           "", f"Workload `{d['workload']}`, backend `{d['backend']}`. Predicted = `sim.simulate` with the "
           "calibrated costs below; measured = the same Schedule object run by `validate` with torch.distributed.", ""]
    if d["workload"] == "emulated":
        out += ["**Compute was emulated**: each action waited for its cost; only scheduling and communication are real.", ""]
    if figure_name:
        out += [f"![predicted and measured Gantt]({figure_name})", ""]
    out += ["| figure | predicted | measured |", "|---|---:|---:|",
            f"| makespan (ms) | {_ms(p.makespan)} | {_ms(m.makespan)} ({d['makespan_error']:+.1%}) |",
            f"| bubble fraction | {p.bubble_fraction:.1%} | {m.bubble_fraction:.1%} |",
            f"| throughput (samples/s) | {p.throughput:.4g} | {m.throughput:.4g} |", "",
            f"Per-action error (matched by device, stage, micro-batch, kind): start median {_ms(d['start_error_median'])} ms, "
            f"worst {_ms(d['start_error_worst'])} ms; end median {_ms(d['end_error_median'])} ms, worst "
            f"{_ms(d['end_error_worst'])} ms.", "",
            "| device | predicted utilization | measured utilization | measured peak memory |", "|---|---:|---:|---:|"]
    for k in range(report.predicted.schedule.devices):
        mem = report.memory[k] if k < len(report.memory) else None
        out.append(f"| {k} | {p.device_utilization[k]:.1%} | {m.device_utilization[k]:.1%} | "
                   f"{'not measured (CPU)' if mem is None else f'{mem / 2**20:.1f} MiB'} |")
    out += ["", "## Correctness", "",
            f"gradients_match: **{d['gradients_match']}** (largest difference {d['gradient_error']})."]
    if d["sync_drift"] is not None:
        out.append(f"PipeDream's weights drift from synchronous SGD by {d['sync_drift']:.3g} (relative to the weights).")
    cal = report.calibration
    out += ["", "## Calibration used", "", "| stage | F (ms) | B (ms) | W (ms) | R (ms) | U (ms) | sent (bytes) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    c = cal.costs
    for s in range(c.stages):
        out.append(f"| {s} | {_ms(c.forward[s])} | {_ms(c.backward[s])} | {_ms(c.weight[s])} | {_ms(c.recompute[s])} | "
                   f"{_ms(c.update[s])} | {c.send_bytes[s]:.0f} |")
    out += [""] + [f"- {line}" for line in cal.comments()[1:]]
    out += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(out) + "\n"


def write_report(report, folder: Path) -> dict[str, str]:
    """Write every file of the report (temporary names, renamed at the end); returns name -> path."""
    from sim.plots import gantt
    s = report.predicted.schedule
    folder = check_output_dir(folder)
    stem = f"{s.name.replace('+', '-')}_K{s.devices}_M{s.microbatches}_{report.workload}"
    final = {"report": folder / f"{stem}.md", "figure": folder / f"{stem}.png",
             "costs": folder / f"{stem}_costs.csv", "hardware": folder / f"{stem}_hardware.json"}
    try:
        trace = importlib.import_module("sim.trace")
    except ImportError:
        trace = None
    if trace is not None:
        final["trace"] = folder / f"{stem}_trace.json"
    fig = gantt([report.predicted, report.measured],
                titles=[f"predicted: {s.name} (simulated with calibrated costs)",
                        f"measured: {s.name} on {report.backend}" + (" (compute emulated)" if report.workload == "emulated" else "")])
    with atomic_paths(list(final.values())) as temps:  # all renamed into place, or none (sim.files)
        tmp = dict(zip(final, temps))
        fig.savefig(tmp["figure"], dpi=110, format="png")
        report.calibration.save(tmp["costs"], tmp["hardware"])
        if trace is not None:
            trace.write_trace(trace.chrome_trace([report.predicted, report.measured],
                                                 names=["predicted", "measured"]), tmp["trace"])
        tmp["report"].write_text(format_markdown(report, final["figure"].name))
    return {k: str(v) for k, v in final.items()}
