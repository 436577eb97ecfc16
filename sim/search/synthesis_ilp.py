"""The exact model of schedule synthesis: a mixed-integer program for small K x M (PuLP with CBC).

Optional: ``pip install 'pipesim[synth]'`` installs PuLP, which ships the CBC solver; without it
:func:`available` is False and the synthesis uses its greedy and local search.

The model is the zero-bubble paper's (Qi et al., ICLR 2024, appendix: "ILP formulation"), written for our IR
on a linear placement (stage s on device s):

- variables: the end time E(a) of every action a (F, B and, with the split, W of every stage and micro-batch),
  the makespan C, and for every two actions of one device that no dependency orders, a binary O(a, b) = 1 when
  a runs before b;
- dependencies: E(F(s,m)) >= E(F(s-1,m)) + comm + T_F(s); E(B(s,m)) >= E(B(s+1,m)) + comm + T_B(s) (the last
  stage after its own F); E(W(s,m)) >= E(B(s,m)) + T_W(s);
- one action at a time per device: E(b) >= E(a) + T(b) - H (1 - O(a,b)) and the converse (H a horizon, the
  greedy's makespan);
- memory, in execution order (one device runs one action at a time, so what it holds when a forward starts
  is the sum of what the actions before it allocated and freed; the memory model of :mod:`sim.results.memory`):
  for every F(s,m), static + sum over a of O(a, F) * delta(a) + act(s) <= cap, delta(F) = +act,
  delta(B) = -(act - kept), delta(W) = -kept (the paper's M_B and M_W; delta(B) = -act without the split);
- C >= E(a) for every a, and C >= E(a) + the work the device must still do after a (valid cuts: the forwards of
  later micro-batches and the backwards and W's still due); minimise C.

Within a stage the micro-batches keep their order (F(s,m) before F(s,m+1), the same for B and W), which every
hand-written schedule does and which removes symmetric solutions; so only pairs of different kinds need a
binary, and only where the micro-batch order leaves them open. Transfers are a fixed time per stage boundary
(latency + bytes / bandwidth: the delay between dependent actions on two devices, with no link contention), so the
model is a relaxation of the engine; the solver's order is timed again by the exact engine, and "optimal" is
claimed where the engine runs it in the model's optimum (:func:`sim.search.synthesis._ilp`: then no order can do
better on the engine either, links with times included).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass

from sim.core.ir import OP_B, OP_F, OP_W, decode_key, encode_key
from sim.search.synthesis_problem import Problem, SynthesisError, lower_bound

__all__ = ["available", "solve", "Solved"]


def available() -> bool:
    """Whether PuLP (and so CBC, which it ships) is installed; nothing is imported."""
    return importlib.util.find_spec("pulp") is not None


@dataclass(frozen=True, slots=True)
class Solved:
    order: list[list[int]]
    """Per device, the keys in execution order."""
    optimal: bool
    """The solver proved optimality (under the model) within its time limit."""
    makespan: float
    """The model's makespan (links without contention)."""
    notes: tuple[str, ...] = ()


