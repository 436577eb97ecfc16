"""Pipeline actions and point-to-point messages in one rank's trace. Needs no torch.

Where the actions come from (three naming forms, looked for in every trace):

- ``PP:<action>``: PyTorch's multi-stage runtime (``_PipelineScheduleRuntime._step_microbatches``,
  torch 2.5+) wraps every action of its lowered schedule in ``record_function(f"PP:{action}")``:
  computations ``PP:2F0`` (forward), ``PP:2B0`` (full backward), ``PP:2I0`` (input gradient),
  ``PP:2W0`` (weight gradient), communication ``PP:2SEND_F0``, ``PP:2RECV_F0``, ``PP:2SEND_B0``,
  ``PP:2RECV_B0``, bookkeeping ``PP:0UNSHARD``, ``PP:0RESHARD``, ``PP:0REDUCE_GRAD`` (ignored), and
  DualPipeV's overlapped pairs ``PP:(0F3;3B1)OVERLAP_F_B``.
- ``Forward i`` / ``Backward i``: the single-stage runtime (``ScheduleGPipe._step_microbatches``)
  wraps micro-batch *i*'s forward and backward; the stage is the rank's only stage.
- ``--action-pattern REGEX`` (other runtimes): a regular expression matched against whole event
  names, with named groups ``kind`` (F / B / I / W / U, or forward, backward, input, weight,
  update) and ``mb``, and optionally ``stage`` (default: the rank's only stage).
- No names at all: torch 2.13's ``Schedule1F1B`` with the profiler's defaults, and Megatron-LM's
  ``forward_step`` / ``backward_step``: the computations are found from the op structure or those
  functions and numbered from the schedule's order (:mod:`validate.ingest.infer`; form ``inferred``
  or ``megatron``).

What a range holds, and how compute is told from waiting (times in the trace's microseconds):

- A ``Forward i`` range first receives its input: a ``c10d::recv_`` call posts the receive and
  the backend's ``gloo:recv`` span ends when ``wait()`` returned, i.e. when the data was there.
  The forward computes from that moment; it ends where the range posts its send (``c10d::send``),
  or at the range's end. ``Backward i`` likewise with the gradient.
- A ``PP:sFm`` range of the multi-stage runtime starts by waiting on the receive that the
  earlier ``PP:sRECV_Fm`` posted, so its compute starts at that receive's completion when the
  completion falls inside the range (``PP:sB``/``PP:sI`` and ``RECV_B`` likewise).
- An overlapped pair (``OVERLAP_F_B``) runs its forward, then its backward, in one range: the
  backward starts at the first autograd engine event inside the range (or at the completion of its
  gradient's receive); the forward ends there. A pair that shows neither cannot be split, and its
  two actions are reported missing instead of being guessed.
- A range nested in another range of the same action (e.g. a harness that marks the
  computation inside the runtime's own range) wins: it is the tighter one.
- On GPUs (the trace holds kernels), an action's time is that of the compute kernels launched
  inside its range, from any thread of the process (the autograd engine launches the backward's
  from its device thread) onto any stream, matched through the launch's ``correlation`` id (or,
  where a kernel lacks it, the ``ac2g`` flow arrow from its launch); NCCL kernels are
  communication, and a receive completes when its NCCL kernel ends. Where a range launched no
  kernel the profiler saw, its ``gpu_user_annotation`` copy (Kineto's GPU-side span of the same
  range) gives the GPU time. A range with neither did no device work (PyTorch's first stage skips its
  input-gradient action, ``stage.py``: "Skip the backward for the first stage"; its W does the whole
  backward): it is an instant on the device's timeline where the stream stood when it was issued, the
  end of the GPU work launched before it (its host times would put it ahead of kernels still queued).

Messages: a send is a ``c10d::send`` call (or a backend span where the trace has no c10d call);
a receive a ``c10d::recv_`` call plus the ``gloo:recv`` span that ends at its completion. What a
message carries comes from where it sits: inside ``PP:sSEND_Fm`` it carries F(s,m)'s activation,
inside ``Forward i`` it is F(s,i)'s input or output, and so on. Messages outside every range
(Schedule1F1B's own loop) are left for :mod:`validate.ingest.flow` to pair in order. Sizes come from
``Input Dims`` and ``Input type`` (profile with ``record_shapes=True``), the peer from the
call's ``Concrete Inputs`` or ProcessGroupNCCL's profiling title (``nccl:send 0->1``,
``nccl:recv 1<-0``).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sim.core.ir import Action, ActionKind
from sim.errors import PipesimError

from validate.ingest.infer import OrderMismatchError, Segment, match_order, megatron_segments, pytorch_segments
from validate.ingest.reader import Span, TraceFile

__all__ = ["ActionPatternError", "ActionRange", "BLOCKING_EXCHANGES", "WAIT_CALL", "Message", "RankRecords",
           "compile_patterns", "extract_rank", "COMPUTE_KINDS", "SOURCES", "OrderMismatchError", "check_backtracking"]

SOURCES = ("auto", "megatron")
"""How actions are found: ``auto`` (named ranges; on a rank with one stage and none, the op structure) or
``megatron`` (Megatron-LM's forward_step / backward_step)."""

COMPUTE_KINDS = ("F", "B", "I", "W", "U")
"""Kinds of recorded computations: PyTorch's letters (B = full backward, I = input gradient) plus U."""

_PP = re.compile(r"^PP:(\d+)(F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)(\d*)$")
_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_SUB = re.compile(r"^(\d+)(F|I|B|W)(\d+)$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
KIND_WORDS = {"f": "F", "fwd": "F", "forward": "F", "b": "B", "bwd": "B", "backward": "B", "full": "B",
               "i": "I", "input": "I", "bwd_input": "I", "backward_input": "I", "w": "W", "weight": "W",
               "bwd_weight": "W", "backward_weight": "W", "u": "U", "update": "U", "optimizer": "U", "step": "U"}
_SEND_CALLS = ("c10d::send",)
_RECV_CALLS = ("c10d::recv_", "c10d::recv_any_source_")
_BACKEND_SEND = ("gloo:send", "nccl:send")
_BACKEND_RECV = ("gloo:recv", "nccl:recv")
_NCCL_TITLE = re.compile(r"^nccl:(send|recv) (\d+)(->|<-)(\d+)$")  # ProcessGroupNCCL's profiling title
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_DTYPE_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "long": 8, "int": 4,
                "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
                "c10::complex<double>": 16, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1}


class ActionPatternError(PipesimError):
    """An ``--action-pattern`` that is not a usable regular expression."""


def compile_patterns(patterns: Sequence[str], *, groups: Sequence[str] = ("kind", "mb")) -> list[re.Pattern]:
    """Compile ``--action-pattern`` expressions; each needs the named *groups* (``kind`` and ``mb`` for actions)."""
    out = []
    for text in patterns:
        check_backtracking(text)
        try:
            rx = re.compile(text)
        except re.error as exc:
            raise ActionPatternError(f"--action-pattern {text!r} is not a regular expression: {exc}") from None
        missing = [g for g in groups if g not in rx.groupindex]
        if missing == ["kind"] and list(groups) == ["kind"]:
            raise ActionPatternError(f"--action-pattern {text!r} needs the named group kind, e.g. "
                                     r"'(?P<part>\w+)\((?P<kind>[FBW])\)'")
        if missing:
            raise ActionPatternError(f"--action-pattern {text!r} lacks the named group(s) {missing}; e.g. "
                                     r"'fwd_(?P<stage>\d+)_(?P<mb>\d+)' needs (?P<kind>...) too, or write the "
                                     r"kind into it: '(?P<kind>fwd|bwd)_(?P<stage>\d+)_(?P<mb>\d+)'")
        out.append(rx)
    return out


_NESTED = re.compile(r"\((?:[^()\\]|\\.)*(?:[*+]|\{\d*,\d*\})(?:[^()\\]|\\.)*\)\s*(?:[*+]|\{\d*,\d*\})")
_MAX_PATTERN = 500


def check_backtracking(text: str) -> None:
    """Refuse what makes Python's backtracking engine exponential: a quantified group whose body is itself
    quantified, ``(a+)+``, ``(?:\\w*)*``, ``(x{1,5})+`` (the "nested quantifier" class of ReDoS, OWASP). Names are
    matched whole, one event at a time: a pattern without nesting stays polynomial in a name's length."""
    if len(text) > _MAX_PATTERN:
        raise ActionPatternError(f"--action-pattern is {len(text)} characters long; at most {_MAX_PATTERN}")
    if _NESTED.search(text):
        raise ActionPatternError(f"--action-pattern {text!r} repeats a group that itself repeats (like (a+)+), which "
                                 f"can take exponential time on a long event name; write it without the nested "
                                 f"quantifier, e.g. (?P<kind>a+) instead of (?P<kind>(?:a+)+)")


@dataclass(frozen=True, slots=True)
class ActionRange:
    """One recorded computation, in the trace's microseconds."""

    stage: int
    kind: str
    """One of :data:`COMPUTE_KINDS`."""
    mb: int
    start: float
    """Start of the range as recorded (it may include waiting for the input)."""
    end: float
    compute_start: float
    """When it computed: after its input arrived (see the module docstring)."""
    compute_end: float
    form: str
    """'PP', 'single', 'pattern', 'overlap' (split out of an overlapped pair), 'inferred' (from the op structure,
    numbered by the schedule's order) or 'megatron' (Megatron-LM's forward_step / backward_step, numbered so)."""
    thread: tuple
    step: int = -1
    """Which profiled step it belongs to (set by :func:`extract_rank`)."""
    on_gpu: bool = False
    """True when the compute times are on the GPU's timeline: those of its kernels (or its range's GPU copy), or
    the instant the stream reached it where its range launched no kernel (:func:`_on_the_stream`)."""

    @property
    def identity(self) -> tuple[int, str, int]:
        return (self.stage, self.kind, self.mb)


@dataclass(frozen=True, slots=True)
class Message:
    """One point-to-point send or receive call."""

    direction: str
    """'send' or 'recv'."""
    start: float
    """Start of the call that posts it (microseconds)."""
    end: float
    """End of that call."""
    complete: float | None = None
    """Receive: when ``wait()`` returned (its data was there); on GPUs the end of its NCCL kernel. Send: None."""
    send_done: float | None = None
    """Send on the host: when its work completed (the end of the backend's ``gloo:send`` range, which
    ``ProcessGroupGloo``'s work closes when the send's ``wait()`` returns); None otherwise."""
    wait_start: float | None = None
    """Receive: when its consumer began waiting for it, if the trace shows it."""
    nbytes: float | None = None
    peer: int | None = None
    """Group rank of the peer as the call states it."""
    producer: tuple[int, str, int] | None = None
    """What it carries: (stage, 'F' activation or 'B' gradient, mb) of the computation that made it; None: unknown."""
    step: int = -1
    thread: tuple = ()
    gpu_span: tuple[float, float] | None = None
    """On a GPU: (start, end) of its NCCL kernel(s)."""
    waited: tuple[float, float] | None = None
    """Receive on the host: (start, end) of the ``Work.wait()`` call that returned it, where the trace has Python
    events (``with_stack=True``, as Megatron profiles: :data:`WAIT_CALL`); None: not shown."""


@dataclass(slots=True)
class RankRecords:
    """Everything :func:`extract_rank` found in one rank's trace."""

    actions: list[ActionRange] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    """Messages whose payload is known from the range they sit in."""
    loose: list[Message] = field(default_factory=list)
    """Messages outside every range (paired in order by :mod:`validate.ingest.flow`)."""
    forms: set[str] = field(default_factory=set)
    unsplit: list[str] = field(default_factory=list)
    """Overlapped pairs that could not be split (their actions are missing)."""
    comm_spans: list[tuple[float, float]] = field(default_factory=list)
    """Intervals the rank spent inside communication calls, or blocked in them (for the idle split)."""
    call_remainders: list[tuple[str, float]] = field(default_factory=list)
    """('send' | 'recv', seconds) per communication range of the runtime's (``PP:SEND_F3``...) that holds calls:
    its duration less theirs, the runtime's own time around them (:mod:`validate.ingest.call_overhead`)."""
    stageless: int = 0
    """'Forward i' / 'Backward i' ranges left out: the schedule puts several stages (or none) on this rank."""
    steps_marked: bool = False
    """True when ``ProfilerStep#N`` markers assigned the steps."""
    gpu: bool = False
    notes: list[str] = field(default_factory=list)
    inferred: int = 0
    """Actions whose identity (micro-batch, stage) was inferred from the schedule's order."""
    left_out: int = 0
    """Op runs after a step's last backward left out (scale_grads, output merge, optimizer)."""


# ------------------------------------------------------------------------------------ names
def _pp_name(name: str) -> tuple[int, str, int | None] | None:
    m = _PP.match(name)
    if m is None:
        return None
    return int(m[1]), m[2], int(m[3]) if m[3] else None


def _pattern_match(name: str, patterns: Sequence[re.Pattern], own_stage: int | None):
    for rx in patterns:
        m = rx.fullmatch(name)
        if m is None:
            continue
        kind = KIND_WORDS.get(m["kind"].lower()) if m["kind"] else None
        if kind is None or not m["mb"] or not m["mb"].isdigit():
            continue
        stage = m.groupdict().get("stage")
        if stage is not None and not stage.isdigit():
            continue
        stage = int(stage) if stage is not None else own_stage
        if stage is None:
            continue
        return stage, kind, int(m["mb"])
    return None


# ------------------------------------------------------------------------------------ messages
def _nbytes(call: Span, backend: Span | None) -> float | None:
    dims = call.args.get("Input Dims") or (backend.args.get("Input Dims") if backend else None)
    types = (backend.args.get("Input type") if backend else None) or call.args.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(types, list) or not types:
        return None
    tensors = dims[0]
    if isinstance(tensors, list) and tensors and all(isinstance(t, list) for t in tensors):
        shapes = tensors  # a TensorList argument: one shape per tensor
    elif isinstance(tensors, list):
        shapes = [tensors]
    else:
        return None
    dtype = next((t for t in types if isinstance(t, str) and t.lower() in _DTYPE_BYTES), None)
    if dtype is None or not all(isinstance(d, int) and d >= 0 for s in shapes for d in s):
        return None
    return float(sum(math.prod(s) for s in shapes) * _DTYPE_BYTES[dtype.lower()])


def _peer(call: Span, backend: Span | None = None) -> int | None:
    concrete = call.args.get("Concrete Inputs")
    if isinstance(concrete, list) and len(concrete) > 2 and isinstance(concrete[2], str) and concrete[2].isdigit():
        return int(concrete[2])
    for s in (call, backend):
        m = _NCCL_TITLE.match(s.name) if s is not None else None
        if m:  # "nccl:send 0->1": the peer is the second; "nccl:recv 1<-0": likewise
            return int(m[4])
    return None


def _is_backend(name: str, recv: bool) -> bool:
    names = _BACKEND_RECV if recv else _BACKEND_SEND
    return name in names or name.startswith(names[1] + " ")


class _Thread:
    """Spans of one thread sorted by start, for 'what starts inside [a, b)' queries."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = sorted(spans, key=lambda s: (s.start, -s.end))
        self.starts = [s.start for s in self.spans]

    def inside(self, a: float, b: float) -> list[Span]:
        lo = bisect.bisect_left(self.starts, a)
        hi = bisect.bisect_right(self.starts, b)
        return self.spans[lo:hi]


def _by_thread(spans: list[Span]) -> dict[tuple, _Thread]:
    groups: dict[tuple, list[Span]] = defaultdict(list)
    for s in spans:
        groups[s.thread].append(s)
    return {t: _Thread(v) for t, v in groups.items()}


class _Gpu:
    """GPU kernels by the correlation id of their launch (Kineto's ``args.correlation``; the reader gives a kernel
    without it the id of its ``ac2g`` flow), and the ``gpu_user_annotation`` copies of the CPU ranges."""

    def __init__(self, spans: Sequence[Span], annotations: Sequence[Span] = ()) -> None:
        self.kernels: dict[object, list[Span]] = defaultdict(list)
        self.annotations: dict[str, list[Span]] = defaultdict(list)
        for a in sorted(annotations, key=lambda a: a.start):
            self.annotations[a.name].append(a)
        self.taken: dict[str, int] = defaultdict(int)
        launches = []
        for s in spans:
            corr = s.args.get("correlation")
            if isinstance(corr, bool) or not isinstance(corr, (int, str)):
                continue
            if s.cat in _DEVICE_CATS:
                self.kernels[corr].append(s)
            elif s.cat in ("cuda_runtime", "cuda_driver") or s.name.startswith(("cuda", "hip")):
                launches.append(s)
        self.by_pid = _by_thread([replace(s, tid=None) for s in launches])  # launches of any thread of the process

    def __bool__(self) -> bool:
        return bool(self.kernels) or bool(self.annotations)

    def annotation(self, name: str) -> Span | None:
        """The GPU copy of the next CPU range named *name*: the n-th range's copy is the n-th copy (Kineto records
        one per range, in launch order; their clocks need not agree)."""
        copies = self.annotations.get(name, ())
        n = self.taken[name]
        self.taken[name] += 1
        return copies[n] if n < len(copies) else None

    def kernels_in(self, pid, a: float, b: float, *, comm: bool) -> list[Span]:
        thread = self.by_pid.get((pid, None))
        if thread is None:
            return []
        out = []
        for launch in thread.inside(a, b):
            corr = launch.args.get("correlation")
            for k in self.kernels.get(corr, ()) if isinstance(corr, (int, str)) else ():
                if ("nccl" in k.name.lower()) == comm:
                    out.append(k)
        return out


BLOCKING_EXCHANGES = (": _communicate", ": _batched_p2p_ops")
"""Python functions (``with_stack=True`` events) of a call that posts a batch and waits for all of it before
returning: Megatron-LM's ``p2p_communication.py`` ``_communicate`` holding a ``_batched_p2p_ops`` call
(``batch_p2p_comm``, which asserts ``wait_on_reqs``; with ``overlap_p2p_comm`` it posts through ``_p2p_ops`` and may
return at once, so those calls bound nothing). The backend's ``gloo:recv`` range ends when gloo's thread gets to
record it, which on a busy machine comes after the waiting thread has returned and computed on (measured: up to
0.8 ms after the consumer began); the call's return bounds the completion of everything it posted."""


