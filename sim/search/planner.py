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
   engine as :attr:`PlanSpace.runtime` executes them (:mod:`sim.model.runtimes`), batched (:func:`sim.search.batch.evaluate`, the engine ``pipesim sweep`` uses). Memory is settled
   first, cheaply and soundly: a device's memory depends only on its own action order, and in every
   registered schedule its peak never falls as M grows (property-tested), so a *memory probe* - the same
   layout with p x v micro-batches - that is over the cap rejects the candidate; so does a selective-
   recompute twin over the cap for a candidate without recompute (same schedule, more bytes);
3. rejects those whose simulated peak memory exceeds the cap (by how much, on which device), and
   ranks the others by iteration time = makespan + the exposed part of the data-parallel gradient reduction
   + the optimizer step, then by peak memory. The reduction is bucketed and overlapped with the last
   micro-batch's backward as Megatron-LM and DDP do (:mod:`sim.search.gradient_sync`: reduce-scatter with
   the distributed optimizer / ZeRO-1, all-reduce without), which needs the candidate's timeline; so every
   candidate is first ranked by the bound makespan + the whole reduction after the flush
   (:func:`sim.model.estimate.data_parallel_sync_time`), and candidates are then re-simulated with their
   timeline in order of their makespan (a lower bound of the overlapped time) until no other can beat the
   best: the winner is exact, the other rows say which figure they carry (``dp_overlap``);
4. keeps the asynchronous schedules apart (those whose forwards run on weights older than the last update their
   predecessors' gradients make: PipeDream's weight stashing, 2BW's delay-one gradients; a different
   optimiser, :func:`asynchronous_schedule`): they are ranked in
   :attr:`Plan.asynchronous`, never chosen as the winner.

No candidate over the cap is ever ranked. A request where every candidate is impossible before any estimate
(devices not divisible into t x p, a global batch not divisible by d x b, ...) is a :class:`PlanError` that
counts the reasons. Figures per candidate: iteration time (s), tokens/s,
achieved model FLOP utilisation (model FLOPs of F+B+W, recompute excluded, over N x peak x time:
Chowdhery et al., "PaLM" (2022), appendix B), bubble fraction, peak memory (bytes, worst device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from sim.schedules import registry as generators
from sim.search.batch import (Candidate, cached_schedule, check_runtime, compiled_for, evaluate, resolve_chunks,
                              worker_session)
from sim.errors import PipesimError
from sim.model.efficiency import optimizer_step_time
from sim.model.estimate import (RECOMPUTE_MODES, Estimate, EstimateError, Parallelism, data_parallel_sync_time,
    estimate, pipeline_hardware, stage_bytes)
from sim.model.cost import StageCosts
from sim.model.gpus import GpuSpec
from sim.search.gradient_sync import exposed_gradient_sync, megatron_bucket_bytes
from sim.search.plan_memory import (asynchronous_schedule, estimate_within, evaluate_with_probes, gib, per_device,
    stage_placement)
from sim.results.memory_breakdown import memory_breakdown
from sim.model.models import ModelSpec
from sim.results.result import Result
from sim.simulate import simulate

__all__ = ["PlanSpace", "Plan", "PlanError", "plan", "simulate_candidate", "pareto_front", "RANKED_COLUMNS",
           "asynchronous_schedule", "DEFAULT_SCHEDULES"]

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
    "dp_sync",            # seconds, the whole gradient reduction if it ran after the flush (the bound)
    "dp_exposed",         # seconds of it showing after the pipeline when overlapped (NaN where not simulated)
    "dp_overlap",         # 'simulated': iteration_time uses dp_exposed; 'bound': it uses dp_sync
    "optimizer",          # seconds, the optimizer step after the reduction
    "weight_versions",    # most weight versions a device holds (> 1: asynchronous training)
    "split",              # '' for the compute-balanced partition, else blocks per stage ('9,10,10,3')
]

MAX_RESPLIT = 16
"""At most this many candidates over the cap are re-split to fit (the fastest first)."""

