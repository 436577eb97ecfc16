"""The machine a validation runs on: workload sizes worth measuring, core pinning, load average.

- :func:`size_workload`: on CPU a forward of the default mlp stage takes well under a
  millisecond, so a makespan of such actions mostly measures OS scheduling. Unless the
  user gave sizes, the stage is grown (width / d_model, then batch or sequence, doubling
  in turn) until one forward takes at least ``target`` seconds (default 10 ms), timed
  here with the rank's thread count.
- :func:`pinning`: rank r on core r when K <= the usable cores (``os.sched_getaffinity``);
  otherwise no pinning and a warning that real workloads then time-share cores.
- :func:`load_average`: the 1-minute load average, and a warning when it exceeds the cores.

Units: seconds.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace

from validate.request import WorkloadSpec

__all__ = ["size_workload", "SIZE_FIELDS", "usable_cores", "pinning", "load_average", "load_warning",
           "PROBE_TARGET"]

PROBE_TARGET = 0.010
"""Seconds one stage forward should take at least, so that actions stand well above scheduling noise."""

SIZE_FIELDS = {"mlp": ("width", "depth", "batch"), "transformer": ("d_model", "heads", "seq", "depth", "batch")}
"""The sizes that, when any is given by the user, turn the probe off."""

_GROW = {"mlp": ("width", "batch"), "transformer": ("d_model", "seq", "batch")}
_LIMIT = {"width": 4096, "batch": 4096, "d_model": 2048, "seq": 2048}


def _forward_seconds(spec: WorkloadSpec, threads: int) -> float:
    import torch

    from validate.rank.workloads import build_stage_module, microbatch_data
    module = build_stage_module(spec, 0)
    x = microbatch_data(spec, 0)[0]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = []
        with torch.no_grad():
            for i in range(4):
                t0 = time.perf_counter()
                module(x)
                if i:  # the first call pays for allocation
                    times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(old)


def size_workload(spec: WorkloadSpec, *, threads: int = 1, target: float = PROBE_TARGET) -> tuple[WorkloadSpec, str]:
    """(*spec* grown until one forward takes >= *target* seconds, a note saying what was chosen)."""
    if spec.name not in _GROW:
        return spec, ""
    t = _forward_seconds(spec, threads)
    grow = _GROW[spec.name]
    turn = 0
    for _ in range(24):
        if t >= target:
            break
        grown = None
        for _ in grow:  # the next field still below its limit
            name = grow[turn % len(grow)]
            turn += 1
            if getattr(spec, name) * 2 <= _LIMIT[name]:
                grown = replace(spec, **{name: getattr(spec, name) * 2})
                break
        if grown is None:
            break
        spec = grown
        microbatch_cache_clear()
        t = _forward_seconds(spec, threads)
    sizes = ", ".join(f"{f}={getattr(spec, f)}" for f in SIZE_FIELDS[spec.name])
    return spec, (f"workload sized by a probe so one stage forward takes >= {target * 1e3:.0f} ms: {sizes} "
                  f"(forward {t * 1e3:.1f} ms on {threads} thread(s)); give any size option to choose yourself")


def microbatch_cache_clear() -> None:
    from validate.rank.workloads import microbatch_data
    microbatch_data.cache_clear()  # probe tensors of discarded sizes: free them


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def pinning(devices: int, backend: str) -> tuple[tuple[int, ...] | None, str]:
    """(cores to pin rank r to cores[r], or None; a note for the report)."""
    cores = usable_cores()
    if backend != "gloo":
        return None, ""
    if devices <= len(cores):
        return tuple(cores[:devices]), f"rank r pinned to core {', '.join(map(str, cores[:devices]))} (r = 0..{devices - 1})"
    return None, (f"WARNING: {devices} ranks on {len(cores)} usable core(s): ranks are not pinned and real workloads "
                  f"time-share cores, so measured times include waiting for a core")


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def load_warning(before: float, after: float) -> str | None:
    cores = len(usable_cores())
    worst = max(before, after)
    if worst > cores:
        return (f"WARNING: 1-minute load average {before:.2f} before, {after:.2f} after the run, above the {cores} "
                f"usable core(s): other work competed for the cores, expect noise")
    return None
