"""Megatron-LM's own pipeline schedules (``megatron.core``) on the validator's ranks, gloo on CPU or NCCL.

``pipesim validate --runtime megatron`` measures the runtime most large-model training uses, as it is: each rank
builds the validator's stage modules, hands them to ``megatron.core.pipeline_parallel.get_forward_backward_func()``
(``forward_backward_pipelining_without_interleaving``, pipesim's ``1f1b``, or
``forward_backward_pipelining_with_interleaving``, pipesim's ``interleaved-1f1b``, when model chunks are given) and
calls it once per step, as ``megatron/training/training.py`` ``train_step`` does. Its point-to-point code
(``p2p_communication.py``: ``send_forward_recv_backward`` ..., batched ``batch_isend_irecv`` by default) posts every
send and receive; nothing of pipesim's executor runs. The trace is then read as any Megatron trace is
(``pipesim ingest --from-megatron``: its ``forward_step`` / ``backward_step`` calls, which ``with_stack=True``
records, :func:`validate.ingest.infer.megatron_segments`).

What adapts the validator's stages to Megatron's protocol (``megatron/core/pipeline_parallel/schedules.py``):

- a model is an ``nn.Module`` with ``config`` (a ``TransformerConfig``), ``model_type`` and
  ``set_input_tensor`` (the schedule gives a non-first stage its received activation that way, before calling
  ``forward_step_func``);
- every message has the one shape ``(seq_length, micro_batch_size, hidden_size)`` (``get_tensor_shapes``): the
  stages' boundary tensors travel flat as ``(1, 1, numel)`` (``seq_length = micro_batch_size = 1``,
  ``hidden_size = numel``) and are viewed back to their shape on arrival, so every boundary must have one size;
- the last stage's ``loss_func`` returns ``(loss, {...})``; the schedule divides it by the number of micro-batches
  (``forward_step_calc_loss``), so a step's gradients are those of the mean loss, as PyTorch's schedules give.

On CPU (gloo) three CUDA calls of ``megatron.core`` 0.16 are answered for the CPU, and nothing else is changed:
``torch.cuda.current_device()`` names the device of the receive buffers (``p2p_communication.py``
``create_tensor_recv_prev``) and returns ``"cpu"``; ``torch.cuda.synchronize()`` after a batch of p2p operations
(``batch_p2p_sync``, a guard for NCCL streams) has nothing to wait for; and the token counter a step allocates with
``device="cuda"`` (``total_num_tokens``) is made on the CPU by a ``TorchFunctionMode`` that maps CUDA devices to the
CPU, switched off inside the stage modules so that their computations run, and are timed, untouched.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from sim.errors import PipesimError
from sim.model.runtimes import get_runtime

__all__ = ["MEGATRON_SCHEDULES", "MegatronMissingError", "megatron_step", "end_megatron", "megatron_version",
           "check_megatron", "megatron_function", "boundary_numel"]

MEGATRON_SCHEDULES = {"1f1b": "forward_backward_pipelining_without_interleaving",
                      "interleaved-1f1b": "forward_backward_pipelining_with_interleaving"}
"""pipesim schedule name -> the ``megatron.core.pipeline_parallel.schedules`` function that runs it."""

_TESTED = "0.16"
"""The ``megatron-core`` release line these adaptations were read from (pyproject pins it)."""


class MegatronMissingError(PipesimError):
    """``--runtime megatron`` without ``megatron-core`` installed, or a schedule Megatron has no function for."""


def megatron_version() -> str | None:
    """The installed ``megatron-core`` version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("megatron-core")
    except PackageNotFoundError:
        return None


def check_megatron(name: str, devices: int, microbatches: int, *, overlap: bool = False) -> str:
    """The Megatron function that runs pipesim schedule *name* on *devices* ranks; one line when Megatron lacks it,
    refuses the shape, or is missing. *overlap*: ``overlap_p2p_comm`` (``--runtime megatron-overlap``)."""
    if name not in MEGATRON_SCHEDULES:
        known = ", ".join(f"{k} ({v})" for k, v in MEGATRON_SCHEDULES.items())
        raise MegatronMissingError(f"Megatron-LM has no schedule function for {name!r}; the megatron runtime runs: "
                                   f"{known}")
    if name == "interleaved-1f1b" and devices <= 2 and not overlap:
        # earlier releases' parallel_state.initialize_model_parallel refused it ("pipeline-model-parallel size should be
        # greater than 2 with interleaved schedule"); 0.16 runs it, and its batched exchanges (_batched_p2p_ops:
        # send to previous before send to next) put the backward's gradient first on the one link between two ranks
        # while the receiver takes the activation first: measured here, the step's gradients are wrong
        raise MegatronMissingError("Megatron's interleaved schedule needs more than 2 pipeline ranks: with 2, its "
                                   "batched exchanges pair a gradient with an activation (use -K 4, --runtime "
                                   "megatron-overlap, or -s 1f1b)")
    if name == "interleaved-1f1b" and (microbatches < devices or microbatches % devices):
        raise MegatronMissingError(f"Megatron's interleaved schedule runs micro-batches in groups of the pipeline "
                                   f"size: -M must be a multiple of -K ({microbatches} is not of {devices})")
    if megatron_version() is None:
        raise MegatronMissingError(f"--runtime megatron needs megatron-core: pip install 'pipesim[megatron]' (it "
                                   f"brings megatron-core {_TESTED}.x)")
    return megatron_function(name, devices)


def megatron_function(name: str, devices: int) -> str:
    """The function ``get_forward_backward_func()`` gives for pipesim schedule *name* on *devices* pipeline ranks:
    without a pipeline (one rank) ``forward_backward_no_pipelining``, whose forward-then-backward per micro-batch is
    pipesim's ``1f1b`` on one device."""
    return "forward_backward_no_pipelining" if devices == 1 else MEGATRON_SCHEDULES[name]