MAX_REFINED = 64
"""At most this many candidates are re-simulated with their timeline for the overlapped gradient reduction."""


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
    runtime: str = "pipesim"
    """The runtime that executes every candidate (:mod:`sim.model.runtimes`; not a choice: the one you launch with)."""
    dispatch: float | None = None
    """That runtime's own time before each action, seconds (None: the estimated costs', 0)."""
    post_overhead: float = 0.0
    """Seconds each posted batch of sends and receives holds its device."""

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
        object.__setattr__(self, "runtime", check_runtime(self.runtime, self.post_overhead))  # 'Torch' -> 'torch'
        if self.dispatch is not None and (isinstance(self.dispatch, bool) or not isinstance(self.dispatch, (int, float))
                                          or not 0 <= self.dispatch < math.inf):
            raise PlanError(f"dispatch must be a finite number of seconds >= 0 or None, got {self.dispatch!r}")

    def costs(self, costs: StageCosts) -> StageCosts:
        """*costs* (an estimate's) with this space's dispatch overhead, as every candidate is simulated."""
        return costs if self.dispatch is None else costs.with_dispatch(self.dispatch)


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
    asynchronous: pd.DataFrame | None = None
    """Feasible candidates of asynchronous schedules (stale weights), best first; never the winner."""
    refined: int = 0
    """How many candidates were re-simulated for their overlapped gradient reduction."""
    resplit: int = 0
    """How many candidates over the cap fit once their layers were split by memory (``split`` column)."""

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
    split: tuple[int, ...] | None = None
    """Blocks per stage when not the compute-balanced partition (a memory-balanced split, phase 3b)."""

    def parallelism(self, space: PlanSpace) -> Parallelism:
        return Parallelism(tensor=self.tensor, sequence_parallel=space.sequence_parallel and self.tensor > 1,
                           pipeline=self.pipeline, chunks=self.chunks, data=self.data,
                           microbatch_size=self.microbatch_size, recompute=self.recompute, zero1=space.zero1)

    def row(self) -> dict:
        return {c: getattr(self, c) for c in CONFIG_COLUMNS}

    def describe(self) -> str:
        v = f" v={self.chunks}" if self.chunks > 1 else ""
        split = f" split={','.join(map(str, self.split))}" if self.split else ""
        return (f"{self.schedule} p={self.pipeline}{v} t={self.tensor} d={self.data} b={self.microbatch_size} "
                f"M={self.microbatches} recompute={self.recompute}{split}")


def _powers_of_two(top: int) -> tuple[int, ...]:
    out, v = [], 1
    while v <= top:
        out.append(v)
        v *= 2
    return tuple(out)


def _enumerate(model: ModelSpec, gpus: int, global_batch: int, space: PlanSpace):
    """Every candidate, with the rule it breaks and why ('' and '' if it may run): (config, rule, reason)."""
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
                                yield config, "devices", f"{gpus} GPUs are not divisible into t x p = {t * p}"
                            elif batch_rest or M == 0:
                                yield config, "batch", (f"global batch {global_batch} is not divisible by "
                                                        f"d x b = {d * b}")
                            elif p * v > model.layers:
                                yield config, "layers", (f"{p * v} stages (p x v) but the model has "
                                                         f"{model.layers} layers")
                            else:
                                yield config, "", ""


_RULE_ADVICE = {
    "devices": "give --gpus a multiple of t x p, or other --tensor-parallel / --pipeline-parallel degrees",
    "batch": "give a --global-batch divisible by d x b (d = gpus / (t x p)), or other degrees and micro-batch sizes",
    "layers": "give fewer pipeline stages (p x v) than the model has layers",
    "node": "give tensor-parallel degrees within one node",
}


