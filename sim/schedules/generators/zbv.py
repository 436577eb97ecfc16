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

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import NUM_KINDS, OP_B, OP_F, OP_W, Schedule
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


def zbv_keys(device: int, devices: int, M: int) -> np.ndarray:
    """One iteration of device *device* over micro-batches 0..M-1 as keys (:mod:`sim.core.keys`): the steps below,
    integers from the start (no Action per step: the planner generates hundreds of these)."""
    K = devices
    S = 2 * K
    down, up = device, 2 * K - 1 - device  # chunk 0 and chunk 1 stages
    n = max(2 * K - 1, M)  # the steps assume enough micro-batches; extra ones are dropped below
    count = [0] * (2 * S * NUM_KINDS)  # (stage, kind) -> how many emitted, at stage * NUM_KINDS + kind
    keys: list[int] = []

    def emit(stage: int, kind: int) -> None:
        slot = stage * NUM_KINDS + kind
        j = count[slot]
        count[slot] = j + 1
        if j < M:
            keys.append((j * S + stage) * NUM_KINDS + kind)  # encode_key(stage, kind, j, S)

    for _ in range(2 * (K - device) - 1):  # warm-up: chunk-0 forwards
        emit(down, OP_F)
    for _ in range(device):  # alternate the chunks' forwards
        emit(up, OP_F)
        emit(down, OP_F)
    for _ in range(K - device):  # the turn of the V: chunk 1 runs F, B, W
        emit(up, OP_F)
        emit(up, OP_B)
        emit(up, OP_W)
    f_down, f_up = down * NUM_KINDS + OP_F, up * NUM_KINDS + OP_F
    while count[f_up] < count[f_down] or count[f_down] < n:  # steady
        if count[f_down] < n:
            emit(down, OP_F)
        emit(down, OP_B)
        emit(down, OP_W)
        emit(up, OP_F)
        emit(up, OP_B)
        emit(up, OP_W)
    for _ in range(device):  # cool-down: input gradients first, weights later
        emit(down, OP_B)
        emit(up, OP_B)
    for _ in range(K - device):
        emit(down, OP_B)
        emit(down, OP_W)
    for stage in (up, down):  # the deferred weight gradients
        while count[stage * NUM_KINDS + OP_W] < count[stage * NUM_KINDS + OP_B]:
            emit(stage, OP_W)
    return np.asarray(keys, dtype=np.int64)


def generate(cfg: PipelineConfig) -> Schedule:
    check_v_chunks(NAME, cfg)
    return flush_iterations(cfg, name=NAME, order=lambda d, mbs: zbv_keys(d, cfg.devices, len(mbs)),
                            placement=v_placement(cfg.devices))
