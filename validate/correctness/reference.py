"""One-process references for the correctness checks (no pipeline, no torch.distributed), in float64.

:func:`emulate_updates` replays every update of a schedule in one process, micro-batch
by micro-batch, and returns the gradient each update applies and the weights after
it. Which weights a micro-batch sees is the *semantics*:

- ``"stash"``: PipeDream's weight stashing (Narayanan et al., SOSP 2019, section 3.3):
  the forward *and* backward of micro-batch m on stage s use version v_s(m) = the
  number of updates of s that precede F(s,m) in its device's list. For a flush
  schedule (naive, GPipe, 1F1B, ...) every micro-batch of iteration i sees version
  i, so this *is* one-process training on the whole mini-batch, iteration by iteration.
- ``"sync"``: synchronous SGD: micro-batch m uses version m // g (g = micro-batches
  per update), whatever the schedule's order.
- ``"latest"``: no weight stash: forward and backward use the version current when
  B(s,m) runs (what an optimizer that updates the weights in place gives).

The loss is computed here, not through the workload's code, so a wrong loss
scaling in :mod:`validate.rank.workloads` is caught (the user's own model brings its loss
function, :mod:`validate.rank.user_model`; the scaling by 1/g is still done here): micro-batch loss
``mean((y - target)^2) / g``; summed over the g micro-batches of an update it is the
mean over the update's whole mini-batch (equal micro-batch sizes). SGD: ``w -= lr * grad``.
The model's initial weights and the data come from the same seeds as the workers
(:func:`validate.rank.workloads.build_stage_module`, :func:`validate.rank.workloads.microbatch_data`),
so both sides start equal; everything is then cast to float64 so the reference's own
rounding is negligible next to the float32 run it checks.

Where it runs: on the CPU, or, after an NCCL run, on that run's GPU (:func:`reference_device`; float64 is IEEE
arithmetic there too), falling back to the CPU where the whole model in float64 does not fit that one GPU
(:func:`_on_device`). A transformer of d_model 1024 over 8 micro-batches of 16 x 512 tokens took more than two
minutes of float64 on one CPU thread after a 1-second run on an H200; the results come back to the CPU either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call

from sim.core.ir import ActionKind, Schedule

from validate.rank.user_model import loss_function
from validate.rank.workloads import WorkloadSpec, build_stage_module, microbatch_data

__all__ = ["UpdateLog", "emulate_updates", "reference_grads", "relative_difference", "max_difference", "SEMANTICS",
           "weight_versions", "reference_device"]

SEMANTICS = ("stash", "sync", "latest")


@dataclass(frozen=True, slots=True)
class UpdateLog:
    """stage -> per update: the gradient it applied and the weights after it ({name: tensor})."""

    grads: dict[int, list[dict[str, torch.Tensor]]]
    weights: dict[int, list[dict[str, torch.Tensor]]]


def weight_versions(schedule: Schedule, semantics: str) -> list[list[int]]:
    """[stage][micro-batch] -> the weight version its forward and backward use under *semantics*."""
    if semantics not in SEMANTICS:
        raise ValueError(f"unknown semantics {semantics!r}; choose one of {SEMANTICS}")
    S, g, total = schedule.stages, schedule.microbatches_per_update, schedule.total_microbatches
    version = [[m // g for m in range(total)] for _ in range(S)]
    if semantics == "sync":
        return version
    counted = ActionKind.F if semantics == "stash" else ActionKind.B
    for device in range(schedule.devices):
        done = {s: 0 for s in schedule.stages_of(device)}
        for a in schedule.actions[device]:
            if a.kind is ActionKind.U:
                done[a.stage] += 1
            elif a.kind is counted:
                version[a.stage][a.mb] = done[a.stage]
    return version


def reference_device(backend: str) -> torch.device:
    """Where the reference of a run on *backend* computes: the GPU after an NCCL run (its ranks have exited, so
    the card is free), else the CPU."""
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def emulate_updates(spec: WorkloadSpec, schedule: Schedule, *, semantics: str = "stash",
                    dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> UpdateLog:
    """Every update of *schedule* replayed in one process (see the module docstring).

    *dtype*: float64 for the reference; float32 gives the rounding floor of one-process training itself.
    *device*: where it computes (None: the CPU); the log's tensors are on the CPU.
    """
    def run(on: torch.device) -> UpdateLog:
        if on.type != "cpu":
            return _emulate(spec, schedule, semantics, dtype, on)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small matrices: on a shared, loaded machine more threads are 30x slower
        try:
            return _emulate(spec, schedule, semantics, dtype, on)
        finally:
            torch.set_num_threads(threads)
    return _on_device(run, device)


def _on_device(compute, device: torch.device | None):
    """*compute(device)*, or *compute* on the CPU where *device* is None, the CPU, or a GPU that runs out of memory
    (the whole model in float64 on the one GPU: the CPU's memory is larger)."""
    if device is not None and device.type != "cpu":
        try:
            return compute(device)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    return compute(torch.device("cpu"))


def _emulate(spec: WorkloadSpec, schedule: Schedule, semantics: str, dtype: torch.dtype,
             device: torch.device) -> UpdateLog:
    S, g, total = schedule.stages, schedule.microbatches_per_update, schedule.total_microbatches
    modules = [build_stage_module(spec, s).to(device=device, dtype=dtype) for s in range(S)]
    version = weight_versions(schedule, semantics)
    weights = [[{k: p.detach().clone() for k, p in m.named_parameters()}] for m in modules]  # [stage][version]
    grads: list[list[dict]] = [[] for _ in range(S)]
    acc = [{} for _ in range(S)]  # stage -> {update group: summed gradient}
    count = [{} for _ in range(S)]
    pending = list(range(total))
    while pending:
        ready = [m for m in pending if all(version[s][m] < len(weights[s]) for s in range(S))]
        if not ready:
            raise RuntimeError(f"{semantics} emulation is stuck: a micro-batch needs a weight version never produced")
        for m in ready:
            params = [{k: v.clone().requires_grad_(True) for k, v in weights[s][version[s][m]].items()}
                      for s in range(S)]
            x, target = microbatch_data(spec, m)
            y = _cast(x.to(device), dtype)
            for s in range(S):
                y = functional_call(modules[s], params[s], (y,))
            # this micro-batch's share of the mini-batch mean
            loss = _mean_loss(spec, y, _cast(target.to(device), dtype)) / g
            flat = [p for ps in params for p in ps.values()]
            step = iter(torch.autograd.grad(loss, flat))
            u = m // g
            for s in range(S):
                part = {k: next(step) for k in params[s]}
                if u in acc[s]:
                    for k in part:
                        acc[s][u][k] += part[k]
                else:
                    acc[s][u] = part
                count[s][u] = count[s].get(u, 0) + 1
                if count[s][u] == g:  # update u of stage s makes version u + 1 (updates of a stage complete in order)
                    assert len(weights[s]) == u + 1, "updates of a stage complete in order"
                    grads[s].append(acc[s].pop(u))
                    weights[s].append({k: w - spec.lr * grads[s][u][k] for k, w in weights[s][u].items()})
        pending = [m for m in pending if m not in ready]
    cpu = lambda d: {k: v.cpu() for k, v in d.items()}  # noqa: E731
    return UpdateLog(grads={s: [cpu(x) for x in grads[s]] for s in range(S)},
                     weights={s: [cpu(x) for x in weights[s][1:]] for s in range(S)})


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Floating tensors to *dtype*; integer ones (the token ids of a user's model) stay as they are."""
    return t.to(dtype) if t.is_floating_point() else t


def _mean_loss(spec: WorkloadSpec, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean loss over the samples of *y*: mean squared error, written here (not the workload's code), for
    the built-in workloads; the user's own loss function for theirs (its 1/g scaling stays here)."""
    if spec.user:
        return loss_function(spec)(y, target)
    return ((y - target) ** 2).mean()


def reference_grads(spec: WorkloadSpec, stages: int, microbatches: int, iteration: int = 0,
                    dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> dict[int, dict]:
    """stage -> {parameter name: gradient} of one iteration trained on its whole mini-batch (float32 copy, CPU).

    The whole model (all stages chained) on the concatenated micro-batches of *iteration*,
    loss = mean squared error over the mini-batch, computed here (the user's model: its loss).
    *dtype*: float64 for the reference; float32 gives the rounding floor of one-process training itself.
    *device*: where it computes (None: the CPU).
    """
    return _on_device(lambda on: _reference_grads(spec, stages, microbatches, iteration, dtype, on), device)


def _reference_grads(spec: WorkloadSpec, stages: int, microbatches: int, iteration: int, dtype: torch.dtype,
                     device: torch.device) -> dict[int, dict]:
    modules = [build_stage_module(spec, s).to(device=device, dtype=dtype) for s in range(stages)]
    data = [microbatch_data(spec, m) for m in range(iteration * microbatches, (iteration + 1) * microbatches)]
    x = _cast(torch.cat([d[0] for d in data]).to(device), dtype)  # (M * batch, ...): the whole mini-batch
    target = _cast(torch.cat([d[1] for d in data]).to(device), dtype)
    for module in modules:
        x = module(x)
    _mean_loss(spec, x, target).backward()
    return {s: {k: p.grad.detach().float().cpu() for k, p in m.named_parameters()} for s, m in enumerate(modules)}


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max |a - b| over one stage's tensors, relative to the largest |b| of them (0 when both are 0)."""
    worst = max((float((a[k].double() - b[k].double()).abs().max()) for k in b), default=0.0)
    scale = max((float(v.double().abs().max()) for v in b.values()), default=0.0)
    return worst / scale if scale > 0 else worst


def max_difference(a: dict[int, dict], b: dict[int, dict]) -> tuple[float, float]:
    """(largest absolute difference, largest difference relative to the largest |b|) over every stage's tensors."""
    worst, scale = 0.0, 0.0
    for s in b:
        for k, ref in b[s].items():
            worst = max(worst, float((a[s][k].double() - ref.double()).abs().max()))
            scale = max(scale, float(ref.double().abs().max()))
    return worst, worst / scale if scale else worst
