"""A synthesized schedule against the registered ones: who fits the same cap, who is faster, and where.

:func:`compare_registered` runs every registered flush schedule of the same K and M with the same costs, links and
memory cap (asynchronous PipeDream variants are left out: they train with other semantics, weight stashing and no
flush, so their makespan answers another question). :func:`gain` says what the synthesized schedule gains over
the best one that fits, and where: per device, the idle time it removes in the warm-up (before the device's first
backward), the steady state and the cool-down (after its last forward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.core.config import ConfigError
from sim.core.ir import OP_B, OP_F, Schedule, ScheduleError
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from sim.results.result import Result
from sim.search.synthesis import Synthesis, fits
from sim.search.synthesis_problem import Problem, device_costs_to_stages
from sim.simulate import simulate

__all__ = ["Rival", "compare_registered", "best_fitting", "gain", "Gain", "ASYNCHRONOUS"]

ASYNCHRONOUS = ("pipedream", "pipedream-2bw")
"""Registered schedules left out of the comparison (no flush: another training semantics)."""


@dataclass(frozen=True, slots=True)
class Rival:
    """A registered schedule run under the same costs, links and cap."""

    name: str
    makespan: float
    fits: bool
    """Whether every device stays under the cap."""
    peak: tuple[float, ...]
    """Peak bytes per device (in the synthesis' units where it counts micro-batches)."""
    result: Result = field(compare=False, repr=False)


def compare_registered(found: Synthesis, costs: StageCosts, hardware: Hardware,
                       names: Sequence[str] | None = None) -> list[Rival]:
    """Every registered flush schedule of the same K and M under the same costs, links and cap (only those with an
    unsplit backward when the synthesis was asked for one), those that fit first, each group by makespan.
    *costs*: the synthesis' own (one row per stage of its placement) or one row per device; every rival gets each
    device's work cut over its own stages on that device (:func:`_costs_for`)."""
    from sim import schedules
    from sim.schedules.registry import default_chunks

    p = found.problem
    rivals = []
    for name in names or schedules.names():
        if name in ASYNCHRONOUS:
            continue
        try:
            schedule = schedules.generate(name, p.devices, p.microbatches, chunks=default_chunks(name))
        except (ScheduleError, ConfigError):
            continue  # a shape this generator refuses (interleaved 1F1B needs M a multiple of K)
        if not p.split and schedule.split_backward:
            continue  # the backward was asked unsplit (a runtime without B/W split): split schedules are not options
        rival_costs = _costs_for(costs, p, schedule)
        if rival_costs is None:
            continue  # costs of 2K chunk rows cannot describe a one-stage-per-device schedule
        result = simulate(schedule, rival_costs, hardware)
        rivals.append(Rival(name, result.metrics.makespan, fits(p, result.memory.peak), tuple(result.memory.peak),
                            result))
    return sorted(rivals, key=lambda r: (not r.fits, r.makespan))


def best_fitting(rivals: Sequence[Rival]) -> Rival | None:
    """The fastest rival that fits the cap, or None."""
    return next((r for r in rivals if r.fits), None)


def _costs_for(costs: StageCosts, p: Problem, schedule: Schedule) -> StageCosts | None:
    """*costs* for *schedule*'s stages with every device doing the same work as in the synthesis: as given where
    the placements match, else the per-device rows cut over the rival's own placement
    (:func:`~sim.search.synthesis_problem.device_costs_to_stages`); memory in the synthesis' units where it
    counts micro-batches."""
    K = p.devices
    if schedule.placement == p.placement and costs.stages == schedule.stages:
        base = costs
    else:
        rows = costs if costs.stages == K else _merge_to_devices(costs, p)
        base = device_costs_to_stages(rows, schedule.placement)
    if p.units:  # one unit per micro-batch and device, shared by its stages: the synthesis' own count
        share = [1.0 / sum(1 for d in schedule.placement if d == dev) for dev in range(K)]
        units = tuple(share[d] for d in schedule.placement)
        base = dataclasses.replace(base, activation_bytes=units, checkpoint_bytes=(0.0,) * schedule.stages,
                                   weight_activation_bytes=units)
    if p.weight_memory is not None:  # the same M_W / M_B as the synthesis
        base = dataclasses.replace(base, weight_activation_bytes=tuple(a * p.weight_memory
                                                                       for a in base.activation_bytes))
    return base


def _merge_to_devices(costs: StageCosts, p: Problem) -> StageCosts:
    """Stage rows summed back into one row per device (its stages' work; the first stage's bytes sent)."""
    K = p.devices
    merged = {}
    for column in ("forward", "backward", "weight", "recompute", "update", "activation_bytes", "weight_bytes",
                   "grad_bytes", "optimizer_bytes", "weight_activation_bytes"):
        values = getattr(costs, column)
        merged[column] = tuple(sum(values[s] for s in p.stages_on(d)) for d in range(K))
    for column in ("send_bytes", "checkpoint_bytes"):
        values = getattr(costs, column)
        merged[column] = tuple(values[p.stages_on(d)[0]] for d in range(K))
    return StageCosts(**merged)


@dataclass(frozen=True, slots=True)
class Gain:
    """What the synthesized schedule gains over a rival."""

    rival: str
    seconds: float
    """Rival's makespan minus ours (> 0: ours is shorter)."""
    fraction: float
    """seconds / rival's makespan."""
    idle: dict[str, list[float]]
    """phase (warm-up, steady, cool-down) -> per device, the rival's idle seconds minus ours in that phase."""
    capped: bool = True
    """Whether there is a memory cap (the line then says the rival is the best that fits it)."""
    placement_searched: bool = True
    """Whether the search tried the rival's stage placement (a V-shaped rival beats a linear-only search)."""

    def line(self) -> str:
        """One sentence: how much shorter, and on which devices and phases the idle time went."""
        who = f"{self.rival}, the best registered schedule" + (" that fits the cap" if self.capped else "")
        if abs(self.seconds) <= 1e-12 * max(1.0, abs(self.seconds)):
            return f"as fast as {who}"
        verb = "shorter" if self.seconds > 0 else "longer"
        where = []
        for phase, per_device in self.idle.items():
            for d in np.argsort(per_device)[::-1][:2].tolist():
                if per_device[d] > 1e-9 * max(1.0, abs(self.seconds)):
                    where.append((per_device[d], f"device {d} {phase} ({per_device[d]:.4g} s less idle)"))
        where = [w for _, w in sorted(where, reverse=True)[:3]]
        text = f"{abs(self.seconds):.4g} s ({abs(self.fraction):.1%}) {verb} than {who}"
        if self.seconds > 0:
            return text + (": " + ", ".join(where) if where else "")
        hint = "" if self.placement_searched else \
            f"; {self.rival} places its stages otherwise than this search did (--placement any tries both)"
        return "none: " + text + hint


def gain(found: Synthesis, rival: Rival) -> Gain:
    """Our makespan against *rival*'s, and the idle time per device and phase that the difference comes from."""
    ours, theirs = _idle_by_phase(found.result), _idle_by_phase(rival.result)
    delta = {phase: [t - o for t, o in zip(theirs[phase], ours[phase])] for phase in ours}
    seconds = rival.makespan - found.makespan
    capped = any(c != float("inf") for c in found.problem.cap)
    same_placement = tuple(rival.result.schedule.placement) == tuple(found.result.schedule.placement)
    return Gain(rival.name, seconds, seconds / rival.makespan if rival.makespan else 0.0, delta, capped,
                same_placement or seconds >= 0)


def _idle_by_phase(result: Result) -> dict[str, list[float]]:
    """Per device, idle seconds within [0, makespan]: before its first B starts (warm-up), after its last F ends
    (cool-down), and between (steady)."""
    rows = result.rows
    comp = rows.computing
    device, op, start, end = rows.device[comp], rows.op[comp], rows.start[comp], rows.end[comp]
    makespan = result.metrics.makespan
    out = {"warm-up": [], "steady": [], "cool-down": []}
    for d in range(result.schedule.devices):
        mine = device == d
        s, e, o = start[mine], end[mine], op[mine]
        first_b = float(s[o == OP_B].min()) if (o == OP_B).any() else makespan
        last_f = float(e[o == OP_F].max()) if (o == OP_F).any() else 0.0
        bounds = {"warm-up": (0.0, first_b), "steady": (first_b, max(first_b, last_f)),
                  "cool-down": (max(first_b, last_f), makespan)}
        for phase, (lo, hi) in bounds.items():
            busy = float(np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None).sum())
            out[phase].append(max(0.0, (hi - lo) - busy))
    return out
