"""Reading one profiler trace file: Chrome trace / Kineto JSON in, timed spans out. Needs no torch.

What a trace file holds (``torch.profiler.profile(...).export_chrome_trace(path)``, or
``tensorboard_trace_handler``, which may gzip it): a JSON object whose ``traceEvents``
list has one event per operator, ``record_function`` range, GPU kernel, runtime call,
flow arrow and metadata record. Kineto adds, next to the events:

- ``baseTimeNanoseconds``: the events' ``ts`` are microseconds *after* this instant
  (Unix time, ns), so that ``ts`` keeps its sub-microsecond digits; older traces have no
  base and absolute ``ts``;
- ``distributedInfo``: ``{"backend", "rank", "world_size", "pg_config": [...]}`` when a
  process group existed while profiling (the global rank, and every process group with
  its member ranks);
- ``host_name`` (newer releases): the machine that wrote the file.

Only timed events are kept: complete events (``ph: "X"``, ``ts`` + ``dur``) and
begin/end pairs (``ph: "B"`` / ``"E"``, matched per process and thread). Events of
other phases (metadata, instants, counters, flow arrows) are skipped; events that
claim to be timed but are malformed (no name, non-numeric or negative times) are
counted in :attr:`TraceFile.skipped`, never silently used.

The Chrome trace format also allows a bare JSON list of events (the "JSON Array
Format"); both forms are read. Times stay in the file's own microseconds here;
:mod:`validate.ingest.flow` puts the ranks on one clock.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import PipesimError

__all__ = ["TraceReadError", "Span", "TraceFile", "read_trace", "rank_from_name"]



def _ends_open(text: str) -> bool:
    """Whether *text* stops inside a string or with brackets still open: a cut JSON file. The decoder alone
    cannot tell, since a cut inside a string is reported where that string starts, not at the end."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return in_string or depth > 0

class TraceReadError(PipesimError):
    """A trace file that cannot be read: missing, not JSON (e.g. truncated), or without timed events."""


@dataclass(frozen=True, slots=True)
class Span:
    """One timed event of a trace, in microseconds of the file's own clock."""

    name: str
    cat: str
    start: float
    """Microseconds after the file's base time (``ts``)."""
    end: float
    """``ts + dur``, microseconds."""
    pid: object
    tid: object
    args: dict = field(default_factory=dict)

    @property
    def thread(self) -> tuple[object, object]:
        return (self.pid, self.tid)


@dataclass(frozen=True, slots=True)
class TraceFile:
    """The timed spans of one trace file and what the file says about where it came from."""

    path: str
    spans: tuple[Span, ...]
    """Sorted by start time, then longest first (so an enclosing span comes before what it encloses)."""
    rank: int | None = None
    """Global rank from ``distributedInfo`` (None when the trace has none)."""
    world_size: int | None = None
    host: str | None = None
    base_ns: int = 0
    """``baseTimeNanoseconds``: Unix time (ns) of ``ts = 0``; 0 when the trace has absolute times."""
    process_groups: tuple[dict, ...] = ()
    """``distributedInfo.pg_config``: each process group's ``ranks`` (global ranks, in group-rank order)."""
    skipped: int = 0
    """Timed-looking events that were malformed and left out."""


def _open_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceReadError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the suffix says
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceReadError(f"trace {str(path)!r} is not a complete gzip file ({exc}); "
                                 f"was it copied or written only in part?") from None
    try:
        return raw.decode("utf-8-sig")  # with or without a byte-order mark
    except UnicodeDecodeError as exc:
        raise TraceReadError(f"trace {str(path)!r} is not UTF-8 text (byte {exc.start}); expected a Chrome/Kineto "
                             f"JSON trace (.json or .json.gz)") from None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):  # some writers quote numbers
            try:
                value = float(value)
            except ValueError:
                return None
        else:
            return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_trace(path: str | Path) -> TraceFile:
    """Read one Chrome / Kineto trace (``.json`` or ``.json.gz``); raises :class:`TraceReadError`."""
    path = Path(path)
    text = _open_text(path)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or a 4300-digit integer
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        hint = " (the file ends early: truncated?)" if isinstance(exc, json.JSONDecodeError) and (
            exc.pos >= len(text.rstrip()) - 1 or _ends_open(text)) else ""
        raise TraceReadError(f"trace {str(path)!r} is not valid JSON{where}{hint}") from None
    if isinstance(data, list):
        events, meta = data, {}
    elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        events, meta = data["traceEvents"], data
    else:
        raise TraceReadError(f"trace {str(path)!r} is not a Chrome trace: expected a JSON object with a "
                             f"'traceEvents' list (or a list of events)")
    spans, skipped = _spans(events)
    if not spans:
        raise TraceReadError(f"trace {str(path)!r} holds no timed events (ph 'X' or 'B'/'E'); was the profiler "
                             f"stopped before anything ran?")
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    world = info.get("world_size")
    groups = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    base = meta.get("baseTimeNanoseconds")
    host = meta.get("host_name") if isinstance(meta.get("host_name"), str) else None
    return TraceFile(
        path=str(path), spans=tuple(spans),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None,
        host=host, base_ns=base if isinstance(base, int) and not isinstance(base, bool) else 0,
        process_groups=tuple(g for g in groups if isinstance(g, dict)), skipped=skipped)


def _spans(events: list) -> tuple[list[Span], int]:
    spans: list[Span] = []
    skipped = 0
    open_: dict[tuple, list[dict]] = {}  # (pid, tid) -> stack of "B" events
    for e in events:
        if not isinstance(e, dict):
            skipped += 1
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E"):
            continue
        ts = _number(e.get("ts"))
        pid, tid = e.get("pid"), e.get("tid")
        if ts is None or isinstance(pid, (dict, list)) or isinstance(tid, (dict, list)):
            skipped += 1
            continue
        if ph == "B":
            open_.setdefault((pid, tid), []).append(e)
            continue
        if ph == "E":
            stack = open_.get((pid, tid))
            if not stack:
                skipped += 1
                continue
            begin = stack.pop()
            start = _number(begin.get("ts"))
            name, cat, args = begin.get("name"), begin.get("cat", ""), begin.get("args")
            end = ts
        else:
            dur = _number(e.get("dur"))
            if dur is None or dur < 0:
                skipped += 1
                continue
            start, end = ts, ts + dur
            name, cat, args = e.get("name"), e.get("cat", ""), e.get("args")
        if not isinstance(name, str) or end < start:
            skipped += 1
            continue
        spans.append(Span(name=name, cat=cat if isinstance(cat, str) else "", start=start, end=end, pid=pid, tid=tid,
                          args=args if isinstance(args, dict) else {}))
    skipped += sum(len(stack) for stack in open_.values())  # a "B" never closed
    spans.sort(key=lambda s: (s.start, -s.end))
    return spans, skipped


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str | Path) -> int | None:
    """The rank a file name states (``rank0.json``, ``trace_rank_1.json.gz``, ``pp-rank3.pt.trace.json``), or None."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match[1]) if match else None