def plan(model: ModelSpec, gpu: GpuSpec, *, gpus: int, global_batch: int, memory_cap: float | None = None,
         space: PlanSpace | None = None, efficiency: float | None = None, jobs: int = 1,
         progress: bool = False) -> Plan:
    """Search *space* for the fastest feasible way to train *model* on *gpus* devices like *gpu*.

    *global_batch*: samples per iteration, G. *memory_cap*: bytes per device (default: the device's memory).
    *efficiency*: None (default) for the size-aware compute model (:mod:`sim.model.efficiency`), or a constant
    fraction of peak FLOP/s. *jobs*: simulation worker processes.
    """
    space = space or PlanSpace()
    for label, value in (("gpus", gpus), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{label} must be a positive integer, got {value!r}")
        if value > _PLAN_LIMITS[label]:
            raise PlanError(f"{label} = {value if value < 10**30 else f'{value:.3e}'} is above the limit of "
                            f"{_PLAN_LIMITS[label]:,}")
    cap = float(gpu.memory_bytes if memory_cap is None else memory_cap)
    if not cap > 0 or math.isinf(cap):
        raise PlanError(f"memory_cap must be a positive number of bytes, got {memory_cap!r}")

    rejected, pending, n = _screen(model, gpu, gpus, global_batch, space, efficiency, cap)
    candidates, twins = _candidates(pending, gpu, space, cap)
    # a large search loads numba once, before its first schedule (same floats); with jobs > 1 its workers are
    # forked after that and kept for every evaluate() of the search, each schedule shape on one of them
    with compiled_for(candidates), worker_session(jobs):
        evaluations, probed, simulated, probe_evals = evaluate_with_probes(candidates, cap, twins, jobs=jobs,
                                                                           progress=progress)
        ranked, asynchronous = _rank(model, gpu, space, pending, evaluations, rejected, gpus, global_batch, cap,
                                     probe_evals)
        resplit = _resplit(model, gpu, space, rejected, ranked, efficiency, cap, gpus, global_batch, jobs)
    for row in rejected:  # the evaluations kept for the re-split are not part of the table
        row.pop("_evaluation", None)
        row.pop("_estimate", None)
    refined = _refine_gradient_sync(model, gpu, space, ranked, efficiency, cap)
    ranked_df = _frame(ranked)
    async_df = _frame(asynchronous)
    rejected_df = pd.DataFrame(rejected, columns=CONFIG_COLUMNS + ["stage", "reason", "makespan", "peak_memory"])
    inputs = {"model": model.to_dict(), "gpu": gpu.to_dict(), "gpus": gpus, "global_batch": global_batch,
              "memory_cap": cap, "efficiency": efficiency, "space": space, "runtime": space.runtime}
    winner, explanation = None, [_nothing_fits(rejected_df, len(async_df))]
    if len(ranked_df):
        winner = ranked_df.iloc[0].to_dict()
        config = _config_of(winner)
        est = estimate(model, gpu, config.parallelism(space), efficiency=efficiency, layers_per_stage=config.split)
        result = simulate_candidate(model, gpu, config, space, efficiency=efficiency, memory_cap=cap)
        winner["memory_breakdown"] = memory_breakdown(result)
        winner["layers_per_stage"] = [hi - lo for lo, hi in est.bounds]
        winner["even_split"] = _even_split(model, gpu, config, space, efficiency, cap, winner)
        explanation = _explain(ranked_df, rejected_df, winner, cap)
        if len(async_df) and async_df["iteration_time"].iloc[0] < winner["iteration_time"]:
            a = async_df.iloc[0].to_dict()
            explanation.append(f"Asynchronous {_config_of(a).describe()} would take {a['iteration_time']:.4g} s, but "
                               f"it trains on stale weights (up to {int(a['weight_versions'])} versions per stage), "
                               f"a different optimiser: ranked apart, never chosen.")
    return Plan(ranked_df, rejected_df, winner, explanation, n, simulated, cap, inputs, probed, async_df, refined,
                resplit)


_PLAN_LIMITS = {"gpus": 2**24, "global_batch": 2**30}
"""Largest device count and global batch a plan takes: far above real clusters; every count stays an exact float."""


def _screen(model: ModelSpec, gpu: GpuSpec, gpus: int, global_batch: int, space: PlanSpace,
            efficiency: float | None, cap: float) -> tuple[list[dict], list[tuple[_Config, Estimate]], int]:
    """Phase 1: enumerate, reject what cannot run or cannot fit (static rules, memory lower bounds), estimate the
    rest. A request where every candidate breaks a static rule is a PlanError that counts the rules."""
    rejected, pending = [], []
    estimates: dict[tuple, Estimate | str] = {}
    rules: dict[str, int] = {}
    n = 0
    for config, rule, reason in _enumerate(model, gpus, global_batch, space):
        n += 1
        if not reason and config.tensor > gpu.gpus_per_node:
            rule, reason = "node", f"tensor-parallel degree {config.tensor} spans nodes of {gpu.gpus_per_node} devices"
        if reason:
            rules[rule] = rules.get(rule, 0) + 1
            rejected.append({**config.row(), "stage": "static", "reason": reason})
            continue
        par = config.parallelism(space)
        key = (par.tensor, par.pipeline, par.chunks, par.data if par.zero1 else 1, par.microbatch_size, par.recompute)
        if key not in estimates:
            estimates[key] = estimate_within(model, gpu, par, efficiency, cap)
        est = estimates[key]
        if isinstance(est, str):
            static = not est.startswith("over")
            if static:
                rules["layout"] = rules.get("layout", 0) + 1
            rejected.append({**config.row(), "stage": "static" if static else "memory bound", "reason": est})
            continue
        pending.append((config, est))
    if n == 0:
        raise PlanError("the search space is empty")
    if sum(rules.values()) == n:
        counts = "; ".join(f"{count} because {_example(rejected, rule)}" for rule, count in
                           sorted(rules.items(), key=lambda kv: -kv[1]))
        advice = "; ".join(_RULE_ADVICE[r] for r in rules if r in _RULE_ADVICE)
        raise PlanError(f"all {n} candidates are impossible before any estimate: {counts}"
                        + (f" ({advice})" if advice else ""))
    return rejected, pending, n


def _example(rejected: list[dict], rule: str) -> str:
    """The reason of the first rejection of *rule* (the rules' reasons start with distinct words)."""
    starts = {"devices": "GPUs are not divisible", "batch": "global batch", "layers": "stages (p x v)",
              "node": "tensor-parallel degree"}
    for row in rejected:
        if rule in starts and starts[rule] in row["reason"]:
            return row["reason"]
        if rule == "layout" and row["stage"] == "static" and not any(s in row["reason"] for s in starts.values()):
            return row["reason"]
    return rule


def _candidates(pending: list[tuple[_Config, Estimate]], gpu: GpuSpec, space: PlanSpace,
                cap: float) -> tuple[list[Candidate], dict[int, int]]:
    """Phase 2: one batch-engine Candidate per pending configuration (sorted so that candidates sharing a
    schedule shape sit side by side: the engine generates each shape once per worker), and the twins."""
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
                                    recompute=config.recompute == "full", costs=space.costs(est.costs),
                                    hardware=hardware[hw_key], microbatch_size=float(config.microbatch_size), tag=i,
                                    runtime=space.runtime, post_overhead=space.post_overhead))
    # the selective-recompute twin of a no-recompute candidate: same schedule, same order, fewer activation bytes
    index = {(c.schedule, c.pipeline, c.tensor, c.data, c.microbatch_size, c.chunks, c.recompute): i
             for i, (c, _) in enumerate(pending)}
    twins = {i: index[key] for i, (c, _) in enumerate(pending) if c.recompute == "none"
             and (key := (c.schedule, c.pipeline, c.tensor, c.data, c.microbatch_size, c.chunks, "selective")) in index}
    return candidates, twins