WAIT_CALL = "<built-in method wait of "
"""The Python event of ``Work.wait()`` (``with_stack=True`` traces). It tells when a receive was waited for where
the runtime does not wait right after posting: Megatron-LM's ``overlap_p2p_comm`` posts a receive, computes, and
waits in ``pp_pre_forward`` / ``pp_pre_backward``. ``ProcessGroupGloo`` closes the receive's ``gloo:recv`` range
inside that wait (measured: 1-3 us before it returns), so the completion alone read as a transfer lasting the whole
computation in between: in one 1-ms launch of ``validate --runtime megatron-overlap``, 784 of 1584 receives took a
median 1.3 ms from the later post to their completion, while the wait that returned them lasted 2-3 us."""


def _wait_calls(spans: Sequence[Span]) -> dict[tuple, tuple[list[float], list[Span]]]:
    """Per thread, the ``Work.wait()`` calls (:data:`WAIT_CALL`) sorted by start."""
    calls: dict[tuple, list[Span]] = defaultdict(list)
    for s in spans:
        if s.cat == "python_function" and s.name.startswith(WAIT_CALL):
            calls[s.thread].append(s)
    return {t: ([c.start for c in v], v) for t, v in ((t, sorted(v, key=lambda c: c.start)) for t, v in calls.items())}


