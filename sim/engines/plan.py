"""What both engines need to know about each action before time starts.

Actions are identified by their integer key (:meth:`sim.core.ir.Schedule.key`) and
their inputs by :attr:`sim.core.compiled.Compiled.deps` (``~p``: the result of *p* arriving
from another device). The plan adds time (seconds): the duration of every action,
and for every result sent to another device the transfer that carries it
(``SEND_F`` activations, ``SEND_B`` gradients). It holds them as arrays in the
order of :attr:`sim.core.compiled.Compiled.flat` (for :mod:`sim.engines.fastpath`), built with numpy
once per call; the per-key dicts the simpy engine reads are derived on first use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.model.cost import StageCosts
from sim.errors import PipesimError
from sim.model.hardware import Hardware
from sim import jit
from sim.core.compiled import FlatSchedule
from sim.core.ir import NUM_KINDS, OP_B, OP_F, OP_W, Schedule, ScheduleError, key_kind, key_stage

__all__ = ["Plan", "make_plan", "directed_links", "OverlapFB", "OverlapError"]


class OverlapError(PipesimError):
    """An overlapped-pair duration pipesim cannot use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapFB:
    """How long an overlapped forward-backward pair runs (DualPipe; PyTorch's ``OVERLAP_F_B``).

    A pair runs as one unit on its device: it starts when the inputs of both halves are there and
    both results are ready when it ends. Overlapping the forward of one micro-batch with the backward
    of another hides one's communication behind the other's computation, which is DualPipe's point
    (DeepSeek-V3 Technical Report, 2024, section 3.2.1): the pair takes less than F + B.
    """

    seconds: float | None = None
    """Every pair lasts this many seconds (when given, *saved* is ignored)."""
    saved: float = 0.0
    """Otherwise a pair lasts (F + B) x (1 - saved): the share of its time that overlapping saves, in [0, 1)."""

    def __post_init__(self) -> None:
        if self.seconds is not None and not (isinstance(self.seconds, (int, float)) and 0 <= self.seconds < math.inf):
            raise OverlapError(f"an overlapped pair's seconds must be a finite number >= 0, got {self.seconds!r}")
        if not (isinstance(self.saved, (int, float)) and 0 <= self.saved < 1):
            raise OverlapError(f"the share of a pair's time saved by overlapping must be in [0, 1), got {self.saved!r}")

    @classmethod
    def parse(cls, text: str) -> OverlapFB:
        """``"1.5"``: every pair lasts 1.5 s; ``"30%"``: a pair lasts 70% of F + B."""
        text = text.strip()
        percent = text.endswith("%")
        try:
            value = float(text[:-1] if percent else text)
        except ValueError:
            raise OverlapError(f"--overlap-fb takes seconds per pair (e.g. 1.5) or the share of F+B saved "
                               f"(e.g. 30%), got {text!r}") from None
        return cls(saved=value / 100) if percent else cls(seconds=value)

    def pair_seconds(self, forward, backward):
        """Seconds of pairs whose halves would take *forward* and *backward* alone (numbers or arrays)."""
        if self.seconds is not None:
            return np.full_like(np.asarray(forward + backward, dtype=float), self.seconds)
        return (forward + backward) * (1.0 - self.saved)