def _rank(model: ModelSpec, gpu: GpuSpec, space: PlanSpace, pending, evaluations, rejected: list[dict], gpus: int,
          global_batch: int, cap: float, probe_evals: dict) -> tuple[list[dict], list[dict]]:
    """Phase 3: the evaluations into rows (synchronous and asynchronous apart); the rest into *rejected* (memory
    rejections keep their evaluation and estimate for phase 3b, under keys that start with '_')."""
    ranked, asynchronous = [], []
    for i, ((config, est), ev) in enumerate(zip(pending, evaluations)):
        if isinstance(ev, str):
            row = {**config.row(), "stage": "memory probe", "reason": ev, "makespan": math.nan}
            if i in probe_evals:
                row.update(_evaluation=probe_evals[i], _estimate=est)
            rejected.append(row)
            continue
        if ev.error:
            rejected.append({**config.row(), "stage": "schedule", "reason": ev.error})
            continue
        peak = max(ev.peak_memory)
        device = ev.peak_memory.index(peak)
        if peak > cap:
            rejected.append({**config.row(), "stage": "simulated",
                             "reason": f"over memory by {gib(peak - cap)} GiB on device {device} "
                                       f"(peak {gib(peak)} GiB, cap {gib(cap)} GiB)",
                             "makespan": ev.makespan, "peak_memory": peak, "_evaluation": ev, "_estimate": est})
            continue
        row = _row(model, gpu, space, config, est, ev, gpus, global_batch)
        (asynchronous if asynchronous_schedule(config.schedule) else ranked).append(row)
    return ranked, asynchronous


