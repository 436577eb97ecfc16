"""Published training runs the compute model is checked against (``benchmarks/bench_fidelity.py``).

Each :class:`PublishedRun` is one row of a paper's table with the configuration the paper states, and the
figure it reports. Nothing here is fitted: the estimate of a row uses the GPU preset and the model's shape.

- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21,
  arXiv 2104.04473), Table 1: GPT models of 1.7B-1T parameters on up to 3072 A100s (Selene), vocabulary
  51,200, sequence 2048, mixed precision, activation recomputation; the figure is the achieved teraFLOP/s per
  GPU, counted with the paper's equation (3) (:func:`paper_flops`: it counts the recomputed forward).
- Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B" (arXiv 2201.11990), section
  2.4: 105 layers, hidden 20480, 128 heads, 8-way tensor and 35-way pipeline parallelism, global batch 1920 on
  280 / 350 / 420 DGX A100 nodes: 60.1 / 50.2 / 44.4 s per iteration (126 / 121 / 113 teraFLOP/s per GPU).

What the tables leave out is set the same way for every row (no per-row choice): micro-batch size 1, the
1F1B schedule (PipeDream-Flush, Narayanan et al. section 2.2.1), full recomputation of every block, no sequence
parallelism and no distributed optimizer (both later than these runs), the unfused attention of 2021 (no
FlashAttention), and the data-parallel gradient all-reduce after the pipeline drains (not overlapped).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.models import ModelSpec

__all__ = ["PublishedRun", "NARAYANAN_2021_TABLE1", "MT_NLG_530B", "PUBLISHED_RUNS", "gpt_model", "paper_flops"]

SEQ_LEN = 2048
VOCAB = 51200


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published configuration and what it achieved."""

    source: str
    label: str
    layers: int
    hidden: int
    heads: int
    tensor: int
    pipeline: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float | None = None
    """Achieved teraFLOP/s per GPU as the paper counts it (equation (3) FLOPs over the iteration time)."""
    iteration_time: float | None = None
    """Seconds per iteration, where the paper gives it."""

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline)


def gpt_model(run: PublishedRun) -> ModelSpec:
    """The GPT of *run*: FFN 4h, GELU, tied embeddings, dropout, 16-bit (the papers' setting)."""
    return ModelSpec(name=run.label, layers=run.layers, hidden=run.hidden, heads=run.heads, vocab=VOCAB,
                     seq_len=SEQ_LEN, tied_embeddings=True, gated_mlp=False, dropout=True)


def paper_flops(run: PublishedRun) -> float:
    """FLOPs of one iteration as Narayanan et al. count them (section 5.1, equation (3), with recomputation):
    96 B s l h^2 (1 + s / (6 h) + V / (16 l h))."""
    B, s, l, h, V = run.global_batch, SEQ_LEN, run.layers, run.hidden, VOCAB
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


_N = "Narayanan et al. 2021, Table 1"
NARAYANAN_2021_TABLE1 = tuple(
    PublishedRun(source=_N, label=label, heads=a, hidden=h, layers=l, tensor=t, pipeline=p, gpus=n, global_batch=B,
                 tflops_per_gpu=tf)
    for label, a, h, l, t, p, n, B, tf in (
        ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
        ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
        ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
        ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
        ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
        ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
        ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
        ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
        ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
        ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
    ))

_S = "Smith et al. 2022 (MT-NLG), section 2.4"
MT_NLG_530B = tuple(
    PublishedRun(source=_S, label=f"MT-NLG 530B, {n} GPUs", layers=105, hidden=20480, heads=128, tensor=8,
                 pipeline=35, gpus=n, global_batch=1920, iteration_time=it)
    for n, it in ((2240, 60.1), (2800, 50.2), (3360, 44.4)))

PUBLISHED_RUNS = NARAYANAN_2021_TABLE1 + MT_NLG_530B
