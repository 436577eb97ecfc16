"""The planner: the fastest way to train a model on N devices under a memory cap, found by exact simulation.

    from sim import models, gpus
    from sim.search.planner import PlanSpace, plan
    p = plan(models.get_model("llama3-8b"), gpus.get_gpu("h100-sxm"), gpus=16, global_batch=64)
    p.winner, p.explanation, p.ranked.head(), p.rejected["reason"].value_counts()

It enumerates schedule x pipeline degree p x tensor degree t x data degree d x micro-batch size b
x micro-batches M (= G / (d b)) x chunks v x recompute, and for every candidate

1. rejects what cannot run, with the reason: N not divisible by t x p, t larger than a node,
   heads or FFN not divisible by t, G not divisible by d x b, more stages than layers, a memory
   lower bound over the cap (weights, gradients and optimizer state averaged over the p devices plus
   the smallest activation a backward must hold: no device can need less), or the schedule's own
   rule (M not a multiple of p for interleaved 1F1B, M < 2p for DualPipeV, ...);
2. estimates per-stage costs (:func:`sim.model.estimate.estimate`) and simulates the rest with the exact
   engine, batched (:func:`sim.search.batch.evaluate`, the engine ``pipesim sweep`` uses). Memory is settled
   first, cheaply and soundly: a device's memory depends only on its own action order, and in every
   registered schedule its peak never falls as M grows (property-tested), so a *memory probe* - the same
   layout with p x v micro-batches - that is over the cap rejects the candidate; so does a selective-
   recompute twin over the cap for a candidate without recompute (same schedule, more bytes);
3. rejects those whose simulated peak memory exceeds the cap (by how much, on which device), and
   ranks the others by iteration time = makespan + the data-parallel gradient all-reduce
   (:func:`sim.model.estimate.data_parallel_sync_time`), then by peak memory.

No candidate over the cap is ever ranked. Figures per candidate: iteration time (s), tokens/s,
achieved model FLOP utilisation (model FLOPs of F+B+W, recompute excluded, over N x peak x time:
Chowdhery et al., "PaLM" (2022), appendix B), bubble fraction, peak memory (bytes, worst device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from sim.schedules import registry as generators
from sim import schedules
from sim.search.batch import Candidate, evaluate, resolve_chunks
from sim.errors import PipesimError
from sim.model.estimate import (RECOMPUTE_MODES, Estimate, EstimateError, Parallelism, activation_bytes_per_layer,
    data_parallel_sync_time, estimate, pipeline_hardware)
from sim.model.gpus import DEFAULT_MFU, GpuSpec
from sim.results.memory_breakdown import memory_breakdown
from sim.model.models import ModelSpec
from sim.results.result import Result
from sim.simulate import simulate

__all__ = ["PlanSpace", "Plan", "PlanError", "plan", "simulate_candidate", "pareto_front", "RANKED_COLUMNS",
           "DEFAULT_SCHEDULES"]

DEFAULT_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv")

CONFIG_COLUMNS = ["schedule", "pipeline", "tensor", "data", "microbatch_size", "microbatches", "chunks", "recompute"]
RANKED_COLUMNS = CONFIG_COLUMNS + [
    "iteration_time",     # seconds: makespan + data-parallel gradient sync
    "tokens_per_s",       # G x s / iteration_time
    "mfu",                # achieved model FLOP utilisation
    "bubble_fraction",    # idle share of p x makespan
    "peak_memory",        # bytes, the worst pipeline device
    "peak_device",        # which one
    "makespan",           # seconds, the pipeline alone
    "dp_sync",            # seconds, the gradient all-reduce after it
]


class PlanError(PipesimError):
    """A plan that cannot be asked: no devices, a global batch that is not positive, an empty search space."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSpace:
    """What the planner may choose from; each field lists the options."""

    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    """Registered schedule names."""
    pipeline: tuple[int, ...] | None = None
    """Pipeline degrees p (None: every power of two up to the layers and the devices)."""
    tensor: tuple[int, ...] = (1, 2, 4, 8)
    """Tensor-parallel degrees t."""
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batch sizes b."""
    chunks: tuple[int, ...] = (2, 4)
    """Chunks per device for schedules that take any (interleaved 1F1B); others use their own."""
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    """'none', 'selective', 'full'."""
    sequence_parallel: bool = True
    """Use sequence parallelism whenever t > 1 (Korthikanti et al. 2022: it only saves memory)."""
    zero1: bool = True
    """Shard the optimizer state over the data-parallel replicas (ZeRO-1)."""

    def __post_init__(self) -> None:
        for name in self.schedules:
            try:
                generators.get_generator(name)
            except ValueError as exc:
                raise PlanError(str(exc)) from None
        for label in ("tensor", "microbatch_sizes", "chunks") + (("pipeline",) if self.pipeline is not None else ()):
            values = getattr(self, label)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise PlanError(f"{label} must list positive integers, got {values!r}")
        bad = [r for r in self.recompute if r not in RECOMPUTE_MODES]
        if not self.recompute or bad:
            raise PlanError(f"recompute must list some of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if not self.schedules:
            raise PlanError("the plan has no schedules; give at least one")


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`plan` found."""

    ranked: pd.DataFrame
    """Feasible candidates, best first (:data:`RANKED_COLUMNS`)."""
    rejected: pd.DataFrame
    """Every other candidate: :data:`CONFIG_COLUMNS` + ``stage`` (where it was rejected) + ``reason``."""
    winner: dict | None
    """The first ranked row with its ``memory_breakdown`` per device; None if nothing fits."""
    explanation: list[str]
    """Why the winner wins, in sentences."""
    candidates: int
    """How many candidates were enumerated."""
    simulated: int
    """How many of them were simulated with their own M (the rest were rejected before)."""
    memory_cap: float
    inputs: dict = field(default_factory=dict)
    probes: int = 0
    """How many memory probes (the same layout with fewer micro-batches) were simulated."""

    @property
    def pareto(self) -> pd.DataFrame:
        return pareto_front(self.ranked)