def _waited_in(waits: dict, call: Span, complete: float) -> tuple[float, float] | None:
    """The wait call of *call*'s thread that was running when the receive posted by *call* completed (the last one
    begun after *call* that holds *complete*), as (start, end); None if there is none."""
    starts, spans = waits.get(call.thread, ((), ()))
    i = bisect.bisect_right(starts, complete) - 1
    while i >= 0 and spans[i].start >= call.end:
        if spans[i].end >= complete:
            return spans[i].start, spans[i].end
        i -= 1
    return None


def _returned_by(spans: Sequence[Span]) -> dict[tuple, tuple[list[float], list[Span]]]:
    """Per thread, the blocking exchanges (:data:`BLOCKING_EXCHANGES`: a ``_communicate`` holding a batch) sorted by
    start, for :func:`_enclosing`."""
    calls: dict[tuple, list[Span]] = defaultdict(list)
    batches: dict[tuple, list[float]] = defaultdict(list)
    for s in spans:
        if s.cat == "python_function" and s.name.endswith(BLOCKING_EXCHANGES[0]):
            calls[s.thread].append(s)
        elif s.cat == "python_function" and s.name.endswith(BLOCKING_EXCHANGES[1]):
            batches[s.thread].append(s.start)
    out = {}
    for t, v in calls.items():
        held = sorted(batches.get(t, ()))
        v = sorted((c for c in v if bisect.bisect_right(held, c.end) > bisect.bisect_left(held, c.start)),
                   key=lambda c: c.start)
        if v:
            out[t] = ([c.start for c in v], v)
    return out


