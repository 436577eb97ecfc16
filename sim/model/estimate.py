"""From a model's shape and a device's spec to per-stage costs: FLOPs, times and bytes of a transformer.

Units: FLOPs, seconds, bytes. Notation of the papers below: s sequence length, b
micro-batch size (samples), h hidden size, a attention heads, f FFN width, V
vocabulary, L layers, t tensor-parallel degree, p pipeline degree, d data-parallel degree.

Compute (one micro-batch, one transformer block, forward; a multiply-add is 2 FLOPs):

- dense (the matrix multiplies with weights): 2 s b h (h + 2 h_kv) for Q, K, V; 2 s b h^2 for the output
  projection; 4 s b h f for a GELU MLP (6 s b h f for SwiGLU's three matrices). With h_kv = h and f = 4h
  this is 24 s b h^2, Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM" (SC'21), appendix, eq. (2)'s per-layer term;
- attention (Q K^T and the weighted sum over V): 4 s^2 b h (the same appendix; no causal halving);
- the output layer: 2 s b h V on the last stage (the appendix's 6 x 2 s b h V over F+B+W).

The backward splits as in Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), section 2: the input
gradient B costs one forward of the dense part plus two of the attention part (which has no weights); the
weight gradient W costs one forward of the dense part. F + B + W = 3 x forward, the usual 6N FLOPs per token.
Time: by default each kernel of a block on one tensor-parallel rank is timed by the size-aware model of
:mod:`sim.model.efficiency` (GEMMs by roofline with tile and wave quantisation, the attention core, the
memory-bound element-wise kernels); with a constant efficiency (``--mfu``, or a device without kernel figures),
time = FLOPs / (t x peak x efficiency). Either way tensor parallelism splits every matrix t ways.

Tensor-parallel communication (Shoeybi et al., "Megatron-LM" (2019), section 3, Figure 4): two all-reduces of
s b h activations per block in the forward and two in the backward; with sequence parallelism each becomes a
reduce-scatter plus an all-gather of the same total volume (Korthikanti et al. 2022, section 4.2.2). A ring
all-reduce of n bytes over t devices takes 2 (t-1) (latency + n / (t bandwidth)) (Patarasuk & Yuan 2009).
It is added to F and B (not overlapped: an upper bound, as Megatron's all-reduces sit on the critical path).

Activation memory per block and micro-batch: :func:`activation_bytes_per_layer` (Korthikanti et al. 2022,
Table 2). Weights, gradients and optimizer state: mixed-precision Adam, 2 + 2 + 12 bytes per parameter
(Rajbhandari et al., "ZeRO" (SC'20), section 3.1), optimizer state split d ways with ZeRO-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from sim.errors import PipesimError
from sim.model.efficiency import attention_kernel_times, block_kernel_times, has_kernel_model, output_kernel_times
from sim.model.gpus import DEFAULT_MFU, GpuSpec
from sim.model.models import ModelSpec
from sim.model.partition import PartitionError, min_max_bounds

__all__ = ["Parallelism", "Estimate", "EstimateError", "RECOMPUTE_MODES", "layer_flops",
           "activation_bytes_per_layer", "tp_allreduce_time", "estimate", "calibrate_efficiency",
           "optimizer_bytes_per_parameter", "memory_floor", "stage_bytes", "StageBytes", "pipeline_hardware",
           "data_parallel_sync_time", "with_seq_len"]

RECOMPUTE_MODES = ("none", "selective", "full")


_PARALLEL_LIMITS = {"tensor": 2**16, "pipeline": 100_000, "chunks": 1024, "data": 2**24, "microbatch_size": 2**20}
"""Upper bounds of the layout's integers: far above real runs, low enough that every product stays finite."""


