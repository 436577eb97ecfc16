"""What a schedule synthesis is asked: shape, costs, links and a memory cap per device, and its lower bound.

A :class:`Problem` is everything the searches (:mod:`sim.search.synthesis_greedy`,
:mod:`sim.search.synthesis_local`, :mod:`sim.search.synthesis_ilp`) read, as plain per-stage tuples:

- durations of F, B, W, R per stage (seconds). Without the B/W split, B is the full backward
  (``backward + weight``, as the engine runs a B that has no W);
- the time a stage boundary's transfer takes (``Hardware.transfer_time``: latency + bytes / bandwidth;
  0 between stages on one device). Link contention is left to the exact engine, which evaluates every
  order the searches produce;
- memory, in bytes, as :mod:`sim.results.memory` counts it: static bytes (weights, gradients, optimizer
  state) from the start, ``activation_bytes`` from the start of F(s,m) (``checkpoint_bytes`` when the
  micro-batch is recomputed, plus ``activation_bytes`` from the start of R(s,m)) until the end of W(s,m)
  (the end of B(s,m) without the split); with the split, the end of B(s,m) frees what W does not need and W
  the rest (``weight_activation_bytes``, the zero-bubble paper's M_W: Qi et al., ICLR 2024, section 2.1; its
  runtime counts F +M_B, B -(M_B - M_W), W -M_W, sail-sg/zero-bubble-pipeline-parallelism
  ``megatron/core/pipeline_parallel/zerobubble/runtime.py``, ``f_mem_approx`` / ``w_mem_approx``).
  ``weight_memory`` gives M_W / M_B as one fraction instead (also where activations are counted in units).

The cap is per device, in bytes. ``--memory-limit N`` counts micro-batches of activations as the zero-bubble
paper does (Qi et al., ICLR 2024, section 3.1: M_limit in units of M_B, one micro-batch's activations of one
pipeline stage): device d may hold its static bytes plus N times the activations of one micro-batch over all
of its stages. Where the costs give no activation bytes, the synthesis counts one unit per micro-batch and
stage (split evenly over a device's chunks), so the limit still means N micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.errors import PipesimError
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware

__all__ = ["SynthesisError", "Problem", "make_problem", "v_placement", "lower_bound", "PLACEMENTS",
           "device_costs_to_stages"]

PLACEMENTS = ("linear", "v")
"""linear: stage s on device s (K stages); v: the V shape, stage s and 2K-1-s on device s (2K stages)."""


class SynthesisError(PipesimError):
    """A synthesis that cannot be asked or cannot be met: bad shape, a cap below one micro-batch, no solver."""


def v_placement(devices: int) -> tuple[int, ...]:
    """Stage s on device s for s < K, stage 2K-1-s back on device s (the V of ZB-V, Qi et al. 2024, section 6)."""
    return tuple(range(devices)) + tuple(reversed(range(devices)))


def device_costs_to_stages(costs: StageCosts, placement: Sequence[int]) -> StageCosts:
    """Costs of one row per device -> one row per stage of *placement*: each device's work cut evenly over the
    stages placed on it, so every device does the same work whatever the placement (a fair comparison of a V or
    an interleaving with a line). Bytes sent and checkpointed per micro-batch are the device row's, as
    :meth:`StageCosts.split_into_chunks` keeps them."""
    devices = costs.stages
    if max(placement, default=-1) >= devices:
        raise SynthesisError(f"placement names device {max(placement)} but the costs have {devices} device rows")
    per_device = [sum(1 for d in placement if d == device) for device in range(devices)]
    columns = {}
    for name in ("forward", "backward", "weight", "recompute", "update", "send_bytes", "activation_bytes",
                 "checkpoint_bytes", "weight_bytes", "grad_bytes", "optimizer_bytes"):
        values = getattr(costs, name)  # (weight_activation_bytes below: it must follow activation_bytes)
        keep = name in ("send_bytes", "checkpoint_bytes")
        columns[name] = tuple(values[d] if keep else values[d] / per_device[d] for d in placement)
    columns["weight_activation_bytes"] = tuple(costs.weight_activation_bytes[d] / per_device[d] for d in placement)
    return StageCosts(**columns)


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """A synthesis problem; every field a plain number or tuple (picklable, hashable)."""

    devices: int
    """K."""
    microbatches: int
    """M, one iteration."""
    placement: tuple[int, ...]
    """stage -> device."""
    split: bool
    """True: the backward runs as B (input gradient) then W (weight gradient), each its own action."""
    recompute: bool
    """True: the search may recompute a micro-batch's forward (R before B) to keep only its checkpoint."""
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    """B per stage: the input-gradient part with the split, the full backward without it."""
    weight: tuple[float, ...]
    """W per stage (0 without the split)."""
    recompute_time: tuple[float, ...]
    comm_down: tuple[float, ...]
    """comm_down[s]: seconds from the end of F(s,m) until F(s+1,m) may start (s < S-1); 0 on one device."""
    comm_up: tuple[float, ...]
    """comm_up[s]: seconds from the end of B(s,m) until B(s-1,m) may start (s > 0); 0 on one device."""
    activation: tuple[float, ...]
    """Bytes held per in-flight micro-batch and stage (or units, see the module docstring)."""
    checkpoint: tuple[float, ...]
    """Bytes held per recomputed micro-batch and stage from F to R."""
    kept: tuple[float, ...]
    """Of :attr:`activation`, what a micro-batch still holds from the end of its B until the end of its W (all of it
    without the split)."""
    weight_memory: float | None
    """M_W / M_B as one fraction where the caller gave it (None: the costs' ``weight_activation_bytes``)."""
    static: tuple[float, ...]
    """Bytes per device held from the start (weights, gradients, optimizer state)."""
    cap: tuple[float, ...]
    """Bytes per device that may never be exceeded (math.inf: no cap)."""
    units: bool
    """True: ``activation`` counts micro-batch units because the costs give no activation bytes."""

    @property
    def stages(self) -> int:
        return len(self.placement)

    def stages_on(self, device: int) -> list[int]:
        return [s for s, d in enumerate(self.placement) if d == device]

    def device_work(self, device: int) -> float:
        """Seconds of computation device *device* must do (no recompute)."""
        M = self.microbatches
        return sum(M * (self.forward[s] + self.backward[s] + self.weight[s]) for s in self.stages_on(device))

    def memory_costs(self, costs: StageCosts) -> StageCosts:
        """*costs* with the activation bytes this problem counts (units where the costs had none)."""
        if not self.units and self.kept == costs.weight_activation_bytes:
            return costs
        return dataclasses.replace(costs, activation_bytes=self.activation, checkpoint_bytes=self.checkpoint,
                                   weight_activation_bytes=self.kept)


