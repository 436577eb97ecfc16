"""Putting every rank's trace on one clock. Needs no torch.

Each trace's times are microseconds after its own ``baseTimeNanoseconds``; the first step
is to add ``(base_r - base_0) / 1000`` so that all ranks count from rank 0's base. On one
host that is all: the processes read the same system clock.

Across hosts the clocks differ by an unknown offset. Matched messages bound it (the
causality argument of Lamport 1978 and of NTP's offset estimate, Mills, RFC 5905 sec. 8):
a message from rank a to rank b cannot complete before it was posted, so with
``off_b - off_a = delta``::

    complete_b + off_b >= send_a + off_a      =>  delta >= max(send_a - complete_b)   (messages a -> b)
    complete_a + off_a >= send_b + off_b      =>  delta <= min(complete_a - send_b)   (messages b -> a)

A pipeline sends activations one way and gradients the other, so both bounds exist
between neighbours. The estimate is the midpoint (it assumes equal latency both ways),
its uncertainty half the interval's width; ranks are reached from rank 0 along pairs that
exchanged messages both ways, and uncertainties add up along the path. On one host the
same bounds are a check: a bound that excludes 0 means a message completed before it was
sent, i.e. the ranks did not share a clock.

Units: microseconds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.errors import PipesimError

__all__ = ["ClockError", "ClockAlignment", "align_clocks", "CLOCK_MODES"]

CLOCK_MODES = ("auto", "shared", "pairs")
"""auto: one shared clock when every trace names the same host, else pairs; shared; pairs (align by messages)."""

_TOLERANCE_US = 1.0
"""Slack for 'completed before sent' on a shared clock (timestamps are rounded to ~1 us)."""


class ClockError(PipesimError):
    """Ranks whose clocks cannot be put on one time axis."""


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    """Offsets to add to each rank's (base-adjusted) times to read them on rank 0's clock."""

    offsets: tuple[float, ...]
    """Microseconds, per rank; 0 for rank 0."""
    uncertainty: tuple[float, ...]
    """± microseconds, per rank (0 on a shared clock)."""
    shared: bool
    method: str
    violations: int = 0
    """Messages that completed before they were sent, after alignment (beyond 1 us)."""
    notes: list[str] = field(default_factory=list)


def align_clocks(pairs: Sequence[tuple[int, int, float, float]], ranks: int, *, shared: bool) -> ClockAlignment:
    """Offsets from matched messages ``(src, dst, send_start, complete)`` (base-adjusted microseconds).

    *shared*: the ranks read one clock (one host): offsets are 0 and the pairs only check it.
    Raises :class:`ClockError` when *shared* is False and a rank cannot be reached from rank 0.
    """
    lower: dict[tuple[int, int], float] = {}  # (a, b) -> lower bound of off_b - off_a
    for src, dst, sent, complete in pairs:
        bound = sent - complete
        key = (src, dst)
        lower[key] = max(lower.get(key, -math.inf), bound)
    if shared:
        offsets = [0.0] * ranks
        notes = []
    else:
        offsets, unc, notes = _from_bounds(lower, ranks)
    violations = sum(1 for src, dst, sent, complete in pairs
                     if complete + offsets[dst] < sent + offsets[src] - _TOLERANCE_US)
    if shared:
        if violations:
            notes.append(f"{violations} message(s) completed before they were sent on the shared clock: the ranks do "
                         f"not share a clock; use --clock pairs")
        return ClockAlignment(tuple(offsets), (0.0,) * ranks, True, "one host: every rank read the same clock",
                              violations, notes)
    method = ("clocks aligned by matched send/receive pairs (midpoint of the causality bounds), uncertainty up to "
              f"{max(unc):.0f} us")
    return ClockAlignment(tuple(offsets), tuple(unc), False, method, violations, notes)


def _from_bounds(lower: dict[tuple[int, int], float], ranks: int):
    offsets = [math.nan] * ranks
    unc = [math.nan] * ranks
    offsets[0], unc[0] = 0.0, 0.0
    notes = []
    queue = deque([0])
    while queue:
        a = queue.popleft()
        for b in range(ranks):
            if not math.isnan(offsets[b]) or (a, b) not in lower or (b, a) not in lower:
                continue
            lo, hi = lower[(a, b)], -lower[(b, a)]  # delta = off_b - off_a in [lo, hi]
            if lo > hi:
                notes.append(f"ranks {a} and {b}: the message bounds contradict each other by {lo - hi:.0f} us "
                             f"(clock drift during the trace?); took the midpoint")
            offsets[b] = offsets[a] + (lo + hi) / 2
            unc[b] = unc[a] + abs(hi - lo) / 2
            queue.append(b)
    lost = [r for r in range(ranks) if math.isnan(offsets[r])]
    if lost:
        raise ClockError(f"cannot put rank(s) {lost} on rank 0's clock: they exchanged no messages in both directions "
                         f"with an aligned rank; if every rank ran on one host, use --clock shared")
    return offsets, unc, notes