def solve(p: Problem, *, start: list[list[int]] | None = None, seconds: float = 60.0) -> Solved:
    """Solve *p* exactly (linear placement, no recompute); *start* (an order) bounds the horizon."""
    try:
        import pulp
    except ImportError:
        raise SynthesisError("the ILP needs PuLP: pip install 'pipesim[synth]' (or use --method local)") from None
    if p.placement != tuple(range(p.devices)):
        raise SynthesisError("the ILP models one stage per device (linear placement); use --method local for a V")
    if p.recompute:
        raise SynthesisError("the ILP does not model recompute; use --method local")
    S, M = p.stages, p.microbatches
    kinds = (OP_F, OP_B, OP_W) if p.split else (OP_F, OP_B)
    dur = {OP_F: p.forward, OP_B: p.backward, OP_W: p.weight}
    horizon = _horizon(p)
    prob = pulp.LpProblem("pipesim_synthesis", pulp.LpMinimize)
    var = _variable_maker(pulp, prob)
    end = {(k, s, m): var(f"E_{k}_{s}_{m}", 0, horizon, "Continuous")
           for k in kinds for s in range(S) for m in range(M)}
    makespan = var("C", lower_bound(p), horizon, "Continuous")  # the problem's bound: a cut the LP cannot find
    prob += makespan
    for s in range(S):
        for m in range(M):
            f, b = end[OP_F, s, m], end[OP_B, s, m]
            prob += f >= (end[OP_F, s - 1, m] + p.comm_down[s - 1] if s else 0) + p.forward[s]
            prob += b >= (end[OP_B, s + 1, m] + p.comm_up[s + 1] if s < S - 1 else f) + p.backward[s]
            prob += b >= f + p.backward[s]
            last = b
            if p.split:
                prob += end[OP_W, s, m] >= b + p.weight[s]
                last = end[OP_W, s, m]
            prob += makespan >= last
            if m:  # micro-batch order within a stage and kind
                for k in kinds:
                    prob += end[k, s, m] >= end[k, s, m - 1] + dur[k][s]
    # valid cuts that tighten the LP relaxation (big-M disjunctions alone bound C poorly): whatever a device must
    # still run after one of its actions, it runs after that action ends. After F(s,m): the forwards of later
    # micro-batches and the backward (and W) of m and later; after B(s,m): the later B's and the W's from m on.
    for s in range(S):
        for m in range(M):
            w_from = p.weight[s] * (M - m) if p.split else 0.0
            prob += makespan >= end[OP_F, s, m] + p.forward[s] * (M - 1 - m) + p.backward[s] * (M - m) + w_from
            prob += makespan >= end[OP_B, s, m] + p.backward[s] * (M - 1 - m) + w_from
    before = {}  # (a, b) -> binary: a runs before b, for pairs no dependency orders
    for s in range(S):
        for ka in kinds:
            for kb in kinds:
                if _rank(ka) >= _rank(kb):
                    continue
                for ma in range(M):
                    for mb in range(M):
                        if mb >= ma:
                            continue  # ka(ma) before kb(mb) for mb >= ma: F(m) -> B(m) -> W(m), in order
                        a, b = (ka, s, ma), (kb, s, mb)  # open pair: kb of an earlier micro-batch vs ka of a later
                        o = var(f"O_{ka}_{kb}_{s}_{ma}_{mb}", None, None, "Binary")
                        before[a, b] = o
                        prob += end[b] >= end[a] + dur[kb][s] - horizon * (1 - o)
                        prob += end[a] >= end[b] + dur[ka][s] - horizon * o
    if any(c < math.inf for c in p.cap):
        _memory(prob, p, kinds, before)
    if start is not None:
        _warm_start(p, start, end, before, kinds, makespan)
    with warnings.catch_warnings():  # PuLP 3.x announces 4.0's renames; the bundled CBC is what we want here
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(math.ceil(seconds))),
                                   warmStart=start is not None)
        status = prob.solve(solver)
    if pulp.LpStatus[status] not in ("Optimal", "Not Solved") or makespan.value() is None:
        raise SynthesisError(f"the ILP solver returned {pulp.LpStatus[status]!r}; use --method local")
    optimal = pulp.LpStatus[status] == "Optimal" and prob.sol_status == pulp.LpSolutionOptimal
    order = []
    for d in range(p.devices):
        acts = sorted(((end[k, d, m].value() - dur[k][d], _rank(k), m, k) for k in kinds for m in range(M)))
        order.append([int(encode_key(d, k, m, S)) for _, _, m, k in acts])
    notes = () if optimal else (f"the ILP stopped at its time limit ({seconds:g} s) without proving optimality",)
    return Solved(order, optimal, float(makespan.value()), notes)


def _variable_maker(pulp, prob):
    """A variable factory: ``prob.add_variable`` where PuLP has it (3.3 on; 4.0 requires it), else
    ``LpVariable``."""
    if hasattr(prob, "add_variable"):
        return lambda name, low, high, cat: prob.add_variable(name, low, high, cat=cat)
    return lambda name, low, high, cat: pulp.LpVariable(name, lowBound=low, upBound=high, cat=cat)