@dataclass(frozen=True, slots=True)
class _Config:
    schedule: str
    pipeline: int
    tensor: int
    data: int
    microbatch_size: int
    microbatches: int
    chunks: int
    recompute: str

    def parallelism(self, space: PlanSpace) -> Parallelism:
        return Parallelism(tensor=self.tensor, sequence_parallel=space.sequence_parallel and self.tensor > 1,
                           pipeline=self.pipeline, chunks=self.chunks, data=self.data,
                           microbatch_size=self.microbatch_size, recompute=self.recompute, zero1=space.zero1)

    def row(self) -> dict:
        return {c: getattr(self, c) for c in CONFIG_COLUMNS}

    def describe(self) -> str:
        v = f" v={self.chunks}" if self.chunks > 1 else ""
        return (f"{self.schedule} p={self.pipeline}{v} t={self.tensor} d={self.data} b={self.microbatch_size} "
                f"M={self.microbatches} recompute={self.recompute}")


def _powers_of_two(top: int) -> tuple[int, ...]:
    out, v = [], 1
    while v <= top:
        out.append(v)
        v *= 2
    return tuple(out)


def _enumerate(model: ModelSpec, gpus: int, global_batch: int, space: PlanSpace):
    """Every candidate, with the reason it cannot run ('' if it may): (config, reason)."""
    pipelines = space.pipeline or _powers_of_two(min(model.layers, gpus))
    for name in space.schedules:
        generator = generators.get_generator(name)
        own = getattr(generator, "CHUNKS", 1)
        chunk_options = space.chunks if not own else (resolve_chunks(name, None),)
        for t in space.tensor:
            for p in pipelines:
                d, rest = divmod(gpus, t * p)
                for b in space.microbatch_sizes:
                    M, batch_rest = divmod(global_batch, max(d, 1) * b)
                    for v in chunk_options:
                        for r in space.recompute:
                            config = _Config(name, p, t, d, b, M, v, r)
                            if rest or d == 0:
                                yield config, f"{gpus} GPUs are not divisible into t x p = {t * p}"
                            elif batch_rest or M == 0:
                                yield config, f"global batch {global_batch} is not divisible by d x b = {d * b}"
                            elif p * v > model.layers:
                                yield config, f"{p * v} stages (p x v) but the model has {model.layers} layers"
                            else:
                                yield config, ""


