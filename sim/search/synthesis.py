"""Schedule synthesis: search per-device orders that minimise the makespan under a memory cap per device.

    import sim
    costs = sim.uniform(8, forward=1.0, backward=1.0, weight=1.0)
    found = sim.synthesize(costs, sim.Hardware(devices=8), microbatches=32, memory_limit=8)
    found.schedule                     # a Schedule like any other: simulate, draw, export, validate it
    found.makespan, found.bound, found.gap

The zero-bubble paper (Qi et al., ICLR 2024, section 3) shows that an automatic scheduler given the F, B, W and
transfer times and a memory limit beats hand-written schedules; this is pipesim's: the greedy list scheduler of
:mod:`sim.search.synthesis_greedy` (the paper's heuristic, a family of policies), improved by the local search of
:mod:`sim.search.synthesis_local`, or the exact model of :mod:`sim.search.synthesis_ilp` for small K x M. Every
order is timed by the exact engine (:func:`sim.simulate`), and the returned schedule is checked once more before
anyone sees it: :meth:`Schedule.validate` (every action once, no deadlock) and the memory model's peak of every
device against its cap.

The lower bound (:func:`sim.search.synthesis_problem.lower_bound`) says how far from optimal the result can be at
most: ``gap = makespan / bound - 1``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.ir import OP_B, OP_U, OP_W, Schedule, ScheduleError, decode_key, encode_key
from sim.errors import PipesimError, PipesimTypeError
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from sim.engines.fastpath import run_fast
from sim.engines.plan import make_plan
from sim.results.memory import memory_profile
from sim.results.result import Result
from sim.search.synthesis_greedy import POLICIES, Order, greedy_order
from sim.search.synthesis_local import Score, improve
from sim.search.synthesis_problem import (Problem, SynthesisError, device_costs_to_stages, lower_bound, make_problem,
                                         v_placement)
from sim.simulate import simulate

__all__ = ["synthesize", "Synthesis", "SynthesisError", "METHODS", "OBJECTIVES", "evaluate_order", "schedule_of",
           "fits", "registered_orders"]

METHODS = ("auto", "greedy", "local", "ilp")
"""greedy: the best policy's order; local: that plus local search (default via auto); ilp: the exact model
(PuLP + CBC, ``pip install 'pipesim[synth]'``); auto: ilp where it is small and the solver is installed, else
local."""

ILP_AUTO_ACTIONS = 120
"""auto runs the ILP up to this many actions (K=4, M=8 with the split is 96), local search beyond."""

MAX_ACTIONS = 20_000
"""The largest problem searched (K=32, M=208 with the split): each greedy order is a Python list scheduler over
every action, and the local search times thousands of orders; beyond this a registered schedule is the answer."""

SMALL_FAMILY_ACTIONS = 2_000
"""Above this many actions the greedy runs a quarter of its policy family (every fourth), to leave the time budget
to the local search."""


@dataclass(frozen=True, slots=True)
class Synthesis:
    """A synthesized schedule with its exact simulation, its lower bound and how it was found."""

    schedule: Schedule
    result: Result
    """The exact engine's run of :attr:`schedule` (makespan, memory, timeline)."""
    problem: Problem
    bound: float
    """Seconds no schedule of this problem can beat (links without contention)."""
    method: str
    """What found it: ``greedy``, ``local`` or ``ilp``."""
    optimal: bool
    """True where the bound is met, or where the ILP proved its order optimal and the engine runs it in the ILP's
    makespan (links with times included: no transfer waited for a busy link; among the orders that
    keep each stage's micro-batches in order per kind, as every registered schedule does; see
    :mod:`sim.search.synthesis_ilp`)."""
    seconds: float
    """Wall time of the search."""
    evaluations: int
    """Orders timed by the exact engine."""
    notes: tuple[str, ...] = ()
    start: str = ""
    """Where the search started: the greedy policy or the registered schedule whose order was best."""

    @property
    def makespan(self) -> float:
        return self.result.metrics.makespan

    @property
    def longest_span(self) -> float:
        """The longest device span, first start to last end (the zero-bubble paper's cost)."""
        rows = self.result.rows
        comp = rows.computing
        spans = [float(rows.end[comp & (rows.device == d)].max() - rows.start[comp & (rows.device == d)].min())
                 for d in range(self.problem.devices) if (comp & (rows.device == d)).any()]
        return max(spans, default=0.0)

    @property
    def gap(self) -> float:
        """makespan / bound - 1 (0: provably optimal)."""
        return self.makespan / self.bound - 1 if self.bound > 0 else 0.0

    @property
    def peak(self) -> tuple[float, ...]:
        return tuple(self.result.memory.peak)


