"""Chrome trace (Trace Event Format) export of timelines: opens in Perfetto and chrome://tracing.

Layout of the trace made by :func:`chrome_trace`:

- one process (``pid``) per device of each result, numbered from 1 (result i's device d
  is pid ``1000 i + d + 1``; pid 0 is advised against); several results (e.g. predicted
  and measured) get distinct pids and process names, so they lie one above the other;
- in each process, thread (``tid``) 0 holds the computations and thread ``1 + dst``
  the transfers on the outgoing link to device ``dst``. Slices of one thread never
  overlap partially (Perfetto drops such slices): a transfer that starts before the
  previous one on its link has ended (measured runs send asynchronously) goes to the
  first free lane of that link, thread ``1 + dst + 1000 j`` ("send to device dst, lane
  j+1"); a computation that overlaps the previous one likewise goes to thread ``1000 j``;
- every timeline row is exactly one complete event (``ph: "X"``); its ``args`` carry
  stage, micro-batch, iteration and, for transfers, src, dst and bytes;
- a flow arrow (``ph: "s"`` on the transfer, ``ph: "f"`` with ``bp: "e"`` on the action
  that consumes it) links every transfer to its receiver; both ends sit in the middle of
  their slices (bound to the enclosing slice);
- memory held per device is a counter track (``ph: "C"``, ``args: {"bytes": ...}``);
- names and order come from metadata events (``ph: "M"``).

Units: ``ts`` and ``dur`` in microseconds (the format's unit); timelines are in seconds.
Format: "Trace Event Format", Google, https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.core.ir import Action, ActionKind
from sim.results.result import Result
from sim.results.timeline import compute_rows, transfer_rows
from sim.errors import PipesimError
from sim.files import atomic_path

__all__ = ["chrome_trace", "write_trace", "check_trace", "TraceError"]

_US = 1e6  # microseconds per second
_PID_STRIDE = 1000  # result i's device d is pid i * 1000 + d + 1 (pid 0 is advised against)
_LANE_STRIDE = 1000  # lane j of a thread is tid + 1000 j


class TraceError(PipesimError):
    """A trace that breaks the Trace Event Format rules this project relies on."""


def _us(seconds: float) -> float:
    return round(float(seconds) * _US, 6)  # rounded so equal seconds give equal microseconds


def chrome_trace(result_or_results: Result | Sequence[Result], names: Sequence[str] | None = None) -> dict:
    """The Chrome-trace object (``{"traceEvents": [...], ...}``) of one or several results.

    *names*: one label per result, prefixed to its process names (default: the
    schedule names when they differ, else "predicted"/"measured" by source, else numbered).
    """
    results = [result_or_results] if isinstance(result_or_results, Result) else list(result_or_results)
    if not results:
        raise TraceError("chrome_trace needs at least one Result; got an empty list")
    if names is None:  # distinct schedule names, else predicted/measured, else numbered
        sources = [{"simulated": "predicted"}.get(r.source, r.source) for r in results]
        schedules = [r.schedule.name for r in results]
        names = (schedules if len(set(schedules)) == len(results) else
                 sources if len(set(sources)) == len(results) else
                 [f"{i}: {n}" for i, n in enumerate(schedules)])
    if len(names) != len(results):
        raise TraceError(f"chrome_trace got {len(names)} names for {len(results)} results; give one name per result")
    events: list[dict] = []
    flow_id = 0
    for i, (r, name) in enumerate(zip(results, names)):
        flow_id = _result_events(events, r, str(name), base=i * _PID_STRIDE + 1, sort_base=i * _PID_STRIDE,
                                 first_flow=flow_id)
    other = {"generator": "pipesim", "units": "ts and dur in microseconds; timelines in seconds",
             "results": [{"name": str(n), "schedule": r.schedule.name, "source": r.source,
                          "devices": r.schedule.devices, "microbatches": r.schedule.microbatches,
                          "makespan_s": r.metrics.makespan, "bubble_fraction": r.metrics.bubble_fraction}
                         for r, n in zip(results, names)]}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _result_events(events: list[dict], r: Result, name: str, *, base: int, sort_base: int, first_flow: int) -> int:
    s, tl = r.schedule, r.timeline
    for d in range(s.devices):
        pid = base + d
        stages = ",".join(str(x) for x in s.stages_of(d))
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"{name}: device {d} (stages {stages})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": sort_base + d}})
        _thread_name(events, pid, 0, "compute", 0)

    comp = compute_rows(tl)
    # (stage, op, micro-batch) -> (pid, tid, middle ts) of the computation, where the flow arrow lands: the middle
    # lies inside the slice, so viewers bind the arrow to it whatever their rule for slice boundaries
    start_of: dict[tuple[int, str, int], tuple[int, int, float]] = {}
    comp_lanes = _lanes(comp["device"], comp["start"], comp["end"])
    for dev, stage, mb, it, op, start, end, lane in zip(comp["device"], comp["stage"], comp["microbatch"],
                                                       comp["iteration"], comp["op"], comp["start"], comp["end"],
                                                       comp_lanes):
        ts, tid = _us(start), _LANE_STRIDE * int(lane)
        events.append({"ph": "X", "name": f"{int(stage)}{op}{int(mb)}", "cat": "compute", "pid": base + int(dev),
                       "tid": tid, "ts": ts, "dur": max(0.0, round(_us(end) - ts, 6)),
                       "args": {"op": str(op), "stage": int(stage), "microbatch": int(mb), "iteration": int(it)}})
        start_of[(int(stage), str(op), int(mb))] = (base + int(dev), tid, round((ts + _us(end)) / 2, 6))
    for dev, lane in sorted(set(zip(comp["device"].astype(int), comp_lanes.tolist()))):
        if lane:
            _thread_name(events, base + dev, _LANE_STRIDE * lane, f"compute, overlapping (lane {lane + 1})", lane)

    tr = transfer_rows(tl)
    tr_lanes = _lanes(list(zip(tr["src"].astype(int), tr["dst"].astype(int))), tr["start"], tr["end"])
    for src, dst, lane in sorted(set(zip(tr["src"].astype(int), tr["dst"].astype(int), tr_lanes.tolist()))):
        _thread_name(events, base + src, 1 + dst + _LANE_STRIDE * lane,
                     f"send to device {dst}" + (f", lane {lane + 1}" if lane else ""), 1 + dst + lane / 1000)
    flow = first_flow
    consumers = _consumer_map(s) if len(tr) else {}
    for src, dst, stage, mb, it, op, start, end, nbytes, lane in zip(
            tr["src"], tr["dst"], tr["stage"], tr["microbatch"], tr["iteration"], tr["op"], tr["start"], tr["end"],
            tr["bytes"], tr_lanes):
        src, dst, stage, mb = int(src), int(dst), int(stage), int(mb)
        kind = ActionKind.F if op == "SEND_F" else ActionKind.B
        producer = Action(stage, kind, mb)
        ts = _us(start)
        pid, tid = base + src, 1 + dst + _LANE_STRIDE * int(lane)
        events.append({"ph": "X", "name": f"{op} {producer}", "cat": "transfer", "pid": pid, "tid": tid, "ts": ts,
                       "dur": max(0.0, round(_us(end) - ts, 6)),
                       "args": {"op": str(op), "stage": stage, "microbatch": mb, "iteration": int(it), "src": src,
                                "dst": dst, "bytes": float(nbytes)}})
        for consumer in consumers.get((producer, dst), []):
            target = start_of.get((consumer.stage, consumer.kind.value, consumer.mb))
            if target is None:  # a partial (e.g. measured, cut short) timeline: no arrow to draw
                continue
            flow += 1
            common = {"name": str(op), "cat": "flow", "id": flow}
            events.append({**common, "ph": "s", "pid": pid, "tid": tid, "ts": round((ts + _us(end)) / 2, 6)})
            events.append({**common, "ph": "f", "bp": "e", "pid": target[0], "tid": target[1], "ts": target[2]})

    usage = r.memory.usage
    for d in range(s.devices):
        u = usage[usage["device"] == d].drop_duplicates("time", keep="last")  # the level after each instant
        for t, b in zip(u["time"], u["bytes"]):
            events.append({"ph": "C", "name": "memory", "pid": base + d, "tid": 0, "ts": _us(t),
                           "args": {"bytes": float(b)}})
    return flow


def _thread_name(events: list[dict], pid: int, tid: int, name: str, sort_index: float) -> None:
    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                   "args": {"sort_index": int(round(sort_index * 1000))}})


def _lanes(tracks, start, end) -> np.ndarray:
    """Per row, the lane of its track (a device, or a (src, dst) link) that keeps its slices from overlapping.

    Rows are taken by start (longest first on a tie) and each goes to the first lane free at its start
    (greedy interval partitioning: the fewest lanes). Lane 0 for every row unless two overlap.
    """
    tracks = list(tracks.tolist() if hasattr(tracks, "tolist") else tracks)
    ts = [_us(t) for t in start]
    te = [_us(t) for t in end]
    lanes = np.zeros(len(tracks), dtype=np.int64)
    free_at: dict[object, list[float]] = {}  # track -> per lane, when its last slice ends (microseconds)
    for i in sorted(range(len(tracks)), key=lambda i: (ts[i], ts[i] - te[i])):
        ends = free_at.setdefault(tracks[i], [])
        lane = next((j for j, e in enumerate(ends) if e <= ts[i]), len(ends))
        if lane == len(ends):
            ends.append(te[i])
        else:
            ends[lane] = te[i]
        lanes[i] = lane
    return lanes


def _consumer_map(schedule) -> dict[tuple[Action, int], list[Action]]:
    """(producer, receiving device) -> the actions there that depend on it: who receives a transfer."""
    out: dict[tuple[Action, int], list[Action]] = {}
    for action in schedule:
        d = schedule.device_of(action)
        for dep in schedule.dependencies(action):
            if schedule.device_of(dep) != d:
                out.setdefault((dep, d), []).append(action)
    return out


def write_trace(obj: dict, path: str | Path) -> Path:
    """Write a trace object as JSON (``.json``, or gzip-compressed ``.json.gz``), atomically."""
    path = Path(path)
    if not (path.name.endswith(".json") or path.name.endswith(".json.gz")):
        raise TraceError(f"cannot write a trace to {str(path)!r}: use a .json or .json.gz file name")
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    with atomic_path(path) as tmp:
        if path.name.endswith(".gz"):
            with gzip.open(tmp, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            tmp.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- checks
_REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "s": ("name", "cat", "id", "ts", "pid", "tid"),
             "f": ("name", "cat", "id", "ts", "pid", "tid"), "C": ("name", "ts", "pid", "args"),
             "M": ("name", "pid", "args"), "B": ("name", "ts", "pid", "tid"), "E": ("ts", "pid", "tid"),
             "i": ("name", "ts", "pid"), "I": ("name", "ts", "pid")}
_METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
             "thread_sort_index": "sort_index", "process_labels": "labels"}


def check_trace(obj: dict) -> None:
    """Raise :class:`TraceError` unless *obj* follows the Trace Event Format rules that viewers rely on.

    Checked: the JSON-object form with a ``traceEvents`` list; per phase the required
    keys; ``ts``/``dur`` finite numbers, ``dur`` >= 0; integer pid/tid, pids from 1;
    complete slices of one thread either nested or apart, never partially overlapping
    (Perfetto drops such slices); metadata names with their argument; counter args
    numeric; every flow id has exactly one start
    (``s``) and one finish (``f``), with the same name and category, the finish not
    before the start, and each end lying inside an ``X`` slice of its thread.
    The whole object must serialize as strict JSON (no NaN or infinity).
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise TraceError("a trace must be a JSON object with a 'traceEvents' list")
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"the trace is not strict JSON: {exc}") from None
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    flows: dict[object, dict[str, dict]] = {}
    for n, e in enumerate(obj["traceEvents"]):
        ph = e.get("ph") if isinstance(e, dict) else None
        if ph not in _REQUIRED:
            raise TraceError(f"event {n} has phase {ph!r}; this project emits only {sorted(_REQUIRED)}")
        missing = [k for k in _REQUIRED[ph] if k not in e]
        if missing:
            raise TraceError(f"event {n} (ph {ph!r}) lacks {missing}")
        for key in ("pid", "tid"):
            if key in e and (isinstance(e[key], bool) or not isinstance(e[key], int)):
                raise TraceError(f"event {n}: {key} must be an integer, got {e[key]!r}")
        if e["pid"] < 1:
            raise TraceError(f"event {n}: pid {e['pid']}; number processes from 1 (pid 0 is advised against)")
        for key in ("ts", "dur"):
            if key in e and (isinstance(e[key], bool) or not isinstance(e[key], (int, float))
                             or not math.isfinite(e[key])):
                raise TraceError(f"event {n}: {key} must be a finite number of microseconds, got {e[key]!r}")
        if ph == "X":
            if e["dur"] < 0:
                raise TraceError(f"event {n}: negative duration {e['dur']}")
            # ts and dur are written to 1e-6 us: so is their sum (a float sum can exceed the next slice's ts by 1e-14)
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], round(e["ts"] + e["dur"], 6)))
        elif ph == "M":
            arg = _METADATA.get(e["name"])
            if arg is None or arg not in e["args"]:
                raise TraceError(f"event {n}: metadata {e['name']!r} needs args.{arg or 'name'}")
        elif ph == "C":
            if not e["args"] or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                        for v in e["args"].values()):
                raise TraceError(f"event {n}: counter {e['name']!r} needs numeric args")
        elif ph in ("s", "f"):
            pair = flows.setdefault(e["id"], {})
            if ph in pair:
                raise TraceError(f"flow id {e['id']!r} has two {ph!r} events; each flow has one start and one finish")
            pair[ph] = e
    for (pid, tid), spans in slices.items():
        _check_nesting(pid, tid, spans)
    for fid, pair in flows.items():
        if set(pair) != {"s", "f"}:
            raise TraceError(f"flow id {fid!r} has only {sorted(pair)}; a flow needs a start 's' and a finish 'f'")
        s, f = pair["s"], pair["f"]
        if (s["name"], s["cat"]) != (f["name"], f["cat"]):
            raise TraceError(f"flow id {fid!r}: start and finish differ in name or category")
        if f["ts"] < s["ts"]:
            raise TraceError(f"flow id {fid!r} finishes (ts {f['ts']}) before it starts (ts {s['ts']})")
        for end in (s, f):
            spans = np.asarray(slices.get((end["pid"], end["tid"]), []), dtype=float).reshape(-1, 2)
            if not ((spans[:, 0] <= end["ts"]) & (end["ts"] <= spans[:, 1])).any():
                raise TraceError(f"flow id {fid!r}: its {end['ph']!r} at ts {end['ts']} on pid {end['pid']} tid "
                                 f"{end['tid']} lies in no slice; viewers bind flow ends to an enclosing slice")


def _check_nesting(pid: int, tid: int, spans: list[tuple[float, float]]) -> None:
    """Slices of one thread must nest or lie apart: a stack walk in start order (longest first on a tie)."""
    open_ends: list[float] = []
    for start, end in sorted(spans, key=lambda x: (x[0], -x[1])):
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        if open_ends and end > open_ends[-1]:
            raise TraceError(f"pid {pid} tid {tid}: a slice [{start}, {end}] overlaps the end ({open_ends[-1]}) of "
                             f"another partially; viewers drop such slices: put one of them on its own thread")
        open_ends.append(end)
