"""The memory-aware greedy list scheduler of schedule synthesis.

It follows the heuristic of the zero-bubble paper (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
section 3.1, "automatic scheduling"): in the warm-up each stage runs as many forwards as its memory limit allows
before its first backward can arrive; in the steady state a backward (on the critical path, upstream) goes first
when it is ready; a weight gradient W fills the gap while the next F or B is not ready yet, and runs whenever the
memory limit stops the next forward (W frees the activations its B left: the paper's M_W); the W's left at the end
close the iteration. This module is our own event-driven version of that heuristic, not the paper's code: devices are
simulated together in time order, each picking its next action when it becomes free.

Its timing model is the problem's (:class:`~sim.search.synthesis_problem.Problem`: computation times plus one
transfer time per stage boundary, links without contention); the order it produces is what counts, and the exact
engine times it (:mod:`sim.search.synthesis`). A :class:`Policy` sets how eager forwards and weight gradients are;
:data:`POLICIES` is the small family the synthesis tries, each giving one order.

Memory is counted as the engine's memory model does (:mod:`sim.results.memory`) in execution order: a device runs
one action at a time, so what it holds when an action starts is the sum of what the earlier actions allocated and
freed. Each F, and each R, is admitted only if the device stays under its cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.core.ir import OP_B, OP_F, OP_R, OP_W, encode_key
from sim.search.synthesis_problem import Problem, SynthesisError

__all__ = ["Policy", "POLICIES", "greedy_order", "Order"]

Order = list[list[int]]
"""Per device, its actions as keys of :mod:`sim.core.ir`'s codec, in execution order."""

_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Policy:
    """How eager the greedy scheduler is (times are multiples of the action's own duration)."""

    f_slack: float = math.inf
    """A ready forward may start only if it delays the device's next backward by at most this many forwards'
    time (inf: forwards whenever ready and memory allows; 0: never delay a backward that is on its way)."""
    warmup_slack: float = math.inf
    """The same as :attr:`f_slack`, before the stage's first backward (the warm-up): 0 keeps the first
    backward, which every upstream stage waits for, from waiting behind an extra forward."""
    w_slack: float = 0.0
    """An idle device runs a pending W only if the W ends at most this many W's time after the next F or B
    could start (0: W only where it fits the gap; inf: W whenever nothing is ready)."""
    w_unknown: bool = True
    """Whether an idle device whose next F and B wait for actions not yet placed fills the wait with W's."""
    deep_first: bool = True
    """With several stages on a device (V placement): prefer the later stage's forward (its backward comes
    back sooner)."""
    first: str = "urgent"
    """When a forward and a backward are both ready: ``"b"`` the backward (the critical path runs upstream),
    ``"f"`` the forward, ``"urgent"`` the one whose consumer is free sooner: the device of the next stage for
    F, of the previous stage for B (a first stage's B feeds only its own W: its forward goes first)."""
    free_first: bool = False
    """When the memory cap stops the next forward and a W is pending: run the W (then the forward) before a
    ready backward, so the devices downstream get their next forward sooner."""


POLICIES: tuple[Policy, ...] = tuple(
    Policy(first=first, warmup_slack=ws0, f_slack=fs, w_slack=ws, free_first=ff, deep_first=df)
    for first in ("urgent", "b") for ws0 in (0.0, 0.5, math.inf) for fs in (math.inf, 0.5) for ws in (0.0, math.inf)
    for ff in (False, True) for df in (True, False))
"""The family the synthesis runs: 96 orders on a V, 48 on a line (deep_first only orders a device's stages)."""


class _State:
    """Mutable state of one greedy run: what each stage has placed, each device's clock and memory."""

    def __init__(self, p: Problem) -> None:
        S, M = p.stages, p.microbatches
        self.p = p
        self.next_f = [0] * S  # next micro-batch to forward on stage s
        self.next_b = [0] * S
        self.pending_w: list[list[int]] = [[] for _ in range(S)]  # B done, W not yet (split only)
        self.f_end = np.full((S, M), np.nan)
        self.b_end = np.full((S, M), np.nan)
        self.recomputed = np.zeros((S, M), dtype=bool)  # F kept only the checkpoint; R due before B
        self.r_done = np.zeros((S, M), dtype=bool)
        self.free_at = [0.0] * p.devices
        self.memory = list(p.static)
        # on a V, a micro-batch that entered a device's first stage will need its later stage there too: that
        # memory is reserved at the first forward, so the first stage's forwards can never fill the device and
        # leave the micro-batches already in flight nowhere to go (a deadlock)
        self.later = [[t for t in p.stages_on(p.placement[s]) if t > s] for s in range(S)]
        self.reserved = [0.0] * p.devices
        # recomputed micro-batches whose R has not run yet, per device: while there is one, a forward must leave
        # room to re-materialize it, or the device could fill up with newer forwards and never run that R
        self.awaiting_r = [0] * p.devices
        self.largest = [max(p.activation[t] for t in p.stages_on(d)) for d in range(p.devices)]
        # per device the static memory plus the checkpoints held (from a recomputed F until its W): what no
        # backward drains, so a forward may keep only its checkpoint only if its R fits beside that
        self.checkpoints = list(p.static)
        self.inflight = [0] * S
        self.order: Order = [[] for _ in range(p.devices)]


