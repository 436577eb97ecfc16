"""One-process references for the correctness checks (no pipeline, no torch.distributed).

- :func:`reference_grads`: the whole model (all stages chained) trained in one
  process on the whole mini-batch of one iteration; loss = mean over the mini-batch.
  Flush schedules (naive, GPipe, 1F1B, with or without recompute) must produce
  exactly these gradients, up to float32 rounding: the sum of the micro-batch
  losses, each divided by M, is that mean (equal micro-batch sizes).
- :func:`emulate_updates`: the weights after every update under PipeDream's
  weight-stashing semantics (Narayanan et al., SOSP 2019, section 3.3): the forward
  *and* backward of micro-batch m on stage s use the weight version v_s(m) = the
  number of updates of s that precede F(s,m) in its device's list; update u of s
  subtracts lr x the gradient of its micro-batches. ``stash=False`` gives synchronous
  SGD instead (every stage uses version m // g), to show how far PipeDream drifts.

Same seeds as the workers (:mod:`validate.workloads`), so both sides start equal.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from sim.ir import ActionKind, Schedule

from .workloads import WorkloadSpec, build_stage_module, initial_weights, microbatch_data, stage_loss

__all__ = ["reference_grads", "emulate_updates", "max_difference"]


def reference_grads(spec: WorkloadSpec, stages: int, microbatches: int, iteration: int = 0) -> dict[int, dict]:
    """stage -> {parameter name: gradient} of one iteration trained on the whole mini-batch."""
    modules = [build_stage_module(spec, s) for s in range(stages)]
    data = [microbatch_data(spec, m) for m in range(iteration * microbatches, (iteration + 1) * microbatches)]
    x = torch.cat([d[0] for d in data])  # (M * batch, ...): the whole mini-batch
    target = torch.cat([d[1] for d in data])
    for module in modules:
        x = module(x)
    torch.nn.functional.mse_loss(x, target).backward()
    return {s: {k: p.grad.detach().clone() for k, p in m.named_parameters()} for s, m in enumerate(modules)}


def emulate_updates(spec: WorkloadSpec, schedule: Schedule, *, stash: bool = True) -> dict[int, dict]:
    """stage -> final weights after every update of *schedule*, by weight stashing (or synchronous SGD)."""
    S, g, total = schedule.stages, schedule.microbatches_per_update, schedule.total_microbatches
    modules = [build_stage_module(spec, s) for s in range(S)]
    cpu = torch.device("cpu")
    weights = [[{k: v.detach() for k, v in initial_weights(m, cpu).items()}] for m in modules]
    # v_s(m): updates of stage s before F(s, m) in its device's order
    version = [[0] * total for _ in range(S)]
    for device in range(schedule.devices):
        done = {s: 0 for s in schedule.stages_of(device)}
        for a in schedule.actions[device]:
            if a.kind is ActionKind.U:
                done[a.stage] += 1
            elif a.kind is ActionKind.F:
                version[a.stage][a.mb] = done[a.stage] if stash else a.mb // g
    acc = [{} for _ in range(S)]  # stage -> {group: summed gradient}
    count = [{} for _ in range(S)]
    pending = list(range(total))
    while pending:
        ready = [m for m in pending if all(version[s][m] < len(weights[s]) for s in range(S))]
        if not ready:
            raise RuntimeError("weight-stashing emulation is stuck: a forward needs a version never produced")
        for m in ready:
            params = [{k: v.clone().requires_grad_(True) for k, v in weights[s][version[s][m]].items()} for s in range(S)]
            x, target = microbatch_data(spec, m)
            for s in range(S):
                x = functional_call(modules[s], params[s], (x,))
            loss = stage_loss(x, target, g)
            flat = [p for ps in params for p in ps.values()]
            grads = iter(torch.autograd.grad(loss, flat))
            u = m // g
            for s in range(S):
                step = {k: next(grads) for k in params[s]}
                if u in acc[s]:
                    for k in step:
                        acc[s][u][k] += step[k]
                else:
                    acc[s][u] = step
                count[s][u] = count[s].get(u, 0) + 1
                if count[s][u] == g:  # update u of stage s: version u + 1
                    assert len(weights[s]) == u + 1, "updates of a stage complete in order"
                    weights[s].append({k: w - spec.lr * acc[s][u][k] for k, w in weights[s][u].items()})
        pending = [m for m in pending if m not in ready]
    return {s: weights[s][-1] for s in range(S)}


def max_difference(a: dict[int, dict], b: dict[int, dict]) -> tuple[float, float]:
    """(largest absolute difference, largest difference relative to the largest |b|) over every stage's tensors."""
    worst, scale = 0.0, 0.0
    for s in b:
        for k, ref in b[s].items():
            worst = max(worst, float((a[s][k].float() - ref.float()).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    return worst, worst / scale if scale else worst
