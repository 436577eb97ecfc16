"""What generators share: key arrays for one stage's order, and iterations laid back to back with a flush.

Generators build the integer keys of :mod:`sim.core.ir`'s codec directly (``Schedule.from_keys``);
:class:`~sim.core.ir.Action` objects are made only when someone looks at them. An order given as
Action lists (the hand-written generators) is encoded once, for the first iteration only:
every later iteration is the same order shifted by M micro-batches, which in key space is
adding :func:`sim.core.ir.microbatch_shift` of M. All of it is linear in the number of actions (no K x S loops).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sim.core.config import PipelineConfig
from sim.core.ir import OP_B, OP_F, OP_U, Action, ActionKind, Schedule, encode_key, microbatch_shift

__all__ = ["flush_iterations", "stage_keys", "encode_actions", "interleave", "one_f_one_b_positions",
           "forward_backward_grid"]

DeviceOrder = Callable[[int, range], "list[Action] | np.ndarray | tuple[np.ndarray, np.ndarray]"]


def stage_keys(stage, kind: int, mbs, stages: int) -> np.ndarray:
    """Keys of *kind* for *stage* over the micro-batches *mbs* (broadcasts: a column of stages gives a grid)."""
    return encode_key(np.asarray(stage, dtype=np.int64), kind, np.asarray(mbs, dtype=np.int64), stages)


_ORDINAL = {kind: i for i, kind in enumerate(ActionKind)}  # the codec's kind ordinals


def encode_actions(actions: Sequence[Action], stages: int) -> np.ndarray:
    """The keys of an Action list (the hand-written generators' orders)."""
    stage = np.fromiter((a.stage for a in actions), dtype=np.int64, count=len(actions))
    kind = np.fromiter((_ORDINAL[a.kind] for a in actions), dtype=np.int64, count=len(actions))
    mb = np.fromiter((a.mb for a in actions), dtype=np.int64, count=len(actions))
    return encode_key(stage, kind, mb, stages)


def one_f_one_b_positions(warmup: np.ndarray, M: int) -> tuple[np.ndarray, np.ndarray]:
    """Where F(j) and B(j) stand in 1F1B's order of 2M actions with *warmup* forwards first (per row).

    Order: F(0..w-1); then F(w+j), B(j) for j < M-w; then B(M-w..M-1). So F(j) is at j for j < w,
    else at 2j-w; B(j) is at w+2j+1 for j < M-w, else (cool-down) at M+j.
    """
    w = np.asarray(warmup, dtype=np.int64)[:, None]
    j = np.arange(M, dtype=np.int64)[None, :]
    f_at = np.where(j < w, j, 2 * j - w)
    b_at = np.where(j < M - w, w + 2 * j + 1, M + j)
    return f_at, b_at


def interleave(f_keys: np.ndarray, b_keys: np.ndarray, f_at: np.ndarray, b_at: np.ndarray) -> np.ndarray:
    """Rows of 2M keys with the forwards at *f_at* and the backwards at *b_at* (all arrays K x M)."""
    K, M = np.shape(f_at)
    out = np.empty((K, 2 * M), dtype=np.int64)
    rows = np.arange(K)[:, None]  # plain fancy indexing: put_along_axis builds the same index at twice the cost
    out[rows, f_at] = f_keys
    out[rows, b_at] = b_keys
    return out


def flush_iterations(cfg: PipelineConfig, *, name: str, order: DeviceOrder | None = None,
                     grid: Callable[[int], np.ndarray] | None = None,
                     placement: Sequence[int] | None = None) -> Schedule:
    """cfg.iterations iterations back to back, each ending with a flush and one update per stage.

    The first iteration's order comes from *grid(M)* (a K x L array of keys, every device at once)
    or from *order(device, range(M))* (one device's keys; or its keys and the positions where overlapped
    (F, B) pairs start among them, as a tuple of two arrays; or its Actions, where a tuple (F, B) is an
    overlapped pair that runs as one unit). After its last backward of
    an iteration (the flush) every device updates each stage it holds, so the next iteration's
    forwards read the new weights.
    """
    K, M, N = cfg.devices, cfg.microbatches, cfg.iterations
    placement = tuple(range(K)) if placement is None else tuple(placement)
    S = len(placement)
    shift = microbatch_shift(M * np.arange(N, dtype=np.int64), S)  # iteration t: micro-batches moved by t*M
    if grid is not None and placement == tuple(range(K)):  # one stage per device: every device at once
        body = np.asarray(grid(M))[:, None, :] + shift[None, :, None]  # K x N x L
        updates = stage_keys(np.arange(K)[:, None, None], OP_U, np.arange(N)[None, :, None], S)  # U(d, t)
        runs = np.concatenate([body, updates], axis=2).reshape(K, -1)
        return Schedule.from_keys(name=name, devices=K, microbatches=M, iterations=N, placement=placement,
                                  keys=runs.ravel(), device_start=np.arange(K + 1, dtype=np.int64) * runs.shape[1])
    mbs = range(M)
    first, pairs = [], []  # per device: iteration 0's keys, and where its overlapped pairs start
    rows = None if grid is None else np.asarray(grid(M))
    for d in range(K):
        acts = rows[d] if rows is not None else order(d, mbs)
        if isinstance(acts, np.ndarray):
            first.append(acts)
            pairs.append(np.zeros(0, dtype=np.int64))
        elif isinstance(acts, tuple):  # keys, and where the overlapped pairs start among them
            first.append(acts[0])
            pairs.append(acts[1])
        else:
            flat, at = _flatten_pairs(acts)
            first.append(encode_actions(flat, S))
            pairs.append(at)
    stages_on: list[list[int]] = [[] for _ in range(K)]  # device -> its stages, in stage order (one pass: no K x S)
    for s, d in enumerate(placement):
        stages_on[d].append(s)
    runs, fused, offset = [], [], 0
    for d in range(K):
        body = first[d][None, :] + shift[:, None]  # N x L
        updates = stage_keys(np.asarray(stages_on[d])[None, :], OP_U, np.arange(N)[:, None], S)  # U(s, t)
        run = np.concatenate([body, updates], axis=1)
        if len(pairs[d]):
            fused.append((offset + run.shape[1] * np.arange(N)[:, None] + pairs[d][None, :]).ravel())
        runs.append(run.ravel())
        offset += run.size
    device_start = np.zeros(K + 1, dtype=np.int64)
    np.cumsum([len(r) for r in runs], out=device_start[1:])
    keys = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
    return Schedule.from_keys(name=name, devices=K, microbatches=M, iterations=N, placement=placement, keys=keys,
                              device_start=device_start, fused=np.concatenate(fused) if fused else None)


def _flatten_pairs(order: Sequence) -> tuple[list[Action], np.ndarray]:
    """An order whose items are Actions or overlapped (F, B) pairs -> the Actions, and where each pair starts."""
    flat: list[Action] = []
    starts = []
    for item in order:
        if isinstance(item, tuple):
            starts.append(len(flat))
            flat.extend(item)
        else:
            flat.append(item)
    return flat, np.asarray(starts, dtype=np.int64)


def forward_backward_grid(K: int, M: int, f_at: np.ndarray, b_at: np.ndarray) -> np.ndarray:
    """K x 2M keys of one stage per device: F(d, j) at f_at[d, j], B(d, j) at b_at[d, j]."""
    stage = np.arange(K)[:, None]
    j = np.arange(M)[None, :]
    f_keys = stage_keys(stage, OP_F, j, K)  # K x M (a column of stages by a row of micro-batches)
    return interleave(f_keys, f_keys + (OP_B - OP_F), np.broadcast_to(f_at, (K, M)), np.broadcast_to(b_at, (K, M)))
