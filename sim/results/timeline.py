"""The timeline schema shared by simulated and measured runs.

A timeline is a long-form pandas DataFrame, one row per computation or transfer:

=========== ====================================================================
device      device (rank) that ran the row; for a transfer, the sender
stage       stage of the action (for a transfer: the producing stage)
microbatch  micro-batch index over all iterations (update number for ``U``)
iteration   iteration the row belongs to
op          ``F``, ``B``, ``W``, ``R``, ``U``, or ``SEND_F`` / ``SEND_B`` for transfers
            (a categorical column over :data:`OPS`; compare it with strings as usual)
start, end  seconds from the start of the run
src, dst    sender and receiver device of a transfer (-1 for computations)
bytes       bytes moved by a transfer (0 for computations)
=========== ====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from sim import jit
from sim.core.ir import (NUM_KINDS, OP_F, OP_SEND_B, OP_SEND_F, OP_U, ActionKind, Schedule, key_kind, key_mb,
    key_stage, transfer_op)

__all__ = ["TIMELINE_COLUMNS", "OPS", "COMPUTE_OPS", "TRANSFER_OPS", "TimelineRows", "EngineRun", "timeline_rows", "engine_rows", "op_codes", "compute_rows", "transfer_rows",
           "empty_timeline", "timeline_frame"]

TIMELINE_COLUMNS = ["device", "stage", "microbatch", "iteration", "op", "start", "end", "src", "dst", "bytes"]
COMPUTE_OPS = tuple(k.value for k in ActionKind)  # in key-ordinal order: F, B, W, R, U
TRANSFER_OPS = ("SEND_F", "SEND_B")
OPS = COMPUTE_OPS + TRANSFER_OPS  # the op column is categorical over these, in this order
_DTYPES = {"device": "int64", "stage": "int64", "microbatch": "int64", "iteration": "int64", "op": "category",
           "start": "float64", "end": "float64", "src": "int64", "dst": "int64", "bytes": "float64"}
"""Column dtypes; ``op`` is categorical over :data:`OPS`."""


@dataclass(frozen=True, slots=True, eq=False)
class TimelineRows:
    """A timeline as plain numpy columns, in no particular order: what the engines produce and what
    metrics and memory read. :meth:`frame` makes the sorted DataFrame (the schema above) when someone asks.

    ``op`` holds op codes (:data:`sim.core.ir.OP_F` .. :data:`sim.core.ir.OP_SEND_B`); the rows with ``src < 0``
    are computations, the others transfers.
    """

    device: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    iteration: np.ndarray
    op: np.ndarray
    start: np.ndarray
    end: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @property
    def computing(self) -> np.ndarray:
        """bool per row: a computation (not a transfer)."""
        return self.src < 0

    def frame(self) -> pd.DataFrame:
        """The timeline DataFrame, sorted by start time, then device, then end, then op, stage and micro-batch.

        The last three make the order total: rows that tie on their times (zero-cost actions, the two sends
        that leave together after an overlapped pair) come out in one order whichever engine recorded them, in
        whatever order (the simpy engine records transfers as they complete)."""
        import pandas as pd  # here, not at the top: `import sim` and metrics-only callers never load pandas

        order = np.lexsort((self.microbatch, self.stage, self.op, self.end, self.device, self.start))
        wide = lambda column: column[order].astype(np.int64)  # noqa: E731  the schema's integer dtype
        return pd.DataFrame({
            "device": wide(self.device), "stage": wide(self.stage), "microbatch": wide(self.microbatch),
            "iteration": wide(self.iteration), "op": pd.Categorical.from_codes(self.op[order], categories=OPS),
            "start": self.start[order], "end": self.end[order],
            "src": wide(self.src), "dst": wide(self.dst), "bytes": self.bytes[order],
        })

    @classmethod
    def of(cls, timeline) -> TimelineRows:
        """*timeline* as rows: a TimelineRows as it is, the rows of an :class:`EngineRun`, or a timeline DataFrame
        (e.g. a measured one)."""
        if isinstance(timeline, TimelineRows):
            return timeline
        if isinstance(timeline, EngineRun):
            return timeline.rows()
        column = lambda name, dtype: timeline[name].to_numpy(dtype=dtype)  # noqa: E731
        return cls(device=column("device", np.int64), stage=column("stage", np.int64),
                   microbatch=column("microbatch", np.int64), iteration=column("iteration", np.int64),
                   op=op_codes(timeline["op"]), start=column("start", float), end=column("end", float),
                   src=column("src", np.int64), dst=column("dst", np.int64), bytes=column("bytes", float))


@dataclass(frozen=True, slots=True, eq=False)
class EngineRun:
    """What the fast engine computed, before it is laid out as rows: per action (in the order of
    :class:`sim.core.compiled.FlatSchedule`: device by device, each device's actions in the order they ran) its
    start and end, and per transfer its producer and times. Metrics and memory peaks are read from these
    arrays; the rows (:meth:`rows`) are built only when someone asks for the timeline."""

    schedule: Schedule
    keys: np.ndarray
    device: np.ndarray
    device_start: np.ndarray
    start: np.ndarray
    end: np.ndarray
    link: np.ndarray
    """Per action: the link its result travels on, -1 when it stays on its device."""
    transfer_start: np.ndarray
    """Per action: when its result's transfer starts (meaningful where ``link >= 0``, else 0)."""
    transfer_end: np.ndarray
    send_to: np.ndarray
    """Per action: the device its result travels to, -1 for none."""
    send_bytes: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False)
    """The transfers as their own arrays and the rows, made on first use (most runs only need metrics)."""

    @property
    def sent(self) -> np.ndarray:
        """Positions of the actions whose result travels to another device."""
        if "sent" not in self._cache:
            self._cache["sent"] = np.flatnonzero(self.link >= 0)
        return self._cache["sent"]

    @property
    def sent_start(self) -> np.ndarray:
        return self.transfer_start[self.sent]

    @property
    def sent_end(self) -> np.ndarray:
        return self.transfer_end[self.sent]

    @property
    def sent_dst(self) -> np.ndarray:
        return self.send_to[self.sent]

    @property
    def sent_bytes(self) -> np.ndarray:
        return self.send_bytes[self.sent]

    def rows(self) -> TimelineRows:
        """The timeline's rows (built on first call, then kept)."""
        if "rows" not in self._cache:
            sent = self.sent
            self._cache["rows"] = engine_rows(
                self.schedule, None, device=self.device, key=self.keys, start=self.start, end=self.end,
                sent_key=self.keys[sent], sent_start=self.sent_start, sent_end=self.sent_end,
                sent_route=(self.device[sent], self.sent_dst, self.sent_bytes))
        return self._cache["rows"]

    @property
    def makespan(self) -> float:
        """The end of the last computation or transfer (seconds; 0 for an empty run)."""
        # transfer_end is 0 where nothing is sent, and no time is negative: its maximum is the last transfer's end
        return max(float(self.end.max(initial=0.0)), float(self.transfer_end.max(initial=0.0)))


