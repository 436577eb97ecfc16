"""Replicated stages and data parallelism over pipelines, with the gradient all-reduce simulated on the links.

This module owns the layout of replicas onto devices and the scheduling of a
replicated run. It builds on the engines' inputs without changing them: the base
:class:`~sim.core.ir.Schedule` says what each pipeline device does and in which order,
its derived dependencies say what waits for what, :class:`~sim.model.cost.StageCosts`
and :class:`~sim.model.hardware.Hardware` give durations, and :mod:`sim.engines.collectives`
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

Engine. The run is scheduled by the one exact list scheduler of :mod:`sim.engines.fastpath`, the
kernel :func:`sim.simulate` uses: every replicated device walks its action list, an action
starts when its device is free and its inputs have arrived, and each directed link serves
its transfers first come, first served. The all-reduce joins the same problem: each device
has a NIC lane that sends its all-reduce messages (from :func:`sim.engines.collectives.messages`)
one at a time, in the algorithm's program order, each after the messages of earlier steps
have reached it, on the same links as pipeline transfers (``hardware.latency`` and
``bandwidth``). With D=1 and no replicated stage the result is :func:`sim.simulate`'s,
row for row (tested over every registered schedule). Memory is :func:`sim.results.memory.memory_profile`'s
(activations, weights, gradients, optimizer state and PipeDream's weight stashing) with
each replica's stages counted on their own: a replica keeps the weight versions its own
micro-batches still need.

Model notes (stated in :attr:`ReplicatedRun.notes`): links are per directed pair, as for
pipeline transfers, so a node may receive from several senders at once; ``pipesim
collective`` (:mod:`sim.engines.collectives`) also gives each node a single receive port, so where
several nodes may send to one at once (sequential, tree, parallel, direct) this run's
all-reduce can finish earlier than that command says; ring and halving-doubling (one
partner per step) gave the same times in every case compared (432 runs when this was built).
In this layout the replicas of a stage are never pipeline neighbours, so a directed link
carries pipeline or all-reduce traffic, never both (checked when the run is built: the list
scheduler serves a link in the order of the one lane that sends on it, which is what makes
it exact). A device that holds several stages sends their
all-reduces in the order its own gradients become ready (as a communication stream does).

Timeline. The usual schema (:mod:`sim.results.timeline`) plus one transfer op,
``ALLREDUCE``: one row per all-reduce message, ``device`` = ``src`` = sender,
``dst`` receiver, ``bytes`` its size, ``stage`` the stage, ``microbatch`` the
update number (the first update of its round). Micro-batch numbers are per copy (copy = device // W).

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim.engines.collectives import ALGORITHMS, messages
from sim.model.cost import COLUMNS as COST_COLUMNS
from sim.model.cost import MEMORY_COLUMNS
from sim.model.cost import DISPATCH_COLUMNS, StageCosts, check_totals
from sim.errors import PipesimError
from sim.core.compiled import FlatSchedule
from sim.core.listsched import list_schedule
from sim.model.hardware import Hardware
from sim.core.ir import (OP_B, OP_U, OP_W, ActionKind, Schedule, boundary_stage, decode_key, key_kind, key_mb,
    key_stage, transfer_op)
from sim.results.memory import MemoryProfile, memory_profile
from sim.results.metrics import Metrics, compute_metrics
from sim.engines.plan import OverlapFB
from sim.results.result import Result
from sim.results.timeline import OPS, TimelineRows

if TYPE_CHECKING:
    import pandas as pd

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
    """All-reduce algorithm among the replicas of a stage (see :mod:`sim.engines.collectives`; not ps/ps-sharded)."""
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
    """Schema of :mod:`sim.results.timeline` plus ALLREDUCE transfer rows."""
    memory: MemoryProfile
    metrics: Metrics
    allreduces: pd.DataFrame
    """One row per (stage, update): first_ready, start, end, bytes, algorithm, messages."""
    sync_wait: list[float]
    """Per device: seconds its U actions waited for the all-reduce beyond their local inputs."""
    notes: list[str] = field(default_factory=list)

    def as_result(self, costs: StageCosts, hardware: Hardware | None = None) -> Result:
        """The run as a :class:`~sim.results.result.Result` over all D x W devices, for :func:`sim.io.plots.gantt`.

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
                        hardware: Hardware | None = None, *, microbatch_size: float = 1.0,
                        overlap_fb: OverlapFB | None = None) -> ReplicatedRun:
    """Run *schedule* replicated as *replication* says, on the exact list scheduler of :mod:`sim.engines.fastpath`.

    *hardware* describes all D x W devices (default: free links). *overlap_fb*: how long overlapped
    forward-backward pairs (DualPipeV) last, as in :func:`sim.simulate` (default F + B).
    """
    schedule.validate()
    if costs.stages != schedule.stages:
        raise ReplicationError(f"costs describe {costs.stages} stages but the schedule has {schedule.stages}")
    check_totals(costs, schedule.total_microbatches)  # sums past the largest float: refused, not printed as inf
    check_totals(costs, schedule.total_microbatches)  # sums past the largest float: refused, not printed as inf
    offsets = replication.layout(schedule)
    W = sum(len(o) for o in offsets)
    D = replication.data_parallel
    N = D * W
    hardware = hardware or Hardware(devices=N)
    if hardware.devices != N:
        raise ReplicationError(f"hardware has {hardware.devices} devices; D={D} copies x {W} devices need {N}")
    reps = [len(o) for o in offsets]
    g = schedule.microbatches_per_update
    for p in range(schedule.devices):
        if g < reps[p] and g != 1:
            raise ReplicationError(
                f"device {p} is replicated {reps[p]} times but one update consumes {g} micro-batches; use at least "
                f"{reps[p]} micro-batches per update, or a schedule that updates after every micro-batch (pipedream)")
    fused_devices = sorted({int(np.searchsorted(schedule.device_start, i, side="right")) - 1
                            for i in schedule.fused.tolist()})
    split_pairs = [p for p in fused_devices if reps[p] > 1]
    if split_pairs:
        raise ReplicationError(f"device {split_pairs[0]} runs overlapped forward-backward pairs, whose two "
                               f"micro-batches would go to different replicas; replicate other devices, or use -D")
    problem = _Problem(schedule, costs, replication, hardware, offsets, W, N, overlap_fb or OverlapFB())
    start, end, sent_start, sent_end = problem.run()
    return problem.result(start, end, sent_start, sent_end, microbatch_size)


