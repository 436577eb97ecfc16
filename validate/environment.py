"""The machine a validation runs on: workload sizes worth measuring, core pinning, load average.

- :func:`size_workload`: on CPU a forward of the default mlp stage takes well under a
  millisecond, so a makespan of such actions mostly measures OS scheduling. Unless the
  user gave sizes, the stage is grown (width / d_model, then batch or sequence, doubling
  in turn) until one forward takes at least ``target`` seconds (default 10 ms), timed
  here with the rank's thread count.
- :func:`pinning`: rank r on core r when K <= the usable cores (``os.sched_getaffinity``);
  otherwise no pinning and a warning that real workloads then time-share cores.
- :func:`load_average`: the 1-minute load average; :func:`cpu_snapshot` / :func:`cpu_share`: the
  CPU seconds of the whole machine against those of the launch itself, so that a warning blames
  other work only for what other work did (:func:`load_warning`).
- :func:`check_memory`: refuse, before anything is built, a run that would not fit this machine's
  memory (K ranks of :data:`RANK_BYTES` each plus the model's weights).

Units: seconds, bytes.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace

from sim import limits

from validate.errors import ValidationError
from validate.request import CpuShare, WorkloadSpec

__all__ = ["size_workload", "SIZE_FIELDS", "usable_cores", "pinning", "load_average", "load_warning",
           "PROBE_TARGET", "RANK_BYTES", "available_memory", "workload_bytes", "check_memory", "cpu_snapshot",
           "cpu_share", "OTHER_WORK_SHARE"]

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


OTHER_WORK_SHARE = 0.25
"""Other work is blamed when it used more than this share of the machine's CPU time while the ranks ran."""


def load_warning(before: float, after: float, cpu: CpuShare | None = None) -> str | None:
    """A line for the report when the machine was busy; *cpu*: what the launch itself used (then other work is
    blamed only for the CPU time it took, not for the load the run's own ranks made).

    Without *cpu* (not measured) a load average above the cores is all there is to go by.
    """
    cores = len(usable_cores())
    worst = max(before, after)
    if cpu is None or cpu.wall <= 0:
        if worst > cores:
            return (f"WARNING: 1-minute load average {before:.2f} before, {after:.2f} after the run, above the {cores} "
                    f"usable core(s): other work competed for the cores, expect noise")
        return None
    capacity = cpu.wall * cores
    if cpu.other > OTHER_WORK_SHARE * capacity:
        return (f"WARNING: other work used {cpu.other:.1f} CPU-s of the {capacity:.1f} CPU-s the {cores} core(s) had "
                f"while the ranks ran ({cpu.other / capacity:.0%}; this run itself used {cpu.own:.1f}): it competed "
                f"for the cores, expect noise")
    if worst > cores:
        # the load average lags by minutes and counts this run's own ranks: the CPU seconds say who competed
        return (f"1-minute load average {before:.2f} before, {after:.2f} after the run, above the {cores} usable "
                f"core(s), but while the ranks ran other work used only {cpu.other:.1f} of the {capacity:.1f} CPU-s "
                f"({cpu.other / capacity:.0%}); this run itself used {cpu.own:.1f}: not blamed on other work")
    return None


def cpu_snapshot() -> tuple[float, float, float] | None:
    """(monotonic seconds, CPU seconds of every process of the machine, CPU seconds of this process and its
    waited-for children); None where ``/proc/stat`` cannot be read (not Linux).

    The machine's CPU time is the ``cpu`` line of ``/proc/stat`` (proc(5)): user + nice + system + irq +
    softirq, idle, iowait and steal (time the hypervisor gave to other guests) left out.
    """
    import resource
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    machine = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        own += usage.ru_utime + usage.ru_stime
    return time.monotonic(), machine, own


def cpu_share(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> CpuShare | None:
    """What the machine and this process (with its children, once waited for) used between two snapshots."""
    if before is None or after is None:
        return None
    return CpuShare(wall=after[0] - before[0], machine=after[1] - before[1], own=after[2] - before[2])


RANK_BYTES = 310 * 2**20
"""Resident memory of one rank before its model's weights: Python with torch and gloo loaded, the process
groups set up. Measured on the 2-core VM (torch 2.13 CPU): 302-303 MiB per rank of ``validate -s gpipe -K 4
-M 8 --workload emulated`` (RSS from ``ps``); issue 26 saw 5.1 GB for K=17, 300 MB per rank."""
WEIGHT_COPIES = 12
"""Copies of a stage's float32 weights a validation holds at its peak, counted: on the rank the module's
own, version 0, the current and the next version, the accumulated gradient and the first timed run's logs
of gradient and weights (6); in the launcher the float64 reference's weights, gradient and next version
(3 x 2 for the width)."""
MAX_DEPTH = 4096
"""Layers per stage at most: every layer is a Python module call per action, so far beyond this an action
measures the interpreter, and building the modules alone takes minutes (issue 26: ``--depth 1000000``)."""


def available_memory() -> int | None:
    """Bytes this process can still be given (:func:`sim.limits.available_memory`: the least of MemAvailable, the
    control group's room and ``ulimit -v``); None if unknown."""
    return limits.available_memory()


def workload_bytes(spec: WorkloadSpec) -> int:
    """Bytes of one stage's float32 weights, from the sizes alone (nothing is built). The emulated workload
    and the user's model (built, and so measured, by its own pre-check) count 0 here."""
    if spec.name == "mlp":  # depth x Linear(width, width): weight and bias
        params = spec.depth * (spec.width * spec.width + spec.width)
    elif spec.name == "transformer":  # per layer: attention 4 d^2 + 4 d, feed-forward 8 d^2 + 5 d, 2 LayerNorms 4 d
        params = spec.depth * (12 * spec.d_model ** 2 + 13 * spec.d_model)
    else:
        return 0
    return 4 * params


def check_memory(spec: WorkloadSpec, devices: int, stages: int) -> None:
    """Refuse a run of *devices* ranks and *stages* stages that would not fit this machine's memory, or whose
    stages are absurdly deep, before anything is built (:class:`ValidationError`, one line)."""
    if spec.name in ("mlp", "transformer") and spec.depth > MAX_DEPTH:
        raise ValidationError(f"--depth {spec.depth} is more than {MAX_DEPTH} layers per stage: each layer is a "
                              f"Python call per action, and building them alone would take minutes; give at most "
                              f"{MAX_DEPTH}")
    available = available_memory()
    if available is None:
        return
    ranks = devices * RANK_BYTES
    weights = stages * WEIGHT_COPIES * workload_bytes(spec)
    need = ranks + weights
    if need > available:
        gib = 2**30
        parts = f"{devices} ranks x {RANK_BYTES / 2**20:.0f} MiB" + (
            f" + {weights / gib:.1f} GiB for {stages} stages' weights ({WEIGHT_COPIES} copies of "
            f"{workload_bytes(spec) / gib:.2g} GiB)" if weights else "")
        fit = max(1, int(available // RANK_BYTES)) if not weights else None
        hint = (f"at most about {fit} ranks fit" if fit is not None
                else "lower --depth, --width or --d-model, or -K")
        raise ValidationError(f"this validation would need about {need / gib:.1f} GiB ({parts}), more than the "
                              f"{available / gib:.1f} GiB of memory available on this machine; {hint}")
