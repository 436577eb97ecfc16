"""Reading one profiler trace file in one streaming pass: Chrome trace / Kineto JSON in, timed spans out.

What a trace file holds (``torch.profiler.profile(...).export_chrome_trace(path)``, or
``tensorboard_trace_handler``, which may gzip it): a JSON object whose ``traceEvents``
list has one event per operator, ``record_function`` range, GPU kernel, runtime call,
flow arrow and metadata record. Kineto adds, next to the events (before or after them,
depending on the release: both are read):

- ``baseTimeNanoseconds``: the events' ``ts`` are microseconds *after* this instant
  (Unix time, ns), so that ``ts`` keeps its sub-microsecond digits; older traces have no
  base and absolute ``ts``;
- ``distributedInfo``: ``{"backend", "rank", "world_size", "pg_config": [...]}`` when a
  process group existed while profiling (the global rank, and every process group with
  its member ranks);
- ``host_name`` (newer releases): the machine that wrote the file.

**One pass, bounded memory.** A real per-rank Kineto trace of a GPU step is hundreds of MB;
reading it whole (``json.loads`` of the full text) costs several times its size in Python
objects. The events are streamed instead with ijson's C backend (yajl2): measured on a 60 MB
Kineto-shaped file (2 cores shared, load ~1), ``json.loads`` 0.71 s and 235 MB peak,
``orjson.loads`` 0.53 s and 390 MB, ``ijson.items`` 0.61 s and 13 MB; orjson would need the
array cut into chunks by hand, which a string holding a brace defeats. Of each event only
what ingest uses is kept (:class:`Keep`): action and step ranges, communication calls,
autograd spans, GPU kernels and their launches (with the correlation id alone), and the
forward ops of the pipeline thread when actions are to be inferred from the op structure.
The metadata before the events is read by a short first pass; what a release writes after
them is parsed from the last bytes of the stream.

Only timed events are kept: complete events (``ph: "X"``, ``ts`` + ``dur``) and begin/end
pairs (``ph: "B"`` / ``"E"``, matched per process and thread); the ``ac2g`` flow arrows
only lend a kernel that lacks ``args.correlation`` the id of its launch. Events that claim
to be timed but are malformed (non-numeric or negative times) are counted in
:attr:`TraceFile.skipped`; an event whose name is not a string is refused (it is not a
profiler trace). Times stay in the file's own microseconds here; :mod:`validate.ingest.flow`
puts the ranks on one clock.

Refused before anything large is built (one line, :class:`TraceReadError`): a path that is
not a regular file (``/dev/zero``, a folder), a gzip stream that inflates more than
:data:`MAX_INFLATION` times its size past 1 GiB (a "zip bomb" is not a trace), more than
:data:`MAX_KEPT_EVENTS` kept events in one file, timestamps beyond :data:`MAX_ABS_TS_US`,
a ``baseTimeNanoseconds`` that is not a Unix time in ns.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import stat
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import PipesimError

__all__ = ["TraceReadError", "Span", "TraceFile", "Keep", "read_trace", "read_header", "rank_from_name",
           "progress_bar", "MAX_KEPT_EVENTS", "MAX_INFLATION"]

MAX_KEPT_EVENTS = 4_000_000
"""Events kept from one file at most (measured: ~360 B per kept kernel or launch with its correlation id, ~210 B
per op: at most ~1.4 GB). A 250 MB Kineto trace of one GPU step keeps about 0.4 M; more means many steps
profiled at once: profile fewer (``torch.profiler.schedule(active=...)``)."""

MAX_INFLATION = 200
"""A gzip trace may inflate this many times its compressed size (JSON traces: 8-20x measured) once past 1 GiB."""

_INFLATION_FLOOR = 1 << 30

MAX_ABS_TS_US = 1e17
"""|ts| beyond this (~3,000 years in microseconds) is no clock reading."""

_BASE_NS_RANGE = (946_684_800 * 10**9, 4_102_444_800 * 10**9)
"""``baseTimeNanoseconds`` must be a Unix time between 2000-01-01 and 2100-01-01 (or 0 / absent)."""

_CHUNK = 1 << 20
_TAIL = 1 << 20


class TraceReadError(PipesimError):
    """A trace file that cannot be read: missing, not JSON (e.g. truncated), or without timed events."""


@dataclass(slots=True)
class Span:
    """One timed event of a trace, in microseconds of the file's own clock. Treated as immutable (not frozen:
    a frozen dataclass's ``__init__`` costs ~5x more, and a GPU trace keeps hundreds of thousands)."""

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
    """The timed spans of one trace file that ingest uses, and what the file says about where it came from."""

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
    events: int = 0
    """Events in the file (every phase)."""


