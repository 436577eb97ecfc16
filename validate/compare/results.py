"""Predicted against measured, any two Results of the one schema; importable without torch.

:func:`compare_results` is what every comparison of pipesim reports (``pipesim validate``,
``pipesim ingest``, ``pipesim validate --runtime torch``): makespans and their relative
error, bubble fractions, per-device utilization, and the start/end error of every
computation both timelines share (matched by device, stage, micro-batch and kind).
Units: seconds; errors relative to the prediction where marked relative.
"""

from __future__ import annotations

import math

import pandas as pd

from sim.results.result import Result
from sim.results.timeline import compute_rows

__all__ = ["compare_results", "action_errors"]


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


def compare_results(predicted: Result, measured: Result) -> dict:
    """Predicted against measured: keys predicted_makespan, measured_makespan, makespan_error (relative),
    predicted/measured_bubble_fraction, predicted/measured_utilization (per device), start/end_error_median
    and _worst (seconds, over the computations both timelines share)."""
    p, m = predicted.metrics, measured.metrics
    (sm, sw), (em, ew) = action_errors(predicted.timeline, measured.timeline)
    return {
        "predicted_makespan": p.makespan, "measured_makespan": m.makespan,
        "makespan_error": (m.makespan - p.makespan) / p.makespan if p.makespan > 0 else math.inf,
        "predicted_bubble_fraction": p.bubble_fraction, "measured_bubble_fraction": m.bubble_fraction,
        "predicted_utilization": list(p.device_utilization), "measured_utilization": list(m.device_utilization),
        "start_error_median": sm, "start_error_worst": sw, "end_error_median": em, "end_error_worst": ew,
    }
