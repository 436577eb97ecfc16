"""A planned layout in the forms people launch: Megatron-LM arguments, a torchtitan TOML fragment, PyTorch's CSV.

    from sim.io.launch_formats import LaunchSpec, megatron_arguments, torchtitan_toml
    spec = LaunchSpec.from_plan_row(model, winner_row, layers_per_stage=(7, 8, 8, 7), global_batch=64)
    print(megatron_arguments(spec))      # --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 ...
    print(torchtitan_toml(spec))         # [parallelism] ... [training] ... [activation_checkpoint] ...

Each format names only options its project defines; the names were read from the projects' own code
(tests/test_launch_formats.py lists every one with its file and commit):

- **Megatron-LM** ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM d98e8a64, 22 Aug 2026): the
  explicit arguments (``--decoder-first-pipeline-num-layers``, ``--pipeline-model-parallel-layout``,
  ``--num-layers-per-virtual-pipeline-stage``, ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
  ``--seq-length``, ...) and those its ``ArgumentGroupFactory`` makes from the fields of
  ``TransformerConfig`` / ``ModelParallelConfig`` / ``TrainingConfig`` (field ``x_y`` -> ``--x-y``:
  ``--tensor-model-parallel-size``, ``--recompute-granularity``, ``--micro-batch-size``, ...). The layout
  string follows ``PipelineParallelLayerLayout.parse_str_to_list``: ``|`` separates stages in model order
  (virtual stage v of rank r is stage v x p + r), ``E`` the embedding, ``t`` a transformer layer, ``L``
  the loss, ``x*n`` repeats.
- **torchtitan** ``torchtitan/config/job_config.py`` at pytorch/torchtitan e347b1e5 (15 Feb 2026), the last
  version configured by TOML files (PR #2386 then moved configuration to Python functions; the same
  ``--section.option`` names remain its command-line flags): ``[parallelism]``, ``[training]``,
  ``[activation_checkpoint]``. The stage split is ``module_fqns_per_model_part`` with the module names of
  its decoder models (``tok_embeddings``, ``layers.i``, ``norm``, ``output``).
- **PyTorch** ``torch.distributed.pipelining``: the schedule as the CSV that
  ``_PipelineScheduleRuntime._load_csv`` reads (:func:`sim.io.schedule_io.write_pytorch_csv`), one row per
  rank; torchtitan takes it through ``pipeline_parallel_schedule_csv``.

Where a project cannot run the planned schedule (Megatron-LM has 1F1B and interleaved 1F1B only; nothing runs
PipeDream's asynchronous updates) the output says so in a comment line instead of pretending.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import PipesimError
from sim.model.models import ModelSpec

__all__ = ["LaunchSpec", "LaunchError", "megatron_arguments", "megatron_layout", "torchtitan_toml",
           "TORCHTITAN_SCHEDULES", "MEGATRON_SCHEDULES", "ASYNC_SCHEDULES", "EMIT_FORMATS"]

EMIT_FORMATS = ("megatron", "torchtitan", "csv")

MEGATRON_SCHEDULES = {"1f1b": "1F1B (PipeDream-Flush)", "interleaved-1f1b": "interleaved 1F1B"}
"""Schedules Megatron-LM runs (megatron/core/pipeline_parallel/schedules.py): chosen by the layout, not a flag."""

TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
"""Our name -> PyTorch's ``get_schedule_class`` name, for the schedules both have."""

ASYNC_SCHEDULES = ("pipedream", "pipedream-2bw")
"""Asynchronous weight updates (no flush): different training semantics; no runtime above runs them."""

V_SHAPED = ("zbv", "dualpipev")
"""Stage s on device s for s < p and on device 2p-1-s after: not Megatron's round-robin layout."""