def _enclosing(blocking: dict, call: Span) -> Span | None:
    """The blocking exchange of *call*'s thread that holds it, if any."""
    starts, spans = blocking.get(call.thread, ((), ()))
    i = bisect.bisect_right(starts, call.start) - 1
    return spans[i] if i >= 0 and spans[i].end >= call.end else None


def _messages(threads: dict[tuple, _Thread], all_spans: Sequence[Span], gpu: _Gpu) -> list[Message]:
    """Every send / receive call of the rank, with its completion, size and peer."""
    out = []
    blocking = _returned_by(all_spans)
    waits = _wait_calls(all_spans)
    calls = [s for s in all_spans if s.name in _SEND_CALLS or s.name in _RECV_CALLS]
    if not calls:  # a trace without c10d calls: the backend's own spans are the calls
        calls = [s for s in all_spans if _is_backend(s.name, False) or _is_backend(s.name, True)]
    for call in calls:
        recv = call.name in _RECV_CALLS or _is_backend(call.name, True)
        backend = call if _is_backend(call.name, recv) else next(
            (s for s in threads[call.thread].inside(call.start, call.end) if _is_backend(s.name, recv)), None)
        complete = backend.end if (recv and backend is not None) else None
        gpu_span = None
        if gpu:
            kernels = gpu.kernels_in(call.pid, call.start, call.end, comm=True)
            if kernels:
                gpu_span = (min(k.start for k in kernels), max(k.end for k in kernels))
                if recv:
                    complete = gpu_span[1]
        send_done = backend.end if (not recv and backend is not None and backend is not call) else None
        exchange = _enclosing(blocking, call) if blocking else None
        if exchange is not None and gpu_span is None:  # its return bounds every completion (BLOCKING_EXCHANGES)
            complete = None if complete is None else min(complete, exchange.end)
            send_done = None if send_done is None else min(send_done, exchange.end)
        waited = (_waited_in(waits, call, complete) if waits and recv and complete is not None and gpu_span is None
                  else None)
        out.append(Message(direction="recv" if recv else "send", start=call.start,
                           end=call.end if backend is not call else call.start, complete=complete,
                           send_done=send_done,
                           nbytes=_nbytes(call, backend), peer=_peer(call, backend), thread=call.thread,
                           gpu_span=gpu_span, waited=waited))
    out.sort(key=lambda m: m.start)
    return out


