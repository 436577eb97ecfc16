"""Published training runs the compute model is checked against (``benchmarks/bench_fidelity.py``).

Each :class:`PublishedRun` is one row of a paper's table with the configuration its authors ran, and the figure
it reports; each :class:`Framework` is the software that ran it, with every parameter taken from a public source
(cited beside it). Nothing here is fitted and no row has a constant of its own.

- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21,
  arXiv 2104.04473), Table 1: GPT models of 1.7B-1T parameters on up to 3072 A100s (Selene), vocabulary 51,200,
  sequence 2048, fp16, activation recomputation; the figure is the achieved teraFLOP/s per GPU, counted with the
  paper's equation (3) (:func:`paper_flops`: it counts the recomputed forward). The table gives t, p, the GPUs
  and the global batch; the micro-batch size, the interleaving and the data-parallel implementation of each
  row are in the paper's own launch script, Megatron-LM ``examples/sc21/run_table_1.sh`` (MBS,
  ``--num-layers-per-virtual-pipeline-stage``, ``DDP=torch|local``; ``CONFIG.sh``: ``--fp16``, seq 2048;
  ``SRUN.sh``: container ``nvcr.io/nvidia/pytorch:20.12-py3``).
- Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B" (arXiv 2201.11990), sections
  2.4 and 3: 105 layers, hidden 20480, 128 heads, 8-way tensor and 35-way pipeline parallelism, micro-batch 1,
  global batch 1920 on 280 / 350 / 420 DGX A100 nodes: 60.1 / 50.2 / 44.4 s per iteration (126 / 121 / 113
  teraFLOP/s per GPU). The pipeline is DeepSpeed's engine (``deepspeed/runtime/pipe/engine.py``), the layers
  Megatron's.

Rules shared by every row: full recomputation of every block (Megatron's ``--recompute-method uniform`` with its
default one layer per group; DeepSpeed's per-layer checkpointing), blocks split evenly over the stages (neither
runtime of 2021 had an uneven split: ``--num-layers`` must divide by p, or by p x v when interleaved), no sequence
parallelism, no distributed optimizer and no FlashAttention (all later than these runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.models import ModelSpec

__all__ = ["Framework", "PublishedRun", "MEGATRON_2021_TORCH_DDP", "MEGATRON_2021_LOCAL_DDP", "DEEPSPEED_PIPE_2021",
           "NARAYANAN_2021_TABLE1", "MT_NLG_530B", "PUBLISHED_RUNS", "gpt_model", "paper_flops",
           "GEMM_EFFICIENCY_2021", "NCCL_NVLINK_EFFICIENCY", "HBM_EFFICIENCY", "a100_2021"]

SEQ_LEN = 2048
VOCAB = 51200

GEMM_EFFICIENCY_2021 = 230.0 / 312.0
"""The fraction of the A100's 312 TFLOP/s a large fp16 matrix multiply reached with the CUDA 11 software of
these runs: 230 TFLOP/s on an A100 80GB (Mu Li, ``mli/transformers-benchmarks`` README, "MatMul FP32 / FP16:
116 / 230", NGC ``pytorch:22.07-py3``, the nearest public measurement to the runs' ``pytorch:20.12-py3``). The
``a100-80gb`` preset's 0.859 is a CUDA 12.1 figure (Bekman's MAMF table): two years of cuBLAS later."""

NCCL_NVLINK_EFFICIENCY = 0.8
"""The share of NVLink's line rate NCCL's collectives move as data: "With the protocol overhead (~20%) NCCL can
get an effective NVLink bandwidth of 370GB/s" of H100's 450 (S. Jeaugey, NCCL maintainer, NVIDIA/nccl-tests
issue #212); the same on A100: all_reduce_perf bus bandwidth ~200-210 GB/s of the 300 GB/s line rate on 8 x
A100 SXM4 80GB (nccl-tests issues #149, #178). The tensor-parallel all-reduces run at it."""

HBM_EFFICIENCY = 0.88
"""The share of the datasheet's HBM bandwidth a memory-bound kernel reaches: 1.80 of 2.04 TB/s on an A100 80GB
SXM, 88% by Nsight Compute too, "around 90%" the best kernel of an NVIDIA GTC talk (NVIDIA developer forums,
"Trouble to Reach Peak Bandwidth of A100", thread 339083). The element-wise kernels, the softmax and the thin
attention GEMMs run at it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    """The runtime that ran a published row: what it adds to the estimate of the model's kernels."""

    name: str
    blocking_p2p: bool
    """A device waits for its pipeline sends to finish before it computes again (the simulator's
    ``Hardware(overlap=False)``): Megatron-LM 2021 posts each send/receive pair with
    ``torch.distributed.batch_isend_irecv`` and waits on it at once (megatron/p2p_communication.py
    ``_communicate``); DeepSpeed's engine sends with a blocking ``dist.broadcast`` (pipe/p2p.py). Read by the
    Megatron path only: the DeepSpeed path (:mod:`sim.model.deepspeed_pipeline`) is blocking by construction."""
    scatter_gather: bool
    """Each of the t ranks sends 1/t of the boundary activation and the receiver all-gathers it over NVLink
    (Narayanan et al. section 4.1); without it every rank sends the whole s b h tensor over its own NIC."""
    dp_overlap: bool
    """The gradient all-reduce runs in buckets during the backward (PyTorch DDP) instead of after the flush."""
    engine: str = "megatron"
    """Whose pipeline loop runs the micro-batches: ``"megatron"`` (its 1F1B / interleaved 1F1B loop, simulated
    with the schedule) or ``"deepspeed"`` (``TrainSchedule``'s step stream, executed by
    :mod:`sim.model.deepspeed_pipeline` with its blocking, paired, one-after-the-other broadcasts)."""
    output_restore_gather: bool = False
    """The backward of every stage but the last first all-gathers its own output, which it partitioned over the
    t ranks after sending it: DeepSpeed ``_exec_backward_pass`` ("Reconstruct if we previously partitioned the
    output": ``self.pipe_buffers['output_tensors'][buffer_id].data = part_output.full()``, pipe/engine.py), beside
    the all-gather of the received gradient. Megatron keeps its output whole."""
    messages_per_exchange: int = 1
    """Broadcasts per pipeline exchange: DeepSpeed sends a partitioned tensor as its meta tensor and its data,
    each a blocking ``p2p.send`` (``_exec_send_activations`` / ``_exec_send_grads``: ``(part.to_meta(),
    part.data(), ...)``), so each exchange pays two latencies."""
    dp_bucket_bytes: float = 25 * 2**20
    """PyTorch DDP's default bucket (``bucket_cap_mb=25``, torch/nn/parallel/distributed.py)."""
    grad_accumulation_bytes: float
    """Bytes per parameter moved by accumulating one micro-batch's gradient into the buffer the all-reduce
    reads: read the new 16-bit gradient, read and write the 16-bit accumulator (6), once per micro-batch after
    the first. Megatron's local DDP: ``param.main_grad.add_(param.grad.data)`` in ``_make_param_hook``
    (megatron/model/distributed.py; fp16 buffer unless ``--accumulate-allreduce-grads-in-fp32``); DeepSpeed's
    engine and PyTorch DDP leave it to autograd's AccumulateGrad (``param.grad += new``), the same traffic.
    Nothing when M = 1."""
    source: str


MEGATRON_2021_TORCH_DDP = Framework(
    name="Megatron-LM 2021, PyTorch DDP", blocking_p2p=True, scatter_gather=True, dp_overlap=True,
    grad_accumulation_bytes=6.0, source="run_table_1.sh DDP=torch (rows without pipelining)")
MEGATRON_2021_LOCAL_DDP = Framework(
    name="Megatron-LM 2021, local DDP", blocking_p2p=True, scatter_gather=True, dp_overlap=False,
    grad_accumulation_bytes=6.0,
    source="run_table_1.sh DDP=local: Megatron's own DDP all-reduces its buffer after the pipeline flush "
           "(megatron/training.py train_step: model.allreduce_gradients() after forward_backward_func)")
DEEPSPEED_PIPE_2021 = Framework(
    name="DeepSpeed pipeline engine 2021", blocking_p2p=True, scatter_gather=True, dp_overlap=False,
    grad_accumulation_bytes=6.0, engine="deepspeed", output_restore_gather=True, messages_per_exchange=2,
    source="deepspeed/runtime/pipe/engine.py: TrainSchedule (1F1B, no interleaving); with tensor parallelism "
           "is_pipe_partitioned and is_grad_partitioned: each rank sends its 1/t PartitionedTensor and the receiver "
           "all-gathers it (.full()), Megatron's scatter/gather; p2p.send/recv as a blocking broadcast in a "
           "two-rank group (pipe/p2p.py); _exec_reduce_grads after the flush")


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
    microbatch_size: int
    """b, samples per micro-batch (run_table_1.sh MBS; MT-NLG: 1, as issue 25 quotes Smith et al.)."""
    chunks: int = 1
    """v, model chunks per pipeline device: layers / (p x --num-layers-per-virtual-pipeline-stage)."""
    framework: Framework
    tflops_per_gpu: float | None = None
    """Achieved teraFLOP/s per GPU as the paper counts it (equation (3) FLOPs over the iteration time)."""
    iteration_time: float | None = None
    """Seconds per iteration, where the paper gives it."""

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline)

    @property
    def microbatches(self) -> int:
        """M per pipeline per iteration: global batch / (d x b)."""
        return self.global_batch // (self.data * self.microbatch_size)