@dataclass(frozen=True, slots=True)
class _ReplicaStages:
    """What :func:`sim.results.memory.memory_profile` reads of a schedule, with each replica's copy of a stage as a
    stage of its own ("virtual stage"): a replica's activations, updates and weight versions stay its own."""

    devices: int
    stages: int
    placement: tuple[int, ...]


class _Problem:
    """The replicated run as the list scheduler's flat arrays: lanes (the devices, then one NIC lane per device
    that sends all-reduce messages, then one lane of flush barriers), actions in lane order, input slots."""

    def __init__(self, schedule: Schedule, costs: StageCosts, replication: Replication, hardware: Hardware,
                 offsets: list[list[int]], W: int, N: int, overlap_fb: OverlapFB) -> None:
        self.schedule, self.costs, self.replication, self.hardware = schedule, costs, replication, hardware
        self.offsets, self.W, self.N = offsets, W, N
        K = schedule.devices
        self.reps = reps = [len(o) for o in offsets]
        g = schedule.microbatches_per_update
        self.rounds_of = [1 if g >= reps[p] else reps[p] for p in range(K)]  # updates per sync
        self.updates = schedule.updates_per_stage
        self.split = schedule.split_backward

        # actions under provisional ids (lane order is fixed at the end); per action: lane, seconds, inputs as
        # (action id, arrived-from-elsewhere flag), and the transfer its result makes (link, seconds)
        self.lane: list[int] = []
        self.duration: list[float] = []
        self.dispatch: list[float] = []  # action id -> dispatch overhead before it (sim.engines.plan.Plan.overhead)
        self.pair_forwards: list[int] = []
        self.inputs: list[list[tuple[int, bool]]] = []
        self.link: list[int] = []
        self.send_seconds: list[float] = []
        self.lanes: list[list[int]] = [[] for _ in range(2 * N)]  # devices 0..N-1, then NIC lanes N..2N-1

        pairs = self._computations()
        self._pipeline_transfers()
        self._overlapped_pairs(pairs, overlap_fb)
        piece_of_mb = self._synchronizations()
        self._flush_barriers(piece_of_mb)
        self._allreduce_messages()

    def _computations(self) -> list[tuple[int, int]]:
        """1. Every copy runs the base lists; a replicated device's micro-batches go round-robin. Returns the
        (forward id, backward id) of every overlapped pair run."""
        schedule, offsets, reps, W = self.schedule, self.offsets, self.reps, self.W
        S, K, D = schedule.stages, schedule.devices, self.replication.data_parallel
        place = schedule.placement

        def where(c: int, key: int) -> int:
            p = place[key_stage(key, S)]
            return c * W + offsets[p][key_mb(key, S) % reps[p]]

        self.compute: list[tuple[int, int, int]] = []  # action id -> (device, copy, key) for computations
        self.run_on: dict[tuple[int, int], int] = {}  # (copy, key) -> action id (not U: it may run on every replica)
        fused = set(schedule.fused.tolist())  # positions (in the key array) of overlapped pairs' forwards
        pairs: list[tuple[int, int]] = []
        for c in range(D):
            for p in range(K):
                for j, key in enumerate(schedule.compiled.keys[p]):
                    if schedule.device_start[p] + j - 1 in fused:  # the backward of a pair: after its forward
                        pairs.append((len(self.lane) - 1, len(self.lane)))
                    if key_kind(key) == OP_U and self.rounds_of[p] == 1:
                        devices = [c * W + offsets[p][r] for r in range(reps[p])]
                    else:
                        devices = [where(c, key)]
                    for d in devices:
                        s, kind, mb = decode_key(key, S)
                        i = self._add(d, self.costs.cost(s, _KINDS[kind], split=(s, mb) in self.split))
                        self.dispatch[i] = getattr(self.costs, DISPATCH_COLUMNS[kind])[s]  # the runtime's own time
                        self.compute.append((d, c, key))
                        if kind != OP_U:
                            self.run_on[(c, key)] = i
        return pairs

    def _pipeline_transfers(self) -> None:
        """Each computation's inputs; a result crossing devices is a transfer on the link between them."""
        S, N, comp = self.schedule.stages, self.N, self.schedule.compiled
        self.transfer_of: dict[int, tuple[int, int, int, float]] = {}  # producer id -> (src, dst, op, bytes)
        for i, (d, c, key) in enumerate(self.compute):
            for producer_key in comp.dependency_keys(key):
                j = self.run_on[(c, producer_key)]
                src = self.lane[j]
                if key_kind(key) == OP_U and src != d:
                    continue  # a replica's U needs only its own gradients (and the all-reduce, below)
                if src == d:
                    self.inputs[i].append((j, False))
                    continue
                self.inputs[i].append((j, True))
                if j not in self.transfer_of:  # F(s,m) -> F(s+1,m) or B(s,m) -> B(s-1,m): one consumer device
                    nbytes = self.costs.send_bytes[boundary_stage(producer_key, S)]
                    self.transfer_of[j] = (src, d, transfer_op(producer_key), nbytes)
                    self.link[j] = src * N + d
                    self.send_seconds[j] = self.hardware.transfer_time(src, d, nbytes)
                assert self.transfer_of[j][1] == d, "a result travels to one device"

    def _overlapped_pairs(self, pairs: list[tuple[int, int]], overlap_fb: OverlapFB) -> None:
        """An overlapped pair is one unit (as in sim.engines.plan): the forward's slot waits for the inputs of both
        and lasts the pair's time; the backward then takes no time of its own."""
        self.pair_forwards = [f for f, _ in pairs]  # a blocking send holds the device only after the pair
        for f, b in pairs:
            self.inputs[f] = self.inputs[f] + [x for x in self.inputs[b] if x[0] != f]
            self.dispatch[f] += self.dispatch[b]  # dispatched once, as in sim.engines.plan
            self.dispatch[b] = 0.0
            self.duration[f] = float(overlap_fb.pair_seconds(np.float64(self.duration[f]), np.float64(self.duration[b])))
            self.duration[b] = 0.0

    def _synchronizations(self) -> dict[int, list[int]]:
        """2. Gradient synchronizations: (stage, round) -> participants and their backward pieces. Returns each
        micro-batch's backward pieces, every stage and copy."""
        schedule, offsets, reps, W = self.schedule, self.offsets, self.reps, self.W
        S, D, place = schedule.stages, self.replication.data_parallel, schedule.placement
        g, rounds_of = schedule.microbatches_per_update, self.rounds_of
        participants: dict[tuple[int, int], list[int]] = {}
        for s in range(S):
            p = place[s]
            for u in range(self.updates):
                k = u // rounds_of[p]
                devs = [c * W + d for c in range(D) for d in offsets[p]] if rounds_of[p] == 1 else \
                    [c * W + offsets[p][u % reps[p]] for c in range(D)]
                group = participants.setdefault((s, k), [])
                group.extend(d for d in devs if d not in group)
        self.participants = participants
        pieces: dict[tuple[int, int], dict[int, list[int]]] = {sk: {} for sk in participants}
        piece_of_mb: dict[int, list[int]] = {}
        for i, (d, c, key) in enumerate(self.compute):
            s, kind, mb = decode_key(key, S)
            if kind == OP_W or (kind == OP_B and (s, mb) not in self.split):
                pieces[(s, mb // g // rounds_of[place[s]])].setdefault(d, []).append(i)
                piece_of_mb.setdefault(mb, []).append(i)
        self.pieces = pieces
        return piece_of_mb

    def _flush_barriers(self, piece_of_mb: dict[int, list[int]]) -> None:
        """3. The flush barriers (overlap=False): barrier j is passed when every backward piece of the micro-batches
        before j, on every stage and copy, is done; each waits for the previous one, so inputs stay linear."""
        self.barrier: dict[int, int] = {}  # micro-batch threshold -> action id
        if self.replication.overlap:
            return
        place, g = self.schedule.placement, self.schedule.microbatches_per_update
        thresholds = sorted({min((k + 1) * self.rounds_of[place[s]], self.updates) * g for s, k in self.participants})
        lane, previous, low = 2 * self.N, None, 0
        self.lanes.append([])
        for j in thresholds:
            b = self._add(lane, 0.0)
            self.inputs[b] = ([(previous, False)] if previous is not None else []) + \
                [(x, False) for mb in range(low, j) for x in piece_of_mb.get(mb, ())]
            self.barrier[j], previous, low = b, b, j

    def _allreduce_messages(self) -> None:
        """4. The all-reduce messages, on each sender's NIC lane, and each replica's U waiting for its end."""
        schedule, costs, N = self.schedule, self.costs, self.N
        S, place, g = schedule.stages, schedule.placement, schedule.microbatches_per_update
        rounds_of, updates, pieces = self.rounds_of, self.updates, self.pieces
        self.messages: list[tuple[int, int, int, int, float]] = []  # message id -> (stage, round, src, dst, bytes)
        self.collective_rows: list[dict] = []
        position = {}  # action id -> index in its device's list: the order gradients become ready
        for d in range(N):
            for n_, i in enumerate(self.lanes[d]):
                position[i] = n_
        outgoing: dict[int, list[tuple[tuple, list]]] = {d: [] for d in range(N)}
        arrivals: dict[tuple[int, int, int], list[int]] = {}  # (stage, round, device) -> messages into it
        self.start_of: dict[tuple[int, int], object] = {}  # (stage, round) -> barrier id, or None (own pieces)
        for (s, k), nodes in self.participants.items():
            nbytes = costs.grad_bytes[s] or costs.weight_bytes[s]
            last_update = min((k + 1) * rounds_of[place[s]], updates)
            barrier = self.barrier.get(last_update * g)
            self.start_of[(s, k)] = barrier
            if len(nodes) == 1:
                continue
            chunks, _, msgs = messages(self.replication.algorithm, len(nodes))
            chunk = nbytes / chunks
            ids = []
            for m in msgs:
                src, dst = nodes[m.src], nodes[m.dst]
                size = chunk * len(m.chunks)
                i = self._add(None, 0.0)
                self.link[i] = src * N + dst
                self.send_seconds[i] = self.hardware.transfer_time(src, dst, size)
                self.messages.append((s, k, src, dst, size))
                self.transfer_of[i] = (src, dst, -1, size)
                ids.append(i)
                arrivals.setdefault((s, k, dst), []).append(i)
            for node in nodes:  # the node's messages, in the algorithm's program order (stable within a step)
                mine = sorted((n_ for n_, m in enumerate(msgs) if nodes[m.src] == node), key=lambda n_: msgs[n_].step)
                heard = [(n_, msgs[n_].step) for n_, m in enumerate(msgs) if nodes[m.dst] == node]
                own = pieces[(s, k)].get(node, [])
                ready = [(barrier, False)] if barrier is not None else [(x, False) for x in own]
                previous = None
                for n_ in mine:
                    i = ids[n_]
                    self.inputs[i] = list(ready)
                    self.inputs[i] += [(ids[h], True) for h, step in heard if step < msgs[n_].step]
                    if previous is not None:
                        self.inputs[i].append((previous, True))  # one message at a time from this NIC
                    previous = i
                order = max((position[x] for x in own), default=-1)
                outgoing[node].append(((order, s, k), [ids[n_] for n_ in mine]))
        for d in range(N):
            for _, ids in sorted(outgoing[d], key=lambda item: item[0]):
                for i in ids:
                    self.lane[i] = N + d
                    self.lanes[N + d].append(i)
        for i, (d, c, key) in enumerate(self.compute):
            if key_kind(key) == OP_U:
                s = key_stage(key, S)
                k = key_mb(key, S) // rounds_of[place[s]]
                into = arrivals.get((s, k, d))
                if into:
                    self.inputs[i] += [(m, True) for m in into]
                elif self.start_of[(s, k)] is not None:
                    self.inputs[i].append((self.start_of[(s, k)], False))

    def _add(self, lane: int | None, seconds: float) -> int:
        self.dispatch.append(0.0)
        i = len(self.lane)
        self.lane.append(-1 if lane is None else lane)
        self.duration.append(seconds)
        self.inputs.append([])
        self.link.append(-1)
        self.send_seconds.append(0.0)
        if lane is not None:
            self.lanes[lane].append(i)
        return i

    def run(self):
        """Schedule every action on the shared kernel; per action id: start, end, transfer start and end."""
        order = [i for lane in self.lanes for i in lane]
        n = len(order)
        assert n == len(self.lane), "every action sits on one lane"
        at = np.empty(n, dtype=np.int64)  # action id -> position in lane order
        at[order] = np.arange(n)
        device_start = np.zeros(len(self.lanes) + 1, dtype=np.int64)
        np.cumsum([len(lane) for lane in self.lanes], out=device_start[1:])
        counts = np.fromiter((len(self.inputs[i]) for i in order), dtype=np.int64, count=n)
        dep_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=dep_start[1:])
        dep_slot = np.fromiter((at[j] + (n if arrived else 0) for i in order for j, arrived in self.inputs[i]),
                               dtype=np.int64, count=int(dep_start[-1]))
        link = np.asarray(self.link, dtype=np.int64)[order]
        lanes_of_link: dict[int, int] = {}
        for i in order:  # the kernel serves a link in its one sender lane's order (sim.engines.fastpath); keep it so
            if self.link[i] >= 0:
                assert lanes_of_link.setdefault(self.link[i], self.lane[i]) == self.lane[i], "a link, two lanes"
        lane = np.asarray(self.lane, dtype=np.int64)[order]
        flat = FlatSchedule(keys=np.full(n, -1, dtype=np.int64), device=lane, device_start=device_start,
                            dep_start=dep_start, dep_slot=dep_slot, send_to=np.full(n, -1, dtype=np.int64))
        dispatch = np.asarray(self.dispatch, dtype=float)[order]
        duration = np.asarray(self.duration, dtype=float)[order]
        occupy = dispatch + duration if dispatch.any() else duration  # as sim.engines.fastpath: the same floats
        paired = np.zeros(n, dtype=np.bool_)
        paired[at[self.pair_forwards]] = True
        start, end, sent_start, sent_end, position = (np.asarray(x) for x in list_schedule(
            flat, occupy, link, np.asarray(self.send_seconds, dtype=float)[order], self.N * self.N,
            bool(self.hardware.overlap), paired))
        if dispatch.any():
            start = start + dispatch
        stuck = np.flatnonzero(position < device_start[1:])
        if len(stuck):
            lanes = [int(x) for x in stuck[:8] if x < self.N]
            raise ReplicationError(f"replicated run stopped with devices {lanes or stuck[:8].tolist()} unfinished; "
                                   f"the base schedule cannot be split this way")
        return start[at], end[at], sent_start[at], sent_end[at]

    def result(self, start, end, sent_start, sent_end, microbatch_size: float) -> ReplicatedRun:
        schedule, N, S = self.schedule, self.N, self.schedule.stages
        g, M = schedule.microbatches_per_update, schedule.microbatches
        ids = np.arange(len(self.compute))
        device = np.array([d for d, _, _ in self.compute], dtype=np.int64)
        key = np.array([k for _, _, k in self.compute], dtype=np.int64)
        kind, stage, mb = key_kind(key), key_stage(key, S), key_mb(key, S)
        sent = np.array(sorted(self.transfer_of), dtype=np.int64)
        info = [self.transfer_of[i] for i in sent.tolist()]
        msg_ids = sent[sent >= len(self.compute)]  # messages were added after every computation
        msg_stage = np.array([self.messages[i][0] for i in range(len(self.messages))], dtype=np.int64)
        msg_round = np.array([self.messages[i][1] for i in range(len(self.messages))], dtype=np.int64)
        rounds_of = np.asarray(self.rounds_of)[np.asarray(schedule.placement)[msg_stage]] if len(msg_stage) else 0
        pipe = sent[sent < len(self.compute)]
        # rows: computations, pipeline transfers, all-reduce messages (op ALLREDUCE_CODE, outside sim.results.timeline.OPS)
        r_device = np.concatenate([device, device[pipe], [self.messages[i][2] for i in range(len(self.messages))]])
        r_stage = np.concatenate([stage, stage[pipe], msg_stage])
        r_mb = np.concatenate([mb, mb[pipe], msg_round * rounds_of])
        r_op = np.concatenate([kind, [info[x][2] for x in range(len(pipe))], np.full(len(msg_ids), ALLREDUCE_CODE)])
        r_start = np.concatenate([start[ids], sent_start[pipe], sent_start[msg_ids]])
        r_end = np.concatenate([end[ids], sent_end[pipe], sent_end[msg_ids]])
        r_src = np.concatenate([np.full(len(ids), -1), [t[0] for t in info]]).astype(np.int64)
        r_dst = np.concatenate([np.full(len(ids), -1), [t[1] for t in info]]).astype(np.int64)
        r_bytes = np.concatenate([np.zeros(len(ids)), [t[3] for t in info]])
        first_mb = np.where((r_op == OP_U) | (r_op == ALLREDUCE_CODE), r_mb * g, r_mb)
        rows = TimelineRows(device=r_device.astype(np.int64), stage=r_stage.astype(np.int64),
                            microbatch=r_mb.astype(np.int64), iteration=(first_mb // M).astype(np.int64),
                            op=r_op.astype(np.int64), start=r_start.astype(float), end=r_end.astype(float),
                            src=r_src, dst=r_dst, bytes=r_bytes.astype(float))
        memory = self._memory(rows)
        metrics = compute_metrics(rows, memory, devices=N, samples=self.replication.data_parallel *
                                  schedule.total_microbatches * microbatch_size)
        sync_wait = self._sync_wait(start, end, sent_end)
        allreduces = self._allreduces(start, end, sent_end)
        notes = ["all-reduce messages use the pipeline's links (one directed link per pair, first come first "
                 "served) and one send at a time per device; unlike `pipesim collective`, a device may receive "
                 "from several senders at once",
                 "weight versions are counted per replica (PipeDream's stashing included)"]
        device_actions = {d: [(self.compute[i][1], str(schedule.action_of(self.compute[i][2])))
                              for i in self.lanes[d]] for d in range(N)}
        return ReplicatedRun(schedule, self.replication, N, device_actions, _frame(rows), memory, metrics,
                             allreduces, sync_wait, notes)

    def _memory(self, rows: TimelineRows) -> MemoryProfile:
        """:func:`memory_profile` over every replica's stages as stages of their own (see _ReplicaStages)."""
        schedule, costs, N = self.schedule, self.costs, self.N
        base_device = [p for p, devs in enumerate(self.offsets) for _ in devs] * self.replication.data_parallel
        virtual = np.full((N, schedule.stages), -1, dtype=np.int64)  # (device, stage) -> virtual stage
        base_stage, placement = [], []
        for d in range(N):
            for s in schedule.stages_of(base_device[d]):
                virtual[d, s] = len(base_stage)
                base_stage.append(s)
                placement.append(d)
        view = _ReplicaStages(devices=N, stages=len(base_stage), placement=tuple(placement))
        # every column, the memory ones too: weight_activation_bytes says what B frees before W (zero-bubble
        # schedules); left out, each replica would keep all of F's activations until W
        per_stage = StageCosts(**{c: tuple(getattr(costs, c)[s] for s in base_stage)
                                  for c in COST_COLUMNS + MEMORY_COLUMNS})
        comp = rows.computing
        compute_rows = TimelineRows(
            device=rows.device[comp], stage=virtual[rows.device[comp], rows.stage[comp]],
            microbatch=rows.microbatch[comp], iteration=rows.iteration[comp], op=rows.op[comp],
            start=rows.start[comp], end=rows.end[comp], src=rows.src[comp], dst=rows.dst[comp],
            bytes=rows.bytes[comp])
        return memory_profile(view, per_stage, compute_rows, self.hardware.memory_capacity)

    def _sync_wait(self, start, end, sent_end) -> list[float]:
        """Per device: seconds its U's waited beyond their local inputs (the device free, its own gradients)."""
        wait = [0.0] * self.N
        blocking = not self.hardware.overlap  # a blocking send keeps its device busy until the data has left
        for d in range(self.N):
            free = 0.0
            for i in self.lanes[d]:
                if key_kind(self.compute[i][2]) == OP_U:
                    local = max([free] + [float(end[j]) for j, arrived in self.inputs[i]
                                          if not arrived and j < len(self.compute)])
                    wait[d] += float(start[i]) - local
                free = float(sent_end[i]) if blocking and self.link[i] >= 0 else float(end[i])
        return wait

    def _allreduces(self, start, end, sent_end) -> pd.DataFrame:
        import pandas as pd

        rows = []
        arrived: dict[tuple[int, int, int], float] = {}  # (stage, round, device) -> its last message in
        first = len(self.compute) + len(self.barrier)
        for n_, (s, k, src, dst, size) in enumerate(self.messages):
            i = first + n_
            arrived[(s, k, dst)] = max(arrived.get((s, k, dst), 0.0), float(sent_end[i]))
        for (s, k), nodes in self.participants.items():
            barrier = self.start_of[(s, k)]
            if barrier is not None:
                starts = [float(end[barrier])] * len(nodes)
            else:
                starts = [max((float(end[x]) for x in self.pieces[(s, k)].get(d, ())), default=0.0) for d in nodes]
            finish = [arrived.get((s, k, d), t) for d, t in zip(nodes, starts)]
            rows.append({"stage": s, "update": k * self.rounds_of[self.schedule.placement[s]],
                         "first_ready": min(starts), "start": max(starts), "end": max(finish),
                         "bytes": self.costs.grad_bytes[s] or self.costs.weight_bytes[s],
                         "algorithm": self.replication.algorithm,
                         "messages": sum(1 for m in self.messages if m[0] == s and m[1] == k)})
        frame = pd.DataFrame(rows, columns=["stage", "update", "first_ready", "start", "end", "bytes", "algorithm",
                                            "messages"])
        return frame.sort_values(["start", "stage", "update"], kind="stable", ignore_index=True)


ALLREDUCE_CODE = len(OPS)
"""Op code of an all-reduce message in the replicated run's rows (one past :data:`sim.results.timeline.OPS`)."""


def _frame(rows: TimelineRows) -> pd.DataFrame:
    """The timeline DataFrame (schema of :mod:`sim.results.timeline`, op categories OPS + ALLREDUCE), sorted as simulate's."""
    import pandas as pd

    order = np.lexsort((rows.end, rows.device, rows.start))
    return pd.DataFrame({
        "device": rows.device[order], "stage": rows.stage[order], "microbatch": rows.microbatch[order],
        "iteration": rows.iteration[order],
        "op": pd.Categorical.from_codes(rows.op[order], categories=list(OPS) + [ALLREDUCE_OP]),
        "start": rows.start[order], "end": rows.end[order], "src": rows.src[order], "dst": rows.dst[order],
        "bytes": rows.bytes[order],
    })
