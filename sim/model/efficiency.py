"""A size-aware compute model: how long one transformer block's F, B and W take on one device.

One constant fraction of peak (``--mfu``) cannot follow real runs: a matrix multiply of a
small model uses a GPU worse than one of a large model (the tiles of the last wave leave
SMs idle, thin matrices are limited by memory, element-wise kernels cost the same bytes
whatever the FLOPs). This module times each kernel of a block separately (units: seconds,
FLOPs, bytes) with one set of per-device parameters (:class:`sim.model.gpus.GpuSpec`:
``sm_count``, ``hbm_bandwidth``, ``gemm_efficiency``, ``gemm_tile``, ``kernel_launch``):

- **GEMMs** (Williams, Waterman and Patterson, "Roofline", CACM 2009): ``max(compute,
  memory) + launch``. Compute is ``2 m n k / (peak x gemm_efficiency x quantisation)``, where
  the output is cut into ``tile_m x tile_n`` tiles that run ``sm_count`` at a time (waves):
  quantisation = useful tile area / (waves x SMs x tile area), NVIDIA, "Matrix
  Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/performance/
  dl-performance-matrix-multiplication), sections "Tile quantization" and "Wave
  quantization". Memory is reading both inputs and writing the output once, in 2-byte
  elements, at ``hbm_bandwidth``. ``gemm_efficiency`` is the best fraction of peak cuBLAS
  reaches on large shapes in public benchmarks (the per-preset docstrings cite them).
- **Attention core**: unfused (Megatron-LM 2021: Q K^T and the weighted sum over V as batched
  GEMMs of b a/t matrices s x s x d_head, and a softmax that reads and writes the s x s score
  matrix, with its dropout mask and output: 7 bytes per score forward, twice that backward,
  Korthikanti et al. 2022, section 4.1's per-element accounting), or FlashAttention (Dao et
  al. 2022: the same FLOPs, no score traffic; its backward recomputes the scores, 2.5 x the
  forward's FLOPs, Dao 2023 "FlashAttention-2", section 3.2).
- **Element-wise kernels** (layer norms, dropout + residual adds, bias + GeLU/SwiGLU): memory
  bound; the bytes each reads and writes per token are listed in :func:`elementwise_bytes`, twice
  as many in the backward. With sequence parallelism the ones on h-sized tensors split t ways
  (Korthikanti et al. 2022, section 4.2.2).

The estimate (:func:`sim.model.estimate.estimate`) adds tensor-parallel communication to these
times as before; ``--mfu`` still overrides the whole model with one constant fraction of peak.
The fidelity of this model against published runs is printed by ``benchmarks/bench_fidelity.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KernelTimes", "gemm_time", "block_kernel_times", "attention_kernel_times", "output_kernel_times",
           "elementwise_bytes", "has_kernel_model", "optimizer_step_time"]

_BYTES = 2  # 16-bit operands and outputs (bf16/fp16), the precision of every preset's peak


@dataclass(frozen=True, slots=True)
class KernelTimes:
    """Seconds of one block's (or the output layer's) passes on one tensor-parallel rank, communication excluded."""

    forward: float
    backward: float
    """Input gradient: data-gradient GEMMs, attention backward, element-wise backward."""
    weight: float
    """Weight gradient GEMMs."""


def has_kernel_model(gpu) -> bool:
    """True when *gpu* describes its kernels (SMs, memory bandwidth, GEMM efficiency): the model applies."""
    return gpu.sm_count > 0 and gpu.hbm_bandwidth > 0 and gpu.gemm_efficiency > 0


def gemm_time(gpu, m: int, n: int, k: int, *, batch: int = 1) -> float:
    """Seconds of *batch* independent (m x k) @ (k x n) multiplies on *gpu* (module docstring)."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    tile_m, tile_n = gpu.gemm_tile
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch
    waves = math.ceil(tiles / gpu.sm_count)
    quantisation = (m * n * batch) / (waves * gpu.sm_count * tile_m * tile_n)
    compute = 2.0 * m * n * k * batch / (gpu.peak_flops * gpu.gemm_efficiency * quantisation)
    memory = _BYTES * (m * k + k * n + m * n) * batch / gpu.hbm_bandwidth
    return max(compute, memory) + gpu.kernel_launch