def a100_2021():
    """The ``a100-80gb`` preset as these runs used it: 2021's GEMM efficiency, NVLink at NCCL's effective rate, HBM
    at the rate memory-bound kernels reach."""
    from dataclasses import replace

    from sim.model.gpus import a100_80gb

    gpu = a100_80gb()
    return replace(gpu, gemm_efficiency=GEMM_EFFICIENCY_2021, hbm_bandwidth=gpu.hbm_bandwidth * HBM_EFFICIENCY,
                   intra_node_bandwidth=gpu.intra_node_bandwidth * NCCL_NVLINK_EFFICIENCY)


def gpt_model(run: PublishedRun) -> ModelSpec:
    """The GPT of *run*: FFN 4h, GELU, tied embeddings, dropout, 16-bit (the papers' setting)."""
    return ModelSpec(name=run.label, layers=run.layers, hidden=run.hidden, heads=run.heads, vocab=VOCAB,
                     seq_len=SEQ_LEN, tied_embeddings=True, gated_mlp=False, dropout=True)


def paper_flops(run: PublishedRun) -> float:
    """FLOPs of one iteration as Narayanan et al. count them (section 5.1, equation (3), with recomputation):
    96 B s l h^2 (1 + s / (6 h) + V / (16 l h))."""
    B, s, l, h, V = run.global_batch, SEQ_LEN, run.layers, run.hidden, VOCAB
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def _chunks(layers: int, pipeline: int, per_virtual_stage: int | None) -> int:
    return 1 if per_virtual_stage is None else layers // (pipeline * per_virtual_stage)


