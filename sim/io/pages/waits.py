"""What each action waited for: the idle time of its device just before it, split into dependency,
communication and gap, by the rules of ``validate/compare/idle.py`` (its module docstring defines them), per
action instead of per device:

- dependency: until every input of the action had been *computed* (the schedule's own bubble);
- communication: then until every input had *arrived* (the transfer rows), plus any further time the device
  spent inside a communication call or with a send pending that its runtime waits for mid-step (*comm_spans*:
  a trace's ``Ingested.communication``, a prediction's ``ProgramRun.communication``, the one rule of idle.py;
  for a simulation without overlap, its own sends);
- gap: the rest (runtime overhead; a simulation has none).

Each action's inputs are the schedule's dependencies (:attr:`sim.core.compiled.Compiled.flat`; an overlapped
pair waits for the inputs of both halves, as the engines run it). Per device, the sums of these arrays plus
the drain after the last computation equal validate.compare.idle.split_idle's (``tests/test_pages.py``).
Vectorised with numpy: a 64-rank run of 1,024 micro-batches takes well under a second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.keys import NUM_KINDS, OP_B, OP_F, OP_SEND_F
from sim.results.result import Result
from sim.results.timeline import TimelineRows

__all__ = ["ActionWaits", "action_waits"]


@dataclass(frozen=True, slots=True)
class ActionWaits:
    """Seconds waited before each computation row (in the order the caller gave), by category."""

    dependency: np.ndarray
    communication: np.ndarray
    gap: np.ndarray


def action_waits(result: Result, rows: TimelineRows, comp: np.ndarray,
                 comm_spans: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> ActionWaits:
    """The waits before the computation rows *comp* (indices into *rows*, sorted by device, then start)."""
    schedule = result.schedule
    S = schedule.stages
    flat = schedule.compiled.flat
    n = len(flat.keys)
    device, start, end = rows.device[comp], rows.start[comp], rows.end[comp]
    keys = (rows.microbatch[comp] * S + rows.stage[comp]) * NUM_KINDS + rows.op[comp]
    # key -> flat position, and each flat position's end as the timeline has it (-inf: no row, not waited for)
    index = np.full(int(max(flat.keys.max(initial=0), keys.max(initial=0))) + 1, -1, dtype=np.int64)
    index[flat.keys] = np.arange(n)
    pos = index[keys]
    done = np.full(n, -np.inf)
    done[pos[pos >= 0]] = end[pos >= 0]
    # arrivals: a transfer row carries its producer's result (SEND_F: the F, SEND_B: the B) to dst
    sent = np.flatnonzero(~rows.computing & (rows.op >= OP_SEND_F))
    arrive = done.copy()  # no transfer row: the result counts as there when computed
    if len(sent):
        kind = np.where(rows.op[sent] == OP_SEND_F, OP_F, OP_B)
        producer = index[np.minimum((rows.microbatch[sent] * S + rows.stage[sent]) * NUM_KINDS + kind,
                                    len(index) - 1)]
        ok = producer >= 0
        latest = np.full(n, -np.inf)
        np.maximum.at(latest, producer[ok], rows.end[sent][ok])
        arrive = np.where(latest > -np.inf, np.maximum(latest, done), done)
    # per computation: the latest input computed, and the latest arrived (local inputs arrive when computed)
    valid = pos >= 0
    p = np.where(valid, pos, 0)
    counts = np.where(valid, flat.dep_start[p + 1] - flat.dep_start[p], 0)
    slot = flat.dep_slot[np.repeat(np.where(valid, flat.dep_start[p], 0), counts)
                         + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)]
    producer = np.where(slot >= n, slot - n, slot)
    owner = np.repeat(np.arange(len(comp)), counts)
    computed_in = np.full(len(comp), -np.inf)
    arrived_in = np.full(len(comp), -np.inf)
    np.maximum.at(computed_in, owner, done[producer])
    np.maximum.at(arrived_in, owner, np.where(slot >= n, arrive[producer], done[producer]))
    # the end of the device's latest computation before each row (0 before its first)
    previous = np.concatenate([[0.0], end[:-1]])
    first = np.concatenate([[True], device[1:] != device[:-1]])
    previous[first] = 0.0
    free = _running_max_per_device(previous, first)
    waited = start > free
    computed = np.minimum(np.maximum(free, computed_in), start)
    arrived = np.minimum(np.maximum(np.maximum(free, arrived_in), computed), start)
    dependency = np.where(waited, computed - free, 0.0)
    communication = np.where(waited, arrived - computed, 0.0)
    inside = np.zeros(len(comp))
    spans = _sends_as_calls(result, rows) if comm_spans is None and not result.hardware.overlap else comm_spans
    for d, intervals in (spans or {}).items():
        on = np.flatnonzero((device == d) & waited)
        if len(on) and len(intervals):
            inside[on] = _covered(intervals, arrived[on], start[on])
    return ActionWaits(dependency=dependency, communication=communication + inside,
                       gap=np.where(waited, start - arrived - inside, 0.0))


def _running_max_per_device(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running maximum of *values*, restarting where *first* is True (one numpy call per device: exact floats)."""
    out = np.empty_like(values)
    bounds = np.append(np.flatnonzero(first), len(values))
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        out[a:b] = np.maximum.accumulate(values[a:b])
    return out


def _sends_as_calls(result: Result, rows: TimelineRows) -> dict[int, list[tuple[float, float]]]:
    """Without overlap a sending device is busy sending: its transfers count as communication calls."""
    sent = np.flatnonzero(~rows.computing)
    out: dict[int, list[tuple[float, float]]] = {}
    for src, a, b in zip(rows.src[sent].tolist(), rows.start[sent].tolist(), rows.end[sent].tolist()):
        out.setdefault(src, []).append((a, b))
    return out


def _covered(intervals: Sequence[tuple[float, float]], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of each [a, b] covered by the union of *intervals*: through the union's cumulative length."""
    spans = sorted((lo, hi) for lo, hi in intervals if hi > lo)
    merged: list[list[float]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    lo = np.array([m[0] for m in merged])
    hi = np.array([m[1] for m in merged])
    before = np.concatenate([[0.0], np.cumsum(hi - lo)])

    def cumulative(x: np.ndarray) -> np.ndarray:  # covered length in (-inf, x]
        i = np.searchsorted(lo, x, side="right")  # spans starting at or before x
        inside = np.where(i > 0, np.clip(x - lo[np.maximum(i - 1, 0)], 0.0, (hi - lo)[np.maximum(i - 1, 0)]), 0.0)
        return before[np.maximum(i - 1, 0)] * (i > 0) + inside

    return np.maximum(0.0, cumulative(b) - cumulative(a)) * (b > a)