def make_problem(costs: StageCosts, hardware: Hardware, *, microbatches: int, placement: str = "linear",
                 split: bool = True, recompute: bool = False, memory_bytes: float | Sequence[float] | None = None,
                 memory_limit: float | None = None, weight_memory: float | None = None) -> Problem:
    """The problem for *costs* (one row per stage of the placement) on *hardware*.

    *memory_bytes*: the cap in bytes (one number for every device, or one per device); *memory_limit*: the cap
    in micro-batches of activations (see the module docstring). At most one of them; neither: no cap.
    *weight_memory*: the share of a micro-batch's activations its W still needs after B (M_W / M_B, 0..1; default:
    the costs' ``weight_activation_bytes``, all of them where the costs give no bytes).
    """
    K = hardware.devices
    if placement not in PLACEMENTS:
        raise SynthesisError(f"unknown placement {placement!r}; choose one of: {', '.join(PLACEMENTS)}")
    stage_device = tuple(range(K)) if placement == "linear" else v_placement(K)
    S = len(stage_device)
    if costs.stages != S:
        raise SynthesisError(f"the costs have {costs.stages} stages but placement {placement!r} on {K} devices has "
                             f"{S}; give one row per stage")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise SynthesisError(f"microbatches must be a positive integer, got {microbatches!r}")
    if memory_bytes is not None and memory_limit is not None:
        raise SynthesisError("give the memory cap either in bytes or in micro-batches (--memory-limit), not both")
    chunks = S // K
    units = not any(costs.activation_bytes) and memory_limit is not None
    activation = tuple(1.0 / chunks for _ in range(S)) if units else tuple(costs.activation_bytes)
    checkpoint = tuple(0.0 for _ in range(S)) if units else tuple(costs.checkpoint_bytes)
    if weight_memory is not None and not (isinstance(weight_memory, (int, float)) and 0 <= weight_memory <= 1):
        raise SynthesisError(f"weight_memory (M_W / M_B) must be a fraction between 0 and 1, got {weight_memory!r}")
    if weight_memory is not None:
        kept = tuple(a * weight_memory for a in activation)
    else:
        kept = activation if units else tuple(costs.weight_activation_bytes)
    held = [costs.weight_bytes[s] + costs.grad_bytes[s] + costs.optimizer_bytes[s] for s in range(S)]
    static = [0.0] * K
    for s, d in enumerate(stage_device):
        static[d] += held[s]
    if memory_limit is not None:
        if not (isinstance(memory_limit, (int, float)) and memory_limit > 0 and math.isfinite(memory_limit)):
            raise SynthesisError(f"--memory-limit must be a finite number of micro-batches > 0, got {memory_limit!r}")
        per_mb = [sum(activation[s] for s in range(S) if stage_device[s] == d) for d in range(K)]
        cap = tuple(static[d] + memory_limit * per_mb[d] for d in range(K))
    elif memory_bytes is not None:
        values = [memory_bytes] * K if isinstance(memory_bytes, (int, float)) else list(memory_bytes)
        if len(values) != K or not all(isinstance(v, (int, float)) and v > 0 for v in values):
            raise SynthesisError(f"the memory cap must be a number of bytes > 0 (or one per device), got "
                                 f"{memory_bytes!r}")
        cap = tuple(float(v) for v in values)
    else:
        cap = (math.inf,) * K
    comm_down = [0.0] * S
    comm_up = [0.0] * S
    for s in range(S - 1):  # F(s) sends s's activation to s+1; B(s+1) sends the gradient back (same bytes)
        a, b = stage_device[s], stage_device[s + 1]
        if a != b:
            comm_down[s] = hardware.transfer_time(a, b, costs.send_bytes[s])
            comm_up[s + 1] = hardware.transfer_time(b, a, costs.send_bytes[s])
    backward = costs.backward if split else tuple(b + w for b, w in zip(costs.backward, costs.weight))
    problem = Problem(devices=K, microbatches=microbatches, placement=stage_device, split=split, recompute=recompute,
                      forward=tuple(costs.forward), backward=tuple(backward),
                      weight=tuple(costs.weight) if split else (0.0,) * S, recompute_time=tuple(costs.recompute),
                      comm_down=tuple(comm_down), comm_up=tuple(comm_up), activation=activation,
                      checkpoint=checkpoint, kept=kept, weight_memory=weight_memory, static=tuple(static), cap=cap,
                      units=units)
    _check_cap(problem)
    return problem


