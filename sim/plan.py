"""What both engines need to know about each action before time starts.

Actions are identified by their integer key (:meth:`sim.ir.Schedule.key`) and
their inputs by :attr:`sim.compiled.Compiled.deps` (``~p``: the result of *p* arriving
from another device). The plan adds time (seconds): the duration of every action,
and for every result sent to another device the transfer that carries it
(``SEND_F`` activations, ``SEND_B`` gradients). It holds them as arrays in the
order of :attr:`sim.compiled.Compiled.flat` (for :mod:`sim.fastpath`), built with numpy
once per call; the per-key dicts the simpy engine reads are derived on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import StageCosts
from .hardware import Hardware
from .compiled import FlatSchedule
from .ir import OP_B, OP_F, OP_W, ActionKind, Schedule, ScheduleError, boundary_stage, key_kind, key_stage

__all__ = ["Plan", "make_plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    schedule: Schedule
    costs: StageCosts
    hardware: Hardware
    flat: FlatSchedule
    """The actions and their inputs as arrays (:attr:`sim.compiled.Compiled.flat`); the arrays below follow its order."""
    durations: np.ndarray
    """float64[n]: seconds of action i."""
    send_seconds: np.ndarray
    """float64[n]: seconds the transfer of action i's result holds its link (0 where nothing is sent)."""
    send_bytes: np.ndarray
    """float64[n]: bytes the transfer of action i's result carries (0 where nothing is sent)."""
    _views: dict = field(default_factory=dict, repr=False, compare=False)
    """The per-key dicts below, built on first use."""

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


def make_plan(schedule: Schedule, costs: StageCosts, hardware: Hardware) -> Plan:
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

    # durations: table[stage, kind ordinal]; B is a full backward unless its W (key + 1) exists
    table = np.array([[costs.cost(s, kind) for kind in ActionKind] for s in range(S)])
    full_backward = np.array([costs.cost(s, ActionKind.B, split=False) for s in range(S)])
    keys = flat.keys
    kind, stage = key_kind(keys), key_stage(keys, S)
    durations = table[stage, kind]
    unsplit = kind == OP_B
    unsplit[unsplit] = ~np.isin(keys[unsplit] + (OP_W - OP_B), keys[kind == OP_W])
    durations[unsplit] = full_backward[stage[unsplit]]

    # transfers: F(s,m) -> F(s+1,m) carries the activation (send_bytes[s]),
    # B(s,m) -> B(s-1,m) its gradient of the same size (send_bytes[s-1])
    sent = np.flatnonzero(flat.send_to >= 0)
    producers, src, dst = keys[sent], flat.device[sent], flat.send_to[sent]
    nbytes = np.asarray(costs.send_bytes)[boundary_stage(producers, S)]
    latency, bandwidth = np.asarray(hardware.latency), np.asarray(hardware.bandwidth)
    seconds = latency[src, dst] + np.where(nbytes > 0, nbytes / bandwidth[src, dst], 0.0)
    send_seconds = np.zeros(len(keys))
    send_seconds[sent] = seconds
    send_bytes = np.zeros(len(keys))
    send_bytes[sent] = nbytes
    return Plan(schedule, costs, hardware, flat, durations, send_seconds, send_bytes)