# ----------------------------------------------------------------------------------------------- what is kept
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:")
_NAMED = re.compile(r"^(?:PP:|ProfilerStep#|Forward \d|Backward \d)")
_AUTOGRAD = "autograd::engine::evaluate_function"


@dataclass(frozen=True, slots=True)
class Keep:
    """Which events of a trace ingest needs (the rest is dropped while streaming)."""

    patterns: tuple = ()
    """Compiled ``--action-pattern`` expressions: names they match are kept whole."""
    ops: bool = False
    """Keep every CPU op (without args): the op structure actions are inferred from (``validate.ingest.infer``)."""
    python: tuple[str, ...] = ()
    """Suffixes of Python-stack event names to keep (``": forward_step"``: Megatron-LM)."""
    python_calls: tuple[str, ...] = ()
    """Prefixes of Python-stack event names to keep (``"<built-in method wait of "``: a C++ method's call)."""
    annotations: bool = False
    """Keep every ``record_function`` range (``user_annotation``), without args (overlapped pairs)."""

    def __call__(self, name: str, cat: str) -> int:
        """0: drop; 1: keep without args; 2: keep with the correlation id only; 3: keep with args."""
        if cat in _DEVICE_CATS or cat in _LAUNCH_CATS:
            return 2
        if name.startswith(_COMM_PREFIXES) or _NAMED.match(name) or name.endswith("OVERLAP_F_B"):
            return 3
        if cat == "gpu_user_annotation" or name.startswith(_AUTOGRAD):
            return 1
        if cat == "python_function" and ((self.python and name.endswith(self.python))
                                         or (self.python_calls and name.startswith(self.python_calls))):
            return 1
        if any(rx.fullmatch(name) for rx in self.patterns):
            return 3
        if (self.ops and cat in ("cpu_op", "user_annotation")) or (self.annotations and cat == "user_annotation"):
            return 1
        return 0