_N = "Narayanan et al. 2021, Table 1"
# label, heads, hidden, layers, t, p, GPUs, global batch, TFLOP/s per GPU (Table 1); micro-batch, layers per
# virtual stage (None: not interleaved) and DDP (run_table_1.sh)
NARAYANAN_2021_TABLE1 = tuple(
    PublishedRun(source=_N, label=label, heads=a, hidden=h, layers=l, tensor=t, pipeline=p, gpus=n, global_batch=B,
                 microbatch_size=mbs, chunks=_chunks(l, p, lvs), tflops_per_gpu=tf,
                 framework=MEGATRON_2021_TORCH_DDP if ddp == "torch" else MEGATRON_2021_LOCAL_DDP)
    for label, a, h, l, t, p, n, B, tf, mbs, lvs, ddp in (
        ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 16, None, "torch"),
        ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 16, None, "torch"),
        ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 16, None, "torch"),
        ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 8, None, "torch"),
        ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 4, None, "local"),
        ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5, "local"),
        ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5, "local"),
        ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3, "local"),
        ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1, "local"),
        ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, None, "local"),
    ))

_S = "Smith et al. 2022 (MT-NLG), section 2.4"
MT_NLG_530B = tuple(
    PublishedRun(source=_S, label=f"MT-NLG 530B, {n} GPUs", layers=105, hidden=20480, heads=128, tensor=8,
                 pipeline=35, gpus=n, global_batch=1920, microbatch_size=1, framework=DEEPSPEED_PIPE_2021,
                 iteration_time=it)
    for n, it in ((2240, 60.1), (2800, 50.2), (3360, 44.4)))

PUBLISHED_RUNS = NARAYANAN_2021_TABLE1 + MT_NLG_530B
