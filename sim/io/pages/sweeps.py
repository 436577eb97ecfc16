"""A sweep's table (:mod:`sim.search.sweep`'s tidy DataFrame) as the data of an interactive page: utilization
against M per schedule, one line per K, the closed form dashed, each point with its row of the table on hover
(``assets/sweep.js``). The same figure as :func:`sim.io.sweep_plots.sweep_utilization_plot`, readable point by
point."""

from __future__ import annotations

import math

from typing import TYPE_CHECKING


from sim.io.pages.html import render
from sim.io.pages.payload import pack

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["sweep_document", "sweep_page"]

_HOVER = ("chunks", "makespan", "bubble_fraction", "bubble_ratio", "closed_form_utilization", "throughput",
          "peak_memory", "peak_inflight", "weight_versions", "memory_overflows", "latency_s", "bandwidth_bytes_per_s")
"""Columns of the sweep table (sim.search.sweep.SWEEP_UNITS) shown on hover, where the table has them."""


def _value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v.item() if hasattr(v, "item") else v


def sweep_document(df: pd.DataFrame, *, heading: str = "pipesim sweep") -> dict:
    ok = df[df["error"].fillna("") == ""] if "error" in df else df
    failed = [] if "error" not in df else [
        f"{r.schedule} K={r.devices} M={r.microbatches}: {r.error}" for r in df[df["error"].fillna("") != ""].itertuples()]
    panels = []
    for name in dict.fromkeys(ok["schedule"].tolist()):
        sub = ok[ok["schedule"] == name]
        lines = []
        for K, rows in sub.groupby("devices", sort=True):
            rows = rows.sort_values("microbatches")
            points = [{"M": int(r["microbatches"]), "utilization": float(r["utilization"]),
                       "row": {c: _value(r[c]) for c in _HOVER if c in rows.columns}} for _, r in rows.iterrows()]
            closed = []
            if "closed_form_utilization" in rows:
                closed = [[int(m), float(u)] for m, u in zip(rows["microbatches"], rows["closed_form_utilization"])
                          if math.isfinite(float(u))]
            lines.append({"K": int(K), "points": points, "closed": closed})
        panels.append({"schedule": name, "title": f"{name}: utilization against M", "lines": lines})
    return {"kind": "sweep", "heading": heading, "panels": panels, "failed": failed,
            "notes": [f"{len(ok)} configuration(s); hover a point for its row of the table."]}


def sweep_page(df: pd.DataFrame, *, heading: str = "pipesim sweep") -> str:
    """The HTML text of a sweep's interactive utilization curves."""
    return render(title=heading, heading=heading, scripts=["data.js", "timeline.js", "sweep.js"],
                  payload=pack(sweep_document(df, heading=heading)), start="PS.sweep.start")