def op_codes(ops) -> np.ndarray:
    """An op column (pandas Series of strings or categories) as op codes, its position in :data:`OPS`
    (-1 for anything else)."""
    import pandas as pd

    if not isinstance(ops.dtype, pd.CategoricalDtype):
        ops = ops.astype("category")  # its own categories; ops outside OPS (e.g. ALLREDUCE) read -1 below
    categories = list(ops.cat.categories)
    if categories == list(OPS):
        return ops.cat.codes.to_numpy().astype(np.int64)
    lookup = np.array([OPS.index(c) if c in OPS else -1 for c in categories] + [-1], dtype=np.int64)
    return lookup[ops.cat.codes.to_numpy()]  # code -1 (missing) reads the final -1


def timeline_rows(schedule: Schedule, *, device, key, op, start, end, src, dst, nbytes) -> TimelineRows:
    """Rows from arrays; *key* are action keys (:mod:`sim.core.ir`'s codec), *op* the op codes
    (computations: the key's kind; transfers: SEND_F / SEND_B)."""
    key = np.asarray(key, dtype=np.int64)
    rows = _empty_rows(len(key))
    _fill(rows, slice(None), schedule, key, np.asarray(op), device, start, end, src, dst, nbytes)
    return rows


def engine_rows(schedule: Schedule, sends, *, device, key, start, end, sent_key, sent_start,
                sent_end, sent_route=None) -> TimelineRows:
    """Rows from what an engine records: computations by (device, action key, start, end), transfers by
    (producer key, start, end); *sends* (a function giving the plan's sorted producer keys, src, dst, bytes)
    fills in the rest, unless *sent_route* gives each transfer's (src, dst, bytes) already.

    Columns are filled in place (no concatenated copies): a run of millions of actions stays within memory.
    """
    key = np.asarray(key, dtype=np.int64)
    sent = np.asarray(sent_key, dtype=np.int64)
    if sent_route is None:
        producers, all_src, all_dst, all_bytes = sends()
        at = np.searchsorted(producers, sent)
        sent_route = all_src[at], all_dst[at], all_bytes[at]
    src, dst, nbytes = sent_route
    n = len(key)
    rows = _empty_rows(n + len(sent))
    if (kernel := jit.kernel_for(_fill_engine_rows, n)) is not None:
        times = (np.asarray(t, dtype=float) for t in (start, end, sent_start, sent_end))  # the simpy engine's lists
        (start, end, sent_start, sent_end), device = times, np.asarray(device, dtype=np.int64)
        kernel(schedule.stages, schedule.microbatches_per_update, schedule.microbatches, key, device, start, end,
               sent, sent_start, sent_end, np.asarray(src), np.asarray(dst), np.asarray(nbytes, dtype=float),
               *(getattr(rows, name) for name in _ROW_DTYPES))
        return rows
    _fill(rows, slice(0, n), schedule, key, key_kind(key), device, start, end, -1, -1, 0.0)
    _fill(rows, slice(n, None), schedule, sent, transfer_op(sent), src, sent_start, sent_end, src, dst, nbytes)
    return rows