def _rank(kind: int) -> int:
    return {OP_F: 0, OP_B: 1, OP_W: 2}[kind]


def _horizon(p: Problem) -> float:
    """An upper bound on the makespan of any order worth having: every action one after another."""
    serial = sum(p.microbatches * (p.forward[s] + p.backward[s] + p.weight[s]) for s in range(p.stages))
    return serial + p.microbatches * (sum(p.comm_down) + sum(p.comm_up)) + 1.0


def _memory(prob, p: Problem, kinds, before) -> None:
    """At the start of every F: static + what the device's earlier actions hold + its own activations <= cap."""
    S, M = p.stages, p.microbatches
    free_kind = OP_W if p.split else OP_B
    for s in range(S):
        act = p.activation[s]
        if act <= 0 or p.cap[s] == math.inf:
            continue
        kept = p.kept[s] if p.split else act  # what the free_kind action frees; a split B frees the rest
        for m in range(M):
            # the forwards before F(s,m) are F(s,0..m-1); the frees before it are W (or B) of micro-batches < m
            # that run before it: fixed ones need no binary only if the kind order fixes them (never here)
            held = p.static[s] + act * (m + 1)
            frees = []
            partial = []
            for m2 in range(m):
                o = before.get(((OP_F, s, m), (free_kind, s, m2)))  # 1: F(s,m) before the free of m2
                frees.append(1 - o)
                if p.split and act > kept:
                    partial.append(1 - before[(OP_F, s, m), (OP_B, s, m2)])
            prob += held - kept * sum(frees) - (act - kept) * sum(partial) <= p.cap[s]


def _model_times(p: Problem, order) -> dict[tuple[int, int, int], float]:
    """End times of *order* under the ILP's model: each device runs its actions in order, each as soon as its
    inputs are there (a plain list scheduler; the order is a valid one, so it never stalls)."""
    S = p.stages
    ends: dict[tuple[int, int, int], float] = {}
    pos = [0] * p.devices
    free = [0.0] * p.devices
    left = sum(len(row) for row in order)
    while left:
        moved = False
        for d, row in enumerate(order):
            while pos[d] < len(row):
                s, k, m = (int(x) for x in decode_key(row[pos[d]], S))
                if k == OP_F:
                    dep = ends.get((OP_F, s - 1, m), None) if s else 0.0
                    ready = None if dep is None else dep + (p.comm_down[s - 1] if s else 0.0)
                elif k == OP_B:
                    dep = ends.get((OP_F, s, m)) if s == S - 1 else ends.get((OP_B, s + 1, m))
                    ready = None if dep is None else dep + (p.comm_up[s + 1] if s < S - 1 else 0.0)
                    own = ends.get((OP_F, s, m))
                    ready = None if ready is None or own is None else max(ready, own)
                else:
                    ready = ends.get((OP_B, s, m))
                if ready is None:
                    break
                dur = (p.forward, p.backward, p.weight)[(OP_F, OP_B, OP_W).index(k)][s]
                free[d] = max(free[d], ready) + dur
                ends[k, s, m] = free[d]
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:
            raise SynthesisError("the warm start order deadlocks")  # a bug of ours: greedy orders always run
    return ends


def _warm_start(p: Problem, start, end, before, kinds, makespan) -> None:
    """Give the solver the greedy order as its first incumbent, with its times under the model."""
    S = p.stages
    position = {}
    for d, row in enumerate(start):
        for i, key in enumerate(row):
            position[key] = i
    times = _model_times(p, start)
    for key, var in end.items():
        var.setInitialValue(times[key])
    makespan.setInitialValue(max(times.values()))
    for (a, b), o in before.items():
        ka, s, ma = a
        kb, _, mb = b
        o.setInitialValue(1 if position[encode_key(s, ka, ma, S)] < position[encode_key(s, kb, mb, S)] else 0)