class EstimateError(PipesimError):
    """A parallel layout the model cannot take (heads not divisible by t, more stages than layers, ...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """How one model replica is cut, and how much work one micro-batch is."""

    tensor: int = 1
    """t, tensor-parallel degree (Megatron: every matrix split t ways inside a node)."""
    sequence_parallel: bool = False
    """Korthikanti et al.'s sequence parallelism: layer norms and dropouts split t ways too."""
    pipeline: int = 1
    """p, pipeline devices."""
    chunks: int = 1
    """v, model chunks per pipeline device (interleaved / V-shaped schedules): p x v stages."""
    data: int = 1
    """d, data-parallel replicas (ZeRO-1 divides the optimizer state by d)."""
    microbatch_size: int = 1
    """b, samples per micro-batch."""
    recompute: str = "none"
    """'none', 'selective' (attention core recomputed inside B) or 'full' (the stage's forward re-run: R)."""
    zero1: bool = False
    """Shard the optimizer state over the d replicas (ZeRO stage 1)."""
    flash_attention: bool = False
    """Time the attention core as FlashAttention (no s x s score traffic; :mod:`sim.model.efficiency`). Memory
    follows Korthikanti et al.'s Table 2 either way (use recompute='selective' for FlashAttention's memory)."""

    def __post_init__(self) -> None:
        for label in ("tensor", "pipeline", "chunks", "data", "microbatch_size"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EstimateError(f"{label} must be a positive integer, got {value!r}")
            if value > _PARALLEL_LIMITS[label]:
                raise EstimateError(f"{label} = {value if value < 10**30 else f'{value:.3e}'} is above the limit of "
                                    f"{_PARALLEL_LIMITS[label]:,}")
        if self.recompute not in RECOMPUTE_MODES:
            raise EstimateError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")

    @property
    def stages(self) -> int:
        return self.pipeline * self.chunks

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data


def layer_flops(model: ModelSpec, b: int) -> tuple[float, float]:
    """(dense, attention) forward FLOPs of one block for a micro-batch of *b* samples (module docstring)."""
    s, h, f = model.seq_len, model.hidden, model.ffn
    dense = 2 * s * b * h * (h + 2 * model.kv_hidden) + 2 * s * b * h * h
    dense += (6 if model.gated_mlp else 4) * s * b * h * f
    attention = 4 * s * s * b * h
    return float(dense), float(attention)


def activation_bytes_per_layer(model: ModelSpec, b: int, *, tensor: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
    """Bytes one block keeps for its backward, per micro-batch: Korthikanti et al., "Reducing Activation
    Recomputation in Large Transformer Models" (MLSys 2023, arXiv 2205.05198), section 4 and Table 2.

    Table 2 (16-bit activations, 1-byte dropout masks, f = 4h, h_kv = h)::

        no parallelism                         s b h (34 + 5 a s / h)
        tensor parallel (baseline)             s b h (10 + 24/t + 5 a s / (h t))
        tensor + sequence parallel             s b h (34/t + 5 a s / (h t))
        tensor parallel + selective recompute  s b h (10 + 24/t)
        tensor + sequence + selective          s b h (34/t)
        full recompute                         s b h 2

    Derivation (section 4.1), in units of s b h bytes: attention 11 (Q K V input 2, Q and K 4, V 2, output
    projection input 2, dropout mask 1) + 5 a s / h (softmax 2, its dropout mask 1, its output 2); MLP 19
    (input 2, the two 4h activations 8 + 8, mask 1); two layer norms 4. The parts t does not split without
    sequence parallelism are the norms' inputs 4, the attention and MLP inputs 2 + 2 and the two masks 2: 10.
    Generalised here, term by term: K and V are 2 h_kv each (grouped-query attention), the MLP keeps 4 s b f
    (GELU: its input and the second matrix's input) or 6 s b f (SwiGLU: gate and up outputs and the down
    input), and without dropout the masks (2 s b h + a s^2 b) and the softmax-dropout output (2 a s^2 b) are
    gone. Other element sizes than 2 bytes scale every term by dtype_bytes / 2 (masks included: a small
    overcount). With the paper's shape the function returns the table's values exactly (tests check it).
    """
    if recompute not in RECOMPUTE_MODES:
        raise EstimateError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}")
    s, h, a, f, t = model.seq_len, model.hidden, model.heads, model.ffn, tensor
    scale = model.dtype_bytes / 2
    if recompute == "full":
        return 2 * s * b * h * scale  # only the block's input is kept (Table 2, last row)
    masks = 2 * s * b * h if model.dropout else 0.0  # attention-output and MLP-output dropout masks, 1 byte each
    replicated = 4 * s * b * h + 2 * s * b * h + 2 * s * b * h + masks  # norms' inputs, attention and MLP inputs
    mlp = (6 if model.gated_mlp else 4) * s * b * f
    split = 2 * s * b * h + 4 * s * b * model.kv_hidden + 2 * s * b * h + mlp  # Q; K, V; projection input; MLP
    attention_core = (5 if model.dropout else 2) * a * s * s * b  # softmax (+ mask + dropout output)
    if recompute == "selective":
        attention_core = 0.0  # recomputed inside the backward (section 5)
    sharded = split + attention_core
    if sequence_parallel:
        return (replicated + sharded) / t * scale
    return (replicated + sharded / t) * scale


def tp_allreduce_time(nbytes: float, tensor: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of *nbytes* over *tensor* devices: 2 (t-1) steps of n/t bytes (Patarasuk & Yuan 2009)."""
    if tensor == 1:
        return 0.0
    return 2 * (tensor - 1) * (latency + nbytes / tensor / bandwidth)


def optimizer_bytes_per_parameter(model: ModelSpec) -> float:
    """Mixed-precision Adam keeps an fp32 master copy, momentum and variance: 12 bytes (ZeRO, section 3.1);
    fp32 training keeps momentum and variance only: 8."""
    return 8.0 if model.dtype_bytes >= 4 else 12.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Per-stage costs of one model replica cut p x v ways, and where they came from."""

    model: ModelSpec
    gpu: GpuSpec
    parallelism: Parallelism
    efficiency: float
    """Fraction of peak FLOP/s the stages' F + B + W reach (model FLOPs over their busy time, communication
    included): the ``--mfu`` given, or what the size-aware compute model (:mod:`sim.model.efficiency`) implies."""
    costs: StageCosts
    """Per stage (p x v of them, stage order): times of one micro-batch and bytes (see :mod:`sim.model.cost`)."""
    bounds: tuple[tuple[int, int], ...]
    """Per stage: its transformer blocks [first, end)."""
    activation_bytes_per_layer: float
    """Bytes one block keeps between its forward and its backward, per micro-batch (Korthikanti et al. 2022,
    Table 2 under this layout; with full recompute only its input, 2 s b h)."""
    working_bytes_per_layer: float
    """Bytes one block holds while its backward runs, per micro-batch: the transient peak (with full recompute,
    everything the recomputed forward brings back; otherwise the same as activation_bytes_per_layer)."""
    compute_model: str
    """'roofline' (kernel by kernel, :mod:`sim.model.efficiency`) or 'constant' (peak x efficiency)."""
    stage_flops: tuple[float, ...]
    """Per stage: model FLOPs of F + B + W of one micro-batch on one tensor-parallel rank (recompute excluded)."""

    @property
    def model_flops_per_microbatch(self) -> float:
        """FLOPs of F + B + W of one micro-batch through the whole model (all t ranks, no recompute)."""
        return sum(self.stage_flops) * self.parallelism.tensor

    def to_dict(self) -> dict:
        c = self.costs
        stages = [{"stage": s, "layers": [lo, hi], "forward": c.forward[s], "backward": c.backward[s],
                   "weight": c.weight[s], "recompute": c.recompute[s], "activation_bytes": c.activation_bytes[s],
                   "checkpoint_bytes": c.checkpoint_bytes[s], "send_bytes": c.send_bytes[s],
                   "weight_bytes": c.weight_bytes[s], "grad_bytes": c.grad_bytes[s],
                   "optimizer_bytes": c.optimizer_bytes[s]}
                  for s, (lo, hi) in enumerate(self.bounds)]
        par = self.parallelism
        return {"model": self.model.name, "gpu": self.gpu.name, "efficiency": self.efficiency,
                "tensor_parallel": par.tensor, "sequence_parallel": par.sequence_parallel,
                "pipeline_parallel": par.pipeline, "chunks": par.chunks, "data_parallel": par.data,
                "microbatch_size": par.microbatch_size, "seq_len": self.model.seq_len, "recompute": par.recompute,
                "zero1": par.zero1, "flash_attention": par.flash_attention, "compute_model": self.compute_model,
                "activation_bytes_per_layer": self.activation_bytes_per_layer,
                "working_bytes_per_layer": self.working_bytes_per_layer, "stages": stages}


@dataclass(frozen=True, slots=True)
class _Block:
    """One block (or the embedding / output layer) on one tensor-parallel rank: seconds and bytes."""

    forward: float
    backward: float  # input gradient, including selective recompute and tensor-parallel communication
    weight: float
    recompute: float  # full recompute: the forward again
    activation: float
    checkpoint: float
    parameters: float  # parameters on one tensor-parallel rank
    flops: float  # model FLOPs of F + B + W on one rank


@lru_cache(maxsize=1024)
def _blocks(model: ModelSpec, gpu: GpuSpec, par: Parallelism,
            efficiency: float | None) -> tuple[_Block, _Block, _Block]:
    """(transformer block, embedding, output layer) on one tensor-parallel rank.

    *efficiency* None: kernel times from :mod:`sim.model.efficiency`; a number: FLOPs / (peak x efficiency)."""
    t, b = par.tensor, par.microbatch_size
    s, h = model.seq_len, model.hidden
    dense, attention = layer_flops(model, b)
    bandwidth, latency = gpu.link(cross_node=t > gpu.gpus_per_node)
    comm = 2 * tp_allreduce_time(s * b * h * model.dtype_bytes, t, bandwidth, latency)  # two per block and pass
    fixed = gpu.overhead_per_layer  # per pass, whatever the micro-batch size
    logits = 2.0 * s * b * h * model.vocab
    if efficiency is None:
        k = block_kernel_times(model, gpu, b=b, tensor=t, sequence_parallel=par.sequence_parallel,
                               flash_attention=par.flash_attention)
        f_time, b_time, w_time = k.forward, k.backward, k.weight
        # selective recompute re-runs the attention core inside B: its forward share of the kernels
        core = attention_kernel_times(model, gpu, b=b, tensor=t, flash_attention=par.flash_attention).forward
        out = output_kernel_times(model, gpu, b=b, tensor=t)
        out_f, out_b, out_w = out.forward, out.backward, out.weight
    else:
        rate = gpu.peak_flops * efficiency * t  # the t ranks share every matrix multiply
        f_time, b_time, w_time = (dense + attention) / rate, (dense + 2 * attention) / rate, dense / rate
        core = attention / rate
        out_f = out_b = out_w = logits / rate
    forward = f_time + comm + fixed
    selective = core if par.recompute == "selective" else 0.0
    full = par.recompute == "full"
    # what the block's backward reads: everything its forward kept (recomputed first under full recompute)
    working = activation_bytes_per_layer(model, b, tensor=t, sequence_parallel=par.sequence_parallel,
                                         recompute="none" if full else par.recompute)
    ckpt = activation_bytes_per_layer(model, b, tensor=t, recompute="full") if full else 0.0
    block = _Block(forward=forward, backward=b_time + comm + selective + fixed, weight=w_time + fixed,
                   recompute=forward if full else 0.0, activation=working, checkpoint=ckpt,
                   parameters=(model.layer_parameters - 4 * h) / t + 4 * h, flops=3 * (dense + attention) / t)
    # embedding: a lookup (no FLOPs worth counting); keeps its output's dropout mask (Korthikanti section 4.3)
    emb_mask = s * b * h / (t if par.sequence_parallel else 1) if model.dropout else 0.0
    embedding = _Block(0.0, 0.0, 0.0, 0.0, emb_mask * model.dtype_bytes / 2, 0.0, model.embedding_parameters / t, 0.0)
    # output layer: final norm + logits 2 s b h V; keeps 4 s b h / t (1 + V/h) bytes: norm and projection inputs
    # and fp32 logits for the loss (Korthikanti section 4.3)
    out_act = 4 * s * b * h / t * (1 + model.vocab / h) if model.vocab else 0.0
    out_params = model.embedding_parameters / t + 2 * h  # tied: Megatron keeps a copy on the last stage
    output = _Block(out_f, out_b, out_w, 0.0, out_act, 0.0, out_params, 3 * logits / t)
    return block, embedding, output


def estimate(model: ModelSpec, gpu: GpuSpec, parallelism: Parallelism, *, efficiency: float | None = None,
             layers_per_stage: Sequence[int] | None = None) -> Estimate:
    """Per-stage costs of *model* on *gpu* cut as *parallelism* says.

    *efficiency*: None (default) times every kernel with the size-aware model of :mod:`sim.model.efficiency` when
    *gpu* describes its kernels (every GPU preset does), else runs at :data:`sim.model.gpus.DEFAULT_MFU` of peak;
    a number in (0, 1] forces that constant fraction of peak (``--mfu``).

    Blocks go to the p x v stages by GPipe's min-max partitioner (:func:`sim.model.partition.gpipe_partition`) on
    the estimated per-block F + B + W times, with the embedding counted on the first block and the output layer on
    the last (so the end stages get fewer blocks), or as *layers_per_stage* gives them. Every stage's bytes are
    its own: its blocks, plus the embedding's or the output layer's on the end stages.
    """
    par = parallelism
    if efficiency is not None and (isinstance(efficiency, bool) or not isinstance(efficiency, (int, float))
                                   or not 0 < efficiency <= 1):
        raise EstimateError(f"efficiency (model FLOP utilisation) must be in (0, 1], got {efficiency!r}")
    if efficiency is None and not has_kernel_model(gpu):
        efficiency = DEFAULT_MFU
    _check_layout(model, par)
    t, S, L = par.tensor, par.stages, model.layers
    block, embedding, output = _blocks(model, gpu, par, efficiency)
    bounds = _bounds(L, S, block, embedding, output, layers_per_stage)
    opt_per_param = optimizer_bytes_per_parameter(model) / (par.data if par.zero1 else 1)
    send = model.seq_len * par.microbatch_size * model.hidden * model.dtype_bytes
    if t > 1:
        send /= t  # Megatron's scatter/gather optimisation (Narayanan et al. 2021, section 4.1)
    full = par.recompute == "full"
    rows = {k: [] for k in ("forward", "backward", "weight", "recompute", "send_bytes", "activation_bytes",
                            "checkpoint_bytes", "weight_bytes", "grad_bytes", "optimizer_bytes")}
    flops = []
    for s, (lo, hi) in enumerate(bounds):
        n = hi - lo
        ends = ([embedding] if s == 0 and model.vocab else []) + ([output] if s == S - 1 and model.vocab else [])
        rows["forward"].append(n * block.forward + sum(p.forward for p in ends))
        rows["backward"].append(n * block.backward + sum(p.backward for p in ends))
        rows["weight"].append(n * block.weight + sum(p.weight for p in ends))
        rows["recompute"].append(n * block.recompute)
        rows["send_bytes"].append(float(send) if s < S - 1 else 0.0)
        extras = sum(p.activation for p in ends)
        if full:
            # blocks are recomputed one at a time just before their backward (Megatron's uniform method with one
            # layer per group): R brings back one block's activations while every block's input stays kept
            rows["activation_bytes"].append(block.activation + extras)
            rows["checkpoint_bytes"].append(n * block.checkpoint)
        else:
            rows["activation_bytes"].append(n * block.activation + extras)
            rows["checkpoint_bytes"].append(float(send))
        params = n * block.parameters + sum(p.parameters for p in ends)
        rows["weight_bytes"].append(params * model.dtype_bytes)
        rows["grad_bytes"].append(params * model.dtype_bytes)
        rows["optimizer_bytes"].append(params * opt_per_param)
        flops.append(n * block.flops + sum(p.flops for p in ends))
    busy = sum(rows["forward"]) + sum(rows["backward"]) + sum(rows["weight"])
    achieved = efficiency if efficiency is not None else (sum(flops) / (busy * gpu.peak_flops) if busy > 0 else 0.0)
    return Estimate(model=model, gpu=gpu, parallelism=par, efficiency=float(achieved), costs=StageCosts(**rows),
                    bounds=tuple(bounds), activation_bytes_per_layer=block.checkpoint if full else block.activation,
                    working_bytes_per_layer=block.activation, stage_flops=tuple(flops),
                    compute_model="constant" if efficiency is not None else "roofline")


def _check_layout(model: ModelSpec, par: Parallelism) -> None:
    """Raise :class:`EstimateError` if the model cannot be cut as *par* says."""
    t = par.tensor
    # key/value heads fewer than t are replicated (Megatron's GQA), so t must be a multiple of them
    kv_ok = model.kv_heads % t == 0 if model.kv_heads >= t else t % model.kv_heads == 0
    if model.heads % t or not kv_ok:
        raise EstimateError(f"{model.heads} heads ({model.kv_heads} key/value heads) cannot be split over "
                            f"tensor-parallel degree {t}; choose a divisor of the head counts")
    if model.ffn % t or (model.vocab and model.vocab % t):
        raise EstimateError(f"FFN {model.ffn} and vocabulary {model.vocab} must be divisible by tensor degree {t}")
    S, L = par.stages, model.layers
    if S > L:
        raise EstimateError(f"{S} stages (pipeline {par.pipeline} x chunks {par.chunks}) need at least {S} "
                            f"layers; {model.name} has {L}")


def memory_floor(model: ModelSpec, gpu: GpuSpec, par: Parallelism) -> tuple[float, float]:
    """(static, held): bytes no device of this layout can do without, whatever the partition. *static* is the
    average over the p devices of the weights, gradients and optimizer state (the worst device holds at least
    the average); *held* what the backward of one block must hold (its working set, plus its kept input under
    full recompute): every stage has at least one block. Raises :class:`EstimateError` like :func:`estimate`."""
    _check_layout(model, par)
    block, embedding, output = _blocks(model, gpu, par, 1.0)  # bytes do not depend on the efficiency
    params = model.layers * block.parameters + (embedding.parameters + output.parameters if model.vocab else 0.0)
    opt = optimizer_bytes_per_parameter(model) / (par.data if par.zero1 else 1)
    static = params * (2 * model.dtype_bytes + opt) / par.pipeline
    held = block.activation + (block.checkpoint if par.recompute == "full" else 0.0)
    return static, held


@dataclass(frozen=True, slots=True)
class StageBytes:
    """What moving one block between stages moves, on one tensor-parallel rank (bytes): for a memory-aware split."""

    block_static: float
    """Weights, gradients and optimizer state of one block (held all run)."""
    block_kept: float
    """Kept per in-flight micro-batch by one block (its input only, under full recompute)."""
    working: float
    """One block's working set during its backward (held once at a time under full recompute)."""
    first_static: float
    first_kept: float
    """The embedding's static bytes and its kept bytes per micro-batch, on the first stage."""
    last_static: float
    last_kept: float
    """The output layer's, on the last stage."""


def stage_bytes(model: ModelSpec, gpu: GpuSpec, par: Parallelism) -> StageBytes:
    """The per-block and end-layer bytes :func:`estimate` sums into each stage (same formulas, same sources)."""
    _check_layout(model, par)
    block, embedding, output = _blocks(model, gpu, par, 1.0)  # bytes do not depend on the efficiency
    per_param = 2 * model.dtype_bytes + optimizer_bytes_per_parameter(model) / (par.data if par.zero1 else 1)
    full = par.recompute == "full"
    ends = bool(model.vocab)
    return StageBytes(block_static=block.parameters * per_param,
                      block_kept=block.checkpoint if full else block.activation, working=block.activation,
                      first_static=embedding.parameters * per_param if ends else 0.0,
                      first_kept=embedding.activation if ends else 0.0,
                      last_static=output.parameters * per_param if ends else 0.0,
                      last_kept=output.activation if ends else 0.0)


def _bounds(L: int, S: int, block: _Block, embedding: _Block, output: _Block,
            layers_per_stage: Sequence[int] | None) -> list[tuple[int, int]]:
    if layers_per_stage is not None:
        counts = list(layers_per_stage)
        if len(counts) != S or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) \
                or sum(counts) != L:
            raise EstimateError(f"--layers-per-stage must give {S} positive counts summing to {L} layers, got {counts}")
        bounds, lo = [], 0
        for c in counts:
            bounds.append((lo, lo + c))
            lo += c
        return bounds
    per_block = block.forward + block.backward + block.weight
    first = embedding.forward + embedding.backward + embedding.weight
    last = output.forward + output.backward + output.weight
    # min-max is scale-free: blocks cost 1 and the ends their ratio to a block, rounded to 1e-4 of a block (finer
    # differences cannot move a block boundary by a whole block), so one cached partition serves every b and d
    try:
        return list(_min_max_bounds(L, S, round(first / per_block, 4), round(last / per_block, 4)))
    except PartitionError as exc:
        raise EstimateError(str(exc)) from None


@lru_cache(maxsize=4096)
def _min_max_bounds(L: int, S: int, first: float, last: float) -> tuple[tuple[int, int], ...]:
    """GPipe's min-max partition of L blocks of cost 1, plus *first* on block 0 and *last* on block L-1.

    Cached: a planner asks for the same (L, S, costs) for every data-parallel degree and schedule. The costs are
    built here (finite, non-negative), so the search runs on their prefix sums directly.
    """
    prefix = [float(i) for i in range(L + 1)]  # blocks of cost 1 ...
    prefix[1:] = [v + first for v in prefix[1:]]  # ... the embedding on block 0 ...
    prefix[L] += last  # ... and the output layer on block L-1
    return tuple(min_max_bounds(prefix, S))


def calibrate_efficiency(measured: StageCosts, at_peak: Estimate) -> float:
    """The efficiency a measured costs file implies: estimated compute time at 100% of peak over measured time.

    *measured*: per-stage costs calibrated by ``pipesim validate`` (its ``*_costs.csv``) or from an ingested
    trace; *at_peak*: the estimate of the same model and layout with efficiency 1. Summing F + B + W over the
    stages compares total work, so a partition that differs in detail still calibrates.
    """
    if measured.stages != at_peak.costs.stages:
        raise EstimateError(f"the measured costs have {measured.stages} stages but the estimate has "
                            f"{at_peak.costs.stages}; estimate the same pipeline layout that was measured")
    c = at_peak.costs
    predicted = sum(c.forward) + sum(c.backward) + sum(c.weight)
    actual = sum(measured.forward) + sum(measured.backward) + sum(measured.weight)
    if not actual > 0:
        raise EstimateError("the measured costs have no compute time; cannot calibrate an efficiency from them")
    ratio = predicted / actual
    if ratio > 1:
        raise EstimateError(f"the measured compute is {1 / ratio:.3g}x the time at the device's peak FLOP/s, i.e. "
                            f"faster than peak; the device description's peak_flops is too low for this machine")
    return ratio


def with_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    """*model* with another sequence length (``--seq-len``)."""
    return model if seq_len is None else replace(model, seq_len=seq_len)



def _node_of_stage_device(k: int, par: Parallelism, gpu: GpuSpec) -> int:
    """Node of pipeline device *k*'s first rank. Ranks are laid out tensor-innermost, then data, then pipeline
    (Megatron-LM's default order), so pipeline device k starts at rank k x t x d."""
    return k * par.tensor * par.data // gpu.gpus_per_node


def pipeline_hardware(gpu: GpuSpec, par: Parallelism, *, memory_capacity: float | None = None) -> Hardware:
    """The simulator's view of the pipeline: p devices (each a tensor-parallel group), links between them
    inside a node or across nodes (per pair, from the rank layout), *memory_capacity* bytes each."""
    p = par.pipeline
    bandwidth = [[0.0] * p for _ in range(p)]
    latency = [[0.0] * p for _ in range(p)]
    for a in range(p):
        for b in range(p):
            cross = _node_of_stage_device(a, par, gpu) != _node_of_stage_device(b, par, gpu)
            bw, lat = gpu.link(cross_node=cross)
            bandwidth[a][b], latency[a][b] = (bw, lat) if a != b else (1.0, 0.0)
    return Hardware(devices=p, latency=latency, bandwidth=bandwidth, memory_capacity=memory_capacity)


def data_parallel_sync_time(grad_bytes: float, par: Parallelism, gpu: GpuSpec) -> float:
    """Seconds to all-reduce *grad_bytes* of gradients over the d replicas after the pipeline drains (a ring,
    Patarasuk & Yuan 2009; with ZeRO-1 a reduce-scatter plus an all-gather of the same volume, ZeRO section
    5.1). Replicas are t ranks apart, so the ring leaves the node once t x d exceeds a node. Added after the
    makespan, not overlapped with the backward: an upper bound (Megatron overlaps part of it)."""
    bw, lat = gpu.link(cross_node=par.tensor * par.data > gpu.gpus_per_node)
    return tp_allreduce_time(grad_bytes, par.data, bw, lat)
