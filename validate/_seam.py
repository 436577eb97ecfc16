"""PRIVATE STAND-INS for the validator's comparison seam (issue 10); replace at merge time.

The validator helper is building, torch-free, ``validate/compare.py: compare_results`` and
``validate/report.py: write_comparison_report`` with exactly the signatures below. Until their
branch is merged, the ingest pieces (``pipesim ingest``, ``pipesim validate --runtime torch``)
call these minimal stand-ins, imported in ONE place (:mod:`validate.ingest_report`). At merge,
point that import at the real functions and delete this module. Nothing may depend on these
internals: only on the files written and the dict keys named in the signatures' docstrings.

Built from what ``validate/comparison.py`` (``action_errors``, ``ValidationReport.to_dict``) and
``validate/report.py`` (``write_report``) do today, without their torch imports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from sim.commands.options import _strict  # strict JSON: numpy to numbers, non-finite to null
from sim.cost import save_costs
from sim.files import atomic_paths, check_output_dir
from sim.hardware import save_hardware
from sim.result import Result
from sim.timeline import compute_rows

__all__ = ["compare_results", "write_comparison_report"]


def compare_results(predicted: Result, measured: Result) -> dict:
    """Predicted against measured: keys predicted_makespan, measured_makespan, makespan_error (relative),
    predicted/measured_bubble_fraction, predicted/measured_utilization (per device), start/end_error_median
    and _worst (seconds, over the computations both timelines share)."""
    p, m = predicted.metrics, measured.metrics
    keys = ["device", "stage", "microbatch", "op"]
    both = compute_rows(predicted.timeline)[keys + ["start", "end"]].merge(
        compute_rows(measured.timeline)[keys + ["start", "end"]], on=keys, suffixes=("_p", "_m"))
    ds = (both["start_m"] - both["start_p"]).abs()
    de = (both["end_m"] - both["end_p"]).abs()
    none = both.empty
    return {
        "predicted_makespan": p.makespan, "measured_makespan": m.makespan,
        "makespan_error": (m.makespan - p.makespan) / p.makespan if p.makespan > 0 else math.inf,
        "predicted_bubble_fraction": p.bubble_fraction, "measured_bubble_fraction": m.bubble_fraction,
        "predicted_utilization": list(p.device_utilization), "measured_utilization": list(m.device_utilization),
        "start_error_median": 0.0 if none else float(ds.median()), "start_error_worst": 0.0 if none else float(ds.max()),
        "end_error_median": 0.0 if none else float(de.median()), "end_error_worst": 0.0 if none else float(de.max()),
    }


def write_comparison_report(predicted: Result, measured: Result, *, folder, stem: str, title: str, summary: dict,
                            sections: Sequence[tuple[str, str]] = (), costs=None, hardware=None) -> dict[str, Path]:
    """Write stem.md, stem.png (both Gantts on one time axis), stem_trace.json (both in one Chrome trace),
    stem.json (*summary*) and, when given, stem_costs.csv / stem_hardware.json; all or none.
    Returns {"report", "figure", "trace", "json"[, "costs", "hardware"]} -> path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.plots import gantt
    from sim.trace import chrome_trace

    folder = check_output_dir(folder)
    paths = {"report": folder / f"{stem}.md", "figure": folder / f"{stem}.png", "trace": folder / f"{stem}_trace.json",
             "json": folder / f"{stem}.json"}
    if costs is not None:
        paths["costs"] = folder / f"{stem}_costs.csv"
    if hardware is not None:
        paths["hardware"] = folder / f"{stem}_hardware.json"
    fig = gantt([predicted, measured], titles=[f"predicted: {predicted.schedule.name}",
                                               f"measured: {measured.schedule.name}"])
    with atomic_paths(list(paths.values())) as tmps:
        tmp = dict(zip(paths, tmps))
        try:
            fig.savefig(tmp["figure"], dpi=110, format="png")
        finally:
            plt.close(fig)
        tmp["trace"].write_text(json.dumps(chrome_trace([predicted, measured], names=["predicted", "measured"]),
                                           allow_nan=False, separators=(",", ":")))
        tmp["json"].write_text(json.dumps(_strict(summary), indent=2, allow_nan=False) + "\n")
        if costs is not None:
            save_costs(costs, tmp["costs"])
        if hardware is not None:
            save_hardware(hardware, tmp["hardware"])
        tmp["report"].write_text(_markdown(title, summary, paths["figure"].name, sections))
    return paths


def _markdown(title: str, summary: dict, figure: str, sections: Sequence[tuple[str, str]]) -> str:
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    out = [f"# {title}", "", f"![predicted and measured Gantt]({figure})", "",
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