def _row(model: ModelSpec, gpu: GpuSpec, space: PlanSpace, config: _Config, est: Estimate, ev, gpus: int,
         global_batch: int) -> dict:
    """One ranked row: the figures of a candidate that fits (the gradient reduction as its after-flush bound)."""
    par = config.parallelism(space)
    placement = stage_placement(config.schedule, config.pipeline, config.chunks)
    grads = max(per_device(est.costs.grad_bytes, placement))
    params = max(per_device(est.costs.weight_bytes, placement)) / model.dtype_bytes
    sync = data_parallel_sync_time(grads, par, gpu)
    step = optimizer_step_time(gpu, params / (par.data if par.zero1 else 1))  # ZeRO-1: each replica its 1/d share
    time = ev.makespan + sync + step
    flops = est.model_flops_per_microbatch * config.microbatches * config.data
    peak = max(ev.peak_memory)
    return {**config.row(), "iteration_time": time, "tokens_per_s": global_batch * model.seq_len / time,
            "mfu": flops / (time * gpus * gpu.peak_flops), "bubble_fraction": ev.bubble_fraction,
            "peak_memory": peak, "peak_device": ev.peak_memory.index(peak), "makespan": ev.makespan,
            "dp_sync": sync, "dp_exposed": math.nan, "dp_overlap": "bound", "optimizer": step,
            "weight_versions": max(ev.weight_versions) if ev.weight_versions else 1,
            "split": ",".join(map(str, config.split)) if config.split else ""}


def _resplit(model: ModelSpec, gpu: GpuSpec, space: PlanSpace, rejected: list[dict], ranked: list[dict],
             efficiency: float | None, cap: float, gpus: int, global_batch: int, jobs: int) -> int:
    """Phase 3b: candidates over the cap that would be faster than the best that fits, re-split to fit.

    The compute-balanced partition ignores memory, yet in 1F1B-like schedules device k holds its blocks'
    activations for as many micro-batches as it has in flight (p - k on stage k): the first stages run out first.
    From the candidate's own simulation (its per-device peak in-flight count) each stage's bytes are modelled as
    static + blocks x (weights, gradients and optimizer per block + in-flight x activations per block) and
    the most blocks each stage can hold under the cap follow; the layers are then split min-max on compute under
    those limits (bisection on the bound, as the partitioner). The re-split candidate is estimated and simulated
    exactly; if it fits, it replaces its rejection in the ranking (with ``split``), and the winner's explanation
    says when it fits only because of the uneven split. One stage per device (v = 1), synchronous schedules only.
    """
    best = min((r["iteration_time"] for r in ranked), default=math.inf)
    # over the cap once simulated and faster than the best that fits, or over it at the memory probe (time unknown)
    tries = [r for r in rejected if "_evaluation" in r and r["chunks"] == 1 and r["pipeline"] > 1
             and not asynchronous_schedule(r["schedule"]) and not r["makespan"] >= best]
    tries.sort(key=lambda r: (math.isnan(r["makespan"]), r["makespan"]))
    attempts = []
    for r in tries[:MAX_RESPLIT]:
        config, est, ev = _config_of(r), r["_estimate"], r["_evaluation"]
        split = _memory_split(model, gpu, est, ev, cap)
        if split is None or split == [hi - lo for lo, hi in est.bounds]:
            continue
        try:
            new = estimate(model, gpu, config.parallelism(space), efficiency=efficiency, layers_per_stage=split)
        except EstimateError:
            continue
        attempts.append((r, replace(config, split=tuple(split)), new))
    if not attempts:
        return 0
    hardware = {}
    batch = []
    for r, config, new in attempts:
        key = (config.pipeline, config.tensor, config.data)
        if key not in hardware:
            hardware[key] = pipeline_hardware(gpu, config.parallelism(space), memory_capacity=cap)
        batch.append(Candidate(schedule=config.schedule, devices=config.pipeline, microbatches=config.microbatches,
                               chunks=config.chunks, recompute=config.recompute == "full", costs=space.costs(new.costs),
                               hardware=hardware[key], microbatch_size=float(config.microbatch_size),
                               runtime=space.runtime, post_overhead=space.post_overhead))
    fitted = 0
    for (r, config, new), ev in zip(attempts, evaluate(batch, jobs=jobs)):
        if ev.error or max(ev.peak_memory) > cap:
            continue
        rejected.remove(r)
        ranked.append(_row(model, gpu, space, config, new, ev, gpus, global_batch))
        fitted += 1
    return fitted