def _fill_engine_rows(S, per_update, M, key, device, start, end, sent, sent_start, sent_end, src, dst, nbytes,
                      out_device, out_stage, out_mb, out_iteration, out_op, out_start, out_end, out_src, out_dst,
                      out_bytes):
    """:func:`engine_rows`'s two :func:`_fill` calls as one loop (compiled by numba, :mod:`sim.jit`)."""
    n = len(key)
    for r in range(n + len(sent)):
        i = r if r < n else r - n
        k = key[i] if r < n else sent[i]
        pair = k // NUM_KINDS  # keys are >= 0: one division for each part of the codec (they are slow)
        kind = k - pair * NUM_KINDS
        mb = pair // S
        out_stage[r] = pair - mb * S
        out_mb[r] = mb
        out_iteration[r] = (mb * per_update if kind == OP_U else mb) // M  # update u ends micro-batch (u+1)*g-1
        if r < n:
            out_device[r] = device[i]
            out_op[r] = kind
            out_start[r] = start[i]
            out_end[r] = end[i]
            out_src[r] = -1
            out_dst[r] = -1
            out_bytes[r] = 0.0
        else:
            out_device[r] = src[i]
            out_op[r] = OP_SEND_F if kind == OP_F else OP_SEND_B
            out_start[r] = sent_start[i]
            out_end[r] = sent_end[i]
            out_src[r] = src[i]
            out_dst[r] = dst[i]
            out_bytes[r] = nbytes[i]


# Compact columns while rows are arrays (a 4 M-action run has ~8 M rows); :meth:`TimelineRows.frame`
# widens them to the timeline schema's int64.
_ROW_DTYPES = {"device": np.int32, "stage": np.int32, "microbatch": np.int64, "iteration": np.int64, "op": np.int8,
               "start": np.float64, "end": np.float64, "src": np.int32, "dst": np.int32, "bytes": np.float64}


def _empty_rows(count: int) -> TimelineRows:
    return TimelineRows(**{name: np.empty(count, dtype=dtype) for name, dtype in _ROW_DTYPES.items()})


def _fill(rows: TimelineRows, at: slice, schedule: Schedule, key, op, device, start, end, src, dst, nbytes) -> None:
    S = schedule.stages
    rows.device[at] = device
    rows.stage[at] = key_stage(key, S)
    mb = rows.microbatch[at]
    mb[...] = key_mb(key, S)
    rows.op[at] = op
    # update u consumes micro-batches u*g .. (u+1)*g-1, g = microbatches_per_update
    iteration = rows.iteration[at]
    np.floor_divide(np.where(op == OP_U, mb * schedule.microbatches_per_update, mb), schedule.microbatches,
                    out=iteration)
    for name, value in (("start", start), ("end", end), ("src", src), ("dst", dst), ("bytes", nbytes)):
        getattr(rows, name)[at] = value


def timeline_frame(schedule: Schedule, *, device, key, op, start, end, src, dst, nbytes) -> pd.DataFrame:
    """Build a timeline DataFrame from arrays (see :func:`timeline_rows`)."""
    return timeline_rows(schedule, device=device, key=key, op=op, start=start, end=end, src=src, dst=dst,
                         nbytes=nbytes).frame()


def empty_timeline() -> pd.DataFrame:
    import pandas as pd

    dtypes = dict(_DTYPES, op=pd.CategoricalDtype(OPS))
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})


def compute_rows(timeline: pd.DataFrame) -> pd.DataFrame:
    return timeline[timeline["src"] < 0]


def transfer_rows(timeline: pd.DataFrame) -> pd.DataFrame:
    return timeline[timeline["src"] >= 0]