def greedy_order(p: Problem, policy: Policy = Policy()) -> Order:
    """One order of every action of *p* (raises :class:`SynthesisError` if the cap lets nothing run)."""
    st = _State(p)
    K, S = p.devices, p.stages
    total = S * p.microbatches * (3 if p.split else 2)
    placed = 0
    stages_of = [sorted(p.stages_on(d), reverse=policy.deep_first) for d in range(K)]
    proposals: list[tuple[float, int, int, int] | None] = [None] * K  # (start, kind, stage, mb) per device
    dirty = [True] * K
    while placed < total:
        for d in range(K):
            if dirty[d]:
                proposals[d] = _propose(st, d, stages_of[d], policy, fill_unknown=policy.w_unknown)
                dirty[d] = False
        live = [_rank(prop, d) for d, prop in enumerate(proposals) if prop is not None]
        if not live:  # every device waits on actions not yet placed: let the pending W's run
            for d in range(K):
                proposals[d] = _propose(st, d, stages_of[d], policy, fill_unknown=True)
            live = [_rank(prop, d) for d, prop in enumerate(proposals) if prop is not None]
            if not live:
                raise SynthesisError("the memory cap leaves every device waiting: no order runs under it "
                                     "(raise the cap)")
        d = min(live)[-1]
        start, kind, stage, mb = proposals[d]
        placed += _commit(st, d, start, kind, stage, mb)
        for s in (stage - 1, stage, stage + 1):  # the devices whose next action this may have enabled
            if 0 <= s < S:
                dirty[p.placement[s]] = True
        dirty[d] = True
    return st.order


def _rank(proposal, device: int) -> tuple:
    """Which proposal is placed first: the earliest; at equal starts backwards first, the later stage first. A
    backward placed makes the next one's arrival known, so the upstream device decides its next forward knowing
    when that backward comes (the zero-bubble heuristic schedules each round's backwards from the last stage up)."""
    start, kind, stage, _ = proposal
    return start, kind != OP_B, -stage, device


def _commit(st: _State, d: int, start: float, kind: int, stage: int, mb: int) -> int:
    """Place action (*kind*, *stage*, *mb*) on device *d* at *start*; return how many actions of the problem it
    completes (an R is extra)."""
    p = st.p
    S = p.stages
    if kind == OP_F:
        dur = p.forward[stage]
        later = sum(p.activation[t] for t in st.later[stage])
        if any(stage in st.later[t] for t in range(stage)):  # a later stage of its device: reserved already
            st.reserved[d] -= p.activation[stage]
            ckpt = False
        else:
            room = st.largest[d] if st.awaiting_r[d] else 0.0
            ckpt = p.recompute and (st.memory[d] + st.reserved[d] + p.activation[stage] + later + room
                                    > p.cap[d] * (1 + _EPS))
            st.reserved[d] += later
            st.checkpoints[d] += p.checkpoint[stage] if ckpt else 0.0
        st.awaiting_r[d] += ckpt
        st.recomputed[stage, mb] = ckpt
        st.memory[d] += p.checkpoint[stage] if ckpt else p.activation[stage]
        st.next_f[stage] += 1
        st.inflight[stage] += 1
        st.f_end[stage, mb] = start + dur
    elif kind == OP_R:
        dur = p.recompute_time[stage]
        st.memory[d] += p.activation[stage]
        st.r_done[stage, mb] = True
        st.awaiting_r[d] -= 1
    elif kind == OP_B:
        dur = p.backward[stage]
        st.next_b[stage] += 1
        st.b_end[stage, mb] = start + dur
        if p.split:
            st.pending_w[stage].append(mb)
            st.memory[d] -= p.activation[stage] - p.kept[stage]  # what W does not need (M_B - M_W)
        else:
            _free(st, d, stage, mb)
    else:  # W
        dur = p.weight[stage]
        st.pending_w[stage].remove(mb)
        _free(st, d, stage, mb)
    st.free_at[d] = start + dur
    st.order[d].append(int(encode_key(stage, kind, mb, S)))
    return kind != OP_R


def _free(st: _State, d: int, stage: int, mb: int) -> None:
    """The end of a micro-batch's backward on *stage*: W frees what its B kept (all of it without the split)."""
    p = st.p
    held = p.kept[stage] if p.split else p.activation[stage]
    st.memory[d] -= held + (p.checkpoint[stage] if st.recomputed[stage, mb] else 0.0)
    st.checkpoints[d] -= p.checkpoint[stage] if st.recomputed[stage, mb] else 0.0
    st.inflight[stage] -= 1


