"""The planner's memory side: sound lower bounds, memory probes, and which schedules train on stale weights.

Everything here decides, as cheaply as it can and never wrongly, that a candidate cannot fit under the memory cap
(:mod:`sim.search.planner` uses it before simulating a candidate in full), or that a schedule is asynchronous.
Units: bytes, seconds.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from sim import schedules
from sim.core.ir import ActionKind
from sim.errors import PipesimError
from sim.model.estimate import Estimate, EstimateError, Parallelism, estimate, memory_floor
from sim.model.gpus import GpuSpec
from sim.model.models import ModelSpec
from sim.search.batch import Candidate, cached_schedule, evaluate, resolve_chunks

__all__ = ["PROBE_LEVELS", "asynchronous_schedule", "evaluate_with_probes", "probe_group", "static_bytes",
           "stage_placement", "per_device", "static_per_device", "estimate_within", "stage_memory_lower_bound", "gib"]


@lru_cache(maxsize=64)
def asynchronous_schedule(name: str) -> bool:
    """Whether *name* trains on stale weights: some forward of a micro-batch runs before the update its
    predecessors' gradients make (PipeDream's weight stashing, 2BW's delay-one gradients), so it optimises
    differently from a flush schedule. Decided on the schedule itself (2 devices, 4 micro-batches, 2
    iterations: every registered schedule's warm-up and second iteration), not on a list of names."""
    s = schedules.generate(name, 2, 2 * 2 * resolve_chunks(name, None), iterations=2,
                           chunks=resolve_chunks(name, None))
    group = s.microbatches_per_update
    for actions in s.actions.values():
        updated: dict[int, int] = {}  # stage -> the last update it ran
        for a in actions:
            if a.kind is ActionKind.U:
                updated[a.stage] = max(updated.get(a.stage, -1), a.mb)
            elif a.kind is ActionKind.F and a.mb // group >= 1 and updated.get(a.stage, -1) < a.mb // group - 1:
                return True
    return False


PROBE_LEVELS = (1,)
"""Memory probes run the candidate's layout with level x p x v micro-batches, smallest first: enough for every
registered schedule's warm-up to fill (p x v actions of each device's first chunk), and valid for all of them
(a multiple of p; V shapes, v = 2, get the 2p DualPipeV needs)."""


def evaluate_with_probes(candidates: list[Candidate], cap: float, twins: dict[int, int], *, jobs: int,
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
    probe_evals: dict[int, object] = {}  # index -> the Evaluation of its probe (for a memory-aware re-split)
    probed = 0
    for level in PROBE_LEVELS:
        probes, scaled = {}, {}  # scaled: index -> the index whose probe gives its peaks by scaling (see below)
        groups: dict[tuple, int] = {}
        for i, c in enumerate(candidates):
            m = level * c.devices * resolve_chunks(c.schedule, c.chunks)
            if results[i] is None and c.microbatches > m:
                key = probe_group(c, m)
                if key is not None and key in groups:
                    scaled[i] = groups[key]
                    continue
                if key is not None:
                    groups[key] = i
                probes[i] = replace(c, microbatches=m, tag=("probe", i))
        probed += len(probes)
        peaks = {}
        for i, ev in zip(probes, evaluate(list(probes.values()), jobs=jobs, progress=progress)):
            if not ev.error:
                peaks[i] = list(ev.peak_memory)
                probe_evals[i] = ev
        for i, j in scaled.items():
            if j in peaks:
                probe_evals[i] = probe_evals[j]  # the same shape: the same micro-batches in flight
                # per device: static bytes (held all run) + the dynamic part, which scales with the micro-batch size
                factor = candidates[i].microbatch_size / candidates[j].microbatch_size
                own, rep = static_bytes(candidates[i]), static_bytes(candidates[j])
                peaks[i] = [s + (p - r) * factor for p, s, r in zip(peaks[j], own, rep)]
        for i, peak_list in peaks.items():
            peak = max(peak_list)
            if peak > cap * (1 + 1e-9):  # a scaled peak may round by an ulp: decide only clear cases
                m = level * candidates[i].devices * resolve_chunks(candidates[i].schedule, candidates[i].chunks)
                results[i] = (f"over memory by at least {gib(peak - cap)} GiB: with only "
                              f"M={m} micro-batches device {peak_list.index(peak)} already "
                              f"peaks at {gib(peak)} GiB, and the peak never falls as M grows")
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
    return results, probed, len(first) + len(second), probe_evals


def probe_group(c: Candidate, m: int) -> tuple | None:
    """Probes whose peaks follow from one another: the same schedule shape, and per-stage activation, checkpoint
    and message bytes in the same proportion to the micro-batch size (every term of Korthikanti et al.'s count is
    linear in b; weights, gradients and optimizer state are held all run). Their peak per device is then
    static + b x (the same dynamic peak per sample), exactly (tests/test_planner.py checks it against simulations).
    Asynchronous schedules hold weight versions that do not scale with b: no group."""
    if asynchronous_schedule(c.schedule) or c.costs is None:
        return None
    b = c.microbatch_size

    def per_sample(values) -> tuple:
        return tuple(float(f"{v / b:.12g}") for v in values)
    k = c.costs
    return (c.schedule, c.devices, m, c.chunks, c.recompute, per_sample(k.activation_bytes),
            per_sample(k.checkpoint_bytes), per_sample(k.send_bytes))


def static_bytes(c: Candidate) -> list[float]:
    """Per device of *c*: weights, gradients and optimizer state (held for the whole run)."""
    k = c.costs
    per_stage = [w + g + o for w, g, o in zip(k.weight_bytes, k.grad_bytes, k.optimizer_bytes)]
    return per_device(per_stage, stage_placement(c.schedule, c.devices, resolve_chunks(c.schedule, c.chunks)))


placements_cache: dict[tuple[str, int, int], tuple[int, ...]] = {}


def stage_placement(schedule: str, p: int, chunks: int) -> tuple[int, ...]:
    """Stage -> device of *schedule* on p devices with *chunks* each (round robin, or a V); it does not depend on
    M, so the one of the smallest schedule is kept per shape: M = p v (every registered schedule takes it; the
    largest minimum is DualPipeV's 2p), or 2 p v for a generator that refuses p v."""
    key = (schedule, p, chunks)
    if key not in placements_cache:
        # through the batch engine's cache: the memory probes of this shape run this very schedule (M = p v)
        found = cached_schedule(schedule, p, p * chunks, chunks)
        if isinstance(found, PipesimError):
            found = cached_schedule(schedule, p, 2 * p * chunks, chunks)
        if isinstance(found, PipesimError):
            raise found
        placements_cache[key] = tuple(found.placement)
    return placements_cache[key]


def per_device(values, placement) -> list[float]:
    """Per-stage values summed per device."""
    out = [0.0] * (max(placement) + 1)
    for s, v in enumerate(values):
        out[placement[s]] += v
    return out


def static_per_device(est: Estimate) -> float:
    c = est.costs
    return (sum(c.weight_bytes) + sum(c.grad_bytes) + sum(c.optimizer_bytes)) / est.parallelism.pipeline


def estimate_within(model: ModelSpec, gpu: GpuSpec, par: Parallelism, efficiency: float | None,
                     cap: float) -> Estimate | str:
    """The estimate of *par*, or why it is rejected: the layout does not fit the model, or a memory lower bound is
    over *cap* (:func:`sim.model.estimate.memory_floor`, which needs no partition, so hopeless layouts never run
    the partitioner; then the smallest stage's own bytes)."""
    try:
        static, held = memory_floor(model, gpu, par)
    except EstimateError as exc:
        return str(exc).splitlines()[0]
    if static + held > cap:
        return (f"over memory by at least {gib(static + held - cap)} GiB (weights, gradients and optimizer "
                f"{gib(static)} GiB per device, plus one block's activations {gib(held)} GiB)")
    est = estimate(model, gpu, par, efficiency=efficiency)
    bound = stage_memory_lower_bound(est)
    if bound > cap:
        static = static_per_device(est)
        return (f"over memory by at least {gib(bound - cap)} GiB (weights, gradients and optimizer {gib(static)} "
                f"GiB per device, plus the smallest stage's activations {gib(bound - static)} GiB)")
    return est


def stage_memory_lower_bound(est: Estimate) -> float:
    """As :func:`memory_floor` (sim.model.estimate) with the partition known: the smallest stage's activations for one
    micro-batch (plus its checkpoint under full recompute) instead of one block's."""
    c = est.costs
    full = est.parallelism.recompute == "full"
    held = min(a + (k if full else 0.0) for a, k in zip(c.activation_bytes, c.checkpoint_bytes))
    return static_per_device(est) + held


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"
