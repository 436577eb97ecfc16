"""Replicated stages and data parallelism over pipelines, with the gradient all-reduce simulated on the links.

This module owns the layout of replicas onto devices and the scheduling of a
replicated run. It builds on the engines' inputs without changing them: the base
:class:`~sim.ir.Schedule` says what each pipeline device does and in which order,
its derived dependencies say what waits for what, :class:`~sim.cost.StageCosts`
and :class:`~sim.hardware.Hardware` give durations, and :mod:`sim.collectives`
simulates every all-reduce message by message.

Layout. A :class:`Replication` has D pipeline copies (data parallelism, DP x PP)
and, inside each copy, R_p replicas of base device p (PipeDream's replicated
stages). A copy is W = sum(R_p) devices wide; replica r of base device p in copy
c is device ``c*W + sum(R_q for q < p) + r``. Without stage replication a copy is
the K pipeline devices, so DP x PP places copy d on devices d*K .. d*K+K-1.

Work. Every copy runs the base schedule on its own micro-batches (global batch
D x M per iteration). Inside a copy, micro-batch m of base device p runs on
replica m mod R_p (PipeDream's 1F1B-RR round-robin), keeping the base order:
replica r's list is the base device's list restricted to its micro-batches,
plus its U's. Splitting a valid order this way cannot deadlock when every
replica runs every U (any timing of the base schedule is then a valid timing
of the split lists); with per-micro-batch updates a synchronization round
couples the replicas, and an order that cannot run raises
:class:`ReplicationError` naming the stuck devices.

Gradient synchronization. For each stage s and update u, the devices holding
stage s (its replicas in every copy) all-reduce ``grad_bytes[s]`` (or
``weight_bytes[s]`` when no gradient size is given) with the chosen algorithm
(ring by default). A device's contribution is ready when it has finished its
own backward work (B, or W when split) of that update's micro-batches. When an
update consumes fewer micro-batches than a stage has replicas (PipeDream: one
micro-batch per update), replica r runs only the updates of its own
micro-batches (u mod R = r) and the R replicas synchronize once per round of R
consecutive updates, as data-parallel workers that each processed one
micro-batch (Narayanan et al., SOSP 2019, section 3.2); their U's wait for the
round's all-reduce. With
``overlap=True`` stage s starts its all-reduce as soon as every replica of s is
ready, so it overlaps the backward work still running on other stages; with
``overlap=False`` every stage waits until the whole pipeline has drained (the
flush) before any all-reduce of that update starts. Each replica's U(s, u)
waits for its own end of the all-reduce. Flush schedules (GPipe, 1F1B) have one
U per iteration, so this is one all-reduce per stage after (or overlapping) the
flush; PipeDream has one per update.

Simplifications (stated in :attr:`ReplicatedRun.notes`): an all-reduce uses the
links among its stage's replicas as in :mod:`sim.collectives` (one send and one
receive per NIC at a time) and is simulated on its own: it does not queue behind
pipeline transfers (those use other links) nor behind another stage's
all-reduce (other devices), unless devices hold several stages. Memory tracks
activations, weights, gradients and optimizer state, with one weight version
per stage (weight stashing is not tracked here).

Timeline. The usual schema (:mod:`sim.timeline`) plus one transfer op,
``ALLREDUCE``: one row per all-reduce message, ``device`` = ``src`` = sender,
``dst`` receiver, ``bytes`` its size, ``stage`` the stage, ``microbatch`` the
update number (the first update of its round). Micro-batch numbers are per copy (copy = device // W).

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .collectives import ALGORITHMS, simulate_collective
from .cost import StageCosts, check_totals
from .hardware import Hardware
from .ir import (NUM_KINDS, OP_B, OP_F, OP_U, OP_W, ActionKind, Schedule, boundary_stage, decode_key, key_kind,
                 key_mb, key_stage)
from .memory import MemoryProfile, Overflow
from .metrics import Metrics, compute_metrics
from .result import Result
from .timeline import TIMELINE_COLUMNS
from .errors import PipesimError

__all__ = ["Replication", "ReplicationError", "ReplicatedRun", "simulate_replicated", "SYNC_ALGORITHMS", "ALLREDUCE_OP"]

ALLREDUCE_OP = "ALLREDUCE"
_KINDS = tuple(ActionKind)  # key ordinal -> kind
SYNC_ALGORITHMS = tuple(a for a in ALGORITHMS if not a.startswith("ps"))


class ReplicationError(PipesimError):
    """A replication that cannot be laid out or simulated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Replication:
    """How a pipeline is replicated."""

    data_parallel: int = 1
    """D, copies of the whole pipeline."""
    replicas: tuple[int, ...] | None = None
    """R_p per base device p inside one pipeline (PipeDream's replicated stages); None: 1 each."""
    algorithm: str = "ring"
    """All-reduce algorithm among the replicas of a stage (see :mod:`sim.collectives`; not ps/ps-sharded)."""
    overlap: bool = True
    """True: a stage's all-reduce starts once its gradients are ready; False: after the whole flush."""

    def __post_init__(self) -> None:
        D = self.data_parallel
        if isinstance(D, bool) or not isinstance(D, int) or D < 1:
            raise ReplicationError(f"data_parallel must be a positive integer, got {D!r}")
        if self.replicas is not None:
            reps = tuple(self.replicas)
            if not reps or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in reps):
                raise ReplicationError(f"replicas must be positive integers, one per pipeline device; got {reps!r}")
            object.__setattr__(self, "replicas", reps)
        if self.algorithm not in SYNC_ALGORITHMS:
            raise ReplicationError(f"algorithm {self.algorithm!r} cannot synchronize replicas; choose one of "
                                   f"{', '.join(SYNC_ALGORITHMS)}")

    def layout(self, schedule: Schedule) -> list[list[int]]:
        """offsets: ``[p] -> [device of replica r]`` for copy 0 (add c*W for copy c)."""
        reps = self.replicas or (1,) * schedule.devices
        if len(reps) != schedule.devices:
            raise ReplicationError(f"replicas has {len(reps)} entries but the pipeline has {schedule.devices} "
                                   f"devices; give one per device")
        out, d = [], 0
        for r in reps:
            out.append(list(range(d, d + r)))
            d += r
        return out

    def devices(self, schedule: Schedule) -> int:
        return self.data_parallel * sum(self.replicas or (1,) * schedule.devices)