def _forward_first(st: _State, policy: Policy, f_cand, b_cand) -> bool:
    """Whether the ready forward *f_cand* goes before the ready backward *b_cand* (see :attr:`Policy.first`)."""
    if policy.first != "urgent":
        return policy.first == "f"
    p = st.p
    fs, bs = f_cand[2], b_cand[2]
    if bs == 0:
        return True  # the first stage's B feeds only its own W
    f_need = st.free_at[p.placement[fs + 1]] if fs + 1 < p.stages else math.inf
    b_need = st.free_at[p.placement[bs - 1]]
    return f_need < b_need


def _propose(st: _State, d: int, stages: list[int], policy: Policy, *, fill_unknown: bool):
    """Device *d*'s next action as (start, kind, stage, mb), or None while it waits on actions not placed."""
    p = st.p
    M, S = p.microbatches, p.stages
    now = st.free_at[d]
    # the earliest backward (or the recompute it needs first) whose input is known
    b_best = None
    for s in stages:
        m = st.next_b[s]
        if m >= st.next_f[s]:
            continue  # its forward is not placed yet
        ready = st.f_end[s, m] if s == S - 1 else st.b_end[s + 1, m] + p.comm_up[s + 1]
        if math.isnan(ready):
            continue
        if st.recomputed[s, m] and not st.r_done[s, m]:
            if st.memory[d] + st.reserved[d] + p.activation[s] <= p.cap[d] * (1 + _EPS):
                cand = (max(now, ready - p.recompute_time[s]), OP_R, s, m)  # R finishes as the gradient arrives
                if b_best is None or cand[0] < b_best[0]:
                    b_best = cand
            continue
        cand = (max(now, ready), OP_B, s, m)
        if b_best is None or cand[0] < b_best[0]:
            b_best = cand
    # the earliest forward whose input is known and that fits in memory
    f_best, f_blocked = None, False
    for s in stages:
        m = st.next_f[s]
        if m >= M:
            continue
        ready = 0.0 if s == 0 else st.f_end[s - 1, m] + p.comm_down[s - 1]
        if math.isnan(ready):
            continue
        if any(s in st.later[t] for t in range(s)):
            fits = True  # its memory was reserved when the micro-batch entered the device
        else:
            later = sum(p.activation[t] for t in st.later[s])
            room = st.largest[d] if st.awaiting_r[d] else 0.0  # keep a pending R possible
            need = p.activation[s] + later
            if p.recompute and st.memory[d] + st.reserved[d] + need + room > p.cap[d] * (1 + _EPS):
                # it would keep only its checkpoint (as _commit decides), so its R must fit beside every
                # checkpoint held once the rest has drained, or the device is stuck for good (with M_W < M_B a B
                # frees room for a checkpoint but not for its R: found by hypothesis, tests/test_synthesis.py)
                need = min(p.checkpoint[s], p.activation[s]) + later
                reachable = (st.checkpoints[d] + st.reserved[d] + need + max(room, p.activation[s])
                             <= p.cap[d] * (1 + _EPS))
                fits = reachable and st.memory[d] + st.reserved[d] + need + room <= p.cap[d] * (1 + _EPS)
            else:
                fits = st.memory[d] + st.reserved[d] + need + room <= p.cap[d] * (1 + _EPS)
        if not fits:
            f_blocked = True
            continue
        cand = (max(now, ready), OP_F, s, m)
        if f_best is None or cand[0] < f_best[0] - _EPS:
            f_best = cand
    w_stage = next((s for s in sorted(stages) if st.pending_w[s]), None)  # lowest stage: its W's are oldest
    w_cand = None if w_stage is None else (now, OP_W, w_stage, st.pending_w[w_stage][0])

    b_now = b_best is not None and b_best[0] <= now + _EPS
    f_now = f_best is not None and f_best[0] <= now + _EPS
    if policy.free_first and f_blocked and w_cand is not None and b_now and f_best is None:
        return w_cand
    if f_now and b_now and _forward_first(st, policy, f_best, b_best):
        return f_best
    if b_now:
        return b_best
    if f_now:
        slack = policy.warmup_slack if st.next_b[f_best[2]] == 0 else policy.f_slack
        delay_ok = b_best is None or now + p.forward[f_best[2]] <= b_best[0] + slack * p.forward[f_best[2]]
        if delay_ok:
            return f_best
    nxt = [c for c in (b_best, f_best) if c is not None]
    if f_best is not None and f_best[0] <= now + _EPS and b_best is not None:
        nxt = [b_best]  # the forward waits for the backward (f_slack)
    if w_cand is not None:
        w = p.weight[w_stage]
        if not nxt:
            if f_blocked or fill_unknown:
                return w_cand
            return None
        soonest = min(c[0] for c in nxt)
        if now + w <= soonest + policy.w_slack * w + _EPS:
            return w_cand
        if f_blocked and b_best is None:
            return w_cand  # only a W frees the memory the next forward needs
    if not nxt:
        return None
    return min(nxt, key=lambda c: (c[0], c[1] != OP_B))