@dataclass(frozen=True, slots=True)
class Plan:
    schedule: Schedule
    costs: StageCosts
    hardware: Hardware
    flat: FlatSchedule
    """The actions and their inputs as arrays (:attr:`sim.core.compiled.Compiled.flat`); the arrays below follow its order."""
    durations: np.ndarray
    """float64[n]: seconds of action i."""
    send_seconds: np.ndarray
    """float64[n]: seconds the transfer of action i's result holds its link (0 where nothing is sent)."""
    send_bytes: np.ndarray
    """float64[n]: bytes the transfer of action i's result carries (0 where nothing is sent)."""
    link: np.ndarray
    """int64[n]: the directed link action i's result travels on, numbered 0 .. links-1 (-1: nothing sent)."""
    links: int
    """How many directed links are in use."""
    overhead: np.ndarray | None = None
    """float64[n]: the runtime's dispatch overhead before action i, seconds
    (:attr:`sim.model.cost.StageCosts.dispatch_forward` and its siblings): the device is held for it once the action's inputs are there, before it computes; not
    counted as busy. None: none (zeros)."""
    _views: dict = field(default_factory=dict, repr=False, compare=False)
    """The per-key dicts and derived arrays below, built on first use."""

    def __post_init__(self) -> None:
        if self.overhead is None:
            object.__setattr__(self, "overhead", np.zeros(len(self.durations)))

    @property
    def has_overhead(self) -> bool:
        if "has_overhead" not in self._views:
            self._views["has_overhead"] = bool(self.overhead.any())
        return self._views["has_overhead"]

    @property
    def occupy(self) -> np.ndarray:
        """float64[n]: how long action i holds its device once its inputs are there: overhead + duration (the
        durations themselves, the same array, when there is no overhead: the same floats as before overheads)."""
        if "occupy" not in self._views:
            self._views["occupy"] = self.overhead + self.durations if self.has_overhead else self.durations
        return self._views["occupy"]

    @property
    def paired(self) -> np.ndarray:
        """bool[n]: action i is the forward of an overlapped pair (:attr:`sim.core.ir.Schedule.fused`)."""
        if "paired" not in self._views:
            paired = np.zeros(len(self.durations), dtype=np.bool_)
            paired[self.schedule.fused] = True
            self._views["paired"] = paired
        return self._views["paired"]

    def sends(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The transfers as arrays sorted by producer key: producer keys, src, dst, bytes (for the simpy engine)."""
        flat = self.flat
        sent = np.flatnonzero(flat.send_to >= 0)
        sent = sent[np.argsort(flat.keys[sent])]
        return flat.keys[sent], flat.device[sent], flat.send_to[sent], self.send_bytes[sent]

    @property
    def keys(self) -> list[list[int]]:
        """device -> its action keys in order (for the simpy engine)."""
        return self.schedule.compiled.keys

    @property
    def deps(self) -> dict[int, tuple[int, ...]]:
        """key -> inputs: producer keys on the same device, ~producer for arrivals from another device."""
        return self.schedule.compiled.deps

    @property
    def duration(self) -> dict[int, float]:
        """key -> seconds (for the simpy engine)."""
        if "duration" not in self._views:
            self._views["duration"] = dict(zip(self.flat.keys.tolist(), self.durations.tolist()))
        return self._views["duration"]

    @property
    def transfer(self) -> dict[int, tuple[int, int, float]]:
        """producer key -> (src, dst, seconds): the transfer of its result to another device (at most one)."""
        if "transfer" not in self._views:
            flat = self.flat
            sent = np.flatnonzero(flat.send_to >= 0)
            self._views["transfer"] = dict(zip(flat.keys[sent].tolist(), zip(
                flat.device[sent].tolist(), flat.send_to[sent].tolist(), self.send_seconds[sent].tolist())))
        return self._views["transfer"]


def make_plan(schedule: Schedule, costs: StageCosts, hardware: Hardware, overlap: OverlapFB | None = None) -> Plan:
    """Durations and transfers of *schedule*; *overlap* sets how long its overlapped pairs last (default F + B)."""
    if costs.stages != schedule.stages:
        raise ScheduleError(
            f"costs describe {costs.stages} stages but schedule {schedule.name!r} has {schedule.stages}; "
            f"give one cost row per stage"
        )
    if hardware.devices != schedule.devices:
        raise ScheduleError(f"hardware has {hardware.devices} devices but the schedule needs {schedule.devices}")
    compiled = schedule.compiled
    flat = compiled.flat
    S = schedule.stages

    # durations: table[stage, kind ordinal] (F, B, W, R, U: the codec's order), B a full backward (B + W)
    # unless its W (key + 1) exists: then B is the input gradient alone
    forward, backward, weight = (np.asarray(c, dtype=float) for c in (costs.forward, costs.backward, costs.weight))
    table = np.stack([forward, backward + weight, weight, np.asarray(costs.recompute, dtype=float),
                      np.asarray(costs.update, dtype=float)], axis=1)
    # transfers: F(s,m) -> F(s+1,m) carries the activation (send_bytes[s]),
    # B(s,m) -> B(s-1,m) its gradient of the same size (send_bytes[s-1]); each holds its directed link
    # latency + bytes / bandwidth (sim.model.hardware)
    sizes = np.asarray(costs.send_bytes, dtype=float)
    K = schedule.devices
    if K * K <= 4 * len(flat.keys) + 4096 and (kernel := jit.kernel_for(_plan_kernel, len(flat.keys))) is not None:
        durations, send_bytes, link, codes = kernel(flat.keys, flat.device, flat.send_to, S, K, table, backward, sizes)
        latency, bandwidth = _link_table(hardware, *np.divmod(codes, K))
        send_seconds = jit.compiled(_transfer_seconds)(link, send_bytes, latency, bandwidth)
        links = len(codes)
    else:
        durations, send_seconds, send_bytes, link, links = _plan_numpy(flat, S, hardware, table, backward, sizes)
    overhead = _overhead(costs, flat, S)
    fused = schedule.fused
    if len(fused):  # a pair is one unit: its forward's slot holds the pair, its backward takes no time of its own
        durations[fused] = (overlap or OverlapFB()).pair_seconds(durations[fused], durations[fused + 1])
        durations[fused + 1] = 0.0
        if overhead is not None:  # and is dispatched once, for both halves
            overhead[fused] += overhead[fused + 1]
            overhead[fused + 1] = 0.0
    return Plan(schedule, costs, hardware, flat, durations, send_seconds, send_bytes, link, links, overhead)


def _overhead(costs: StageCosts, flat: FlatSchedule, S: int) -> np.ndarray | None:
    """Dispatch overhead per action (seconds) from the costs' dispatch columns, or None where all are 0."""
    table = costs.dispatch_table()
    if table is None:
        return None
    keys = flat.keys
    return np.asarray(table, dtype=float)[key_stage(keys, S), key_kind(keys)]


def _link_table(hardware: Hardware, sources: np.ndarray, destinations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latency and bandwidth of the links in use (numbered as :func:`directed_links`)."""
    def values(matrix) -> np.ndarray:
        if all(row is matrix[0] for row in matrix):  # one number for every link is one shared row (sim.model.hardware)
            return np.asarray(matrix[0], dtype=float)[destinations]
        return np.array([matrix[a][b] for a, b in zip(sources.tolist(), destinations.tolist())], dtype=float)

    return values(hardware.latency), values(hardware.bandwidth)


def _plan_numpy(flat: FlatSchedule, S: int, hardware: Hardware, table, backward, sizes):
    """Durations, transfer seconds and bytes, links (and their count) with vectorised numpy."""
    keys = flat.keys
    kind, stage = key_kind(keys), key_stage(keys, S)
    durations = table[stage, kind]
    is_w = kind == OP_W
    if is_w.any():
        split = kind == OP_B
        split[split] = np.isin(keys[split] + (OP_W - OP_B), keys[is_w])
        durations[split] = backward[stage[split]]
    sent = np.flatnonzero(flat.send_to >= 0)
    nbytes = sizes[stage[sent] - (kind[sent] != OP_F)]  # as ir.boundary_stage, from the parts decoded above
    link_of_sent, pairs = directed_links(flat.device[sent], flat.send_to[sent], hardware.devices)
    latency, bandwidth = _link_table(hardware, *pairs)
    send_bytes = np.zeros(len(keys))
    send_bytes[sent] = nbytes
    link = np.full(len(keys), -1, dtype=np.int64)
    link[sent] = link_of_sent
    send_seconds = np.zeros(len(keys))
    send_seconds[sent] = latency[link_of_sent] + np.where(nbytes > 0, nbytes / bandwidth[link_of_sent], 0.0)
    return durations, send_seconds, send_bytes, link, len(latency)


def _plan_kernel(keys, device, send_to, S, K, table, backward, sizes):
    """:func:`_plan_numpy`'s durations, bytes and links as one loop (compiled by numba, :mod:`sim.jit`); links
    numbered through a K x K table (the caller keeps K x K small). Returns durations, bytes sent, link per action
    (-1: none) and the used links' codes src * K + dst, in the numbering's order."""
    n = len(keys)
    top = 0
    for i in range(n):
        if keys[i] > top:
            top = keys[i]
    present = np.zeros(top + 2, dtype=np.bool_)
    for i in range(n):
        present[keys[i]] = True
    pairs = top // NUM_KINDS + 1
    stage_of = np.empty(pairs, dtype=np.int64)  # mb * S + stage -> stage: a load, not a division per action
    for p in range(0, pairs, S):
        for s in range(min(S, pairs - p)):
            stage_of[p + s] = s
    durations = np.empty(n)
    send_bytes = np.zeros(n)
    link = np.full(n, -1, dtype=np.int64)
    number = np.full(K * K, -1, dtype=np.int64)
    for i in range(n):
        key = keys[i]
        pair = key // NUM_KINDS  # one division per part of the codec
        kind = key - pair * NUM_KINDS
        stage = stage_of[pair]
        if kind == OP_B and present[key + (OP_W - OP_B)]:
            durations[i] = backward[stage]
        else:
            durations[i] = table[stage, kind]
        if send_to[i] >= 0:
            send_bytes[i] = sizes[stage if kind == OP_F else stage - 1]
            number[device[i] * K + send_to[i]] = 0  # used
    count = 0
    for c in range(K * K):  # number the used links in code order, as np.unique would
        if number[c] == 0:
            number[c] = count
            count += 1
    codes = np.empty(count, dtype=np.int64)
    for c in range(K * K):
        if number[c] >= 0:
            codes[number[c]] = c
    for i in range(n):
        if send_to[i] >= 0:
            link[i] = number[device[i] * K + send_to[i]]
    return durations, send_bytes, link, codes


def _transfer_seconds(link, send_bytes, latency, bandwidth):
    """Seconds each transfer holds its link, as :func:`_plan_numpy` computes them: latency + bytes / bandwidth
    (bytes 0: latency alone, even on a link of infinite bandwidth); 0 where nothing is sent. A loop for numba."""
    seconds = np.zeros(len(link))
    for i in range(len(link)):
        on = link[i]
        if on >= 0:
            seconds[i] = latency[on] + (send_bytes[i] / bandwidth[on] if send_bytes[i] > 0 else 0.0)
    return seconds


def directed_links(src: np.ndarray, dst: np.ndarray, devices: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Number the directed links (src, dst) in use 0, 1, ... in (src, dst) order: each transfer's link, and the
    links' (sources, destinations). Only the links in use (about 2K of the K x K table): converting or storing
    the whole table would cost K^2 per call."""
    code = src * devices + dst
    if devices * devices <= 4 * len(code) + 4096:  # a lookup table is cheaper than sorting
        used = np.zeros(devices * devices, dtype=bool)
        used[code] = True
        codes = np.flatnonzero(used)
        number = np.cumsum(used) - 1
        return number[code], np.divmod(codes, devices)
    codes, link = np.unique(code, return_inverse=True)
    return link, np.divmod(codes, devices)