def elementwise_bytes(model, b: int, tensor: int, sequence_parallel: bool) -> float:
    """Bytes the memory-bound kernels of one block's forward read and write, one tensor-parallel rank.

    Per token, in 2-byte elements (h the width, f the MLP width, t the tensor degree; the h-sized ones
    split t ways only with sequence parallelism): two layer norms read and write h each (4 h); two
    dropout + residual adds read two h inputs and write one output and a 1-byte mask (2 x 3.5 h); the
    MLP activation reads and writes f/t (GeLU) or reads 2 f/t and writes f/t (SwiGLU's gate x up).
    """
    s, h, f, t = model.seq_len, model.hidden, model.ffn, tensor
    tokens = s * b
    h_part = h / t if sequence_parallel else h
    per_token_h = (4 + 7) * h_part if model.dropout else (4 + 6) * h_part
    per_token_f = (3 if model.gated_mlp else 2) * f / t
    return tokens * (per_token_h + per_token_f) * _BYTES


def block_kernel_times(model, gpu, *, b: int, tensor: int, sequence_parallel: bool,
                       flash_attention: bool) -> KernelTimes:
    """F, B, W seconds of one transformer block on one tensor-parallel rank, kernel by kernel.

    GEMMs of a block with T = s b tokens (Shoeybi et al. 2019, section 3: Q, K, V and the MLP's first
    matrices split by columns, the output projection and the MLP's last matrix by rows):
    QKV (T x (h + 2 h_kv)/t x h), projection (T x h x h/t), MLP up (T x f/t x h, twice for SwiGLU)
    and down (T x h x f/t). B multiplies the output gradient by each weight (the data gradient, the
    transposed shapes); W multiplies it by each input (k = T).
    """
    s, h, f, t = model.seq_len, model.hidden, model.ffn, tensor
    T = s * b
    qkv = (h + 2 * model.kv_hidden) // t
    ups = 2 if model.gated_mlp else 1
    shapes = [(T, qkv, h), (T, h, h // t)] + [(T, f // t, h)] * ups + [(T, h, f // t)]
    forward = sum(gemm_time(gpu, m, n, k) for m, n, k in shapes)
    data_grad = sum(gemm_time(gpu, m, k, n) for m, n, k in shapes)  # dY (T x n) @ W^T (n x k)
    weight_grad = sum(gemm_time(gpu, k, n, m) for m, n, k in shapes)  # X^T (k x T) @ dY (T x n)

    core = attention_kernel_times(model, gpu, b=b, tensor=t, flash_attention=flash_attention)
    ew = elementwise_bytes(model, b, t, sequence_parallel) / gpu.hbm_bandwidth + 5 * gpu.kernel_launch
    return KernelTimes(forward=forward + core.forward + ew, backward=data_grad + core.backward + 2 * ew,
                       weight=weight_grad)


def attention_kernel_times(model, gpu, *, b: int, tensor: int, flash_attention: bool) -> KernelTimes:
    """The attention core (scores, softmax, weighted sum) of one block on one tensor-parallel rank: b a/t heads
    of (s x d_head) @ (d_head x s) and (s x s) @ (s x d_head), plus the score traffic when unfused (module
    docstring). Key/value heads shared by several query heads (grouped-query attention) do not change it."""
    s, t = model.seq_len, tensor
    heads = b * max(model.heads // t, 1)
    d = model.head_dim
    core = gemm_time(gpu, s, s, d, batch=heads) + gemm_time(gpu, s, d, s, batch=heads)  # Q K^T, then P V
    if flash_attention:
        return KernelTimes(forward=core, backward=2.5 * core, weight=0.0)
    scores = heads * s * s * (7 if model.dropout else 4) / gpu.hbm_bandwidth
    return KernelTimes(forward=core + scores, backward=2 * core + 2 * scores, weight=0.0)


def output_kernel_times(model, gpu, *, b: int, tensor: int) -> KernelTimes:
    """The output layer (logits T x V/t x h) and its fp32 softmax cross-entropy on one tensor-parallel rank."""
    if not model.vocab:
        return KernelTimes(0.0, 0.0, 0.0)
    T, h, V = model.seq_len * b, model.hidden, model.vocab // tensor
    loss = T * V * 4 * 3 / gpu.hbm_bandwidth  # fp32 logits read, exponentiated, reduced (Megatron's fused CE)
    return KernelTimes(forward=gemm_time(gpu, T, V, h) + loss, backward=gemm_time(gpu, T, h, V) + loss,
                       weight=gemm_time(gpu, h, V, T))


def optimizer_step_time(gpu, parameters: float) -> float:
    """Seconds of a mixed-precision Adam step over *parameters* on one device: memory bound, it reads the fp32
    master weights, momentum, variance and the gradient and writes the first three and the 16-bit weights,
    4 x 3 + 2 + 4 x 3 + 2 = 28 bytes per parameter (ZeRO, section 3.1's 16 bytes of state, read and written)."""
    return 28.0 * parameters / gpu.hbm_bandwidth if has_kernel_model(gpu) else 0.0
