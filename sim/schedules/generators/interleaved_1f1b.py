"""Interleaved 1F1B (Megatron-LM's virtual pipeline): v model chunks per device, round-robin placement.

The model is cut into S = K*v stages; stage s lives on device s % K, so device d
holds chunks d, d+K, d+2K, ... Each device walks a list of "virtual micro-batches":
micro-batches go through its chunks in groups of K, chunk by chunk (forward: chunk
0 first; backward: the last chunk first), with a warm-up of (K-d-1)*2 + (v-1)*K
forwards, a steady one-forward-one-backward phase and a cool-down of backwards
(Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM, SC'21, section 2.2.2 and figure 4; the order follows Megatron's
``forward_backward_pipelining_with_interleaving``).

Requirement (as in Megatron): M must be a multiple of K when v > 1. With v = 1 the
schedule is plain 1F1B. Costs: ``--forward/--backward`` stay one device's share of
the model; each chunk costs 1/v of it, so the bubble shrinks by v:
(K-1)(F+B)/v with uniform stages and free links (paper, equation in section 2.2.2).
With a small link latency L the first micro-batch's forward crosses the Kv-1
stage boundaries down and its backward the same ones up: +2(Kv-1)L.
"""

from __future__ import annotations

import numpy as np

from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import OP_B, OP_F, Action, ActionKind, Schedule
from sim.schedules.common import flush_iterations, interleave, one_f_one_b_positions, stage_keys
from sim.schedules.generators.one_f_one_b import one_f_one_b_grid

NAME = "interleaved-1f1b"
SUMMARY = "interleaved 1F1B (Megatron virtual pipeline): v chunks per device, stage s on device s % K"
SOURCE = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM "
          "(SC 2021), section 2.2.2")
BUBBLE = "(K-1)(F+B)/v idle per device per iteration (F, B: one device's share), fraction (K-1)/(v*M+K-1)"
MEMORY = ("device 0 holds (K-1)*2+(v-1)*K+1 chunk activations = K(1+(K-1)/(K*v)) stages' worth "
          "(1F1B: K); needs M % K == 0")
CHUNKS = 0
"""Any number of chunks (0: not fixed); ``--chunks v``."""
DEFAULT_CHUNKS = 2
"""Without ``--chunks``: two chunks per device (one chunk would be plain 1F1B)."""


def _virtual_order(device: int, devices: int, chunks: int, mbs: range) -> list[Action]:
    """Megatron's order for one device over the micro-batches *mbs* (one iteration)."""
    K, v, M = devices, chunks, len(mbs)
    total = M * v  # virtual micro-batches on this device

    def action(k: int, kind: ActionKind) -> Action:
        group, within = divmod(k, K * v)  # k-th virtual micro-batch: group of K*v, chunk-major inside
        chunk = within // K
        if kind is ActionKind.B:
            chunk = v - 1 - chunk  # backwards walk the chunks last to first
        return Action(chunk * K + device, kind, mbs[group * K + within % K])

    warmup = min((K - device - 1) * 2 + (v - 1) * K, total)
    order = [action(k, ActionKind.F) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action(warmup + k, ActionKind.F), action(k, ActionKind.B)]
    order += [action(k, ActionKind.B) for k in range(total - warmup, total)]
    return order


def generate(cfg: PipelineConfig) -> Schedule:
    K, M, v = cfg.devices, cfg.microbatches, cfg.chunks
    if v > 1 and M % K:
        raise ConfigError(f"interleaved-1f1b needs the micro-batches M to be a multiple of the devices K "
                          f"(Megatron's requirement), got M={M}, K={K}; use "
                          + (f"M={K * (M // K)} or " if M > K else "")  # below K the nearest multiple is K itself
                          + f"M={K * (M // K + 1)}, or --chunks 1")
    if v == 1:
        return flush_iterations(cfg, name=NAME, grid=lambda M: one_f_one_b_grid(K, M))
    return flush_iterations(cfg, name=NAME, grid=lambda M: interleaved_grid(K, v, M),
                            placement=[s % K for s in range(K * v)])


def interleaved_grid(K: int, v: int, M: int) -> np.ndarray:
    """Every device's order as keys (K x 2Mv), the same as :func:`_virtual_order` for each device.

    Virtual micro-batch k of device d: group, within = divmod(k, K*v); chunk = within // K (backwards: v-1-chunk);
    stage = chunk*K + d; micro-batch = group*K + within % K. Its forwards and backwards stand where 1F1B's would
    with warm-up min(2(K-d-1) + (v-1)K, Mv) (:func:`sim.schedules.common.one_f_one_b_positions`).
    """
    total = M * v
    d = np.arange(K)[:, None]
    group, within = np.divmod(np.arange(total)[None, :], K * v)
    chunk = within // K
    mb = group * K + within % K
    S = K * v
    f_keys = stage_keys(chunk * K + d, OP_F, mb, S)
    b_keys = stage_keys((v - 1 - chunk) * K + d, OP_B, mb, S)
    warmup = np.minimum((K - np.arange(K) - 1) * 2 + (v - 1) * K, total)
    f_at, b_at = one_f_one_b_positions(warmup, total)
    return interleave(f_keys, b_keys, f_at, b_at)