@dataclass(frozen=True, slots=True)
class ReplicatedRun:
    schedule: Schedule
    """The base (one pipeline, unreplicated) schedule."""
    replication: Replication
    devices: int
    """All devices: D x W."""
    device_actions: dict[int, list[tuple[int, str]]]
    """device -> its (copy, action text) in order."""
    timeline: pd.DataFrame
    """Schema of :mod:`sim.timeline` plus ALLREDUCE transfer rows."""
    memory: MemoryProfile
    metrics: Metrics
    allreduces: pd.DataFrame
    """One row per (stage, update): first_ready, start, end, bytes, algorithm, messages."""
    sync_wait: list[float]
    """Per device: seconds its U actions waited for the all-reduce beyond their local inputs."""
    notes: list[str] = field(default_factory=list)

    def as_result(self, costs: StageCosts, hardware: Hardware | None = None) -> Result:
        """The run as a :class:`~sim.result.Result` over all D x W devices, for :func:`sim.plots.gantt`.

        Its schedule is a display-only shell (no actions: the per-device lists are in
        :attr:`device_actions`); ALLREDUCE rows are transfer rows of the timeline.
        """
        base = self.schedule
        shell = Schedule(name=f"{base.name} D={self.replication.data_parallel} "
                              f"R={list(self.replication.replicas or (1,) * base.devices)}",
                         devices=self.devices, stages=base.stages, microbatches=base.microbatches,
                         iterations=base.iterations, placement=base.placement, actions={})
        return Result(shell, costs, hardware or Hardware(devices=self.devices), self.timeline, self.memory,
                      self.metrics, notes=list(self.notes))

    def summary(self) -> dict:
        out = {"schedule": self.schedule.name, "devices": self.devices,
               "data_parallel": self.replication.data_parallel,
               "replicas": list(self.replication.replicas or (1,) * self.schedule.devices),
               "algorithm": self.replication.algorithm, "overlap": self.replication.overlap}
        out.update(self.metrics.to_dict())
        ar = self.allreduces
        out["allreduce_seconds"] = float((ar["end"] - ar["start"]).sum()) if len(ar) else 0.0
        out["sync_wait"] = list(self.sync_wait)
        return out


