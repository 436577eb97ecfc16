"""DualPipeV: DeepSeek's DualPipe folded onto a V-shaped placement (two chunks per device).

Placement as ZB-V: device d holds stage d (chunk 0) and stage 2K-1-d (chunk 1).
DualPipe's idea is to pair the forward of one micro-batch with the backward of
another on the same device and overlap them, so that one's communication hides
behind the other's computation (DeepSeek-V3 Technical Report, 2024, section
3.2.1 and figure 5; github.com/deepseek-ai/DualPipe, ``dualpipev.py``). Device d
runs eight phases: (1) 2(K-d-1) chunk-0 forwards; (2) d+1 pairs of chunk-0 and
chunk-1 forwards; (3) K-d-1 zero-bubble triples (chunk-1 B, a pending W,
chunk-1 F); (4) M-2K+d+1 main steps, each an overlapped (chunk-0 F, chunk-1 B)
pair and an overlapped (chunk-1 F, chunk-0 B) pair (the last device's first one
not overlapped); (5) K-d-1 steps of chunk-1 B then an overlapped (chunk-1 F,
chunk-0 B); (6) d+1 backward pairs, switching to split backwards halfway; (7)
K-d-1 steps of (pending W, chunk-0 B split); (8) the pending W passes.

Overlapped pairs are one unit in the IR (``Schedule.overlapped``; PyTorch's
``OVERLAP_F_B``): a pair starts when the inputs of both its forward and its
backward are there, lasts F + B by default (``simulate(..., overlap_fb=OverlapFB(...))``,
``--overlap-fb``: seconds per pair, or the share of F + B that overlapping saves, which
is DualPipe's point: one half's communication hides behind the other's computation),
and both results are ready when it ends. That is why DeepSeek's bubble has the
pair's F&B in it: with F = B = W the fused pairs give (PP/2-1)(F&B+B-3W) more idle
than the split model did. Backwards in the zero-bubble phases are split (B = input
gradient, W later); the others are full backwards.

Requirement: M >= 2K micro-batches (DualPipe's ``num_chunks >= num_ranks * 2``).
Chunks: exactly 2 per device; pass ``--chunks 2`` (anything else is refused).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import NUM_KINDS, OP_B, OP_F, OP_W, Schedule
from sim.schedules.common import flush_iterations
from sim.schedules.generators.zbv import check_v_chunks, v_placement

NAME = "dualpipev"
SUMMARY = ("DualPipeV: V-shaped placement, overlapped forward/backward pairs of different micro-batches "
           "(each one unit, --overlap-fb sets its time), zero-bubble split backwards at the ends")
SOURCE = "DeepSeek-AI, DeepSeek-V3 Technical Report (2024), section 3.2.1; github.com/deepseek-ai/DualPipe (dualpipev.py)"
BUBBLE = ("(K-1)F idle per device per iteration for F = B = W with each overlapped pair one unit of F+B "
          "(F: one device's forward share, a chunk costs half; e.g. F=B=W=2, K=4, M=8: makespan 54); DeepSeek's "
          "(PP/2-1)(F&B+B-3W) shrinks as overlapping makes a pair F&B < F+B (--overlap-fb); needs M >= 2K")
MEMORY = "at most 2K+1 chunk activations (K+1/2 stages' worth) on every device; one weight version per chunk"
CHUNKS = 2


def dualpipev_order(device: int, devices: int, mbs: range) -> tuple[np.ndarray, np.ndarray]:
    """One iteration of device *device* over the micro-batches *mbs* (the eight phases above): its keys
    (:mod:`sim.core.keys`, S = 2K stages), and where each overlapped (F, B) pair starts among them."""
    K, M = devices, len(mbs)
    S = 2 * K
    down, up = device, 2 * K - 1 - device  # chunk 0, chunk 1
    forwards = {down: 0, up: 0}
    backwards = {down: 0, up: 0}
    pending_w: deque[tuple[int, int]] = deque()  # (stage, j): split backwards awaiting their W
    order: list[int] = []  # keys: encode_key(stage, kind, mb, S)
    pairs: list[int] = []  # positions in *order* where an overlapped pair's forward stands (its B follows)

    def f(stage: int) -> None:
        order.append((mbs[forwards[stage]] * S + stage) * NUM_KINDS + OP_F)
        forwards[stage] += 1

    def b(stage: int, split: bool = False) -> None:
        j = backwards[stage]
        order.append((mbs[j] * S + stage) * NUM_KINDS + OP_B)
        backwards[stage] += 1
        if split:
            pending_w.append((stage, j))

    def w() -> None:
        if pending_w:  # nothing pending: the step has no weight pass to run
            stage, j = pending_w.popleft()
            order.append((mbs[j] * S + stage) * NUM_KINDS + OP_W)

    def overlapped(forward_stage: int, backward_stage: int) -> None:
        pairs.append(len(order))
        f(forward_stage)  # the pair's forward and its full backward, run as one unit
        b(backward_stage)

    for _ in range(2 * (K - device - 1)):  # 1: chunk-0 forwards
        f(down)
    for _ in range(device + 1):  # 2: both chunks' forwards
        f(down)
        f(up)
    for _ in range(K - device - 1):  # 3: zero-bubble triples on chunk 1
        b(up, split=True)
        w()
        f(up)
    for i in range(M - 2 * K + device + 1):  # 4: main steps
        if i == 0 and device == K - 1:
            f(down)  # the turn of the V: not overlapped
            b(up)
        else:
            overlapped(down, up)
        overlapped(up, down)
    for _ in range(K - device - 1):  # 5
        b(up)
        overlapped(up, down)
    split = False
    for i in range(device + 1):  # 6: backward pairs, split from halfway on
        if i == (device + 1) // 2 and device % 2 == 1:
            split = True
        b(up, split)
        if i == (device + 1) // 2 and device % 2 == 0:
            split = True
        b(down, split)
    for _ in range(K - device - 1):  # 7
        w()
        b(down, split=True)
    while pending_w:  # 8
        w()
    assert forwards == backwards == {down: M, up: M}, "dualpipev phases do not cover every micro-batch"
    return np.asarray(order, dtype=np.int64), np.asarray(pairs, dtype=np.int64)


def generate(cfg: PipelineConfig) -> Schedule:
    check_v_chunks(NAME, cfg)
    K, M = cfg.devices, cfg.microbatches
    if M < 2 * K:
        raise ConfigError(f"{NAME} needs at least 2K micro-batches (DualPipe's num_chunks >= 2 * num_ranks), "
                          f"got M={M} for K={K}; use M >= {2 * K}")
    return flush_iterations(cfg, name=NAME, order=lambda d, mbs: dualpipev_order(d, K, mbs), placement=v_placement(K))