def _memory_split(model: ModelSpec, gpu: GpuSpec, est: Estimate, ev, cap: float) -> list[int] | None:
    """Blocks per stage under per-stage memory limits (see :func:`_resplit`), or None if no split fits the model.

    Stage k with n blocks is modelled as n x (block static + in-flight_k x block kept) + its end layer's bytes
    (+ one block's working set under full recompute), with in-flight_k the simulated peak count of its device."""
    b = stage_bytes(model, gpu, est.parallelism)
    c, L, S = est.costs, model.layers, len(est.bounds)
    counts = [hi - lo for lo, hi in est.bounds]
    full = est.parallelism.recompute == "full"
    limits, ends = [], []
    per_block_time = min((c.forward[k] + c.backward[k] + c.weight[k] + c.recompute[k]) / counts[k] for k in range(S))
    for k in range(S):
        inflight = max(int(ev.peak_inflight[k]), 1)
        end_static = (b.first_static if k == 0 else 0.0) + (b.last_static if k == S - 1 else 0.0)
        end_kept = (b.first_kept if k == 0 else 0.0) + (b.last_kept if k == S - 1 else 0.0)
        room = cap * 0.98 - end_static - (end_kept + b.working if full else inflight * end_kept)
        per_block = b.block_static + inflight * b.block_kept
        limits.append(int(room // per_block) if room > 0 else 0)
        work = c.forward[k] + c.backward[k] + c.weight[k] + c.recompute[k]
        ends.append(work - counts[k] * per_block_time)  # what the end layers add to the stage's time
    if min(limits) < 1 or sum(min(lim, L) for lim in limits) < L:
        return None

    def most(bound: float) -> list[int]:
        return [max(0, min(limits[k], int((bound - ends[k]) // per_block_time))) for k in range(S)]
    lo, hi = 0.0, max(ends) + L * per_block_time
    for _ in range(100):  # bisection on the slowest stage's time, as the partitioner
        mid = (lo + hi) / 2
        if sum(most(mid)) >= L and min(most(mid)) >= 1:
            hi = mid
        else:
            lo = mid
    split = most(hi)
    excess = sum(split) - L
    for k in sorted(range(S), key=lambda k: -(ends[k] + split[k] * per_block_time)):  # trim the slowest first
        take = min(excess, split[k] - 1)
        split[k] -= take
        excess -= take
    return split if excess == 0 and min(split) >= 1 else None


def _refine_gradient_sync(model: ModelSpec, gpu: GpuSpec, space: PlanSpace, ranked: list[dict],
                          efficiency: float | None, cap: float) -> int:
    """Phase 4: overlap the gradient reduction with the backward, exactly for every candidate that could win.

    Each row's makespan is a lower bound of its overlapped iteration time and its bound (reduction after the
    flush) an upper one. Rows are re-simulated with their timeline in order of makespan and their overlapped
    time computed (:func:`sim.search.gradient_sync.exposed_gradient_sync`); once the next makespan is no better
    than the second-best overlapped time, no other row can be the winner or the runner-up (whose comparison the
    explanation gives). Updates *ranked* in place; returns how many were re-simulated."""
    times, refined = [math.inf, math.inf], 0  # the two best overlapped times: the winner and the runner-up exact
    for row in sorted(ranked, key=lambda r: r["makespan"] + r["optimizer"]):
        if row["makespan"] + row["optimizer"] >= times[1] or refined >= MAX_REFINED:
            break
        config = _config_of(row)
        par = config.parallelism(space)
        if par.data > 1:
            est = estimate(model, gpu, par, efficiency=efficiency, layers_per_stage=config.split)
            result = simulate_candidate(model, gpu, config, space, efficiency=efficiency, memory_cap=cap)
            bandwidth, latency = gpu.link(cross_node=par.tensor * par.data > gpu.gpus_per_node)
            sync = exposed_gradient_sync(result, list(est.costs.grad_bytes), data=par.data, bandwidth=bandwidth,
                                         latency=latency,
                                         bucket_bytes=megatron_bucket_bytes(par.data, model.dtype_bytes),
                                         distributed_optimizer=par.zero1)
            exposed = sync.exposed
        else:
            exposed = 0.0
        refined += 1
        time = row["makespan"] + exposed + row["optimizer"]
        scale = row["iteration_time"] / time
        row.update(iteration_time=time, dp_exposed=exposed, dp_overlap="simulated",
                   tokens_per_s=row["tokens_per_s"] * scale, mfu=row["mfu"] * scale)
        times = sorted(times + [time])[:2]
    return refined


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=RANKED_COLUMNS)
    return frame.sort_values(["iteration_time", "peak_memory"], kind="stable").reset_index(drop=True)


def _nothing_fits(rejected: pd.DataFrame, asynchronous: int) -> str:
    counts = rejected["stage"].value_counts()
    parts = ", ".join(f"{int(c)} at the {stage} stage" for stage, c in counts.items())
    memory = int(counts.drop(labels=["static", "schedule"], errors="ignore").sum())
    text = f"no synchronous candidate fits: {parts}"
    if memory:
        text += " (memory: try a larger cap, more devices, recompute or a smaller micro-batch)"
    if asynchronous:
        text += f"; {asynchronous} asynchronous candidates fit (ranked apart: they train on stale weights)"
    return text


def _even_split(model: ModelSpec, gpu: GpuSpec, config: _Config, space: PlanSpace, efficiency: float | None,
                cap: float, winner: dict) -> dict:
    """The winner against the even split of its layers (what a launcher does by default): its peak memory and
    pipeline time, and whether the winner fits only because its end stages hold fewer blocks."""
    par = config.parallelism(space)
    S, L = par.stages, model.layers
    even = [L // S + (i < L % S) for i in range(S)]
    out = {"layers_per_stage": winner["layers_per_stage"], "even_layers_per_stage": even,
           "uneven": even != winner["layers_per_stage"]}
    if not out["uneven"]:
        return out
    est = estimate(model, gpu, par, efficiency=efficiency, layers_per_stage=even)
    schedule = _schedule_of(config)
    result = simulate(schedule, space.costs(est.costs), pipeline_hardware(gpu, par, memory_capacity=cap),
                      microbatch_size=config.microbatch_size, runtime=space.runtime, post_overhead=space.post_overhead)
    peak = float(max(result.metrics.peak_memory))
    out.update(even_peak_memory=peak, even_makespan=float(result.metrics.makespan),
               fits_only_uneven=peak > cap)
    return out


def _schedule_of(c: _Config):  # the candidate's schedule, from the batch engine's cache (what its evaluation ran)
    found = cached_schedule(c.schedule, c.pipeline, c.microbatches, resolve_chunks(c.schedule, c.chunks),
                            recompute=c.recompute == "full")
    if isinstance(found, PipesimError):
        raise found
    return found


def _config_of(row: dict) -> _Config:
    split = row.get("split")
    return _Config(*(row[c] if c in ("schedule", "recompute") else int(row[c]) for c in CONFIG_COLUMNS),
                   split=tuple(int(n) for n in split.split(",")) if isinstance(split, str) and split else None)


def simulate_candidate(model: ModelSpec, gpu: GpuSpec, row: dict | _Config, space: PlanSpace | None = None, *,
                       efficiency: float | None = None, memory_cap: float | None = None) -> Result:
    """The full simulation (timeline, memory) of one planned candidate, e.g. ``plan.winner``, for a Gantt chart."""
    space = space or PlanSpace()
    config = row if isinstance(row, _Config) else _config_of(row)
    par = config.parallelism(space)
    est = estimate(model, gpu, par, efficiency=efficiency, layers_per_stage=config.split)
    schedule = _schedule_of(config)
    cap = gpu.memory_bytes if memory_cap is None else memory_cap
    return simulate(schedule, space.costs(est.costs), pipeline_hardware(gpu, par, memory_capacity=cap),
                    microbatch_size=config.microbatch_size, runtime=space.runtime, post_overhead=space.post_overhead)


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


def _sync_shown(row: dict) -> float:
    """Seconds of gradient reduction a row's iteration time carries: overlapped if simulated, else the bound."""
    return row["dp_exposed"] if row["dp_overlap"] == "simulated" else row["dp_sync"]


def _explain(ranked: pd.DataFrame, rejected: pd.DataFrame, winner: dict, cap: float) -> list[str]:
    """Why the winner wins: its figures, what the runner-up loses, what faster candidates broke."""
    w = _config_of(winner)
    lines = [f"{w.describe()} wins: {winner['iteration_time']:.4g} s per iteration, "
             f"{winner['tokens_per_s']:.4g} tokens/s, MFU {winner['mfu']:.1%}, bubble {winner['bubble_fraction']:.1%}, "
             f"peak {gib(winner['peak_memory'])} of {gib(cap)} GiB (device {int(winner['peak_device'])})."]
    if len(ranked) > 1:
        r = ranked.iloc[1].to_dict()
        gap = r["iteration_time"] / winner["iteration_time"] - 1
        reasons = []
        if r["bubble_fraction"] > winner["bubble_fraction"] + 0.005:
            reasons.append(f"a larger bubble ({r['bubble_fraction']:.1%} vs {winner['bubble_fraction']:.1%})")
        if r["recompute"] != winner["recompute"]:
            reasons.append(f"recompute {r['recompute']} instead of {winner['recompute']}")
        r_sync, w_sync = _sync_shown(r), _sync_shown(winner)
        if r_sync > w_sync * 1.01 + 1e-12:
            reasons.append(f"more gradient reduction after its pipeline ({r_sync:.3g} s vs {w_sync:.3g} s)")
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
    if winner.get("split"):
        lines.append(f"Its layers are split to fit memory ({winner['split']} blocks per stage, fewer where more "
                     f"micro-batches are in flight), not to balance compute: the balanced split was over the cap.")
    split = winner.get("even_split") or {}
    if split.get("uneven"):
        why = "" if winner.get("split") else " (the end stages fewer: they carry the embedding and the output layer)"
        text = (f"Its stages hold {split['layers_per_stage']} blocks{why}; the even split "
                f"{split['even_layers_per_stage']} would peak at {gib(split['even_peak_memory'])} GiB")
        lines.append(text + (f", over the {gib(cap)} GiB cap: it fits only because of the uneven split."
                             if split["fits_only_uneven"] else ", and take "
                             f"{split['even_makespan']:.4g} s of pipeline instead of {winner['makespan']:.4g} s."))
    if winner["dp_overlap"] == "simulated" and winner["dp_sync"] > 0:
        lines.append(f"Its gradient reduction ({winner['dp_sync']:.3g} s if run after the flush) overlaps the last "
                     f"backward: {winner['dp_exposed']:.3g} s of it shows.")
    mem = int((rejected["stage"] == "memory bound").sum())
    if mem:
        lines.append(f"{mem} candidates were rejected without simulation: their weights, gradients and optimizer "
                     f"state with one block's activations already exceed the cap.")
    return lines
