"""Local search over per-device orders, every candidate timed by the exact engine.

The greedy orders of :mod:`sim.search.synthesis_greedy` are timed with the problem's simple model (no link
contention, no rendezvous); this search starts from the best of them and improves it with moves whose every
result is simulated by :func:`sim.simulate` (the fast, compiled list scheduler) and checked against the memory
model, so a move is kept only if the exact makespan goes down (or stays and the devices finish sooner in sum,
which lets the search cross plateaus) and no device goes over its cap.

Moves (the zero-bubble paper, section 3.1, adjusts W placement the same way after its greedy pass; the swaps
are the classic neighbourhood of list scheduling):

- **W moves**: take one W and put it k positions earlier or later on its device (never before its own B);
- **adjacent swaps**: exchange two neighbouring actions of a device (never an action and its own
  prerequisite on that device). Swaps near the device that ends last are tried first, since only they can
  shorten the makespan.

A move that deadlocks (the engine stalls) or breaks the cap is undone. When a full pass finds nothing better, the
best order so far is kicked (a few random swaps, an iterated local search) and the climb starts again from there;
the search stops after a number of evaluations or its time budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.core.ir import OP_B, OP_F, OP_R, OP_W, key_kind, key_mb, key_stage
from sim.search.synthesis_greedy import Order

__all__ = ["Score", "improve"]


@dataclass(frozen=True, slots=True)
class Score:
    """What the search minimises, lexicographically: the makespan; then the longest device span (first start to
    last end: the cost in the zero-bubble paper's bubble rate, section 5.1, which its scheduler minimises), then
    the sum of device end times (a tie-breaker that lets the search cross plateaus). With :attr:`span_first`, the
    span before the makespan."""

    makespan: float
    span: float
    ends: float
    span_first: bool = False
    """True: the longest device span comes first, then the makespan (the zero-bubble paper's objective: its ILP
    minimises the longest stage's execution time, section 3 and appendix; its bubble rate, section 5.1, measures
    that cost). Scores compared are of one objective."""

    def _key(self, other: Score) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Both scores with float noise between them removed: values within 1e-9 (relative) count as equal, so
        that rounding in a sum of costs never outranks the next criterion."""
        mine, theirs = [], []
        pairs = [(self.makespan, other.makespan), (self.span, other.span), (self.ends, other.ends)]
        if self.span_first:
            pairs[0], pairs[1] = pairs[1], pairs[0]
        for a, b in pairs:
            same = abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)
            mine.append(b if same else a)
            theirs.append(b)
        return tuple(mine), tuple(theirs)

    def __lt__(self, other: Score) -> bool:
        mine, theirs = self._key(other)
        return mine < theirs

    def __le__(self, other: Score) -> bool:
        mine, theirs = self._key(other)
        return mine <= theirs


Evaluate = Callable[[Order], "Score | None"]
"""An order -> its exact score, or None if it deadlocks or goes over the cap."""


def _depends_on_device(later: int, earlier: int, stages: int) -> bool:
    """Whether action *later* needs action *earlier* (both on one device) to have run first."""
    if key_mb(later, stages) != key_mb(earlier, stages):
        return False
    sl, kl = key_stage(later, stages), key_kind(later)
    se, ke = key_stage(earlier, stages), key_kind(earlier)
    if sl == se:  # within a stage: F -> R -> B -> W
        rank = {OP_F: 0, OP_R: 1, OP_B: 2, OP_W: 3}
        return rank.get(ke, 9) < rank.get(kl, 9)
    # across stages on one device (a V): F(s) before F(s+1), B(s+1) before B(s), F before any B
    if kl == OP_F and ke == OP_F:
        return se < sl
    if kl in (OP_B, OP_W, OP_R) and ke == OP_F:
        return True
    if kl in (OP_B, OP_W) and ke in (OP_B, OP_W):
        return se > sl
    return False


