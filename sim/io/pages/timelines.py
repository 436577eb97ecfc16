"""Results as the data of an interactive timeline page: one Gantt panel per run, a memory panel per run, the runs'
figures, all on one time axis (``assets/report.js`` draws them).

A run's computations travel as columns sorted by device, then start (the page finds what is under the mouse by
binary search and draws only what is visible); its transfers as columns sorted by sender, then start. Every
computation carries the time its device waited before it, split as :mod:`sim.io.pages.waits` says (dependency,
communication, gap), so hovering a box of a measured run tells what that action waited for.

    from sim.io.pages import timeline_page
    timeline_page([predicted, measured], titles=["predicted", "measured"], heading="...")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


from sim.errors import PipesimTypeError
from sim.io.pages.html import PageError, render
from sim.io.pages.payload import pack
from sim.io.pages.waits import action_waits
from sim.io.units import format_bytes
from sim.model.cost import StageCosts
from sim.results.memory import memory_profile
from sim.results.result import Result
from sim.results.timeline import COMPUTE_OPS, OPS

__all__ = ["run_document", "timeline_document", "timeline_page"]

SCRIPTS = ["data.js", "timeline.js", "report.js"]


def _chunk_of_stage(placement: Sequence[int]) -> np.ndarray:
    """stage -> which of its device's chunks it is (0 for the device's first stage, ...), as the PNG draws them."""
    seen: dict[int, int] = {}
    out = []
    for device in placement:
        out.append(seen.get(device, 0))
        seen[device] = out[-1] + 1
    return np.asarray(out, dtype=np.int64)


def _steps(usage_device: np.ndarray, usage_time: np.ndarray, usage_value: np.ndarray, K: int) -> list[dict]:
    order = np.lexsort((usage_time, usage_device))
    device, time, value = usage_device[order], usage_time[order], usage_value[order]
    bounds = np.searchsorted(device, np.arange(K + 1))
    return [{"time": time[bounds[d]:bounds[d + 1]].astype(np.float64),
             "bytes": value[bounds[d]:bounds[d + 1]].astype(np.float64)} for d in range(K)]


def _memory(result: Result) -> dict:
    """Bytes per device over time; where the run has no byte sizes, micro-batches in flight instead (the PNG
    Gantt's memory panel does the same)."""
    K, usage = result.schedule.devices, result.memory.usage
    if len(usage) and float(usage["bytes"].abs().max()) > 0:
        return {"K": K, "capacity": result.hardware.memory_capacity, "integer": False,
                "steps": _steps(usage["device"].to_numpy(np.int64), usage["time"].to_numpy(float),
                                usage["bytes"].to_numpy(float), K)}
    S = result.schedule.stages
    ones = StageCosts(forward=[0.0] * S, backward=[0.0] * S, activation_bytes=[1.0] * S, checkpoint_bytes=[1.0] * S)
    counted = memory_profile(result.schedule, ones, result.rows).usage
    return {"K": K, "capacity": None, "integer": True,
            "steps": _steps(counted["device"].to_numpy(np.int64), counted["time"].to_numpy(float),
                            counted["bytes"].to_numpy(float), K)}


def _figures(result: Result) -> list[list[str]]:
    m = result.metrics
    rows = [["makespan", f"{m.makespan:.6g} s"], ["utilization", f"{m.utilization:.1%}"],
            ["bubble fraction", f"{m.bubble_fraction:.1%}"], ["bubble ratio (idle / busy)", f"{m.bubble_ratio:.4g}"],
            ["peak memory (worst device)", format_bytes(max(m.peak_memory, default=0.0))],
            ["peak in flight per device", " ".join(map(str, m.peak_inflight))]]
    rows += [["memory overflow", line] for line in m.memory_overflow]
    return rows


def run_document(result: Result, *, title: str | None = None,
                 comm_spans: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> dict:
    """One run's panel data (see the module docstring); *comm_spans*: as :func:`sim.io.pages.waits.action_waits`."""
    if not isinstance(result, Result):
        raise PipesimTypeError(f"a timeline page needs pipesim Results, got {type(result).__name__}")
    s = result.schedule
    K = s.devices
    rows = result.rows  # numpy columns: no DataFrame is built
    known = rows.op >= 0
    comp = np.flatnonzero(rows.computing & known & (rows.op < len(COMPUTE_OPS)))
    comp = comp[np.lexsort((rows.start[comp], rows.device[comp]))]
    waits = action_waits(result, rows, comp, comm_spans)
    xfer = np.flatnonzero(~rows.computing & known)
    xfer = xfer[np.lexsort((rows.start[xfer], rows.device[xfer]))]
    chunk_of = _chunk_of_stage(s.placement)
    stage = rows.stage[comp]
    return {
        "title": title or (s.name + (" (measured)" if result.source == "measured" else "")),
        "K": K, "chunks": max(1, s.stages // K), "makespan": float(result.metrics.makespan),
        "comp": {"devStart": np.searchsorted(rows.device[comp], np.arange(K + 1)).astype(np.int32),
                 "start": rows.start[comp], "end": rows.end[comp], "op": rows.op[comp].astype(np.int8),
                 "stage": stage.astype(np.int32), "mb": rows.microbatch[comp].astype(np.int32),
                 "chunk": chunk_of[np.clip(stage, 0, len(chunk_of) - 1)].astype(np.int8),
                 "wait_dependency": waits.dependency, "wait_communication": waits.communication,
                 "wait_gap": waits.gap},
        "xfer": None if not len(xfer) else {
            "srcStart": np.searchsorted(rows.device[xfer], np.arange(K + 1)).astype(np.int32),
            "start": rows.start[xfer], "end": rows.end[xfer], "op": rows.op[xfer].astype(np.int8),
            "stage": rows.stage[xfer].astype(np.int32), "mb": rows.microbatch[xfer].astype(np.int32),
            "dst": rows.dst[xfer].astype(np.int32), "bytes": rows.bytes[xfer].astype(np.float64)},
        "memory": _memory(result),
        "figures": _figures(result),
        "ops": sorted({OPS[o] for o in np.unique(rows.op[known]).tolist()}, key=OPS.index),
    }


def timeline_document(results: Result | Sequence[Result], *, titles: Sequence[str] | None = None,
                      heading: str = "pipesim timeline", summary: Sequence[Sequence[str]] = (),
                      notes: Sequence[str] = (), comm_spans: Sequence[Mapping | None] | None = None) -> dict:
    """The document of a timeline page: *results* stacked on one time axis (predicted above measured, say),
    *summary* rows (label, value) and *notes* shown above them."""
    results = [results] if isinstance(results, Result) else list(results)
    if not results:
        raise PageError("a timeline page needs at least one Result")
    if titles is not None and len(titles) != len(results):
        raise PageError(f"{len(titles)} titles for {len(results)} results; give one title per result")
    spans = list(comm_spans) if comm_spans is not None else [None] * len(results)
    return {"kind": "timeline", "heading": heading,
            "summary": [list(map(str, row)) for row in summary], "notes": list(notes),
            "runs": [run_document(r, title=None if titles is None else titles[i], comm_spans=spans[i])
                     for i, r in enumerate(results)]}


def timeline_page(results: Result | Sequence[Result], *, titles: Sequence[str] | None = None,
                  heading: str = "pipesim timeline", summary: Sequence[Sequence[str]] = (), notes: Sequence[str] = (),
                  comm_spans: Sequence[Mapping | None] | None = None) -> str:
    """The HTML text of an interactive timeline page (see :func:`timeline_document`)."""
    doc = timeline_document(results, titles=titles, heading=heading, summary=summary, notes=notes,
                            comm_spans=comm_spans)
    return render(title=heading, heading=heading, scripts=SCRIPTS, payload=pack(doc), start="PS.report.start")
