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

import numpy as np
import pandas as pd

from .ir import OP_U, ActionKind, Schedule, key_kind, key_mb, key_stage, transfer_op

__all__ = ["TIMELINE_COLUMNS", "OPS", "COMPUTE_OPS", "TRANSFER_OPS", "TimelineBuilder", "compute_rows", "transfer_rows",
           "empty_timeline", "timeline_frame"]

TIMELINE_COLUMNS = ["device", "stage", "microbatch", "iteration", "op", "start", "end", "src", "dst", "bytes"]
COMPUTE_OPS = tuple(k.value for k in ActionKind)  # in key-ordinal order: F, B, W, R, U
TRANSFER_OPS = ("SEND_F", "SEND_B")
OPS = COMPUTE_OPS + TRANSFER_OPS  # the op column is categorical over these, in this order
_DTYPES = {"device": "int64", "stage": "int64", "microbatch": "int64", "iteration": "int64",
           "op": pd.CategoricalDtype(OPS),
           "start": "float64", "end": "float64", "src": "int64", "dst": "int64", "bytes": "float64"}


class TimelineBuilder:
    """Collects rows as plain lists (cheap in the engines' loops), then makes one DataFrame.

    Computations are recorded by (device, action key, start, end), transfers by
    (producer key, start, end); :meth:`frame` fills in the rest from the plan.
    """

    def __init__(self) -> None:
        self.device: list[int] = []
        self.key: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.sent_key: list[int] = []
        self.sent_start: list[float] = []
        self.sent_end: list[float] = []

    def compute(self, device: int, key: int, start: float, end: float) -> None:
        self.device.append(device)
        self.key.append(key)
        self.start.append(start)
        self.end.append(end)

    def transfer(self, producer: int, start: float, end: float) -> None:
        self.sent_key.append(producer)
        self.sent_start.append(start)
        self.sent_end.append(end)

    def frame(self, schedule: Schedule, sends) -> pd.DataFrame:
        """The timeline, sorted by start time then device.

        *sends*: arrays (producer keys sorted, src, dst, bytes) describing every transfer.
        """
        sent = np.asarray(self.sent_key, dtype=np.int64)
        producers, all_src, all_dst, all_bytes = sends
        at = np.searchsorted(producers, sent)
        src, dst, nbytes = all_src[at], all_dst[at], all_bytes[at]
        n = len(self.key)
        return timeline_frame(
            schedule,
            device=np.concatenate([np.asarray(self.device, dtype=np.int64), src]),
            key=np.concatenate([np.asarray(self.key, dtype=np.int64), sent]),
            op=np.concatenate([key_kind(np.asarray(self.key, dtype=np.int64)), transfer_op(sent)]),
            start=np.concatenate([np.asarray(self.start, dtype=float), np.asarray(self.sent_start, dtype=float)]),
            end=np.concatenate([np.asarray(self.end, dtype=float), np.asarray(self.sent_end, dtype=float)]),
            src=np.concatenate([np.full(n, -1, dtype=np.int64), src]),
            dst=np.concatenate([np.full(n, -1, dtype=np.int64), dst]),
            nbytes=np.concatenate([np.zeros(n), nbytes]),
        )


def timeline_frame(schedule: Schedule, *, device, key, op, start, end, src, dst, nbytes) -> pd.DataFrame:
    """Build a timeline from arrays; *key* are action keys, *op* 0..4 (F, B, W, R, U), 5 SEND_F, 6 SEND_B."""
    S, M = schedule.stages, schedule.microbatches
    key = np.asarray(key, dtype=np.int64)
    op = np.asarray(op, dtype=np.int64)
    mb = key_mb(key, S)
    iteration = np.where(op == OP_U, mb * schedule.microbatches_per_update, mb) // M
    device = np.asarray(device, dtype=np.int64)
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    order = np.lexsort((end, device, start))  # by start time, then device, then end
    return pd.DataFrame({
        "device": device[order], "stage": key_stage(key, S)[order], "microbatch": mb[order],
        "iteration": iteration[order], "op": pd.Categorical.from_codes(op[order], categories=OPS),
        "start": start[order], "end": end[order],
        "src": np.asarray(src, dtype=np.int64)[order], "dst": np.asarray(dst, dtype=np.int64)[order],
        "bytes": np.asarray(nbytes, dtype=float)[order],
    })


def empty_timeline() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _DTYPES.items()})


def compute_rows(timeline: pd.DataFrame) -> pd.DataFrame:
    return timeline[timeline["src"] < 0]


def transfer_rows(timeline: pd.DataFrame) -> pd.DataFrame:
    return timeline[timeline["src"] >= 0]