class _Messages:
    """The rank's messages by thread and start time; each is handed out once."""

    def __init__(self, messages: list[Message]) -> None:
        self.by_thread: dict[tuple, list[Message]] = defaultdict(list)
        for m in messages:
            self.by_thread[m.thread].append(m)
        self.starts = {t: [m.start for m in ms] for t, ms in self.by_thread.items()}
        self.taken: set[int] = set()

    def take(self, span: Span) -> list[Message]:
        """The messages not yet taken whose call starts inside *span* (same thread); marks them taken."""
        ms = self.by_thread.get(span.thread, [])
        starts = self.starts.get(span.thread, [])
        lo, hi = bisect.bisect_left(starts, span.start), bisect.bisect_right(starts, span.end)
        out = [m for m in ms[lo:hi] if id(m) not in self.taken]
        self.taken.update(id(m) for m in out)
        return out

    def rest(self) -> list[Message]:
        return sorted((m for ms in self.by_thread.values() for m in ms if id(m) not in self.taken),
                      key=lambda m: m.start)


# ------------------------------------------------------------------------------------ extraction
@dataclass(slots=True)
class _Raw:
    stage: int
    kind: str
    mb: int
    span: Span
    form: str
    subs: tuple = ()  # overlapped pair: ((stage, kind, mb), ...)
    outer: Span | None = None  # the outermost range of the same action around this one, if any