# ----------------------------------------------------------------------------------------------- the byte stream
class _Stream:
    """The file's bytes, inflated when gzip, without a UTF-8 byte-order mark; counts what was read."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None = None, tail: int = 0) -> None:
        self.path = path
        self.raw = open(path, "rb")
        self.size = os.fstat(self.raw.fileno()).st_size
        self.progress = progress
        head = self.raw.read(2)
        self.raw.seek(0)
        self.gz = head == b"\x1f\x8b"  # gzip magic, whatever the suffix says
        self.inner = gzip.GzipFile(fileobj=self.raw, mode="rb") if self.gz else self.raw
        self.inflated = 0
        self.first = True
        self.tail_size = tail
        self.tail = bytearray()
        self.last_pos = 0
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.inner.read(_CHUNK if n is None or n < 0 else n)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceReadError(f"trace {str(self.path)!r} is not a complete gzip file ({exc}); was it copied or "
                                 f"written only in part?") from None
        if not data:
            self.eof = True
        if self.first and data:
            self.first = False
            if data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
        self.inflated += len(data)
        if self.gz and self.inflated > _INFLATION_FLOOR and self.inflated > MAX_INFLATION * max(1, self.raw.tell()):
            raise TraceReadError(f"trace {str(self.path)!r} inflates more than {MAX_INFLATION}x its gzip size "
                                 f"({self.inflated / 2**30:.1f} GiB from {self.raw.tell() / 2**20:.0f} MiB so far): "
                                 f"not a profiler trace (profiler JSON compresses 8-20x)")
        if self.tail_size:
            self.tail += data
            if len(self.tail) > 2 * self.tail_size:
                del self.tail[:-self.tail_size]
        if self.progress is not None:
            pos = self.raw.tell()
            self.progress(pos - self.last_pos)
            self.last_pos = pos
        return data

    def close(self) -> None:
        self.raw.close()


def _check_path(path: Path) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TraceReadError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a device or pipe, not a regular file"
        raise TraceReadError(f"trace {str(path)!r} is {what}; give the .json or .json.gz file a rank exported")
    if st.st_size == 0:
        raise TraceReadError(f"trace {str(path)!r} is empty; was the profiler stopped before it wrote anything?")


def _ijson():
    import ijson  # the C backend when built (yajl2_c); ~10x slower pure-Python fallback otherwise

    return ijson


def _json_error(path: Path, exc: Exception, *, cut: bool = False) -> TraceReadError:
    raw = exc.args[0] if exc.args else str(exc)
    text = " ".join((raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).split())
    first = text.split(" (right here)")[0].split(" {")[0][:80]  # yajl's message, without its excerpt of the text
    hint = " (the file ends early: truncated?)" if cut or "premature EOF" in text else ""
    return TraceReadError(f"trace {str(path)!r} is not valid JSON ({first}){hint}")


# ----------------------------------------------------------------------------------------------- metadata
def _check_utf8(path: Path) -> None:
    stream = _Stream(path)
    try:
        head = stream.read(4096)
    finally:
        stream.close()
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason != "unexpected end of data":  # not a character cut at the end of the sample
            raise TraceReadError(f"trace {str(path)!r} is not UTF-8 text (byte {exc.start}); expected a Chrome/Kineto "
                                 f"JSON trace (.json or .json.gz)") from None


def _header(path: Path) -> tuple[str, dict]:
    """('object' | 'list' | 'none', the top-level keys before ``traceEvents``): a short first pass ('none': an
    object without ``traceEvents``)."""
    ijson = _ijson()
    stream = _Stream(path)
    meta: dict = {}
    _check_utf8(path)
    try:
        parser = ijson.parse(stream, use_float=True)
        prefix, event, value = next(parser)
        if event == "start_array":
            return "list", meta
        if event != "start_map":
            raise TraceReadError(f"trace {str(path)!r} is not a Chrome trace: expected a JSON object with a "
                                 f"'traceEvents' list (or a list of events)")
        builder = None
        key = None
        for prefix, event, value in parser:
            if prefix == "" and event == "map_key":
                if builder is not None:
                    meta[key] = builder.value
                if value == "traceEvents":
                    return "object", meta
                key, builder = value, ijson.ObjectBuilder()
            elif prefix == "" and event == "end_map":
                if builder is not None:
                    meta[key] = builder.value
                break
            elif builder is not None:
                builder.event(event, value)
        return "none", meta
    except StopIteration:
        raise TraceReadError(f"trace {str(path)!r} is not valid JSON (no value)") from None
    except ijson.JSONError as exc:
        raise _json_error(path, exc) from None
    finally:
        stream.close()


_CLOSE = re.compile(r"\]\s*,\s*(?=\")|\]\s*(?=\}\s*$)")
_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")


def _members(text: str, i: int) -> dict | None:
    """``"key": value, ...}`` from *i* to the end of *text* as a dict, or None where it is not exactly that."""
    out = {}
    n = len(text)
    while True:
        i = _WS.match(text, i).end()
        if i < n and text[i] == "}":
            return out if _WS.match(text, i + 1).end() == n else None
        try:
            key, i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()
            if not isinstance(key, str) or i >= n or text[i] != ":":
                return None
            value, i = _DECODER.raw_decode(text, _WS.match(text, i + 1).end())
        except ValueError:
            return None
        out[key] = value
        i = _WS.match(text, i).end()
        if i < n and text[i] == ",":
            i += 1
        elif not (i < n and text[i] == "}"):
            return None


def _trailer(tail: bytes) -> dict:
    """Top-level keys written after the ``traceEvents`` array, from the stream's last bytes.

    The array's closing bracket is the earliest ``]`` of the tail after which the rest reads as the members of
    one JSON object up to its final ``}`` (a bracket inside an event leaves the event's own ``}`` behind and fails
    at once, so each candidate costs a few bytes)."""
    text = tail.decode("utf-8", errors="replace")
    for m in _CLOSE.finditer(text):
        obj = _members(text, m.end())
        if obj is not None and "traceEvents" not in obj:
            return obj
    return {}


# ----------------------------------------------------------------------------------------------- events
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


def read_trace(path: str | os.PathLike, *, keep: Keep | None = None,
               progress: Callable[[int], None] | None = None) -> TraceFile:
    """Read one Chrome / Kineto trace (``.json`` or ``.json.gz``) in one streaming pass.

    *keep*: which events to keep (default: every timed event, with its args; ingest passes a :class:`Keep`).
    *progress*: called with the bytes of the file read since the last call.
    Raises :class:`TraceReadError` (module docstring).
    """
    path = Path(path)
    keep = keep or _ALL
    _check_path(path)
    form, meta = _header(path)
    if form == "none":
        raise TraceReadError(f"trace {str(path)!r} is not a Chrome trace: expected a JSON object with a "
                             f"'traceEvents' list (or a list of events)")
    ijson = _ijson()
    stream = _Stream(path, progress, tail=_TAIL)
    builder = _Builder(path, keep)
    try:
        for event in ijson.items(stream, "traceEvents.item" if form == "object" else "item", use_float=True):
            builder.add(event)
        if form == "object":
            meta = {**_trailer(bytes(stream.tail)), **meta}
    except ijson.JSONError as exc:
        cut = stream.eof and bytes(stream.tail).rstrip()[-1:] not in (b"}", b"]")
        raise _json_error(path, exc, cut=cut) from None
    except RecursionError:
        raise TraceReadError(f"trace {str(path)!r} nests too deeply to be a profiler trace") from None
    finally:
        stream.close()
    base_ns = _base_ns(path, meta.get("baseTimeNanoseconds"))
    spans = builder.finish()
    if builder.timed == 0:
        raise TraceReadError(f"trace {str(path)!r} holds no timed events (ph 'X' or 'B'/'E'); was the profiler "
                             f"stopped before anything ran?")
    return _trace_file(path, meta, tuple(spans), base_ns=base_ns, skipped=builder.skipped, events=builder.events)


def read_header(path: str | os.PathLike) -> TraceFile:
    """What a trace says about itself before its events (rank, world size, process groups, host), without reading
    the events (:attr:`TraceFile.spans` is empty; ``baseTimeNanoseconds`` may come after the events and is read
    by :func:`read_trace`)."""
    path = Path(path)
    _check_path(path)
    form, meta = _header(path)
    if form == "none":
        raise TraceReadError(f"trace {str(path)!r} is not a Chrome trace: expected a JSON object with a "
                             f"'traceEvents' list (or a list of events)")
    return _trace_file(path, meta, (), base_ns=0, skipped=0, events=0)


def _trace_file(path: Path, meta: dict, spans: tuple, *, base_ns: int, skipped: int, events: int) -> TraceFile:
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    groups = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    host = meta.get("host_name") if isinstance(meta.get("host_name"), str) else None
    return TraceFile(
        path=str(path), spans=spans,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else None,
        host=host, base_ns=base_ns, process_groups=tuple(g for g in groups if isinstance(g, dict)), skipped=skipped,
        events=events)


def _base_ns(path: Path, base) -> int:
    if base is None:
        return 0
    if isinstance(base, float) and base.is_integer():
        base = int(base)
    if isinstance(base, bool) or not isinstance(base, int) or not (
            base == 0 or _BASE_NS_RANGE[0] <= base <= _BASE_NS_RANGE[1]):
        raise TraceReadError(f"trace {str(path)!r}: baseTimeNanoseconds {str(base)[:40]} is not a Unix time in "
                             f"nanoseconds between 2000 and 2100; the trace's clock cannot be trusted")
    return base


class _Builder:
    """Timed events -> kept :class:`Span` objects (module docstring), one event at a time."""

    def __init__(self, path: Path, keep: Keep) -> None:
        self.path = path
        self.keep = keep
        self.spans: list[Span] = []
        self.skipped = 0
        self.events = 0
        self.timed = 0
        """Well-formed timed events, kept or not."""
        self.open: dict[tuple, list[tuple]] = {}  # (pid, tid) -> stack of "B" events
        self.flows: dict[tuple, object] = {}  # ac2g flow ends: (pid, tid, ts) -> correlation id
        self.memo: dict[tuple, int] = {}  # (name, cat) -> Keep verdict
        self.names: dict[str, str] = {}  # one string object per distinct name

    def add(self, e) -> None:
        self.events += 1
        try:
            ph = e["ph"]
        except (KeyError, TypeError):
            if not isinstance(e, dict):
                self.skipped += 1
            return
        if ph == "X":  # most events: complete events, the fast path inline (a GPU trace has millions)
            get = e.get
            name, cat = get("name"), get("cat") or ""
            try:  # the verdict on each (name, cat) once: most events of a trace share a few hundred names
                verdict = self.memo[(name, cat)]
            except (KeyError, TypeError):  # new, or an unhashable name (a list or an object: refused there)
                verdict = self._verdict(name, cat)
            if verdict is None:
                self.skipped += 1
                return
            self.timed += 1
            if not verdict:  # dropped without looking further
                return
            ts, dur = get("ts"), get("dur")
            if type(ts) is not float:
                ts = _number(ts)
            if type(dur) is not float:
                dur = _number(dur)
            if ts is None or dur is None or dur < 0:
                self.skipped += 1
                return
            pid, tid = get("pid"), get("tid")
            if not -MAX_ABS_TS_US <= ts <= MAX_ABS_TS_US:
                self._beyond(name, ts)
            if isinstance(pid, (dict, list)) or isinstance(tid, (dict, list)):
                self.skipped += 1
                return
            if verdict == 2:  # a kernel or launch: its correlation id alone
                args = get("args")
                corr = args.get("correlation") if type(args) is dict else None
                args = _NO_ARGS if corr is None else {"correlation": corr}
            elif verdict == 3:
                args = get("args")
                args = args if type(args) is dict else _NO_ARGS
            else:
                args = _NO_ARGS
            if len(self.spans) >= MAX_KEPT_EVENTS:
                self._too_many()
            self.spans.append(Span(self.names[name], cat if type(cat) is str else "", ts, ts + dur, pid, tid, args))
            return
        if ph == "B":
            name, cat = e.get("name"), e.get("cat") or ""
            try:
                verdict = self.memo[(name, cat)]
            except (KeyError, TypeError):
                verdict = self._verdict(name, cat)
            if verdict is None:
                self.skipped += 1
                return
            self.timed += 1
            pid, tid = e.get("pid"), e.get("tid")
            ts = _number(e.get("ts"))
            if not verdict:  # the end of a dropped range still pops it
                self.open.setdefault((pid, tid), []).append(None)
                return
            if ts is None or isinstance(pid, (dict, list)) or isinstance(tid, (dict, list)):
                self.skipped += 1
                return
            if not -MAX_ABS_TS_US <= ts <= MAX_ABS_TS_US:
                self._beyond(name, ts)
            self.open.setdefault((pid, tid), []).append((name, cat, ts, e.get("args"), verdict))
            return
        if ph == "E":
            stack = self.open.get((e.get("pid"), e.get("tid")))
            if not stack:
                self.skipped += 1
                return
            begin = stack.pop()
            if begin is None:  # the end of a dropped range
                return
            name, cat, start, args, verdict = begin
            end = _number(e.get("ts"))
            if end is None or end < start:
                self.skipped += 1
                return
            if verdict == 2:
                corr = args.get("correlation") if type(args) is dict else None
                args = _NO_ARGS if corr is None else {"correlation": corr}
            elif verdict != 3 or type(args) is not dict:
                args = _NO_ARGS
            if len(self.spans) >= MAX_KEPT_EVENTS:
                self._too_many()
            self.spans.append(Span(self.names[name], cat if type(cat) is str else "", start, end, e.get("pid"),
                                   e.get("tid"), args))
            return
        if ph == "f":  # an ac2g arrow's end, on the kernel: its id is the launch's correlation (Kineto)
            if e.get("cat") == "ac2g":
                self.flows[(e.get("pid"), e.get("tid"), e.get("ts"))] = e.get("id")

    def _beyond(self, name, ts) -> None:
        raise TraceReadError(f"trace {str(self.path)!r}: event {self.events} ({str(name)[:40]}) has ts {ts:g} us, "
                             f"beyond any clock (|ts| <= {MAX_ABS_TS_US:g} us); the trace's clock is broken")

    def _too_many(self) -> None:
        raise TraceReadError(f"trace {str(self.path)!r} holds more than {MAX_KEPT_EVENTS:,} events ingest needs "
                             f"(kernels, ops, ranges; {self.events:,} read so far): profile fewer steps, e.g. "
                             f"torch.profiler.schedule(active=1)")

    def _verdict(self, name, cat) -> int | None:
        """Keep's verdict on a new (name, cat); None: a timed event without a name (malformed, skipped)."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise TraceReadError(f"trace {str(self.path)!r} is not a profiler trace: event {self.events} has the "
                                 f"name {json.dumps(name, default=str)[:60]}, not a string")
        if not isinstance(cat, str):
            cat = ""
        verdict = self.memo[(name, cat)] = self.keep(name, cat)
        self.names[name] = name  # one string object per distinct name, shared by its spans
        return verdict

    def finish(self) -> list[Span]:
        self.skipped += sum(len(stack) for stack in self.open.values())  # a "B" never closed
        if self.flows:  # a kernel without args.correlation takes the id of the ac2g arrow ending on it (Kineto: id =
            # the launch's correlation; the launch itself always carries args.correlation)
            for i, s in enumerate(self.spans):
                if s.args is _NO_ARGS and s.cat in _DEVICE_CATS:
                    corr = self.flows.get((s.pid, s.tid, s.start))
                    if corr is not None:
                        self.spans[i] = Span(s.name, s.cat, s.start, s.end, s.pid, s.tid, {"correlation": corr})
        self.spans.sort(key=lambda s: (s.start, -s.end))
        return self.spans


_NO_ARGS: dict = {}


class _Everything(Keep):
    """Keep every timed event with its args (the default of :func:`read_trace` for callers other than ingest)."""

    def __call__(self, name: str, cat: str) -> int:
        return 3


_ALL = _Everything()


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str | os.PathLike) -> int | None:
    """The rank a file name states (``rank0.json``, ``trace_rank_1.json.gz``, ``pp-rank3.pt.trace.json``), or None."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match[1]) if match else None


def progress_bar(total_bytes: int, *, enabled: bool | None = None):
    """A tqdm bar over bytes on stderr (None when stderr is not a terminal and *enabled* is not True)."""
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="reading traces",
                file=sys.stderr, leave=False, dynamic_ncols=True)