def schedule_of(order: Order, problem: Problem, name: str = "synthesized") -> Schedule:
    """The schedule of a per-device key order, closed like every flush schedule by one optimizer update U per
    stage at the end of its device (update time 0 unless the costs give one; the validator's gradient check
    compares the weights after each U)."""
    S = problem.stages
    rows = [list(row) + [int(encode_key(s, OP_U, 0, S)) for s in problem.stages_on(d)]
            for d, row in enumerate(order)]
    device_start = np.zeros(problem.devices + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=device_start[1:])
    keys = np.fromiter((k for row in rows for k in row), dtype=np.int64, count=int(device_start[-1]))
    return Schedule.from_keys(name=name, devices=problem.devices, microbatches=problem.microbatches,
                              placement=problem.placement, keys=keys, device_start=device_start)


def registered_orders(problem: Problem) -> list[tuple[str, Order]]:
    """The per-device orders of the registered flush schedules on the problem's placement, as the problem's actions:
    a backward the problem splits gets its W right after it, a W the problem does not split is dropped (its B is
    the full backward), updates are left out (:func:`schedule_of` closes every order with them). Whether they fit
    the cap is the caller's test."""
    from sim import schedules
    from sim.schedules.registry import default_chunks

    S, K, M = problem.stages, problem.devices, problem.microbatches
    out = []
    for name in schedules.names():
        chunks = default_chunks(name)
        if name.startswith("pipedream") or K * chunks != S:
            continue
        try:
            schedule = schedules.generate(name, K, M, chunks=chunks)
        except PipesimError:  # a shape this generator refuses
            continue
        if schedule.placement != problem.placement or schedule.recomputed:
            continue
        split = schedule.split_backward
        order = []
        for d in range(K):
            row = []
            for key in schedule.keys_array[schedule.device_start[d]:schedule.device_start[d + 1]].tolist():
                stage, kind, mb = decode_key(key, S)
                if kind == OP_U or (kind == OP_W and not problem.split):
                    continue
                row.append(key)
                if kind == OP_B and problem.split and (stage, mb) not in split:
                    row.append(int(encode_key(stage, OP_W, mb, S)))
            order.append(row)
        out.append((name, order))
    return out


def fits(problem: Problem, peak: Sequence[float]) -> bool:
    return all(p <= c * (1 + 1e-9) + 1e-9 for p, c in zip(peak, problem.cap))


OBJECTIVES = ("makespan", "span")
"""makespan: first start to last end of the whole iteration (then the longest device span); span: the longest
device span first (the zero-bubble paper's cost, which its bubble rate measures: in a training loop whose
optimizer step does not synchronise the devices, section 4, the next iteration of a device starts when it is
done, so the devices' start offsets are not lost), then the makespan."""


def evaluate_order(order: Order, problem: Problem, costs: StageCosts, hardware: Hardware, *,
                   span_first: bool = False) -> Score | None:
    """The exact engine's score of *order*, or None where it deadlocks or goes over the cap.

    The fast engine's list scheduler (:func:`sim.engines.fastpath.run_fast`, compiled for long schedules) and the
    memory model's peaks (:func:`sim.results.memory.memory_profile`) read its arrays directly: what
    :func:`sim.simulate` computes, without the metrics and result objects a search does not need.
    """
    schedule = schedule_of(order, problem)
    try:
        run = run_fast(make_plan(schedule, problem.memory_costs(costs), hardware))
    except ScheduleError:  # the orders stall: a deadlock
        return None
    if not fits(problem, memory_profile(schedule, problem.memory_costs(costs), run).peak):
        return None
    # a device runs its actions one after another in its order: the first starts first, the last ends last
    starts, ends = run.start[run.device_start[:-1]], run.end[run.device_start[1:] - 1]
    sent = run.link >= 0
    makespan = max(float(ends.max()), float(run.transfer_end[sent].max()) if sent.any() else 0.0)
    return Score(makespan, float((ends - starts).max()), float(ends.sum()), span_first)