def _find_ranges(spans: Sequence[Span], rank: int, own: list[int], patterns: Sequence[re.Pattern],
                 rec: RankRecords) -> tuple[list[_Raw], list[tuple[int, str, int, Span]]]:
    """Computation ranges (all three naming forms) and the multi-stage runtime's SEND / RECV ranges."""
    own_stage = own[0] if len(own) == 1 else None
    raws: list[_Raw] = []
    comm_ranges: list[tuple[int, str, int, Span]] = []  # PP:sSEND_Fm, ... as (stage, type, mb, span)
    for s in spans:
        pp = _pp_name(s.name)
        if pp is not None:
            stage, kind, mb = pp
            if kind in ("F", "I", "B", "W") and mb is not None:
                raws.append(_Raw(stage, kind, mb, s, "PP"))
            elif kind.startswith(("SEND", "RECV")) and mb is not None:
                comm_ranges.append((stage, kind, mb, s))
            continue
        overlap = _OVERLAP.match(s.name)
        if overlap:
            subs = tuple((int(m[1]), m[2], int(m[3])) for m in map(_SUB.match, overlap[1].split(";")) if m)
            if subs:
                raws.append(_Raw(-1, "OVERLAP", -1, s, "overlap", subs))
            continue
        single = _SINGLE.match(s.name)
        if single:
            if own_stage is None:
                rec.stageless += 1  # a single-stage runtime's range on a rank the schedule gives several stages
                continue
            raws.append(_Raw(own_stage, "F" if single[1] == "Forward" else "B", int(single[2]), s, "single"))
            continue
        if patterns:
            hit = _pattern_match(s.name, patterns, own_stage)
            if hit is not None:
                raws.append(_Raw(hit[0], hit[1], hit[2], s, "pattern"))
    return _innermost(raws), comm_ranges


def extract_rank(trace: TraceFile, rank: int, placement: Sequence[int], *,
                 patterns: Sequence[re.Pattern] = (), order: Sequence[Action] | None = None,
                 source: str = "auto") -> RankRecords:
    """The actions and messages of *rank* in *trace* (see the module docstring).

    *placement*: stage -> rank of the schedule being ingested (gives ``Forward i`` its stage). *order*: the
    rank's computations in the schedule's order, without U (numbers the actions of runtimes that name none).
    *source*: one of :data:`SOURCES`. Raises :class:`OrderMismatchError` when unnamed computations do not fit
    *order*.
    """
    rec = RankRecords()
    spans = [s for s in trace.spans if s.cat != "gpu_user_annotation"]  # Kineto's GPU copies of the ranges
    threads = _by_thread(spans)
    gpu = _Gpu(spans, [s for s in trace.spans if s.cat == "gpu_user_annotation"])
    rec.gpu = bool(gpu)
    own = [s for s, r in enumerate(placement) if r == rank]
    if source == "megatron":
        raws, comm_ranges = _numbered(megatron_segments(spans), spans, rank, order, rec, "megatron"), []
    else:
        raws, comm_ranges = _find_ranges(spans, rank, own, patterns, rec)
        if not raws and order is not None and len(own) == 1:  # nothing named: the op structure (module docstring)
            raws = _numbered(pytorch_segments(spans)[0], spans, rank, order, rec, "inferred")
    pool = _Messages(_messages(threads, spans, gpu))

    named: list[Message] = []
    for stage, kind, mb, span in comm_ranges:  # the multi-stage runtime names what each message carries
        taken = pool.take(span)
        if taken:  # the runtime's own time in the range, outside its calls (validate.ingest.call_overhead)
            rec.call_remainders.append(("send" if kind.startswith("SEND") else "recv",
                                        (span.end - span.start - sum(m.end - m.start for m in taken)) * 1e-6))
        for m in taken:
            if kind.startswith("SEND") and m.direction == "send":
                named.append(replace(m, producer=(stage, "F" if kind == "SEND_F" else "B", mb)))
            elif kind.startswith("RECV") and m.direction == "recv":
                named.append(replace(m, producer=(stage - 1, "F", mb) if kind == "RECV_F" else (stage + 1, "B", mb)))
        rec.comm_spans.append((span.start, span.end))

    actions: list[ActionRange] = []
    for raw in raws:
        if raw.form == "overlap":
            continue
        span, outer = raw.span, raw.outer or raw.span
        inside = pool.take(outer)  # messages inside a computation's range carry its input or its output
        recvs = [m for m in inside if m.direction == "recv"]
        sends = [m for m in inside if m.direction == "send"]
        grad = "F" if raw.kind == "F" else "B"
        for m in recvs:
            producer = (raw.stage - 1, "F", raw.mb) if raw.kind == "F" else (raw.stage + 1, "B", raw.mb)
            named.append(replace(m, producer=producer, wait_start=m.end))
        for m in sends:
            named.append(replace(m, producer=(raw.stage, grad, raw.mb)))
        ready = max((m.complete for m in recvs if m.complete is not None), default=None)
        if ready is not None and not rec.gpu:
            rec.comm_spans.append((outer.start, min(ready, outer.end)))
        # on a GPU the range's CPU times only bound the kernel launches; its kernels' times are taken later
        compute_start = span.start if ready is None or rec.gpu else max(span.start, ready)
        compute_end = min([span.end] + [m.start for m in sends if m.start >= compute_start])
        actions.append(_action(raw.stage, raw.kind, raw.mb, outer, raw.form, min(compute_start, compute_end),
                               compute_end, gpu))

    # the multi-stage runtime (and others) wait, at the start of a computation, for a receive posted earlier:
    # the k-th such receive of (stage, mb) feeds the k-th computation that consumes it (one per profiled step)
    receipts: dict[tuple, list[int]] = defaultdict(list)  # (consumer stage, mb, 'F' | 'B') -> indices in named
    for i in sorted(range(len(named)), key=lambda i: named[i].start):
        m = named[i]
        if m.direction == "recv" and m.producer is not None and m.wait_start is None and m.complete is not None:
            stage, kind, mb = m.producer
            receipts[(stage + 1, mb, "F") if kind == "F" else (stage - 1, mb, "B")].append(i)
    consumers: dict[tuple, list[int]] = defaultdict(list)
    for j in sorted(range(len(actions)), key=lambda j: actions[j].start):
        a = actions[j]
        if a.form != "overlap" and a.kind != "W":
            consumers[(a.stage, a.mb, "F" if a.kind == "F" else "B")].append(j)
    for key, msgs in receipts.items():
        for i, j in zip(msgs, consumers.get(key, ())):
            m, a = named[i], actions[j]
            named[i] = replace(m, wait_start=max(m.end, a.start))
            if not a.on_gpu and a.start < m.complete <= a.end:
                rec.comm_spans.append((a.start, m.complete))
                actions[j] = replace(a, compute_start=min(max(a.compute_start, m.complete), a.compute_end))
    rec.messages = named
    actions += [a for raw in raws if raw.form == "overlap" for a in _split_overlap(raw, rec, threads, gpu)]

    rec.loose = pool.rest()
    for m in rec.messages + rec.loose:
        if rec.gpu and m.gpu_span is not None:
            rec.comm_spans.append(m.gpu_span)
        else:
            rec.comm_spans.append((m.start, m.end))
    for m in rec.loose:  # a receive outside every range is waited for right after it is posted, or where shown
        if m.direction == "recv" and m.complete is not None and not rec.gpu:
            rec.comm_spans.append((m.start if m.waited is None else m.waited[0], m.complete))
    if rec.gpu:
        actions = _on_the_stream(actions)
    steps = [(int(m[1]), s) for s in spans if (m := _STEP.match(s.name))]
    rec.steps_marked = bool(steps)
    rec.actions = _assign_steps(actions, steps)
    rec.messages = _assign_message_steps(rec.messages, steps)
    rec.forms = {a.form for a in rec.actions}
    return rec


