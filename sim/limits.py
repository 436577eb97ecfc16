"""Refuse, before any work, a run that would not fit in memory.

A schedule of n actions costs about :data:`BYTES_PER_ACTION` bytes at its peak, generated,
checked and simulated with links and memory (measured: K=256, M=8192 1F1B, 4.2 M actions,
peaks at ~1.55 GiB resident including the interpreter, ~370 B per action; see
``benchmarks/bench_simulator.py``). Asking for more than the machine has available ends,
minutes later, in a MemoryError or the kernel's OOM killer; we say so in one line first.
"""

from __future__ import annotations

import os

from sim.errors import PipesimError

__all__ = ["TooLargeError", "BYTES_PER_ACTION", "available_memory", "check_fits"]

BYTES_PER_ACTION = 400
"""Peak bytes per action of generate + validate + simulate (arrays only; the DataFrame timeline, built
on demand, adds ~150 B per row)."""


SMALL_ACTIONS = 100_000
"""Below this many actions (~40 MB) the check is skipped."""


class TooLargeError(PipesimError):
    """A run that would need more memory than the machine has available."""


def available_memory() -> int | None:
    """Bytes the system can give this process now (Linux: MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(actions: int, what: str, *, available: int | None = None) -> None:
    """Raise :class:`TooLargeError` if *actions* actions would not fit in the available memory.

    *what* names the run in the message (e.g. ``"1f1b with K=1024, M=65536"``).
    """
    if actions < SMALL_ACTIONS and available is None:
        return  # a few MB: not worth reading /proc on every simulation of a sweep
    available = available_memory() if available is None else available
    if available is None:
        return
    needed = actions * BYTES_PER_ACTION
    if needed > available:
        fits = available // BYTES_PER_ACTION
        raise TooLargeError(
            f"{what} has about {actions:,} actions and needs ~{needed / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB available; use fewer micro-batches, devices or iterations "
            f"(up to ~{fits:,} actions fit here), or a machine with more memory")
