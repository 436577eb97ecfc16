"""A schedule as the integer arrays the engines read, checked and derived with vectorised numpy.

:class:`sim.core.ir.Schedule` stores its actions as one int64 array of keys (:mod:`sim.core.ir`'s codec,
``(mb*S + stage)*5 + kind``), device by device, plus where each device's run starts. From
those arrays this module

- checks a schedule's shape without a Python loop over actions (:func:`check_structure`):
  misplaced, duplicate, missing and out-of-shape actions, inconsistent updates;
- derives every dependency as flat CSR arrays (:func:`build_flat`, the :class:`FlatSchedule`
  the list scheduler of :mod:`sim.engines.fastpath` walks);
- finds a deadlock by running that same list scheduler with zero costs: a device that stalls
  is stuck, and what it waits for is read from the scheduler's final state
  (:func:`find_stall`, :func:`stuck_actions`). The readable explanation (the device x step
  grid) is built only when there is an error.

Once numba is loaded and a schedule is large enough (:func:`sim.jit.kernel_for`), the check and
the dependency arrays are computed together by one compiled kernel instead (:func:`_flat_kernel`), which
gives the same verdicts and the same integers (``tests/test_fastpath.py``).

:class:`Compiled` keeps the per-key dict views (``keys``, ``deps``, ``sends``) that the simpy
engine, the replication model and the validator's executor read; they are built on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from sim import jit
from sim.core.keys import (NUM_KINDS, OP_B, OP_F, OP_R, OP_U, OP_W, ScheduleError, decode_key, encode_key, key_kind,
    key_mb, key_stage)

if TYPE_CHECKING:
    from sim.core.ir import Schedule

__all__ = ["FlatSchedule", "Compiled", "check_structure", "build_flat", "find_stall", "stuck_actions"]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class FlatSchedule:
    """A schedule's actions and their inputs as flat numpy arrays; action *i* is the i-th key in device order.

    An action's inputs are *slots* of a ready-time array of length 2n: slot ``i`` is the
    end of action *i* on its own device, slot ``n + i`` the arrival of its result at the
    device that needs it.
    """

    keys: np.ndarray
    """int64[n]: action keys, device by device, each device's actions in order."""
    device: np.ndarray
    """int64[n]: the device of each action."""
    device_start: np.ndarray
    """int64[K+1]: device d runs actions device_start[d] .. device_start[d+1]-1."""
    dep_start: np.ndarray
    """int64[n+1]: action i's inputs are dep_slot[dep_start[i]:dep_start[i+1]]."""
    dep_slot: np.ndarray
    """int64: input slots (see above), in the order of :attr:`Compiled.deps`."""
    send_to: np.ndarray
    """int64[n]: the device action i's result is sent to, or -1."""