def _numbered(segments: list[Segment], spans: Sequence[Span], rank: int, order: Sequence[Action] | None,
              rec: RankRecords, form: str) -> list[_Raw]:
    """Unnamed computations -> ranges, numbered step by step from *order* (:func:`validate.ingest.infer.match_order`)."""
    if not segments or order is None or not any(seg.kind == "B" for seg in segments):
        return []  # no backward at all: not a training step (refused as a trace without actions)
    marks = sorted(((s.start, s.end, m[1]) for s in spans if (m := _STEP.match(s.name))), key=lambda t: t[0])
    groups: dict[object, list[Segment]] = defaultdict(list)
    for seg in segments:
        if marks:
            step = next((n for lo, hi, n in marks if lo <= seg.start <= hi), None)
            if step is None:
                continue  # outside every profiled step: not the schedule's
            groups[f"ProfilerStep#{step}"].append(seg)
        else:
            groups["(the whole trace: no ProfilerStep#N marks)"].append(seg)
    source = ("the op structure of PyTorch's single-stage runtime" if form == "inferred"
              else "Megatron-LM's forward_step / backward_step")
    first = min(s.start for s in spans)
    out = []
    for step, segs in groups.items():
        matched, dropped = match_order(segs, order, rank=rank, step=step, source=source, first_ts=first)
        rec.left_out += dropped
        for action, seg in matched:
            kind = action.kind.value
            span = Span(name=f"{form}:{action}", cat=form, start=seg.start, end=seg.end, pid=seg.pid, tid=seg.tid)
            out.append(_Raw(action.stage, "B" if action.kind is ActionKind.B else kind, action.mb, span, form))
            rec.inferred += 1
    return out


def _action(stage, kind, mb, span: Span, form: str, compute_start: float, compute_end: float,
            gpu: _Gpu) -> ActionRange:
    on_gpu = False
    if gpu:
        kernels = gpu.kernels_in(span.pid, compute_start, compute_end, comm=False)
        copy = gpu.annotation(span.name) if form != "overlap" else None
        if kernels:
            compute_start, compute_end = min(k.start for k in kernels), max(k.end for k in kernels)
            on_gpu = True
        elif copy is not None:
            compute_start, compute_end = copy.start, copy.end
            on_gpu = True
    return ActionRange(stage=stage, kind=kind, mb=mb, start=span.start, end=span.end, compute_start=compute_start,
                       compute_end=max(compute_start, compute_end), form=form, thread=span.thread, on_gpu=on_gpu)


