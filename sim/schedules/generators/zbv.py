"""ZB-V: zero-bubble schedule on a V-shaped placement, two chunks per device.

The model is cut into S = 2K stages. Device d holds stage d (chunk 0, on the way
down) and stage 2K-1-d (chunk 1, on the way back up), so the last stage sits on
device 0 next to the first, and a micro-batch's forward goes 0 -> K-1, turns on
device K-1 and comes back to device 0; its backward walks the V the other way
(Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, section 6 and figure 8).

Device d's order: 2(K-d)-1 chunk-0 forwards; d pairs (chunk-1 F, chunk-0 F); K-d
triples (chunk-1 F, B, W); then the steady state alternates the chunks with
F, B, W each; the cool-down runs the remaining B passes and fills the waits with
the deferred W passes. This is the paper's handcrafted schedule (PyTorch's
ScheduleZBVZeroBubble follows the same steps).

Costs: ``--forward/--backward/--weight`` are one device's share; each chunk costs
half. Memory: each device holds at most 2K chunk activations = K stages' worth,
1F1B's first-stage peak. With F = B = W a run idles (K-1)F/2 per device once,
however many iterations it has: the next iteration's warm-up fills the previous
one's cool-down (measured by the engine and asserted in tests/test_new_schedules.py
and tests/test_closed_forms.py; 1F1B idles 3(K-1)F per iteration); the steady
state repeats without bubbles.
Chunks: exactly 2 per device; pass ``--chunks 2`` (anything else is refused).
"""

from __future__ import annotations

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations

NAME = "zbv"
SUMMARY = "ZB-V: V-shaped placement (stage s on device s, and 2K-1-s), B/W split, near-zero bubble for F=B=W"
SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 6, figure 8"
BUBBLE = ("(K-1)F/2 once per run, not per iteration (the next iteration's warm-up fills the cool-down), for "
          "F = B = W and M >= 2K-1 (F: one device's forward share, a chunk costs half; 1F1B: 3(K-1)F per iteration); "
          "other ratios: simulate")
MEMORY = "at most 2K chunk activations per device = K stages' worth (1F1B's first-stage peak) on every device"
CHUNKS = 2


def v_placement(devices: int) -> list[int]:
    """Stage -> device for a V: stage s on device s for s < K, on device 2K-1-s otherwise."""
    return [s if s < devices else 2 * devices - 1 - s for s in range(2 * devices)]


def check_v_chunks(name: str, cfg: PipelineConfig) -> None:
    if cfg.chunks != 2:
        raise ConfigError(f"{name} is V-shaped with exactly two chunks per device; use --chunks 2 "
                          f"(got --chunks {cfg.chunks})")


def zbv_order(device: int, devices: int, mbs: range) -> list[Action]:
    """One iteration of device *device* (the paper's handcrafted ZB-V)."""
    K, M = devices, len(mbs)
    down, up = device, 2 * K - 1 - device  # chunk 0 and chunk 1 stages
    n = max(2 * K - 1, M)  # the steps assume enough micro-batches; extra ones are dropped below
    count = {(s, k): 0 for s in (down, up) for k in (ActionKind.F, ActionKind.B, ActionKind.W)}
    order: list[tuple[int, ActionKind, int]] = []

    def emit(stage: int, kind: ActionKind) -> None:
        order.append((stage, kind, count[stage, kind]))
        count[stage, kind] += 1

    for _ in range(2 * (K - device) - 1):  # warm-up: chunk-0 forwards
        emit(down, ActionKind.F)
    for _ in range(device):  # alternate the chunks' forwards
        emit(up, ActionKind.F)
        emit(down, ActionKind.F)
    for _ in range(K - device):  # the turn of the V: chunk 1 runs F, B, W
        emit(up, ActionKind.F)
        emit(up, ActionKind.B)
        emit(up, ActionKind.W)
    while count[up, ActionKind.F] < count[down, ActionKind.F] or count[down, ActionKind.F] < n:  # steady
        if count[down, ActionKind.F] < n:
            emit(down, ActionKind.F)
        emit(down, ActionKind.B)
        emit(down, ActionKind.W)
        emit(up, ActionKind.F)
        emit(up, ActionKind.B)
        emit(up, ActionKind.W)
    for _ in range(device):  # cool-down: input gradients first, weights later
        emit(down, ActionKind.B)
        emit(up, ActionKind.B)
    for _ in range(K - device):
        emit(down, ActionKind.B)
        emit(down, ActionKind.W)
    for stage in (up, down):  # the deferred weight gradients
        while count[stage, ActionKind.W] < count[stage, ActionKind.B]:
            emit(stage, ActionKind.W)
    return [Action(s, k, mbs[j]) for s, k, j in order if j < M]


def generate(cfg: PipelineConfig) -> Schedule:
    check_v_chunks(NAME, cfg)
    return flush_iterations(cfg, name=NAME, order=lambda d, mbs: zbv_order(d, cfg.devices, mbs),
                            placement=v_placement(cfg.devices))