# ------------------------------------------------------------------ structure checks
def check_structure(schedule: Schedule) -> int:
    """Raise :class:`ScheduleError` unless every expected action appears exactly once, on its stage's device;
    return the number of updates per stage.

    Expected: F and B of every (stage, micro-batch) of the run, any W and R of those, and the
    same number of updates U on every stage, numbered from 0. Vectorised: no loop over actions in
    Python (once numba is loaded, one compiled loop says whether all pass; numpy words any error).
    """
    keys, K, S = schedule.keys_array, schedule.devices, schedule.stages
    if (kernel := jit.kernel_for(_flat_kernel, len(keys))) is not None:
        # one kernel checks the structure and, since the dependency arrays need the same key -> position table,
        # builds them too: every caller of the check goes on to read them (validation, simulation)
        updates, *arrays = kernel(keys, schedule.device_start, np.asarray(schedule.placement, dtype=np.int64),
                                  schedule.total_microbatches, 0)
        if updates >= 0:  # the checks below would all pass; they run (and word the error) only when one fails
            if len(schedule.fused):
                _check_overlapped(schedule, arrays[0], key_kind(keys))
            schedule.compiled.keep_flat(_flat_schedule(schedule, *arrays))
            return updates
    if len(keys) and int(keys.min()) < 0:  # only hand-made arrays can hold these
        raise ScheduleError(f"schedule {schedule.name!r} holds negative action keys")
    device = np.repeat(np.arange(K, dtype=np.int64), np.diff(schedule.device_start))
    kind, stage, mb = key_kind(keys), key_stage(keys, S), key_mb(keys, S)
    placed = np.asarray(schedule.placement, dtype=np.int64)[stage]
    wrong = np.flatnonzero(placed != device)
    if len(wrong):
        i = int(wrong[0])
        raise ScheduleError(f"{schedule.action_of(int(keys[i]))} is on device {int(device[i])} but stage "
                            f"{int(stage[i])} is placed on device {int(placed[i])}")
    ordered = np.sort(keys)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if len(repeated):
        raise ScheduleError(f"{len(repeated)} action(s) appear more than once, "
                            f"e.g. {', '.join(str(schedule.action_of(int(k))) for k in repeated[:8])}")
    is_u = kind == OP_U
    per_stage = np.bincount(stage[is_u], minlength=S)
    if len(per_stage) and per_stage.min() != per_stage.max():
        raise ScheduleError(f"stages have different numbers of updates: {dict(enumerate(per_stage.tolist()))}")
    updates = int(per_stage[0]) if S else 0
    total = schedule.total_microbatches
    if updates and total % updates:
        raise ScheduleError(f"{updates} updates per stage do not divide {total} micro-batches evenly")
    inside = np.where(is_u, mb < updates, mb < total)
    computed = (kind == OP_F) | (kind == OP_B)
    present_fb = int(np.count_nonzero(computed & inside))
    if present_fb != 2 * S * total:  # every (stage, mb) needs its F and its B; none repeats, so a count suffices
        if 2 * S * total > present_fb + 1_000_000:  # e.g. one cell `99999999F0`: say so before listing them all
            raise ScheduleError(f"{2 * S * total - present_fb} action(s) missing: {S} stage(s) x {total} "
                                f"micro-batch(es) need {2 * S * total} F and B actions, the schedule has {present_fb}")
        expected = encode_key(np.arange(S)[None, :, None], np.array([OP_F, OP_B])[None, None, :],
                              np.arange(total)[:, None, None], S).ravel()
        missing = np.setdiff1d(expected, keys)
        raise ScheduleError(f"{len(missing)} action(s) missing, "
                            f"e.g. {', '.join(str(schedule.action_of(int(k))) for k in missing[:8])}")
    extra = np.sort(keys[~inside])
    if len(extra):
        raise ScheduleError(
            f"{len(extra)} action(s) outside the schedule's shape (K={K}, S={S}, M={schedule.microbatches}, "
            f"iterations={schedule.iterations}), e.g. {', '.join(str(schedule.action_of(int(k))) for k in extra[:8])}"
        )
    _check_overlapped(schedule, device, kind)
    return updates


def _check_overlapped(schedule: Schedule, device: np.ndarray, kind: np.ndarray) -> None:
    """Each overlapped pair: a forward then a backward, back to back on one device, in no other pair, and
    independent of each other (the pair starts when the inputs of both are there)."""
    fused, keys, n = schedule.fused, schedule.keys_array, len(schedule.keys_array)
    if not len(fused):
        return
    second = fused + 1
    bad = (fused < 0) | (second >= n)
    bad[~bad] |= (device[fused[~bad]] != device[second[~bad]]) | (kind[fused[~bad]] != OP_F) \
        | (kind[second[~bad]] != OP_B) | np.isin(second[~bad], fused)
    if bad.any():
        i = int(fused[bad][0])
        what = (f"({schedule.action_of(int(keys[i]))};{schedule.action_of(int(keys[i + 1]))})" if 0 <= i < n - 1
                else f"at position {i}")
        raise ScheduleError(f"overlapped pair {what} must be a forward then a backward, back to back on one device "
                            f"and in no other pair")
    for i in fused.tolist():  # few pairs per device: a direct dependency check per pair is cheap
        f_key, b_key = int(keys[i]), int(keys[i + 1])
        if f_key in schedule.compiled.dependency_keys(b_key):
            raise ScheduleError(f"overlapped pair ({schedule.action_of(f_key)};{schedule.action_of(b_key)}): the "
                                f"backward needs the forward's result, so the two cannot run as one unit")