@contextlib.contextmanager
def _cpu_for_cuda():
    """The three CUDA calls of ``megatron.core`` answered for the CPU (module docstring), for the ``with`` block."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                kwargs = dict(kwargs, device="cpu")
            return func(*args, **kwargs)

    saved = torch.cuda.current_device, torch.cuda.synchronize
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    try:
        with CudaOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved


def boundary_numel(workload) -> int:
    """The one message size Megatron's schedule sends (elements); a :class:`validate.errors.ValidationError` when
    the model's boundaries differ in size (checked before any rank starts, and again on each)."""
    from validate.errors import ValidationError
    from validate.rank.workloads import boundary_shape

    shapes = list(workload.boundaries) if workload.user else [boundary_shape(workload)]
    if not shapes:  # one stage: nothing is sent
        return 1
    sizes = {math.prod(s) for s in shapes}
    if len(sizes) != 1:
        raise ValidationError(f"Megatron's schedules send one tensor shape between every pair of stages; this model's "
                              f"boundaries differ ({', '.join(str(tuple(s)) for s in shapes)})")
    return sizes.pop()


def _input_shape(workload, stage: int) -> tuple[int, ...]:
    from validate.rank.workloads import boundary_shape
    return tuple(workload.boundaries[stage - 1]) if workload.user else boundary_shape(workload)


def megatron_step(workload, job: dict, rank: int, device, loss_fn: Callable) -> tuple[Callable[[], None], dict]:
    """Build Megatron's pipeline on this rank for *job* (its ``placement``: stage s on rank ``placement[s]``,
    ``stage = chunk x K + rank`` as Megatron places virtual stages) and return ``(step, modules)``: ``step()`` runs
    one training step through ``get_forward_backward_func()``; *modules* maps each local stage to its module, whose
    parameters' ``.grad`` hold the step's gradients. *loss_fn(output, target)*: one micro-batch's mean loss.

    Megatron's process groups are made here (``parallel_state.initialize_model_parallel``: tensor 1, pipeline K,
    virtual pipeline = chunks when more than one); :func:`end_megatron` destroys them before the next job. A job
    of runtime ``megatron-overlap`` with model chunks runs with ``overlap_p2p_comm`` on and ``batch_p2p_comm`` off,
    as Megatron-LM's training script does (without chunks it turns overlap off, and so does this);
    ``megatron-overlap-flush`` with ``overlap_p2p_comm_warmup_flush`` too."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    from validate.rank.workloads import build_stage_module, microbatch_data

    placement = list(job["placement"])
    K, S, M = max(placement) + 1, len(placement), job["microbatches"]
    chunks = S // K
    if placement != [s % K for s in range(S)]:
        from validate.errors import ValidationError
        raise ValidationError(f"Megatron places virtual stage c x K + r on rank r; placement {placement} differs")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=K,
                                             virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None)
    numel = boundary_numel(workload)
    dtype = torch.float32
    profile = get_runtime(job.get("runtime", "megatron"))
    overlap = profile.overlap_p2p_comm and chunks > 1  # Megatron-LM turns it off without model chunks
    config = TransformerConfig(num_layers=S, hidden_size=numel, num_attention_heads=1, pipeline_model_parallel_size=K,
                               virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
                               pipeline_dtype=dtype, params_dtype=dtype, overlap_p2p_comm=overlap,
                               batch_p2p_comm=not overlap,
                               overlap_p2p_comm_warmup_flush=overlap and profile.overlap_p2p_comm_warmup_flush)

    class MegatronStage(torch.nn.Module):
        """One of the validator's stage modules, as Megatron's schedules call a model (module docstring)."""

        def __init__(self, stage: int):
            super().__init__()
            self.config, self.model_type = config, ModelType.encoder_or_decoder
            self.stage, self.last = stage, stage == S - 1
            self.inner = build_stage_module(workload, stage).to(device)
            self.input_tensor = None

        def set_input_tensor(self, tensor) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, (list, tuple)) else tensor

        def forward(self, x):
            if self.stage > 0:  # the received flat activation, viewed back (its gradient flows to the buffer)
                x = self.input_tensor.view(_input_shape(workload, self.stage))
            with torch._C.DisableTorchFunction():  # the stage's own ops run and are timed untouched
                y = self.inner(x)
            return y if self.last else y.reshape(1, 1, numel)

    local = [s for s in range(S) if placement[s] == rank]
    models = [MegatronStage(s) for s in local]
    data = [microbatch_data(workload, m) for m in range(M)]
    data = [(x.to(device), t.to(device)) for x, t in data]

    def forward_step(iterator, model):
        x, target = next(iterator)
        out = model(x)

        def loss_func(output):
            loss = loss_fn(output, target)
            return loss, {"loss": loss.detach()}
        return out, loss_func

    forward_backward = get_forward_backward_func()
    on_cpu = device.type == "cpu"

    def step() -> None:
        iterators = [iter(data) for _ in models]
        with _cpu_for_cuda() if on_cpu else contextlib.nullcontext():
            forward_backward(forward_step_func=forward_step, data_iterator=iterators if chunks > 1 else iterators[0],
                             model=models if chunks > 1 else models[0], num_microbatches=M, seq_length=1,
                             micro_batch_size=1, forward_only=False)

    return step, {m.stage: m.inner for m in models}


def end_megatron() -> None:
    """Destroy Megatron's process-group state (before another job of the same launch builds its own)."""
    from megatron.core import parallel_state
    parallel_state.destroy_model_parallel()