def _on_the_stream(actions: list[ActionRange]) -> list[ActionRange]:
    """A GPU rank's actions whose ranges launched no kernel (module docstring) -> instants where the stream stood
    when each was issued: the latest end of the GPU work of the actions issued before it (host order), or its
    own host start where the stream had drained by then. Seen on an H200 (ZBV, DualPipeV, K=1, ~1 ms actions):
    the host ran milliseconds ahead of the GPU, so the host times of the first stage's I put it before the
    kernels of the I it depends on, an order the schedule cannot run."""
    reached = -math.inf
    out = []
    for a in sorted(actions, key=lambda a: (a.start, a.end)):
        if a.on_gpu:
            reached = max(reached, a.compute_end)
        else:
            t = max(a.compute_start, reached)
            a = replace(a, compute_start=t, compute_end=t, on_gpu=True)
        out.append(a)
    return out


def _innermost(raws: list[_Raw]) -> list[_Raw]:
    """Keep the innermost of nested ranges of one action (remembering the outermost around it), and drop an
    overlapped pair whose sub-actions each have their own range inside it."""
    by_identity: dict[tuple, list[_Raw]] = defaultdict(list)
    for r in raws:
        if r.form != "overlap":
            by_identity[(r.stage, r.kind, r.mb)].append(r)
    drop = set()
    for group in by_identity.values():
        if len(group) < 2:
            continue
        for inner in group:
            around = [o for o in group if o is not inner and o.span.start <= inner.span.start
                      and inner.span.end <= o.span.end and (o.span.start, o.span.end) != (inner.span.start, inner.span.end)]
            if around:
                drop.update(id(o) for o in around)
                inner.outer = min(around, key=lambda o: (o.span.start, -o.span.end)).span
    for r in raws:
        if r.form == "overlap" and all(
                any(i.span.start >= r.span.start and i.span.end <= r.span.end for i in by_identity.get(sub, ()))
                for sub in r.subs):
            drop.add(id(r))
    return [r for r in raws if id(r) not in drop]


def _split_overlap(raw: _Raw, rec: RankRecords, threads: dict[tuple, _Thread], gpu: _Gpu) -> list[ActionRange]:
    """An overlapped forward/backward pair -> its two actions (module docstring); [] when it cannot be split."""
    span = raw.span
    label = span.name[3:]
    if len(raw.subs) != 2 or raw.subs[0][1] != "F" or raw.subs[1][1] not in ("B", "I"):
        rec.unsplit.append(label)
        return []
    (fs, _, fm), (bs, bk, bm) = raw.subs
    process = [t for key, t in threads.items() if key[0] == span.pid]
    autograd = [s.start for t in process for s in t.inside(span.start, span.end)
                if s.name.startswith("autograd::engine::evaluate_function")]
    grads = [m.complete for m in rec.messages if m.direction == "recv" and m.producer == (bs + 1, "B", bm)
             and m.complete is not None and span.start < m.complete <= span.end]
    inputs = [m.complete for m in rec.messages if m.direction == "recv" and m.producer == (fs - 1, "F", fm)
              and m.complete is not None and span.start < m.complete <= span.end]
    f_start = max([span.start] + inputs)
    boundary = min((t for t in autograd if t >= f_start), default=None)
    f_end = min([t for t in (boundary, max(grads) if grads else None) if t is not None], default=None)
    if f_end is None:
        rec.unsplit.append(label)
        return []
    b_start = max([f_end] + grads + ([boundary] if boundary is not None else []))
    return [_action(fs, "F", fm, span, "overlap", f_start, f_end, gpu),
            _action(bs, bk, bm, span, "overlap", b_start, span.end, gpu)]


def _assign_steps(actions: list[ActionRange], steps: list[tuple[int, Span]]) -> list[ActionRange]:
    """Each action's profiled step: the ``ProfilerStep#N`` range holding it, else its occurrence number."""
    if steps:
        marks = sorted((s.start, s.end, n) for n, s in steps)
        out = []
        for a in actions:
            n = next((n for lo, hi, n in marks if lo <= a.start <= hi), -1)
            out.append(replace(a, step=n))
        return out
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for a in sorted(actions, key=lambda a: a.start):
        out.append(replace(a, step=seen[a.identity]))
        seen[a.identity] += 1
    return out


def _assign_message_steps(messages: list[Message], steps: list[tuple[int, Span]]) -> list[Message]:
    if steps:
        marks = sorted((s.start, s.end, n) for n, s in steps)
        return [replace(m, step=next((n for lo, hi, n in marks if lo <= m.start <= hi), -1)) for m in messages]
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for m in sorted(messages, key=lambda m: m.start):
        key = (m.direction, m.producer)
        out.append(replace(m, step=seen[key]))
        seen[key] += 1
    return out