# ------------------------------------------------------------------ dependencies as arrays
def build_flat(schedule: Schedule) -> FlatSchedule:
    """Every action's inputs as CSR arrays, by the rules of :meth:`sim.core.ir.Schedule.dependencies`.

    Assumes :func:`check_structure` passed (every input of every action exists). Inputs are listed
    in a fixed order: F(s,m): F(s-1,m); B(s,m): B(s+1,m) (last stage: F(s,m)), then R(s,m) if
    recomputed; W(s,m): B(s,m); R(s,m): F(s,m); U(s,u): for each micro-batch of its group, its W if
    split, else its B.
    """
    keys = schedule.keys_array
    if (kernel := jit.kernel_for(_flat_kernel, len(keys))) is not None:
        _, *arrays = kernel(keys, schedule.device_start, np.asarray(schedule.placement, dtype=np.int64),
                            schedule.total_microbatches, schedule.microbatches_per_update)
    else:
        arrays = _flat_numpy(schedule)
    return _flat_schedule(schedule, *arrays)


def _flat_schedule(schedule: Schedule, device, dep_start, dep_slot, send_to, conflict) -> FlatSchedule:
    # the IR's rules give every result at most one consumer on another device; one transfer carries it
    assert not conflict, "a result is needed on two other devices"
    if len(schedule.fused):  # an overlapped pair starts when the inputs of both are there: F(i) takes B(i+1)'s too
        dep_start, dep_slot = _merge_inputs(dep_start, dep_slot, schedule.fused)
    return FlatSchedule(keys=schedule.keys_array, device=device, device_start=schedule.device_start,
                        dep_start=dep_start, dep_slot=dep_slot, send_to=send_to)


def _flat_numpy(schedule: Schedule):
    """:func:`build_flat`'s arrays with vectorised numpy: (device, dep_start, dep_slot, send_to, conflict)."""
    keys, K, S = schedule.keys_array, schedule.devices, schedule.stages
    n = len(keys)
    device = np.repeat(np.arange(K, dtype=np.int64), np.diff(schedule.device_start))
    kind, stage, mb = key_kind(keys), key_stage(keys, S), key_mb(keys, S)
    index = np.full(int(keys.max(initial=-1)) + NUM_KINDS + 1, -1, dtype=np.int64)  # key -> position
    index[keys] = np.arange(n)

    def present(k: np.ndarray) -> np.ndarray:
        return index[np.minimum(k, len(index) - 1)] >= 0  # keys beyond the table are absent

    is_f, is_b, is_w, is_r, is_u = (kind == o for o in (OP_F, OP_B, OP_W, OP_R, OP_U))
    base = keys - kind  # (stage, mb) with kind 0; the neighbour stage is NUM_KINDS away
    # the first input of every action but U (-1: none), and B's recompute
    first = np.full(n, -1, dtype=np.int64)
    first[is_f & (stage > 0)] = base[is_f & (stage > 0)] - NUM_KINDS  # F(s-1, m)
    not_last = stage < S - 1
    first[is_b & not_last] = base[is_b & not_last] + NUM_KINDS + OP_B  # B(s+1, m)
    first[is_b & ~not_last] = base[is_b & ~not_last] + OP_F  # the last stage's own F
    first[is_w] = base[is_w] + OP_B
    first[is_r] = base[is_r] + OP_F
    recompute = is_b & present(base + OP_R)
    g = schedule.microbatches_per_update
    counts = (first >= 0).astype(np.int64) + recompute + np.where(is_u, g, 0)
    dep_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=dep_start[1:])
    dep_key = np.empty(int(dep_start[-1]), dtype=np.int64)
    has_first = first >= 0
    dep_key[dep_start[:-1][has_first]] = first[has_first]
    dep_key[dep_start[:-1][recompute] + 1] = base[recompute] + OP_R
    u_rows = np.flatnonzero(is_u)
    if len(u_rows):  # U(s, u) waits for micro-batches u*g .. (u+1)*g-1 of its stage
        group = mb[u_rows, None] * g + np.arange(g)[None, :]
        grad = encode_key(stage[u_rows, None], 0, group, S)
        grad = np.where(present(grad + OP_W), grad + OP_W, grad + OP_B)
        dep_key[(dep_start[u_rows, None] + np.arange(g)[None, :]).ravel()] = grad.ravel()
    producer = index[dep_key]
    consumer_device = np.repeat(device, counts)
    remote = device[producer] != consumer_device
    dep_slot = producer + np.where(remote, n, 0)
    send_to = np.full(n, -1, dtype=np.int64)
    send_to[producer[remote]] = consumer_device[remote]
    return device, dep_start, dep_slot, send_to, np.count_nonzero(send_to >= 0) != np.count_nonzero(remote)