def plan(model: ModelSpec, gpu: GpuSpec, *, gpus: int, global_batch: int, memory_cap: float | None = None,
         space: PlanSpace | None = None, efficiency: float = DEFAULT_MFU, jobs: int = 1,
         progress: bool = False) -> Plan:
    """Search *space* for the fastest feasible way to train *model* on *gpus* devices like *gpu*.

    *global_batch*: samples per iteration, G. *memory_cap*: bytes per device (default: the device's memory).
    *efficiency*: model FLOP utilisation the estimate assumes. *jobs*: simulation worker processes.
    """
    space = space or PlanSpace()
    for label, value in (("gpus", gpus), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{label} must be a positive integer, got {value!r}")
    cap = float(gpu.memory_bytes if memory_cap is None else memory_cap)
    if not cap > 0 or math.isinf(cap):
        raise PlanError(f"memory_cap must be a positive number of bytes, got {memory_cap!r}")

    rejected, pending = [], []  # pending: (config, estimate, dp_sync)
    estimates: dict[tuple, Estimate | EstimateError] = {}
    n = 0
    for config, reason in _enumerate(model, gpus, global_batch, space):
        n += 1
        if not reason and config.tensor > gpu.gpus_per_node:
            reason = f"tensor-parallel degree {config.tensor} spans nodes of {gpu.gpus_per_node} devices"
        if reason:
            rejected.append({**config.row(), "stage": "static", "reason": reason})
            continue
        par = config.parallelism(space)
        key = (par.tensor, par.pipeline, par.chunks, par.data if par.zero1 else 1, par.microbatch_size, par.recompute)
        if key not in estimates:
            estimates[key] = _estimate_within(model, gpu, par, efficiency, cap)
        est = estimates[key]
        if isinstance(est, str):
            rejected.append({**config.row(), "stage": "memory bound" if est.startswith("over") else "static",
                             "reason": est})
            continue
        pending.append((config, est))
    if n == 0:
        raise PlanError("the search space is empty")

    # candidates sharing a schedule shape side by side: the batch engine generates each shape once per worker
    pending.sort(key=lambda item: (item[0].schedule, item[0].pipeline, item[0].microbatches, item[0].chunks,
                                   item[0].recompute == "full"))
    hardware = {}
    candidates = []
    for i, (config, est) in enumerate(pending):
        hw_key = (config.pipeline, config.tensor, config.data)
        if hw_key not in hardware:
            hardware[hw_key] = pipeline_hardware(gpu, config.parallelism(space), memory_capacity=cap)
        candidates.append(Candidate(schedule=config.schedule, devices=config.pipeline,
                                    microbatches=config.microbatches, chunks=config.chunks,
                                    recompute=config.recompute == "full", costs=est.costs,
                                    hardware=hardware[hw_key], microbatch_size=float(config.microbatch_size), tag=i))
    # the selective-recompute twin of a no-recompute candidate: same schedule, same order, fewer activation bytes
    index = {(c.schedule, c.pipeline, c.tensor, c.data, c.microbatch_size, c.chunks, c.recompute): i
             for i, (c, _) in enumerate(pending)}
    twins = {i: index[key] for i, (c, _) in enumerate(pending) if c.recompute == "none"
             and (key := (c.schedule, c.pipeline, c.tensor, c.data, c.microbatch_size, c.chunks, "selective")) in index}
    evaluations, probed, simulated = _evaluate_with_probes(candidates, cap, twins, jobs=jobs, progress=progress)

    ranked = []
    for (config, est), ev in zip(pending, evaluations):
        if isinstance(ev, str):
            rejected.append({**config.row(), "stage": "memory probe", "reason": ev})
            continue
        if ev.error:
            rejected.append({**config.row(), "stage": "schedule", "reason": ev.error})
            continue
        peak = max(ev.peak_memory)
        device = ev.peak_memory.index(peak)
        if peak > cap:
            rejected.append({**config.row(), "stage": "simulated",
                             "reason": f"over memory by {_gib(peak - cap)} GiB on device {device} "
                                       f"(peak {_gib(peak)} GiB, cap {_gib(cap)} GiB)",
                             "makespan": ev.makespan, "peak_memory": peak})
            continue
        par = config.parallelism(space)
        grads = max(_per_device(est.costs.grad_bytes, _placement(config.schedule, config.pipeline, config.chunks)))
        sync = data_parallel_sync_time(grads, par, gpu)
        time = ev.makespan + sync
        flops = est.model_flops_per_microbatch * config.microbatches * config.data
        ranked.append({**config.row(), "iteration_time": time,
                       "tokens_per_s": global_batch * model.seq_len / time,
                       "mfu": flops / (time * gpus * gpu.peak_flops), "bubble_fraction": ev.bubble_fraction,
                       "peak_memory": peak, "peak_device": device, "makespan": ev.makespan, "dp_sync": sync})
    ranked_df = pd.DataFrame(ranked, columns=RANKED_COLUMNS)
    ranked_df = ranked_df.sort_values(["iteration_time", "peak_memory"], kind="stable").reset_index(drop=True)
    rejected_df = pd.DataFrame(rejected, columns=CONFIG_COLUMNS + ["stage", "reason", "makespan", "peak_memory"])
    inputs = {"model": model.to_dict(), "gpu": gpu.to_dict(), "gpus": gpus, "global_batch": global_batch,
              "memory_cap": cap, "efficiency": efficiency, "space": space}
    winner, explanation = None, ["no candidate fits: see the rejected list (most often memory; try a larger cap, "
                                 "more devices, recompute or a smaller micro-batch)"]
    if len(ranked_df):
        winner = ranked_df.iloc[0].to_dict()
        result = simulate_candidate(model, gpu, _config_of(winner), space, efficiency=efficiency, memory_cap=cap)
        winner["memory_breakdown"] = memory_breakdown(result)
        explanation = _explain(ranked_df, rejected_df, winner, cap)
    return Plan(ranked_df, rejected_df, winner, explanation, n, simulated, cap, inputs, probed)


PROBE_LEVELS = (1,)
"""Memory probes run the candidate's layout with level x p x v micro-batches, smallest first: enough for every
registered schedule's warm-up to fill (p x v actions of each device's first chunk), and valid for all of them
(a multiple of p; V shapes, v = 2, get the 2p DualPipeV needs)."""


def _evaluate_with_probes(candidates: list[Candidate], cap: float, twins: dict[int, int], *, jobs: int,
                          progress: bool) -> tuple[list, int, int]:
    """Evaluations of *candidates*, or for those a cheaper probe proves over the cap, the reason (a str); and how
    many probes and full simulations that took.

    Memory is decided by each device's own action order (every allocation and release is an action of that
    device, run in its order), and in every registered schedule the peak never falls when M grows
    (tests/test_planner.py checks this for each generator). So the same layout with fewer micro-batches, a
    fraction of the actions, gives a lower bound on the peak: if the probe is over the cap, so is the candidate.
    For the same reason a candidate without recompute is over the cap when its selective-recompute twin
    (*twins*: index -> twin's index; the same schedule, so the same orders, with fewer bytes per stage) is.
    """
    results: list = [None] * len(candidates)
    probed = 0
    for level in PROBE_LEVELS:
        probes = {}
        for i, c in enumerate(candidates):
            m = level * c.devices * resolve_chunks(c.schedule, c.chunks)
            if results[i] is None and c.microbatches > m:
                probes[i] = replace(c, microbatches=m, tag=("probe", i))
        probed += len(probes)
        for i, ev in zip(probes, evaluate(list(probes.values()), jobs=jobs, progress=progress)):
            if not ev.error and max(ev.peak_memory) > cap:
                peak = max(ev.peak_memory)
                results[i] = (f"over memory by at least {_gib(peak - cap)} GiB: with only "
                              f"M={probes[i].microbatches} micro-batches device {ev.peak_memory.index(peak)} already "
                              f"peaks at {_gib(peak)} GiB, and the peak never falls as M grows")
    first = [i for i, r in enumerate(results) if r is None and i not in twins]
    for i, ev in zip(first, evaluate([candidates[i] for i in first], jobs=jobs, progress=progress)):
        results[i] = ev
    second = []
    for i, j in twins.items():
        if results[i] is not None:
            continue
        twin = results[j]
        if isinstance(twin, str) or (not twin.error and max(twin.peak_memory) > cap):
            results[i] = "over memory: its selective-recompute twin, which keeps fewer bytes, is already over the cap"
        else:
            second.append(i)
    for i, ev in zip(second, evaluate([candidates[i] for i in second], jobs=jobs, progress=progress)):
        results[i] = ev
    return results, probed, len(first) + len(second)


def _config_of(row: dict) -> _Config:
    return _Config(*(row[c] if c in ("schedule", "recompute") else int(row[c]) for c in CONFIG_COLUMNS))


def simulate_candidate(model: ModelSpec, gpu: GpuSpec, row: dict | _Config, space: PlanSpace | None = None, *,
                       efficiency: float = DEFAULT_MFU, memory_cap: float | None = None) -> Result:
    """The full simulation (timeline, memory) of one planned candidate, e.g. ``plan.winner``, for a Gantt chart."""
    space = space or PlanSpace()
    config = row if isinstance(row, _Config) else _config_of(row)
    par = config.parallelism(space)
    est = estimate(model, gpu, par, efficiency=efficiency)
    schedule = schedules.generate(config.schedule, config.pipeline, config.microbatches,
                                  recompute=config.recompute == "full", chunks=config.chunks)
    cap = gpu.memory_bytes if memory_cap is None else memory_cap
    return simulate(schedule, est.costs, pipeline_hardware(gpu, par, memory_capacity=cap),
                    microbatch_size=config.microbatch_size)


_placements: dict[tuple[str, int, int], tuple[int, ...]] = {}


def _placement(schedule: str, p: int, chunks: int) -> tuple[int, ...]:
    """Stage -> device of *schedule* on p devices with *chunks* each (round robin, or a V); it does not depend on
    M, so one generated with M = 2 p v (valid for every registered schedule) is kept per shape."""
    key = (schedule, p, chunks)
    if key not in _placements:
        _placements[key] = tuple(schedules.generate(schedule, p, 2 * p * chunks, chunks=chunks).placement)
    return _placements[key]


def _per_device(values, placement) -> list[float]:
    """Per-stage values summed per device."""
    out = [0.0] * (max(placement) + 1)
    for s, v in enumerate(values):
        out[placement[s]] += v
    return out


def _static_per_device(est: Estimate) -> float:
    c = est.costs
    return (sum(c.weight_bytes) + sum(c.grad_bytes) + sum(c.optimizer_bytes)) / est.parallelism.pipeline


def _memory_lower_bound(est: Estimate) -> float:
    """No device can need less: the average static bytes (the worst device holds at least the average) plus what
    a backward of one block must hold (its activations, plus its checkpoint under full recompute): every stage has
    at least one block. Neither term depends on how the blocks are partitioned."""
    held = est.activation_bytes_per_layer
    if est.parallelism.recompute == "full":
        held += activation_bytes_per_layer(est.model, est.parallelism.microbatch_size, tensor=est.parallelism.tensor,
                                           recompute="full")
    return _static_per_device(est) + held


def _estimate_within(model: ModelSpec, gpu: GpuSpec, par: Parallelism, efficiency: float,
                     cap: float) -> Estimate | str:
    """The estimate of *par*, or why it is rejected: the layout does not fit the model, or the memory bound is over
    *cap*. The bound is checked on an even split first, so hopeless layouts never run the partitioner."""
    S, L = par.stages, model.layers
    even = [L // S + (i < L % S) for i in range(S)] if S <= L else None
    try:
        rough = estimate(model, gpu, par, efficiency=efficiency, layers_per_stage=even)
    except EstimateError as exc:
        return str(exc).splitlines()[0]
    bound = _memory_lower_bound(rough)
    if bound > cap:
        static = _static_per_device(rough)
        return (f"over memory by at least {_gib(bound - cap)} GiB (weights, gradients and optimizer {_gib(static)} "
                f"GiB per device, plus one block's activations {_gib(bound - static)} GiB)")
    est = estimate(model, gpu, par, efficiency=efficiency)
    bound = _stage_memory_lower_bound(est)
    if bound > cap:
        static = _static_per_device(est)
        return (f"over memory by at least {_gib(bound - cap)} GiB (weights, gradients and optimizer {_gib(static)} "
                f"GiB per device, plus the smallest stage's activations {_gib(bound - static)} GiB)")
    return est


def _stage_memory_lower_bound(est: Estimate) -> float:
    """As :func:`_memory_lower_bound` with the partition known: the smallest stage's activations for one
    micro-batch (plus its checkpoint under full recompute) instead of one block's."""
    c = est.costs
    full = est.parallelism.recompute == "full"
    held = min(a + (k if full else 0.0) for a, k in zip(c.activation_bytes, c.checkpoint_bytes))
    return _static_per_device(est) + held


def pareto_front(ranked: pd.DataFrame) -> pd.DataFrame:
    """The candidates no other beats on both iteration time and peak memory, by increasing memory."""
    if ranked.empty:
        return ranked.copy()
    rows = ranked.sort_values(["peak_memory", "iteration_time"], kind="stable")
    keep, best = [], math.inf
    for index, time in zip(rows.index, rows["iteration_time"]):
        if time < best:
            keep.append(index)
            best = time
    return rows.loc[keep].reset_index(drop=True)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def _explain(ranked: pd.DataFrame, rejected: pd.DataFrame, winner: dict, cap: float) -> list[str]:
    """Why the winner wins: its figures, what the runner-up loses, what faster candidates broke."""
    w = _config_of(winner)
    lines = [f"{w.describe()} wins: {winner['iteration_time']:.4g} s per iteration, "
             f"{winner['tokens_per_s']:.4g} tokens/s, MFU {winner['mfu']:.1%}, bubble {winner['bubble_fraction']:.1%}, "
             f"peak {_gib(winner['peak_memory'])} of {_gib(cap)} GiB (device {int(winner['peak_device'])})."]
    if len(ranked) > 1:
        r = ranked.iloc[1].to_dict()
        gap = r["iteration_time"] / winner["iteration_time"] - 1
        reasons = []
        if r["bubble_fraction"] > winner["bubble_fraction"] + 0.005:
            reasons.append(f"a larger bubble ({r['bubble_fraction']:.1%} vs {winner['bubble_fraction']:.1%})")
        if r["recompute"] != winner["recompute"]:
            reasons.append(f"recompute {r['recompute']} instead of {winner['recompute']}")
        if r["dp_sync"] > winner["dp_sync"] * 1.01 + 1e-12:
            reasons.append(f"a longer gradient all-reduce ({r['dp_sync']:.3g} s vs {winner['dp_sync']:.3g} s)")
        if r["tensor"] > winner["tensor"]:
            reasons.append(f"more tensor-parallel communication (t={int(r['tensor'])})")
        if gap < 1e-3:
            differ = [c for c in CONFIG_COLUMNS if r[c] != winner[c]]
            lines.append(f"The runner-up, {_config_of(r).describe()}, ties within 0.1% (it differs in "
                         f"{', '.join(differ)}); the winner is listed first for its time, then its peak memory.")
        else:
            if not reasons:
                reasons.append("more compute on its busiest device")
            lines.append(f"The runner-up, {_config_of(r).describe()}, is {gap:.1%} slower: {', '.join(reasons)}.")
    over = rejected[(rejected["stage"] == "simulated") & (rejected["makespan"] < winner["makespan"])]
    if len(over):
        best = over.sort_values("makespan").iloc[0].to_dict()
        lines.append(f"Faster candidates exist but break the memory cap, e.g. {_config_of(best).describe()} "
                     f"({best['makespan']:.4g} s of pipeline, {best['reason']}).")
    mem = int((rejected["stage"] == "memory bound").sum())
    if mem:
        lines.append(f"{mem} candidates were rejected without simulation: their weights, gradients and optimizer "
                     f"state with one block's activations already exceed the cap.")
    return lines
