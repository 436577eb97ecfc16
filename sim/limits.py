"""Refuse, before any work, a run that would not fit in memory.

A schedule of n actions costs about :data:`BYTES_PER_ACTION` bytes at its peak, generated,
checked and simulated with links and memory (measured: K=256, M=8192 1F1B, 4.2 M actions,
peaks at ~1.55 GiB resident including the interpreter, ~370 B per action; see
``benchmarks/bench_simulator.py``). The discrete-event engine (simpy, used for ``--jitter``)
holds an event object, a generator frame and dictionary entries per action on top of that:
:data:`SIMPY_BYTES_PER_ACTION`. Asking for more than the machine has available ends,
minutes later, in a MemoryError or the kernel's OOM killer; we say so in one line first.

"Available" is the least of what the system has free (``MemAvailable``), what this process's
control group may still use (a container's or a CI job's memory limit, cgroup v2 ``memory.max``
or v1 ``memory.limit_in_bytes``, less its current use) and what its address-space limit
(``ulimit -v``, RLIMIT_AS) leaves: on a shared CI runner the machine's free memory says nothing
about the job's own limit.
"""

from __future__ import annotations

import os

from sim.errors import PipesimError

__all__ = ["TooLargeError", "BYTES_PER_ACTION", "SIMPY_BYTES_PER_ACTION", "available_memory", "check_fits"]

BYTES_PER_ACTION = 400
"""Peak bytes per action of generate + validate + simulate (arrays only; the DataFrame timeline, built
on demand, adds ~150 B per row)."""

SIMPY_BYTES_PER_ACTION = 2_600
"""Peak bytes per action of the simpy engine, on top of the plan it runs (measured with --jitter 0.1, 1F1B:
K=64 M=512 and K=64 M=2048 peak at 147 MB and 595 MB resident, ~2.3 kB per added action; ~2.6 kB with margin)."""

SMALL_ACTIONS = 100_000
"""Below this many actions (~40 MB) the check is skipped."""

_UNLIMITED = 1 << 60  # what cgroups write for "no limit" is 2**63 - 4096 (v1) or "max" (v2)


class TooLargeError(PipesimError):
    """A run that would need more memory than the machine has available."""


def available_memory() -> int | None:
    """Bytes this process can still be given now (module docstring), or None if unknown."""
    found = [v for v in (_mem_available(), _cgroup_room(), _address_space_room()) if v is not None]
    return max(0, min(found)) if found else None


def _mem_available() -> int | None:
    """The system's MemAvailable (Linux), else free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2's no limit) reads as None


def _cgroup_room() -> int | None:
    """Limit minus usage of this process's memory control group (cgroups(7): v2 ``memory.max`` and
    ``memory.current``; v1 ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``), or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    folders = []
    for line in lines:  # "0::/path" (v2) or "4:memory:/path" (v1)
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            folders.append(("/sys/fs/cgroup" + path.rstrip("/"), "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            folders.append(("/sys/fs/cgroup/memory" + path.rstrip("/"), "memory.limit_in_bytes",
                            "memory.usage_in_bytes"))
    rooms = []
    for folder, limit_name, usage_name in folders:
        root = folder[:len("/sys/fs/cgroup/memory")] if "limit_in_bytes" in limit_name else "/sys/fs/cgroup"
        for base in dict.fromkeys((folder, root)):  # in a container the group's folder is often the mount's root
            limit = _read_int(f"{base}/{limit_name}")
            if limit is None or limit >= _UNLIMITED:
                continue
            rooms.append(limit - (_read_int(f"{base}/{usage_name}") or 0))
            break
    return min(rooms) if rooms else None


def _address_space_room() -> int | None:
    """RLIMIT_AS (``ulimit -v``) less this process's virtual size, or None without such a limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    except (OSError, ValueError):
        size = 0
    return soft - size


def check_fits(actions: int, what: str, *, available: int | None = None,
               bytes_per_action: int = BYTES_PER_ACTION) -> None:
    """Raise :class:`TooLargeError` if *actions* actions would not fit in the available memory.

    *what* names the run in the message (e.g. ``"1f1b with K=1024, M=65536"``); *bytes_per_action*: what
    each action costs at the peak (:data:`BYTES_PER_ACTION`; :data:`SIMPY_BYTES_PER_ACTION` for simpy).
    """
    if actions * bytes_per_action < SMALL_ACTIONS * BYTES_PER_ACTION and available is None:
        return  # a few MB: not worth reading /proc on every simulation of a sweep
    available = available_memory() if available is None else available
    if available is None:
        return
    needed = actions * bytes_per_action
    if needed > available:
        fits = available // bytes_per_action
        raise TooLargeError(
            f"{what} has about {actions:,} actions and needs ~{needed / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB available; use fewer micro-batches, devices or iterations "
            f"(up to ~{fits:,} actions fit here), or a machine with more memory")