class LaunchError(PipesimError):
    """A layout that cannot be written in the asked format."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """One planned layout, everything the launch formats need."""

    model: ModelSpec
    schedule: str
    pipeline: int
    tensor: int
    data: int
    microbatch_size: int
    microbatches: int
    chunks: int
    recompute: str
    """'none', 'selective' or 'full' (full: one block at a time, Megatron's uniform method with 1 layer)."""
    sequence_parallel: bool
    distributed_optimizer: bool
    """ZeRO-1: the optimizer state sharded over the data-parallel replicas (Megatron's distributed optimizer)."""
    layers_per_stage: tuple[int, ...]
    """Transformer blocks per stage, stages in model order (p x v of them)."""

    def __post_init__(self) -> None:
        if len(self.layers_per_stage) != self.pipeline * self.chunks:
            raise LaunchError(f"layers_per_stage has {len(self.layers_per_stage)} stages; p x v = "
                              f"{self.pipeline * self.chunks}")
        if sum(self.layers_per_stage) != self.model.layers:
            raise LaunchError(f"layers_per_stage sums to {sum(self.layers_per_stage)}, the model has "
                              f"{self.model.layers} layers")

    @property
    def global_batch(self) -> int:
        return self.data * self.microbatch_size * self.microbatches

    @property
    def even(self) -> bool:
        return len(set(self.layers_per_stage)) == 1

    @classmethod
    def from_plan_row(cls, model: ModelSpec, row: dict, *, layers_per_stage, sequence_parallel: bool,
                      distributed_optimizer: bool) -> LaunchSpec:
        return cls(model=model, schedule=str(row["schedule"]), pipeline=int(row["pipeline"]),
                   tensor=int(row["tensor"]), data=int(row["data"]), microbatch_size=int(row["microbatch_size"]),
                   microbatches=int(row["microbatches"]), chunks=int(row["chunks"]), recompute=str(row["recompute"]),
                   sequence_parallel=bool(sequence_parallel and int(row["tensor"]) > 1),
                   distributed_optimizer=bool(distributed_optimizer and int(row["data"]) > 1),
                   layers_per_stage=tuple(int(n) for n in layers_per_stage))


def megatron_layout(spec: LaunchSpec) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` string: ``E`` + the first stage's layers ``|`` ... ``|`` the
    last stage's layers + ``L`` (stages in model order, runs of layers written ``t*n``)."""
    parts = []
    last = len(spec.layers_per_stage) - 1
    for s, n in enumerate(spec.layers_per_stage):
        text = "E" if s == 0 else ""
        text += "t" * n if n < 3 else f"t*{n}"
        parts.append(text + ("L" if s == last else ""))
    return "|".join(parts)


def megatron_arguments(spec: LaunchSpec) -> str:
    """The Megatron-LM command-line arguments of *spec* (model shape, parallelism, batch, recompute, optimizer),
    preceded by ``#`` lines where Megatron-LM would run something else than what was planned."""
    m, p, v = spec.model, spec.pipeline, spec.chunks
    notes = []
    if spec.schedule not in MEGATRON_SCHEDULES:
        runs = "interleaved 1F1B" if v > 1 else "1F1B"
        notes.append(f"# Megatron-LM has no {spec.schedule} schedule: with these arguments it runs {runs} "
                     f"(the plan's memory and time are for {spec.schedule})")
    if spec.schedule in V_SHAPED:
        notes.append("# Megatron-LM places virtual stages round-robin, not in a V: the layout below is in model order")
    args = [("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--ffn-hidden-size", m.ffn),
            ("--num-attention-heads", m.heads)]
    if m.kv_heads != m.heads:
        args += [("--group-query-attention", None), ("--num-query-groups", m.kv_heads)]
    args += [("--seq-length", m.seq_len), ("--max-position-embeddings", m.seq_len)]
    if m.gated_mlp:
        args.append(("--swiglu", None))
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if not m.dropout:
        args += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    if m.dtype_bytes == 2:
        args.append(("--bf16", None))  # 16-bit weights and activations, as the estimate assumes
    args += [("--tensor-model-parallel-size", spec.tensor), ("--pipeline-model-parallel-size", p)]
    if spec.sequence_parallel:
        args.append(("--sequence-parallel", None))
    counts = spec.layers_per_stage
    if not spec.even:
        middle = counts[1:-1]
        if v == 1 and p > 1 and (not middle or len(set(middle)) == 1):
            args += [("--decoder-first-pipeline-num-layers", counts[0]),
                     ("--decoder-last-pipeline-num-layers", counts[-1])]
        else:
            args.append(("--pipeline-model-parallel-layout", f'"{megatron_layout(spec)}"'))
    elif v > 1:
        args.append(("--num-layers-per-virtual-pipeline-stage", counts[0]))
    args += [("--micro-batch-size", spec.microbatch_size), ("--global-batch-size", spec.global_batch)]
    if spec.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    elif spec.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if spec.distributed_optimizer:
        args += [("--use-distributed-optimizer", None), ("--overlap-param-gather", None)]
    if spec.data > 1:
        args.append(("--overlap-grad-reduce", None))  # what the plan's DP overlap models
    text = " ".join(name if value is None else f"{name} {value}" for name, value in args)
    return "\n".join(notes + [text])


def _fqns(spec: LaunchSpec) -> list[list[str]]:
    out, first = [], 0
    last = len(spec.layers_per_stage) - 1
    ends = bool(spec.model.vocab)  # a model without a vocabulary (the validator's workload) has no end layers
    for s, n in enumerate(spec.layers_per_stage):
        part = (["tok_embeddings"] if s == 0 and ends else []) + [f"layers.{i}" for i in range(first, first + n)]
        out.append(part + (["norm", "output"] if s == last and ends else []))
        first += n
    return out


def torchtitan_toml(spec: LaunchSpec, *, schedule_csv: str | None = None) -> str:
    """The ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]`` keys of a torchtitan job config.

    *schedule_csv*: the PyTorch CSV of the planned order, used (``pipeline_parallel_schedule_csv``) when PyTorch
    has no class for the schedule. Data parallelism is replicated (DDP, ``data_parallel_replicate_degree``):
    torchtitan has no ZeRO-1; its ``data_parallel_shard_degree`` is FSDP, which holds less memory than planned.
    """
    lines = []
    if spec.schedule in ASYNC_SCHEDULES:
        lines.append(f"# {spec.schedule} updates weights asynchronously (no flush); torchtitan cannot run it")
    name = TORCHTITAN_SCHEDULES.get(spec.schedule)
    if name is None and spec.schedule not in ASYNC_SCHEDULES:
        if schedule_csv is None:
            lines.append(f"# PyTorch has no {spec.schedule} class; give its CSV (pipesim plan --emit csv)")
        name = "PipelineScheduleMulti" if spec.chunks > 1 else "PipelineScheduleSingle"
    if spec.distributed_optimizer:
        lines.append("# the plan shards the optimizer state (ZeRO-1); torchtitan's nearest is FSDP "
                     "(data_parallel_shard_degree), which shards more")
    fqns = ", ".join("[" + ", ".join(f'"{n}"' for n in part) + "]" for part in _fqns(spec))
    mode = {"none": "none", "selective": "selective", "full": "full"}[spec.recompute]
    lines += ["[parallelism]",
              f"data_parallel_replicate_degree = {spec.data}",
              "data_parallel_shard_degree = 1",
              f"tensor_parallel_degree = {spec.tensor}",
              f"pipeline_parallel_degree = {spec.pipeline}"]
    if name is not None:
        lines.append(f'pipeline_parallel_schedule = "{name}"')
    if schedule_csv is not None and spec.schedule not in TORCHTITAN_SCHEDULES and spec.schedule not in ASYNC_SCHEDULES:
        lines.append(f'pipeline_parallel_schedule_csv = "{schedule_csv}"')
    lines += [f"pipeline_parallel_microbatch_size = {spec.microbatch_size}",
              f"module_fqns_per_model_part = [{fqns}]",
              "",
              "[training]",
              f"local_batch_size = {spec.microbatch_size * spec.microbatches}",
              f"global_batch_size = {spec.global_batch}",
              f"seq_len = {spec.model.seq_len}",
              "",
              "[activation_checkpoint]",
              f'mode = "{mode}"']
    if mode == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines)