def _flat_kernel(keys, device_start, placement, total, g):
    """:func:`_flat_numpy` as loops (compiled by numba, :mod:`sim.jit`): the same arrays, the same rules.

    *g*: micro-batches per update, or 0: first check the structure as :func:`check_structure` does (each action
    on its stage's device, none twice, the same number of updates on every stage dividing the micro-batches,
    every F and B of the run and nothing outside it; not the overlapped pairs) and take g from the updates.
    Returns (updates per stage, or -1 when a check fails and nothing else is meaningful; device, dep_start,
    dep_slot, send_to, conflict).
    """
    n = len(keys)
    S = len(placement)
    K = len(device_start) - 1
    check = g == 0
    nothing = np.zeros(0, dtype=np.int64)
    top = -1
    for i in range(n):
        if keys[i] < 0:
            return -1, nothing, nothing, nothing, nothing, False
        if keys[i] > top:
            top = keys[i]
    size = top + NUM_KINDS + 1
    index = np.full(size, -1, dtype=np.int64)  # key -> position
    pairs = top // NUM_KINDS + 1
    stage_of = np.empty(pairs, dtype=np.int64)  # pair (mb * S + stage) -> stage: a load instead of a division
    mb_of = np.empty(pairs, dtype=np.int64)
    at = 0
    for mb in range((pairs + S - 1) // S):
        for s in range(S):
            if at < pairs:
                stage_of[at] = s
                mb_of[at] = mb
                at += 1
    device = np.empty(n, dtype=np.int64)
    kind = np.empty(n, dtype=np.int64)
    stage = np.empty(n, dtype=np.int64)
    updates = np.zeros(S, dtype=np.int64)
    n_updates = 0
    last_update = -1  # the largest update number seen
    fb = 0
    for d in range(K):
        for i in range(device_start[d], device_start[d + 1]):
            key = keys[i]
            pair = key // NUM_KINDS  # the codec's parts (a constant divisor: a multiplication)
            mb = mb_of[pair]
            k = key - pair * NUM_KINDS
            s = stage_of[pair]
            device[i] = d
            kind[i] = k
            stage[i] = s
            if k == OP_U:
                n_updates += 1
            if check:
                if index[key] >= 0 or placement[s] != d:  # twice, or off its stage's device
                    return -1, nothing, nothing, nothing, nothing, False
                if k == OP_U:
                    updates[s] += 1
                    if mb > last_update:
                        last_update = mb
                elif mb >= total:  # outside the run
                    return -1, nothing, nothing, nothing, nothing, False
                elif k == OP_F or k == OP_B:
                    fb += 1
            index[key] = i
    per_stage = 0
    if check:
        per_stage = updates[0] if S else 0
        for s in range(S):
            if updates[s] != per_stage:
                return -1, nothing, nothing, nothing, nothing, False
        if (per_stage and total % per_stage) or last_update >= per_stage or fb != 2 * S * total:
            # updates numbered 0 .. per_stage-1; none twice and none outside: a count of F and B suffices
            return -1, nothing, nothing, nothing, nothing, False
        g = total // per_stage if per_stage else total
    dep_start = np.zeros(n + 1, dtype=np.int64)
    dep_slot = np.empty(2 * n + n_updates * g, dtype=np.int64)  # at most two inputs each, g per update
    send_to = np.full(n, -1, dtype=np.int64)
    conflict = False
    at = 0
    for i in range(n):
        k = kind[i]
        key = keys[i]
        base = key - k
        if k == OP_F:
            if stage[i] > 0:
                dep_slot[at] = base - NUM_KINDS  # F(s-1, m)
                at += 1
        elif k == OP_B:
            dep_slot[at] = base + NUM_KINDS + OP_B if stage[i] < S - 1 else base + OP_F  # B(s+1, m); last: F(s, m)
            at += 1
            if base + OP_R < size and index[base + OP_R] >= 0:  # recomputed: its R too
                dep_slot[at] = base + OP_R
                at += 1
        elif k == OP_W:
            dep_slot[at] = base + OP_B
            at += 1
        elif k == OP_R:
            dep_slot[at] = base + OP_F
            at += 1
        else:  # U(s, u) waits for micro-batches u*g .. (u+1)*g-1 of its stage
            u = key // NUM_KINDS // S
            for j in range(g):
                grad = ((u * g + j) * S + stage[i]) * NUM_KINDS
                w = grad + OP_W
                dep_slot[at] = w if w < size and index[w] >= 0 else grad + OP_B
                at += 1
        for j in range(dep_start[i], at):  # keys -> slots: own device's end, or an arrival
            p = index[dep_slot[j]]
            if device[p] != device[i]:
                conflict = conflict or send_to[p] >= 0  # numpy's count check: a second remote consumer
                send_to[p] = device[i]
                p += n
            dep_slot[j] = p
        dep_start[i + 1] = at
    dep_slot = dep_slot[:at].copy()
    return per_stage, device, dep_start, dep_slot, send_to, conflict


def _merge_inputs(dep_start: np.ndarray, dep_slot: np.ndarray, fused: np.ndarray):
    """CSR inputs where action i (in *fused*) also lists action i+1's: in CSR those follow i's own, so i's
    range simply extends to the end of i+1's."""
    starts = dep_start[:-1]
    ends = dep_start[1:].copy()
    ends[fused] = dep_start[fused + 2]
    lengths = ends - starts
    new_start = np.zeros(len(dep_start), dtype=np.int64)
    np.cumsum(lengths, out=new_start[1:])
    take = np.repeat(starts - new_start[:-1], lengths) + np.arange(int(new_start[-1]))
    return new_start, dep_slot[take]


# ------------------------------------------------------------------ deadlocks
def find_stall(flat: FlatSchedule) -> np.ndarray:
    """Run the list scheduler with zero costs; return how far each device got (its position in *flat*)."""
    from sim.core.listsched import _list_schedule, list_schedule  # the engines' own scheduler: a stall there is a deadlock

    n = len(flat.keys)
    if (kernel := jit.kernel_for(_list_schedule, n)) is not None:
        # compiled, it orders each link's transfers as they happen: with zero costs, a result can travel on its
        # receiving device's link (send_to numbers them) and arrive at once; no copy of the inputs needed
        zero = np.zeros(n)
        return kernel(flat.device_start, flat.dep_start, flat.dep_slot, zero, flat.send_to, zero,
                      len(flat.device_start) - 1, True, np.zeros(n, dtype=np.bool_))[-1]
    # with zero costs an arrival is its producer's end: read every input as the producer's own slot (no transfers)
    local = replace(flat, dep_slot=np.where(flat.dep_slot >= n, flat.dep_slot - n, flat.dep_slot))
    return np.asarray(list_schedule(local, np.zeros(n), np.full(n, -1), np.zeros(n), 0, True)[-1])


def stuck_actions(flat: FlatSchedule, position: np.ndarray) -> dict[int, tuple[int, list[int]]]:
    """{device: (key of its stuck action, keys of the inputs it still waits for)} from a stalled run."""
    n = len(flat.keys)
    position = np.asarray(position)
    stuck = {}
    for d in np.flatnonzero(position < flat.device_start[1:]).tolist():
        i = int(position[d])
        unmet = []
        for slot in flat.dep_slot[flat.dep_start[i]:flat.dep_start[i + 1]].tolist():
            p = slot - n if slot >= n else slot
            if p >= position[flat.device[p]]:  # its producer has not run: device order is run order
                unmet.append(int(flat.keys[p]))
        stuck[d] = (int(flat.keys[i]), unmet)
    return stuck


# ------------------------------------------------------------------ per-key views
class Compiled:
    """A schedule as integer keys (see :meth:`sim.core.ir.Schedule.key`), with every dependency derived.

    ``deps[key]`` lists what *key* waits for: a producer key when the producer runs on
    the same device, or ``~producer`` (a negative number) when its result must first
    arrive from another device. ``sends[producer]`` is the device a result travels to.
    The dicts are built from :attr:`flat` on first use (the fast engine reads only the arrays).
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    @cached_property
    def flat(self) -> FlatSchedule:
        """The actions and dependencies as flat integer arrays (built once)."""
        return build_flat(self.schedule)

    def keep_flat(self, flat: FlatSchedule) -> None:
        """Take *flat* as :attr:`flat` (the compiled structure check builds it on the way)."""
        self.__dict__["flat"] = flat  # where cached_property keeps its value

    @cached_property
    def keys(self) -> list[list[int]]:
        """device -> its action keys in order."""
        s = self.schedule
        keys, bounds = s.keys_array.tolist(), s.device_start.tolist()
        return [keys[bounds[d]:bounds[d + 1]] for d in range(s.devices)]

    @cached_property
    def present(self) -> set[int]:
        return set(self.schedule.keys_array.tolist())

    @cached_property
    def duplicates(self) -> list[int]:
        ordered = np.sort(self.schedule.keys_array)
        return ordered[1:][ordered[1:] == ordered[:-1]].tolist()

    @cached_property
    def deps(self) -> dict[int, tuple[int, ...]]:
        flat = self.flat
        n = len(flat.keys)
        keys, slots, bounds = flat.keys.tolist(), flat.dep_slot.tolist(), flat.dep_start.tolist()
        signed = [keys[p] if p < n else ~keys[p - n] for p in slots]
        return {k: tuple(signed[bounds[i]:bounds[i + 1]]) for i, k in enumerate(keys)}

    @cached_property
    def sends(self) -> dict[int, int]:
        flat = self.flat
        sent = np.flatnonzero(flat.send_to >= 0)
        return dict(zip(flat.keys[sent].tolist(), flat.send_to[sent].tolist()))

    def dependency_keys(self, key: int) -> tuple[int, ...]:
        """The producers of *key* (unsigned), by the rules of :meth:`sim.core.ir.Schedule.dependencies`."""
        S = self.schedule.stages
        s, kind, m = decode_key(key, S)
        base = key - kind
        if kind == OP_F:
            return (base - NUM_KINDS,) if s > 0 else ()  # F(s-1, m)
        if kind == OP_B:
            first = base + NUM_KINDS + OP_B if s < S - 1 else base + OP_F  # B(s+1, m), or F(s, m) on the last stage
            return (first, base + OP_R) if base + OP_R in self.present else (first,)
        if kind == OP_W:
            return (base + OP_B,)
        if kind == OP_R:
            return (base + OP_F,)
        g = self.schedule.microbatches_per_update  # U(s, u): every B / W of its group
        out = []
        for mb in range(m * g, (m + 1) * g):
            b = encode_key(s, 0, mb, S)
            out.append(b + OP_W if b + OP_W in self.present else b + OP_B)
        return tuple(out)

    def expected_keys(self) -> set[int]:
        sched = self.schedule
        S, total = sched.stages, sched.total_microbatches
        keys = {encode_key(s, kind, m, S) for m in range(total) for s in range(S) for kind in (OP_F, OP_B)}
        keys |= {k for k in self.present if key_kind(k) in (OP_W, OP_R) and key_mb(k, S) < total}
        keys |= {encode_key(s, OP_U, u, S) for s in range(S) for u in range(sched.updates_per_stage)}
        return keys