def simulate_replicated(schedule: Schedule, costs: StageCosts, replication: Replication,
                        hardware: Hardware | None = None, *, microbatch_size: float = 1.0) -> ReplicatedRun:
    """Run *schedule* replicated as *replication* says; exact list scheduling as in :mod:`sim.fastpath`.

    *hardware* describes all D x W devices (default: free links).
    """
    schedule.validate()
    if costs.stages != schedule.stages:
        raise ReplicationError(f"costs describe {costs.stages} stages but the schedule has {schedule.stages}")
    check_totals(costs, schedule.total_microbatches)  # sums past the largest float: refused, not printed as inf
    offsets = replication.layout(schedule)
    W = sum(len(o) for o in offsets)
    D = replication.data_parallel
    N = D * W
    hardware = hardware or Hardware(devices=N)
    if hardware.devices != N:
        raise ReplicationError(f"hardware has {hardware.devices} devices; D={D} copies x {W} devices need {N}")
    comp = schedule.compiled
    S, K = schedule.stages, schedule.devices
    reps = [len(o) for o in offsets]
    place = schedule.placement
    g = schedule.microbatches_per_update
    split = schedule.split_backward

    for p in range(K):
        if g < reps[p] and g != 1:
            raise ReplicationError(
                f"device {p} is replicated {reps[p]} times but one update consumes {g} micro-batches; use at least "
                f"{reps[p]} micro-batches per update, or a schedule that updates after every micro-batch (pipedream)")
    rounds_of = [1 if g >= reps[p] else reps[p] for p in range(K)]  # updates per synchronization, per device
    updates = schedule.updates_per_stage

    def where(c: int, key: int) -> int:  # device running base action *key* in copy c
        s, mb = key_stage(key, S), key_mb(key, S)  # for U(s, u) with per-micro-batch updates, u is also its micro-batch
        p = place[s]
        return c * W + offsets[p][mb % reps[p]]

    # per device: (copy, base key) in order; a U runs on every replica, or (per-micro-batch updates) on its own
    lists: list[list[tuple[int, int]]] = [[] for _ in range(N)]
    for c in range(D):
        for p in range(K):
            for key in comp.keys[p]:
                if key_kind(key) == OP_U and rounds_of[p] == 1:
                    for r in range(reps[p]):
                        lists[c * W + offsets[p][r]].append((c, key))
                else:
                    lists[where(c, key)].append((c, key))

    # synchronizations: (stage, round) -> the devices taking part, and the backward pieces it waits for
    participants: dict[tuple[int, int], list[int]] = {}
    pending: dict[tuple[int, int], int] = {}
    for s in range(S):
        p = place[s]
        for u in range(updates):
            k = u // rounds_of[p]
            devs = [c * W + d for c in range(D) for d in offsets[p]] if rounds_of[p] == 1 else \
                [c * W + offsets[p][u % reps[p]] for c in range(D)]
            group = participants.setdefault((s, k), [])
            group.extend(d for d in devs if d not in group)
            pending[(s, k)] = pending.get((s, k), 0) + D * g
    holders = [[c * W + d for c in range(D) for d in offsets[place[s]]] for s in range(S)]
    contribution: dict[tuple[int, int], dict[int, float]] = {}  # (s, round) -> device -> ready time
    # the flush (overlap=False): micro-batches whose backward is done on every stage of every copy
    pieces_done = [0] * schedule.total_microbatches
    flushed = [0]  # leading micro-batches fully done
    flush_time = [0.0] * (schedule.total_microbatches + 1)  # [j]: when micro-batches < j were all done
    piece_end = [0.0] * schedule.total_microbatches
    deferred: list[tuple[int, int, int]] = []  # (first micro-batch after the round, stage, round)

    ready: dict = {}  # (copy, key) -> end; ("in", dev, copy, key) -> arrival at dev; ("ar", dev, s, u)
    device_free = [0.0] * N
    link_free: dict[tuple[int, int], float] = {}
    position = [0] * N
    waiting: dict = {}
    todo = list(range(N))
    rows = []  # (device, stage, mb, op, start, end, src, dst, bytes)
    ar_rows = []
    sync_wait = [0.0] * N

    def wake(token) -> None:
        woken = waiting.pop(token, None)
        if woken:
            todo.extend(woken)

    def start_allreduce(s: int, k: int, at: float | None) -> None:
        nodes = participants[(s, k)]
        ready_at = contribution[(s, k)]
        u = k * rounds_of[place[s]]  # the round's first update names it in the timeline
        starts = [ready_at[d] if at is None else at for d in nodes]
        nbytes = costs.grad_bytes[s] or costs.weight_bytes[s]
        if len(nodes) == 1:
            finish, msgs = starts, None
        else:
            lat = [[hardware.latency[a][b] for b in nodes] for a in nodes]
            bw = [[hardware.bandwidth[a][b] for b in nodes] for a in nodes]
            res = simulate_collective(replication.algorithm, workers=len(nodes), nbytes=nbytes, latency=lat,
                                      bandwidth=bw, start_times=starts)
            assert res.complete, res.problems
            finish, msgs = res.finish, res.messages
            for m in msgs.itertuples(index=False):
                rows.append((nodes[m.src], s, u, ALLREDUCE_OP, m.start, m.end, nodes[m.src], nodes[m.dst], m.bytes))
        ar_rows.append({"stage": s, "update": u, "first_ready": min(starts), "start": max(starts),
                        "end": max(finish), "bytes": nbytes, "algorithm": replication.algorithm,
                        "messages": 0 if msgs is None else len(msgs)})
        for d, t in zip(nodes, finish):
            ready[("ar", d, s, k)] = t
            wake(("ar", d, s, k))

    def backward_done(c: int, key: int, device: int, end: float) -> None:
        s, mb = key_stage(key, S), key_mb(key, S)
        k = mb // g // rounds_of[place[s]]
        slot = contribution.setdefault((s, k), {})
        slot[device] = max(slot.get(device, 0.0), end)
        pending[(s, k)] -= 1
        piece_end[mb] = max(piece_end[mb], end)
        pieces_done[mb] += 1
        if pending[(s, k)] == 0:  # every backward piece of the round is done
            if replication.overlap:
                start_allreduce(s, k, None)
            else:
                last_update = min((k + 1) * rounds_of[place[s]], updates)
                deferred.append((last_update * g, s, k))
        if not replication.overlap:
            j = flushed[0]
            while j < len(pieces_done) and pieces_done[j] == S * D:
                flush_time[j + 1] = max(flush_time[j], piece_end[j])
                j += 1
            flushed[0] = j
            for item in sorted(x for x in deferred if x[0] <= j):  # the pipeline has drained up to them
                deferred.remove(item)
                start_allreduce(item[1], item[2], flush_time[item[0]])

    def inputs(c: int, key: int, device: int) -> list:
        out = []
        for p in comp.dependency_keys(key):
            if key_kind(key) == OP_U:
                if where(c, p) == device:  # U: only this replica's own backward work ...
                    out.append((c, p))
            elif where(c, p) == device:
                out.append((c, p))
            else:
                out.append(("in", device, c, p))
        if key_kind(key) == OP_U:  # ... and its end of the all-reduce
            s = key_stage(key, S)
            out.append(("ar", device, s, key_mb(key, S) // rounds_of[place[s]]))
        return out

    while todo:
        device = todo.pop()
        items = lists[device]
        i = position[device]
        t_free = device_free[device]
        while i < len(items):
            c, key = items[i]
            start, blocked = t_free, None
            need = inputs(c, key, device)
            local = t_free
            for tok in need:
                t = ready.get(tok)
                if t is None:
                    blocked = tok
                    break
                if tok[0] != "ar":
                    local = max(local, t)
                start = max(start, t)
            if blocked is not None:
                waiting.setdefault(blocked, []).append(device)
                break
            s, kind, mb = decode_key(key, S)
            kind_enum = _KINDS[kind]
            dur = costs.cost(s, kind_enum, split=(s, mb) in split)
            end = start + dur
            if kind == OP_U:
                sync_wait[device] += start - local
            rows.append((device, s, mb, kind_enum.value, start, end, -1, -1, 0.0))
            ready[(c, key)] = end
            t_free = end
            wake((c, key))
            if kind == OP_W or (kind == OP_B and (s, mb) not in split):
                backward_done(c, key, device, end)
            if key in comp.sends:  # its result travels to the consumer's device
                consumer = key + NUM_KINDS if kind == OP_F else key - NUM_KINDS  # F(s+1, m) or B(s-1, m)
                dst = where(c, consumer)
                if dst != device:
                    nbytes = costs.send_bytes[boundary_stage(key, S)]
                    t0 = max(end, link_free.get((device, dst), 0.0))
                    t1 = t0 + hardware.transfer_time(device, dst, nbytes)
                    link_free[(device, dst)] = t1
                    rows.append((device, s, mb, "SEND_F" if kind == OP_F else "SEND_B", t0, t1, device, dst, nbytes))
                    ready[("in", dst, c, key)] = t1
                    wake(("in", dst, c, key))
                    if not hardware.overlap:
                        t_free = t1
                else:
                    ready[("in", dst, c, key)] = end
            i += 1
        position[device] = i
        device_free[device] = t_free
    stuck = [d for d in range(N) if position[d] < len(lists[d])]
    if stuck:
        raise ReplicationError(f"replicated run stopped with devices {stuck[:8]} unfinished; "
                               f"the base schedule cannot be split this way")

    timeline = _frame(rows, schedule)
    memory = _memory(schedule, costs, timeline, N, holders, hardware.memory_capacity)
    metrics = compute_metrics(timeline, memory, devices=N,
                              samples=D * schedule.total_microbatches * microbatch_size)
    notes = ["all-reduces are simulated on their own links and do not queue behind pipeline transfers",
             "one weight version per stage is counted (weight stashing not tracked for replicated runs)"]
    device_actions = {d: [(c, str(schedule.action_of(k))) for c, k in lists[d]] for d in range(N)}
    return ReplicatedRun(schedule, replication, N, device_actions, timeline, memory, metrics,
                         pd.DataFrame(ar_rows, columns=["stage", "update", "first_ready", "start", "end", "bytes",
                                                        "algorithm", "messages"]),
                         sync_wait, notes)


def _frame(rows, schedule: Schedule) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["device", "stage", "microbatch", "op", "start", "end", "src", "dst", "bytes"])
    g = schedule.microbatches_per_update
    first_mb = np.where(df["op"].isin(["U", ALLREDUCE_OP]), df["microbatch"] * g, df["microbatch"])
    df["iteration"] = first_mb // schedule.microbatches
    df = df.astype({"device": "int64", "stage": "int64", "microbatch": "int64", "iteration": "int64",
                    "start": "float64", "end": "float64", "src": "int64", "dst": "int64", "bytes": "float64"})
    return df[TIMELINE_COLUMNS].sort_values(["start", "device", "end"], kind="stable", ignore_index=True)


def _memory(schedule: Schedule, costs: StageCosts, timeline: pd.DataFrame, devices: int,
            stage_devices: list[list[int]], capacity: float | None) -> MemoryProfile:
    """Bytes per device over time: static state of its stages plus activations from F to the last backward."""
    static = np.zeros(devices)
    for s, devs in enumerate(stage_devices):  # stage -> the devices holding it
        for d in devs:
            static[d] += costs.weight_bytes[s] + costs.grad_bytes[s] + costs.optimizer_bytes[s]
    comp = timeline[timeline["src"] < 0]
    split, recomputed = schedule.split_backward, schedule.recomputed
    events: list[list[tuple[float, int, float, int]]] = [[] for _ in range(devices)]  # (time, free first, bytes, inflight)
    for d, s, mb, op, start, end in comp[["device", "stage", "microbatch", "op", "start", "end"]].itertuples(index=False):
        act, ckpt, rec = costs.activation_bytes[s], costs.checkpoint_bytes[s], (s, mb) in recomputed
        if op == "F":
            events[d].append((start, 1, ckpt if rec else act, 1))
        elif op == "R":
            events[d].append((start, 1, act, 0))
        elif op == "W" or (op == "B" and (s, mb) not in split):
            events[d].append((end, 0, -(ckpt + act if rec else act), -1))
    frames, peaks, inflight_peaks, overflows = [], [], [], []
    for d in range(devices):
        ev = sorted(events[d])
        times = [0.0] + [e[0] for e in ev]
        levels = static[d] + np.concatenate([[0.0], np.cumsum([e[2] for e in ev])])
        inflight = np.cumsum([e[3] for e in ev]) if ev else np.zeros(1)
        frames.append(pd.DataFrame({"device": d, "time": times, "bytes": levels}))
        peaks.append(float(levels.max()))
        inflight_peaks.append(int(max(0, inflight.max())))
        if capacity is not None and levels.max() > capacity:
            over = np.nonzero(levels > capacity)[0]
            top = int(levels.argmax())
            overflows.append(Overflow(d, float(times[over[0]]), float(times[top]), float(levels[top] - capacity)))
    versions = [sum(1 for devs in stage_devices for x in devs if x == d) for d in range(devices)]
    return MemoryProfile(pd.concat(frames, ignore_index=True), peaks, inflight_peaks, versions, capacity, overflows)

