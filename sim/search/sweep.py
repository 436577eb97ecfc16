"""Parameter sweeps: every (schedule, K, M) combination as one tidy table, evaluated by :mod:`sim.search.batch`.

    from sim.search.sweep import run_sweep
    df = run_sweep(["gpipe", "1f1b"], [2, 4, 8], [1, 2, 4, 8, 16], costs={"forward": 1, "backward": 2}, jobs=2)

One row per configuration (:data:`SWEEP_COLUMNS`, units in :data:`SWEEP_UNITS`). Each row
records the inputs it was simulated with - shape, costs, hardware - so the CSVs of several
sweeps can be concatenated and still be told apart. A configuration that its schedule
rejects (a :class:`~sim.errors.PipesimError` such as ``ConfigError``: e.g. a schedule that
needs M >= K) becomes a row whose ``error`` column holds the first line of the message and
whose figures are empty (NaN); it never stops the sweep. ``error`` is always a string,
``''`` when the configuration ran; :func:`read_sweep` reads a sweep CSV back that way.

Units: times in seconds (as the costs), memory in bytes, throughput in samples/s.
Every simulation uses the fast engine (exact and deterministic; see :mod:`sim.simulate`); with *runtime*
``torch`` or ``megatron``, its list scheduler over the schedule lowered to that runtime's sends and receives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from sim.schedules import registry as generators
from sim import schedules as schedules_module
from sim.search.batch import Candidate, Evaluation, check_runtime, evaluate, resolve_chunks
from sim.schedules.closed_forms import closed_form_utilization
from sim.model.cost import COLUMNS as COST_FIELDS
from sim.model.cost import DISPATCH_COLUMNS
from sim.model.cost import StageCosts, uniform
from sim.errors import PipesimError
from sim.files import atomic_paths
from sim.limits import check_fits
from sim.model.hardware import Hardware
from sim.core.ir import Schedule

__all__ = ["run_sweep", "write_sweep_csv", "read_sweep", "SWEEP_COLUMNS", "SWEEP_UNITS", "SweepError"]

# column -> (unit, meaning). The order is the CSV's. Cost columns hold one device's share of the model per
# micro-batch (a chunk of a chunked schedule costs 1/chunks of it): with uniform costs exactly the --forward,
# --backward, ... values; with a costs file, the mean device (sum over stages / K; bytes sent per boundary and
# checkpoint bytes: the mean stage). Hardware columns: the slowest link (largest latency, smallest bandwidth).
SWEEP_UNITS: dict[str, tuple[str, str]] = {
    "schedule": ("", "schedule name (pipesim schedules)"),
    "devices": ("count", "K, pipeline devices"),
    "chunks": ("count", "model chunks per device"),
    "stages": ("count", "S = K x chunks"),
    "microbatches": ("count", "M, micro-batches per iteration"),
    "iterations": ("count", "N, iterations run back to back"),
    "recompute": ("bool", "activations re-materialized before each backward"),
    "microbatch_size": ("samples", "samples per micro-batch (throughput)"),
    "forward_s": ("s", "forward time per micro-batch, one device's share"),
    "backward_s": ("s", "input-gradient backward time per micro-batch, one device's share"),
    "weight_s": ("s", "weight-gradient time per micro-batch, one device's share"),
    "recompute_s": ("s", "recompute time per micro-batch, one device's share"),
    "update_s": ("s", "optimizer step time per iteration, one device's share"),
    "send_bytes": ("bytes", "activation bytes sent across a stage boundary per micro-batch"),
    "activation_bytes": ("bytes", "activation bytes kept per in-flight micro-batch, one device's share"),
    "checkpoint_bytes": ("bytes", "bytes kept per micro-batch with recompute, per stage"),
    "weight_bytes": ("bytes", "parameter bytes, one device's share"),
    "grad_bytes": ("bytes", "gradient bytes, one device's share"),
    "optimizer_bytes": ("bytes", "optimizer-state bytes, one device's share"),
    "costs_source": ("", "'uniform' (cost flags) or the costs file the row used"),
    "latency_s": ("s", "link latency (the slowest link)"),
    "bandwidth_bytes_per_s": ("bytes/s", "link bandwidth (the slowest link; inf: free)"),
    "overlap": ("bool", "transfers overlap computation"),
    "memory_capacity_bytes": ("bytes", "memory per device (empty: unlimited)"),
    "hardware_source": ("", "'flags' (link flags) or the hardware file the row used"),
    "runtime": ("", "the runtime model that executed the schedule (sim/model/runtimes.py): 'pipesim' (eager links, "
                    "the engines' own model), 'torch' or 'megatron' (that runtime's posting points, rendezvous links)"),
    "dispatch_s": ("s", "the runtime's own time before each action (dispatch overhead), the mean over stages and "
                        "kinds"),
    "post_overhead_s": ("s", "how long each posted batch of sends and receives holds its device"),
    "makespan": ("s", "first start to last end"),
    "utilization": ("fraction", "busy share of K x makespan"),
    "bubble_fraction": ("fraction", "1 - utilization (GPipe's bubble)"),
    "bubble_ratio": ("fraction", "idle / busy time (Megatron's bubble over ideal time)"),
    "closed_form_utilization": ("fraction", "the schedule's own formula for uniform stages on free links "
                                            "(sim.schedules.closed_forms); empty where it has none"),
    "throughput": ("samples/s", "micro-batches x iterations x microbatch_size / makespan"),
    "peak_memory": ("bytes", "most bytes held at once, the worst device"),
    "peak_memory_device": ("index", "which device that is"),
    "peak_inflight": ("count", "most micro-batches with activations held at once, the worst device"),
    "weight_versions": ("count", "most weight versions held at once, the worst device"),
    "memory_overflows": ("count", "devices over the memory capacity"),
    "error": ("", "'' when the configuration ran, else why its schedule rejected it"),
}
SWEEP_COLUMNS = list(SWEEP_UNITS)

# columns that hold numbers which do not add up over chunks: each chunk sends / checkpoints the full boundary
_PER_STAGE_FIELDS = ("send_bytes", "checkpoint_bytes")
_COST_COLUMN = {"forward": "forward_s", "backward": "backward_s", "weight": "weight_s", "recompute": "recompute_s",
                "update": "update_s"}

CostsSpec = StageCosts | Mapping[str, float] | Callable[[Schedule], StageCosts] | None
HardwareSpec = Hardware | Mapping[str, object] | Callable[[Schedule], Hardware] | None


class SweepError(PipesimError):
    """Sweep arguments that cannot run: unknown schedules, empty or non-positive lists, bad costs or hardware."""


def run_sweep(schedules: Sequence[str], devices: Sequence[int], microbatches: Sequence[int], *,
              iterations: int = 1, recompute: bool = False, chunks: int | None = None, costs: CostsSpec = None,
              hardware: HardwareSpec = None, microbatch_size: float = 1.0, jobs: int = 1,
              executor: str = "processes", progress: bool = True, costs_source: str = "uniform",
              hardware_source: str = "flags", runtime: str = "pipesim", post_overhead: float = 0.0) -> pd.DataFrame:
    """Simulate every combination of *schedules* x *devices* (K) x *microbatches* (M); one row each.

    *costs*: ``None`` for the classroom case (uniform stages, forward 1, backward 2); a mapping of
    :func:`sim.model.cost.uniform` keyword arguments (``{"forward": 1, "activation_bytes": 4e6}``), one
    device's share, applied to K devices and cut into each schedule's chunks; or a
    :class:`~sim.model.cost.StageCosts` used as is (rows whose stage count differs record the error); or a
    function ``schedule -> StageCosts`` (called here, once per configuration, on the generated schedule;
    a :class:`~sim.errors.PipesimError` it raises becomes that row's error).
    *hardware*: ``None`` (free links), a mapping of :class:`~sim.model.hardware.Hardware` keyword
    arguments other than ``devices`` (``{"latency": 1e-4, "bandwidth": 1e10}``), a ``Hardware``
    (rows whose K differs record the error), or a function ``schedule -> Hardware``.
    *chunks*: model chunks per device; ``None`` gives each schedule the number it is built for
    (:func:`sim.search.batch.resolve_chunks`), so V-shaped and classic schedules can share one sweep.
    *jobs*, *executor*: where the simulations run (:func:`sim.search.batch.evaluate`).
    *progress*: a tqdm bar on stderr, shown once the sweep runs longer than half a second.
    *costs_source*, *hardware_source*: recorded on every row (the CLI passes the file names).
    *runtime*, *post_overhead*: the runtime model every row is simulated with (:class:`sim.search.batch.Candidate`;
    its dispatch overhead is the costs' dispatch columns); the default gives the rows of a sweep without one,
    bit for bit.

    Mistakes that concern every row (an unknown schedule, a cost keyword that does not exist, a
    negative latency) raise :class:`SweepError` (or the typed error of the input) before any work.
    Rows come in the order schedule, then K, then M; columns are :data:`SWEEP_COLUMNS`.
    """
    schedules, devices, microbatches = list(schedules), list(devices), list(microbatches)
    for label, values in (("schedules", schedules), ("devices", devices), ("microbatches", microbatches)):
        if not values:
            raise SweepError(f"the sweep has no {label}; give at least one")
    for name in schedules:
        if name not in generators.REGISTRY:
            raise SweepError(f"unknown schedule {name!r}; choose one of: {', '.join(generators.names())}")
    for label, values in (("devices", devices), ("microbatches", microbatches)):
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise SweepError(f"{label} must be positive integers, got {values}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SweepError(f"jobs must be a positive integer, got {jobs!r}")
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1):
        raise SweepError(f"chunks must be a positive integer or None, got {chunks!r}")
    runtime = check_runtime(runtime, post_overhead)  # an unknown name: one line, before any work
    costs_for = _costs_maker(costs)
    hardware_for = _hardware_maker(hardware, devices)
    shapes = [(name, k, resolve_chunks(name, chunks)) for name in schedules for k in devices]
    _check_largest_fits(shapes, max(microbatches), iterations, recompute)
    candidates: list[Candidate] = []
    refused: dict[int, str] = {}  # candidate index -> why its costs or hardware function refused it
    for name, k, v in shapes:
        for m in microbatches:
            candidate = Candidate(schedule=name, devices=k, microbatches=m, chunks=v, recompute=recompute,
                                  iterations=iterations, microbatch_size=microbatch_size, runtime=runtime,
                                  post_overhead=post_overhead)
            try:
                candidate = _with_inputs(candidate, costs_for, hardware_for)
            except PipesimError as exc:
                refused[len(candidates)] = (str(exc).splitlines() or [type(exc).__name__])[0]
            candidates.append(candidate)
    ran = iter(evaluate([c for i, c in enumerate(candidates) if i not in refused], jobs=jobs, executor=executor,
                        progress=progress))
    evaluations = [Evaluation.rejected(c.tag, refused[i]) if i in refused else next(ran) for i, c in enumerate(candidates)]
    inputs = {}  # (costs, hardware) -> the input columns, computed once per distinct pair
    rows = []
    for c, e in zip(candidates, evaluations):
        key = (id(c.costs), id(c.hardware), c.devices, c.chunks)
        if key not in inputs:
            inputs[key] = {**_cost_columns(c.costs, c.devices, c.chunks), **_hardware_columns(c.hardware)}
        rows.append(_row(c, e, inputs[key], costs_source, hardware_source))
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def _check_largest_fits(shapes: list[tuple[str, int, int]], microbatches: int, iterations: int,
                        recompute: bool) -> None:
    """Refuse the sweep before any work if its largest configuration could not be built: the bound each
    generation checks (:func:`sim.schedules.generate`: F, B, W and R per stage and micro-batch), met here once
    for the grid instead of row by row after the smaller rows have run."""
    name, k, chunks = max(shapes, key=lambda shape: shape[1] * shape[2])
    actions = k * chunks * microbatches * (iterations if isinstance(iterations, int) else 1) * (3 + bool(recompute))
    check_fits(actions, f"the sweep's largest configuration ({name} with K={k}, M={microbatches}, {chunks} "
                        f"chunk(s), {iterations} iteration(s))")


def write_sweep_csv(df: pd.DataFrame, path: str | Path) -> tuple[Path, Path]:
    """Write *df* to *path* and its column sidecar (``<name>.columns.json``: unit and meaning of every
    column) next to it, both atomically and together; returns the two paths."""
    path = Path(path)
    sidecar = path.with_name(path.stem + ".columns.json")
    described = {c: {"unit": u, "meaning": m} for c, (u, m) in SWEEP_UNITS.items() if c in df.columns}
    with atomic_paths([path, sidecar]) as (csv_tmp, json_tmp):
        df.to_csv(csv_tmp, index=False)
        json_tmp.write_text(json.dumps(described, indent=1) + "\n")
    return path, sidecar


def read_sweep(path: str | Path) -> pd.DataFrame:
    """A sweep CSV read back as run_sweep returned it: ``error`` and the source columns stay strings
    (``''`` for a row that ran, where pandas' default reading would give NaN)."""
    text = ("schedule", "error", "costs_source", "hardware_source", "runtime")
    df = pd.read_csv(path, dtype={c: str for c in text}, keep_default_na=False,
                     na_values={c: ["", "nan", "NaN"] for c in SWEEP_COLUMNS if c not in text})
    return df


def _with_inputs(c: Candidate, costs_for, hardware_for) -> Candidate:
    """*c* with its costs and hardware; a function of the schedule gets the schedule, generated here."""
    schedule = None
    if getattr(costs_for, "per_schedule", False) or getattr(hardware_for, "per_schedule", False):
        try:
            schedule = schedules_module.generate(c.schedule, c.devices, c.microbatches, iterations=c.iterations,
                                                 recompute=c.recompute, chunks=c.chunks)
        except PipesimError:
            return c  # the schedule refuses this shape: the evaluation will say so, in the same words
    return replace(c, costs=costs_for(c.devices, c.chunks, schedule), hardware=hardware_for(c.devices, schedule))


def _per_schedule(fn, what: str):
    """A user's function ``schedule -> StageCosts / Hardware`` as a maker; it runs here, in this process."""
    def make(*args):
        schedule = args[-1]
        value = fn(schedule)
        kind = StageCosts if what == "costs" else Hardware
        if not isinstance(value, kind):  # the caller's function is wrong: a bug to see, not a row to record
            raise TypeError(f"the {what} function returned a {type(value).__name__}, not a {kind.__name__}")
        return value

    make.per_schedule = True
    return make


def _costs_maker(spec: CostsSpec):
    """(K, chunks, schedule) -> StageCosts, checked once here so a bad keyword fails before any work."""
    if spec is None or isinstance(spec, StageCosts):
        return lambda k, v, schedule: spec
    if callable(spec):
        return _per_schedule(spec, "costs")
    if not isinstance(spec, Mapping):
        raise SweepError(f"costs must be None, a StageCosts or a mapping of uniform() arguments, "
                         f"got a {type(spec).__name__}")
    spec = dict(spec)
    try:
        uniform(1, **spec)
    except TypeError as exc:
        raise SweepError(f"costs: {exc}; valid keywords are those of sim.model.cost.uniform") from None
    made: dict[tuple[int, int], StageCosts] = {}

    def make(k: int, v: int, schedule=None) -> StageCosts:
        if (k, v) not in made:
            share = uniform(k, **spec)
            made[k, v] = share.split_into_chunks(v) if v > 1 else share
        return made[k, v]

    return make


def _hardware_maker(spec: HardwareSpec, devices: Sequence[int]):
    """(K, schedule) -> Hardware, built once per K."""
    if spec is None or isinstance(spec, Hardware):
        return lambda k, schedule: spec
    if callable(spec):
        return _per_schedule(spec, "hardware")
    if not isinstance(spec, Mapping):
        raise SweepError(f"hardware must be None, a Hardware or a mapping of its arguments, got a {type(spec).__name__}")
    if "devices" in spec:
        raise SweepError("hardware: leave 'devices' out; the sweep sets it to each K")
    try:
        made = {k: Hardware(devices=k, **spec) for k in sorted(set(devices))}
    except TypeError as exc:
        raise SweepError(f"hardware: {exc}; valid keywords are those of sim.model.hardware.Hardware") from None
    return lambda k, schedule: made[k]


def _cost_columns(costs: StageCosts | None, devices: int, chunks: int) -> dict[str, float]:
    costs = costs if costs is not None else _default_costs(devices, chunks)
    out = {}
    for field in COST_FIELDS:
        if field in DISPATCH_COLUMNS:  # per action, not per device's share: a chunk is dispatched like a stage
            continue
        values = getattr(costs, field)
        # bytes sent per boundary and checkpoint bytes are not cut by chunking (each chunk sends a full boundary)
        per_device = sum(values) / len(values) if field in _PER_STAGE_FIELDS else sum(values) / devices
        out[_COST_COLUMN.get(field, field)] = per_device
    table = costs.dispatch_table()
    out["dispatch_s"] = 0.0 if table is None else sum(map(sum, table)) / (len(table) * len(table[0]))
    return out


def _default_costs(devices: int, chunks: int) -> StageCosts:
    share = uniform(devices)
    return share.split_into_chunks(chunks) if chunks > 1 else share


def _hardware_columns(hw: Hardware | None) -> dict[str, object]:
    if hw is None:
        return {"latency_s": 0.0, "bandwidth_bytes_per_s": math.inf, "overlap": True, "memory_capacity_bytes": math.nan}
    return {"latency_s": _slowest(hw.latency, max, 0.0), "bandwidth_bytes_per_s": _slowest(hw.bandwidth, min, math.inf),
            "overlap": hw.overlap,
            "memory_capacity_bytes": math.nan if hw.memory_capacity is None else hw.memory_capacity}


def _slowest(matrix, pick, none: float) -> float:
    """*pick* (max latency, min bandwidth) over the links of a K x K *matrix*, the diagonal left out; *none*
    without links (K = 1). One number for every link is one row object shared by every sender
    (:mod:`sim.model.hardware`): that is read in O(K), never as K x K pairs (K = 100,000 would be 10^10)."""
    devices = len(matrix)
    if devices < 2:
        return none
    if all(row is matrix[0] for row in matrix):
        return float(pick(matrix[0]))
    import numpy as np

    links = np.array(matrix, dtype=float)  # a matrix given link by link: its K x K numbers exist already
    np.fill_diagonal(links, np.nan)
    return float(np.nanmax(links) if pick is max else np.nanmin(links))


def _uniform_share(costs: StageCosts | None, devices: int, chunks: int) -> dict[str, float] | None:
    """Per-device F, B, W, R when every stage costs the same and nothing else (updates) counts; else None."""
    costs = costs if costs is not None else _default_costs(devices, chunks)
    times = {}
    for field in ("forward", "backward", "weight", "recompute", "update"):
        values = getattr(costs, field)
        if any(v != values[0] for v in values):
            return None
        times[field] = values[0] * chunks
    return None if times.pop("update") > 0 else times


def _row(c: Candidate, e: Evaluation, inputs: dict, costs_source: str, hardware_source: str) -> dict:
    share = _uniform_share(c.costs, c.devices, c.chunks)
    closed = math.nan if share is None else closed_form_utilization(
        c.schedule, devices=c.devices, microbatches=c.microbatches, iterations=c.iterations, chunks=c.chunks,
        recompute=c.recompute, forward=share["forward"], backward=share["backward"], weight=share["weight"],
        recompute_cost=share["recompute"])
    row = {"schedule": c.schedule, "devices": c.devices, "chunks": c.chunks, "stages": c.devices * c.chunks,
           "microbatches": c.microbatches, "iterations": c.iterations, "recompute": c.recompute,
           "microbatch_size": c.microbatch_size, **inputs, "costs_source": costs_source,
           "hardware_source": hardware_source, "runtime": c.runtime, "post_overhead_s": c.post_overhead,
           "closed_form_utilization": closed, "error": e.error}
    if e.error:
        return row
    worst = max(range(len(e.peak_memory)), key=e.peak_memory.__getitem__)
    row.update(makespan=e.makespan, utilization=e.utilization, bubble_fraction=e.bubble_fraction,
               bubble_ratio=e.bubble_ratio, throughput=e.throughput, peak_memory=e.peak_memory[worst],
               peak_memory_device=worst, peak_inflight=max(e.peak_inflight), weight_versions=max(e.weight_versions),
               memory_overflows=e.memory_overflows)
    return row