def synthesize(costs: StageCosts, hardware: Hardware, *, microbatches: int, placement: str = "linear",
               split: bool | None = None, recompute: bool = False, memory_bytes: float | Sequence[float] | None = None,
               memory_limit: float | None = None, method: str = "auto", seconds: float | None = None,
               max_evals: int | None = None, seed: int = 0, seeds: bool = True,
               weight_memory: float | None = None, objective: str = "makespan") -> Synthesis:
    """Search a schedule of *costs* (one row per stage of *placement*) on *hardware* for *microbatches*.

    *placement*: ``"linear"``, ``"v"`` or ``"any"`` (both searched, the faster kept, each with half of *seconds*;
    costs of one row per device, each cut into its two V stages by
    :func:`~sim.search.synthesis_problem.device_costs_to_stages`). *split*: run the backward as B then W (default:
    where the costs give W time). *recompute*: the search may recompute forwards (R before B) to stay under the
    cap. *memory_bytes* / *memory_limit*: the cap per device
    in bytes, or in micro-batches of activations (:mod:`sim.search.synthesis_problem`). *method*: see
    :data:`METHODS`. *seconds*, *max_evals*: the budget of the whole search (wall time; the ILP's time limit with
    ``method="ilp"``) and of the local search's evaluations (default: ``2 + n / 150`` seconds for n actions, 50
    at most). *seeds*: also start from the orders of the registered schedules that fit the cap (so the result is
    never slower than they are; False: the greedy family alone). *weight_memory*: M_W / M_B, the share of a
    micro-batch's activations its W still needs after B (the zero-bubble paper's memory per pass; default: the
    costs' ``weight_activation_bytes``, all of them where the costs give no bytes). *objective*: see
    :data:`OBJECTIVES` (the ILP minimises the makespan). Raises :class:`SynthesisError` for a problem
    that cannot be met.
    """
    if method not in METHODS:
        raise SynthesisError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    if objective not in OBJECTIVES:
        raise SynthesisError(f"unknown objective {objective!r}; choose one of: {', '.join(OBJECTIVES)}")
    span_first = objective == "span"
    for name, value, cls in (("costs", costs, StageCosts), ("hardware", hardware, Hardware)):
        if not isinstance(value, cls):
            raise PipesimTypeError(f"synthesize: {name} must be a {cls.__name__} (see sim.uniform, sim.Hardware), "
                                   f"got {type(value).__name__}")
    if placement == "any":  # one row per device: the line as given, the V with each row cut into two chunks
        options = dict(microbatches=microbatches, split=split, recompute=recompute, memory_bytes=memory_bytes,
                       memory_limit=memory_limit, method=method, seconds=None if seconds is None else seconds / 2,
                       max_evals=max_evals, seed=seed, seeds=seeds, weight_memory=weight_memory, objective=objective)
        if costs.stages != hardware.devices:
            raise SynthesisError(f"placement 'any' takes one cost row per device ({hardware.devices}), got "
                                 f"{costs.stages}")
        line = synthesize(costs, hardware, placement="linear", **options)
        vee = synthesize(device_costs_to_stages(costs, v_placement(hardware.devices)), hardware, placement="v",
                         **options)
        return min((line, vee), key=lambda found: (found.longest_span, found.makespan) if span_first
                   else found.makespan)
    if method == "ilp" and span_first:
        raise SynthesisError("the ILP minimises the makespan; use --method local with --objective span")
    if method == "ilp" and (placement != "linear" or recompute):
        raise SynthesisError("the ILP models one stage per device (linear placement) without recompute; use "
                             "--method local for a V or with recompute")
    if split is None:
        split = any(costs.weight)
    problem = make_problem(costs, hardware, microbatches=microbatches, placement=placement, split=split,
                           recompute=recompute, memory_bytes=memory_bytes, memory_limit=memory_limit,
                           weight_memory=weight_memory)
    n = problem.stages * microbatches * (3 if split else 2)
    if n > MAX_ACTIONS:
        raise SynthesisError(f"{n:,} actions (S={problem.stages} stages x M={microbatches}) are more than the "
                             f"synthesis searches ({MAX_ACTIONS:,}); use fewer micro-batches (a schedule found for a "
                             f"smaller M shows the shape) or a registered schedule")
    began = time.perf_counter()
    bound = lower_bound(problem)
    notes: list[str] = []
    if method == "auto":
        from sim.search import synthesis_ilp

        small = n <= ILP_AUTO_ACTIONS and placement == "linear" and not recompute and not span_first
        method = "ilp" if small and synthesis_ilp.available() else "local"
    # the whole call's wall-time budget (the ILP has its own time limit): the greedy family stops early when it
    # runs out (the registered orders and the first policies always run), the local search gets the rest
    budget = seconds if seconds is not None else min(50.0, 2.0 + n / 150)
    deadline = began + (budget if method == "local" else math.inf)
    best_order, best, start_label, evaluations = _best_start(problem, costs, hardware, seeds=seeds, began=began,
                                                       deadline=deadline, notes=notes, span_first=span_first)
    optimal = False
    if method == "local":
        best_order, best, spent = improve(best_order, best,
                                          lambda o: evaluate_order(o, problem, costs, hardware, span_first=span_first),
                                          stages=problem.stages, seed=seed,
                                          max_evals=max_evals if max_evals is not None else 20 * n,
                                          seconds=max(0.0, deadline - time.perf_counter()))
        evaluations += spent
    elif method == "ilp" and best.makespan <= bound * (1 + 1e-9):
        notes.append("the greedy order meets the lower bound: optimal without the ILP")
    elif method == "ilp":
        best_order, optimal = _ilp(problem, costs, hardware, best_order, best,
                                   seconds=seconds if seconds is not None else 60.0, notes=notes)
        evaluations += 1
    schedule = _checked(best_order, problem, costs, hardware)
    result = simulate(schedule, problem.memory_costs(costs), _with_cap(hardware, problem))
    optimal = optimal or (not span_first and result.metrics.makespan <= bound * (1 + 1e-9))
    return Synthesis(schedule=schedule, result=result, problem=problem, bound=bound, method=method, optimal=optimal,
                     seconds=time.perf_counter() - began, evaluations=evaluations, notes=tuple(notes),
                     start=start_label)