def improve(order: Order, score: Score, evaluate: Evaluate, *, stages: int, max_evals: int = 2000,
            seconds: float = 10.0, seed: int = 0) -> tuple[Order, Score, int]:
    """Iterated local search from *order* (whose exact score is *score*): hill-climb until a full pass finds no
    better neighbour, then kick the best order found (a few random moves that keep each device's own
    dependencies) and climb again, until the budget is spent. Returns the best order, its score and the
    evaluations spent."""
    rng = np.random.default_rng(seed)
    deadline = time.perf_counter() + seconds
    best, best_score = [list(row) for row in order], score
    current, current_score = best, best_score
    evals = 0
    while evals < max_evals and time.perf_counter() < deadline:
        current, current_score, spent = _climb(current, current_score, evaluate, stages=stages, rng=rng,
                                               max_evals=max_evals - evals, deadline=deadline)
        evals += spent
        if current_score < best_score:
            best, best_score = current, current_score
        for _ in range(20):  # a kick whose orders the engine runs (a random move may deadlock across devices)
            if evals >= max_evals or time.perf_counter() >= deadline:
                break
            kicked = _kick(best, stages, rng)
            evals += 1
            got = evaluate(kicked)
            if got is not None:
                current, current_score = kicked, got
                break
        else:
            break  # no kick runs: the neighbourhood of the best is exhausted
    return best, best_score, evals


def _climb(order: Order, score: Score, evaluate: Evaluate, *, stages: int, rng, max_evals: int,
           deadline: float) -> tuple[Order, Score, int]:
    """First-improvement hill climbing over W moves and adjacent swaps until a pass finds nothing better."""
    best, evals = order, 0

    def attempt(candidate: Order) -> bool:
        nonlocal best, score, evals
        evals += 1
        got = evaluate(candidate)
        if got is not None and got < score:
            best, score = candidate, got
            return True
        return False

    improved = True
    while improved and evals < max_evals and time.perf_counter() < deadline:
        improved = False
        for d, i, j in _w_moves(best, stages, rng):
            if evals >= max_evals or time.perf_counter() >= deadline:
                break
            candidate = [list(row) for row in best]
            row = candidate[d]
            row.insert(j, row.pop(i))
            if attempt(candidate):
                improved = True
        for d, i in _swaps(best, stages, rng):
            if evals >= max_evals or time.perf_counter() >= deadline:
                break
            candidate = [list(row) for row in best]
            row = candidate[d]
            row[i], row[i + 1] = row[i + 1], row[i]
            if attempt(candidate):
                improved = True
    return best, score, evals


def _kick(order: Order, stages: int, rng, moves: int = 4) -> Order:
    """*order* after a few random adjacent swaps that keep each device's own dependencies (2 to *moves*)."""
    out = [list(row) for row in order]
    for _ in range(int(rng.integers(2, moves + 1))):
        d = int(rng.integers(len(out)))
        row = out[d]
        if len(row) < 2:
            continue
        i = int(rng.integers(len(row) - 1))
        if not _depends_on_device(row[i + 1], row[i], stages):
            row[i], row[i + 1] = row[i + 1], row[i]
    return out


def _w_moves(order: Order, stages: int, rng) -> list[tuple[int, int, int]]:
    """(device, from, to) moves of W's by 1..3 positions either way, never before their own B, shuffled."""
    moves = []
    for d, row in enumerate(order):
        for i, key in enumerate(row):
            if key_kind(key) != OP_W:
                continue
            for step in (-3, -2, -1, 1, 2, 3):
                j = i + step
                if not 0 <= j < len(row):
                    continue
                lo, hi = min(i, j), max(i, j)
                # moving earlier past its own prerequisite is a deadlock the engine would report: skip it here
                if step < 0 and any(_depends_on_device(key, row[k], stages) for k in range(lo, hi)):
                    continue
                moves.append((d, i, j))
    rng.shuffle(moves)
    return moves


def _swaps(order: Order, stages: int, rng) -> list[tuple[int, int]]:
    """(device, i): swap positions i and i+1 of a device, where neither needs the other; shuffled."""
    swaps = []
    for d, row in enumerate(order):
        for i in range(len(row) - 1):
            if not _depends_on_device(row[i + 1], row[i], stages):
                swaps.append((d, i))
    rng.shuffle(swaps)
    return swaps