def _check_cap(p: Problem) -> None:
    """Refuse a cap below what one micro-batch needs: every stage of a device holds its activations at once
    between the first forward and the last backward of a micro-batch on a V (on a line, one stage each)."""
    for d in range(p.devices):
        own = p.stages_on(d)
        need_full = p.static[d] + sum(p.activation[s] for s in own)
        need_ckpt = p.static[d] + max((p.activation[s] for s in own), default=0.0) + sum(
            p.checkpoint[s] for s in own)  # recompute: the checkpoints plus one stage re-materialized at a time
        need = min(need_full, need_ckpt) if p.recompute else need_full
        if p.static[d] > p.cap[d] * (1 + 1e-12):
            raise SynthesisError(f"device {d} holds {p.static[d]:.6g} bytes of weights, gradients and optimizer "
                                 f"state before any activation, over its cap of {p.cap[d]:.6g}; raise the cap")
        if need > p.cap[d] * (1 + 1e-12):
            raise SynthesisError(f"device {d} cannot run even one micro-batch under its cap: it needs {need:.6g} "
                                 f"bytes (static {p.static[d]:.6g} + activations), the cap is {p.cap[d]:.6g}; "
                                 f"raise the cap" + ("" if p.recompute else " or allow recompute"))


def lower_bound(p: Problem) -> float:
    """A makespan no schedule of *p* can beat (seconds), links without contention.

    Per device d: its work (every F, B, W of its stages, M each) cannot start before its first forward can
    (head: the forwards and transfers of micro-batch 0 on the stages before its first stage), and after its
    last backward B(s,m) the input gradient still travels down to stage 0 (tail: the B's and transfers of
    stages s-1 .. 0); W work left on d after that B can hide the tail, so with the split the tail counts only
    past the device's W work. The bound is the largest of these and of one micro-batch's critical path
    (F through every stage, B back, and the W of stage 0). The zero-bubble paper's bubble accounting
    (section 3.1: each stage's idle before its first F and after its last work) reads the same way.
    """
    S = p.stages
    head = [0.0] * S  # earliest start of F(s, 0)
    for s in range(1, S):
        head[s] = head[s - 1] + p.forward[s - 1] + p.comm_down[s - 1]
    chain = [0.0] * S  # after the end of B(s,m): the B's of stages s-1 .. 0 and their transfers
    for s in range(1, S):
        chain[s] = chain[s - 1] + p.comm_up[s] + p.backward[s - 1]
    best = head[S - 1] + p.forward[S - 1] + p.backward[S - 1] + chain[S - 1] + p.weight[0]
    for d in range(p.devices):
        own = p.stages_on(d)
        start = min(head[s] for s in own)
        w_work = p.microbatches * sum(p.weight[s] for s in own)
        # the device's last B is of one of its stages; the cheapest tail is that of its lowest stage
        tail = max(0.0, min(chain[s] for s in own) - w_work)
        best = max(best, start + p.device_work(d) + tail)
    return best