def _best_start(problem: Problem, costs: StageCosts, hardware: Hardware, *, seeds: bool, began: float,
                deadline: float, notes: list[str], span_first: bool = False) -> tuple[Order, Score, str, int]:
    """The best of the starting orders (the registered schedules' where *seeds*, then the greedy family) under the
    exact engine: (order, score, where it came from, orders timed). Past half of the budget, after at least eight
    starts, the rest are skipped (noted)."""
    n = problem.stages * problem.microbatches * (3 if problem.split else 2)
    family = POLICIES if n <= SMALL_FAMILY_ACTIONS else POLICIES[::4]
    starts: list[tuple[str, Order | object]] = (
        [(f"{name}'s order", order) for name, order in registered_orders(problem)] if seeds else [])
    starts += [(f"greedy {policy}", policy) for policy in family
               if len(problem.stages_on(0)) > 1 or policy.deep_first]  # deep_first only orders a device's stages
    best_order, best, label, evaluations = None, None, "", 0
    for i, (name, start) in enumerate(starts):
        if best is not None and i >= 8 and time.perf_counter() > began + 0.5 * (deadline - began):
            notes.append(f"time budget: {len(starts) - i} of {len(starts)} starts not tried")
            break
        if isinstance(start, list):
            order = start
        else:
            try:
                order = greedy_order(problem, start)
            except SynthesisError as exc:
                notes.append(str(exc))
                continue
        score = evaluate_order(order, problem, costs, hardware, span_first=span_first)
        evaluations += 1
        if score is not None and (best is None or score < best):
            best_order, best, label = order, score, name
    if best is None:
        raise SynthesisError("no greedy order runs under the cap; raise the cap" + (
            "" if problem.recompute else " or allow recompute") + (f" ({notes[0]})" if notes else ""))
    return best_order, best, label, evaluations


def _ilp(problem: Problem, costs: StageCosts, hardware: Hardware, order: Order, score: Score, *, seconds: float,
         notes: list[str]) -> tuple[Order, bool]:
    """The ILP's order where the exact engine finds it no longer than *order* (and whether it is proven optimal:
    only on free links, where the model is exact), else *order*."""
    from sim.search.synthesis_ilp import solve

    solved = solve(problem, start=order, seconds=seconds)
    notes.extend(solved.notes)
    timed = evaluate_order(solved.order, problem, costs, hardware)
    if timed is None or timed.makespan > score.makespan * (1 + 1e-12):
        notes.append("the ILP's order is not shorter under the exact engine (link contention); kept the greedy one")
        return order, False
    # the ILP's model is a relaxation of the engine: the same durations, each transfer a fixed delay (latency +
    # bytes / bandwidth, what the engine holds a link for) but never waiting for a busy link, sends never blocking
    # a device. Every order's engine makespan is >= its model makespan >= the model's optimum, so an order the
    # engine runs in exactly that optimum is optimal for the engine too, links with times included
    exact = timed.makespan <= solved.makespan * (1 + 1e-9) + 1e-12
    if solved.optimal and not exact:
        notes.append(f"the ILP's optimum on links without contention is {solved.makespan:.6g} s; the engine, whose "
                     f"links carry one transfer at a time, runs its order in {timed.makespan:.6g} s (not claimed "
                     f"optimal)")
    return solved.order, solved.optimal and exact


def _with_cap(hardware: Hardware, problem: Problem) -> Hardware:
    """*hardware* with the problem's cap as its memory capacity where one cap holds for every device, so that the
    result's memory profile (and its Gantt's memory panel) shows the line the search kept under."""
    caps = set(problem.cap)
    if len(caps) != 1 or math.isinf(problem.cap[0]) or hardware.memory_capacity == problem.cap[0]:
        return hardware
    return dataclasses.replace(hardware, memory_capacity=problem.cap[0])


def _checked(order: Order, problem: Problem, costs: StageCosts, hardware: Hardware) -> Schedule:
    """The final check before a schedule leaves the synthesis: structure, no deadlock, under the cap."""
    schedule = schedule_of(order, problem).validate()
    result = simulate(schedule, problem.memory_costs(costs), hardware)
    if not fits(problem, result.memory.peak):  # a bug of ours: the searches only keep orders that fit
        raise AssertionError(f"synthesized schedule over its cap: peaks {result.memory.peak}, cap {problem.cap}")
    return schedule
