"""What both engines need to know about each action before time starts.

Actions are identified by their integer key (:meth:`sim.ir.Schedule.key`) and
their inputs by :attr:`sim.ir.Compiled.deps` (``~p``: the result of *p* arriving
from another device). The plan adds time: the duration of every key, and for
every result sent to another device the transfer that carries it
(``SEND_F`` activations, ``SEND_B`` gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import StageCosts
from .hardware import Hardware
from .ir import ActionKind, Schedule, ScheduleError

__all__ = ["Plan", "make_plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    schedule: Schedule
    costs: StageCosts
    hardware: Hardware
    keys: list[list[int]]
    """device -> its action keys in order."""
    deps: dict[int, tuple[int, ...]]
    """key -> inputs: producer keys on the same device, ~producer for arrivals from another device."""
    duration: dict[int, float]
    transfer: dict[int, tuple[int, int, float]]
    """producer key -> (src, dst, seconds): the transfer of its result to another device (at most one)."""
    sends: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """The same transfers as sorted arrays: producer keys, src, dst, bytes."""


def make_plan(schedule: Schedule, costs: StageCosts, hardware: Hardware) -> Plan:
    if costs.stages != schedule.stages:
        raise ScheduleError(
            f"costs describe {costs.stages} stages but schedule {schedule.name!r} has {schedule.stages}; "
            f"give one cost row per stage"
        )
    if hardware.devices != schedule.devices:
        raise ScheduleError(f"hardware has {hardware.devices} devices but the schedule needs {schedule.devices}")
    compiled = schedule.compiled
    S = schedule.stages
    placement = schedule.placement

    # durations, vectorized: table[stage, kind ordinal]; B is a full backward unless its W (key + 1) exists
    table = np.array([[costs.cost(s, kind) for kind in ActionKind] for s in range(S)])
    full_backward = np.array([costs.cost(s, ActionKind.B, split=False) for s in range(S)])
    keys = np.fromiter(compiled.deps.keys(), dtype=np.int64, count=len(compiled.deps))
    kind, stage = keys % 5, (keys // 5) % S
    durations = table[stage, kind]
    has_w = np.isin(keys + 1, keys)
    unsplit = (kind == 1) & ~has_w
    durations[unsplit] = full_backward[stage[unsplit]]
    duration = dict(zip(keys.tolist(), durations.tolist()))

    # transfers, vectorized: F(s,m) -> F(s+1,m) carries the activation (send_bytes[s]),
    # B(s,m) -> B(s-1,m) its gradient of the same size (send_bytes[s-1])
    producers = np.fromiter(compiled.sends.keys(), dtype=np.int64, count=len(compiled.sends))
    dst = np.fromiter(compiled.sends.values(), dtype=np.int64, count=len(compiled.sends))
    p_stage = (producers // 5) % S
    src = np.asarray(placement)[p_stage]
    nbytes = np.asarray(costs.send_bytes)[np.where(producers % 5 == 0, p_stage, p_stage - 1)]
    latency, bandwidth = np.asarray(hardware.latency), np.asarray(hardware.bandwidth)
    seconds = latency[src, dst] + np.where(nbytes > 0, nbytes / bandwidth[src, dst], 0.0)
    transfer = dict(zip(producers.tolist(), zip(src.tolist(), dst.tolist(), seconds.tolist())))
    order = np.argsort(producers)
    sends = (producers[order], src[order], dst[order], nbytes[order])
    return Plan(schedule, costs, hardware, compiled.keys, compiled.deps, duration, transfer, sends)
