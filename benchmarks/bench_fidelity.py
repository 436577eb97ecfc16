"""Predicted against published: the estimate and the simulator on the runs of Megatron-LM's papers.

    .venv/bin/python benchmarks/bench_fidelity.py            # the table, with the size-aware compute model
    .venv/bin/python benchmarks/bench_fidelity.py --mfu 0.5  # the same with one constant efficiency, for contrast

For every row of :data:`sim.model.published_runs.PUBLISHED_RUNS` (Narayanan et al. 2021 Table 1; MT-NLG 530B),
with the configuration its authors ran (micro-batch size, interleaving, data-parallel implementation: the paper's
launch script) and the runtime that ran it (:class:`sim.model.published_runs.Framework`):

1. estimate the per-stage costs on the ``a100-80gb`` preset as the runs used it (:func:`~sim.model.published_runs.
   a100_2021`: the GEMM efficiency of their CUDA 11 software, HBM and NVLink at the rates kernels and NCCL reach,
   each from a cited measurement), blocks split evenly as the 2021 runtimes split them;
2. add what the runtime adds: the per-micro-batch gradient accumulation (memory bound, into W) and, without
   Megatron's scatter/gather, whole activations on the pipeline links;
3. simulate the schedule the row ran (1F1B, or interleaved 1F1B with its chunks) with M = global batch / (d x b)
   micro-batches on the pipeline's links, under the runtime's p2p semantics; a DeepSpeed row instead runs its
   engine's own step stream (:mod:`sim.model.deepspeed_pipeline`: TrainSchedule, paired blocking broadcasts);
4. add the tied embedding's gradient all-reduce between the end stages, the data-parallel gradient all-reduce (after the flush, or the part PyTorch DDP's buckets leave exposed)
   and the optimizer step, and compare with the paper: teraFLOP/s per GPU as the paper counts it, or the
   iteration time. No row is tuned.

Deterministic (no timing of this machine), so ``tests/test_estimate_fidelity.py`` asserts the same figures.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from sim import schedules
from sim.model.deepspeed_pipeline import execute as deepspeed_execute
from sim.model.efficiency import optimizer_step_time
from sim.model.estimate import Parallelism, data_parallel_sync_time, estimate, pipeline_hardware, tp_allreduce_time
from sim.model.published_runs import (GEMM_EFFICIENCY_2021, HBM_EFFICIENCY, NCCL_NVLINK_EFFICIENCY, PUBLISHED_RUNS,
                                      PublishedRun, a100_2021, gpt_model, paper_flops)
from sim.search.gradient_sync import exposed_gradient_sync
from sim.simulate import simulate


def runtime_costs(costs, run: PublishedRun, gpu, microbatches: int):
    """*costs* with what *run*'s framework adds: gradient accumulation after every micro-batch but the first
    (memory bound, on W; averaged over the M micro-batches so the iteration's sum is exact); whole activations on
    the links without scatter/gather, or the receiver's all-gather with it; the recompute inside B."""
    fw, dtype_bytes = run.framework, 2
    share = (microbatches - 1) / microbatches
    weight = [w + fw.grad_accumulation_bytes * (wb / dtype_bytes) / gpu.hbm_bandwidth * share
              for w, wb in zip(costs.weight, costs.weight_bytes)]
    send = list(costs.send_bytes) if fw.scatter_gather else [b * run.tensor for b in costs.send_bytes]
    forward, backward = list(costs.forward), list(costs.backward)
    if fw.scatter_gather and run.tensor > 1:
        # the receiver all-gathers the t pieces over NVLink before it computes (Narayanan et al. section 4.1): a
        # ring all-gather of the whole s b h tensor, (t-1)/t of it through each link (Patarasuk & Yuan 2009)
        bandwidth, latency = gpu.link(cross_node=False)
        whole = costs.send_bytes[0] * run.tensor
        gather = (run.tensor - 1) * (latency + whole / run.tensor / bandwidth)
        S = len(forward)
        forward = [f + (gather if s > 0 else 0.0) for s, f in enumerate(forward)]  # its activation came in
        backward = [b + (gather if s < S - 1 else 0.0) for s, b in enumerate(backward)]  # its gradient came in
        if fw.output_restore_gather:  # DeepSpeed also re-gathers its own output before the backward
            backward = [b + (gather if s < S - 1 else 0.0) for s, b in enumerate(backward)]
    # the recomputed forward runs inside the backward call, once its gradient has arrived (Megatron's
    # CheckpointFunction.backward, megatron/mpu/random.py; DeepSpeed's activation_checkpointing/checkpointing.py):
    # part of B, never ahead of it in a bubble as a separate R could
    backward = [b + r for b, r in zip(backward, costs.recompute)]
    return replace(costs, forward=forward, backward=backward, weight=weight, send_bytes=send,
                   recompute=[0.0] * len(backward))


def tied_embedding_sync_time(run: PublishedRun, gpu, model) -> float:
    """The all-reduce of the tied word embedding's gradient between the first and the last stage, once per
    iteration after the flush: Megatron-LM 2021 ``train_step`` ("All-reduce word_embeddings' grad across first
    and last stages", megatron/training.py) and DeepSpeed's ``ReduceTiedGrads`` (pipe/engine.py
    ``_exec_reduce_tied_grads`` -> ``PipelineModule.allreduce_tied_weight_gradients``). Each of the t ranks holds
    V h / t of it in 16 bits; the two stages are on different nodes. Nothing without pipelining."""
    if run.pipeline == 1:
        return 0.0
    bw, lat = gpu.link(cross_node=True)
    return tp_allreduce_time(model.vocab * model.hidden / run.tensor * model.dtype_bytes, 2, bw, lat)


def predict(run: PublishedRun, *, mfu: float | None = None) -> dict:
    """The prediction of one published row: iteration time (s), teraFLOP/s per GPU, and their errors."""
    gpu = a100_2021()
    model = gpt_model(run)
    v, M = run.chunks, run.microbatches
    par = Parallelism(tensor=run.tensor, pipeline=run.pipeline, chunks=v, data=run.data,
                      microbatch_size=run.microbatch_size, recompute="full")
    stages = run.pipeline * v
    est = estimate(model, gpu, par, efficiency=mfu, layers_per_stage=[run.layers // stages] * stages)
    costs = runtime_costs(est.costs, run, gpu, M)
    if v > 1:  # no R actions: the recompute is in B (runtime_costs)
        schedule = schedules.generate("interleaved-1f1b", run.pipeline, M, chunks=v)
    else:
        schedule = schedules.generate("1f1b", run.pipeline, M)
    # blocking sends as the sending device's time (Hardware.overlap); the engines' own links otherwise. Not the
    # "megatron" runtime profile: its lowering puts each recompute behind the blocking receive of its gradient
    # and then stalls the 1F1B steady state (121.5 s against 97.2 s of work for the 1T row), which Megatron's
    # measured bubble, (p - 1) / M of the ideal (Narayanan et al. section 2.2.1), does not show
    hardware = replace(pipeline_hardware(gpu, par), overlap=not run.framework.blocking_p2p)
    result = simulate(schedule, costs, hardware)
    runtime = "blocking sends" if run.framework.blocking_p2p else "overlapped sends"
    pipeline = result.metrics.makespan
    if run.framework.engine == "deepspeed":
        # DeepSpeed's TrainSchedule step stream, its broadcasts paired and one after the other
        # (sim/model/deepspeed_pipeline.py); BackwardPass is the whole backward (B + W, the recompute inside)
        transfer = [run.framework.messages_per_exchange * hardware.latency[s][s + 1]
                    + costs.send_bytes[s] / hardware.bandwidth[s][s + 1]
                    for s in range(run.pipeline - 1)]
        timing = deepspeed_execute(list(costs.forward), [b + w for b, w in zip(costs.backward, costs.weight)],
                                   transfer, M)
        pipeline, runtime = timing.makespan, "DeepSpeed TrainSchedule, paired blocking broadcasts"
    device_grads = [sum(costs.grad_bytes[s] for s in range(d, stages, run.pipeline)) for d in range(run.pipeline)]
    if run.framework.dp_overlap:
        bw, lat = gpu.link(cross_node=run.tensor * run.data > gpu.gpus_per_node)
        sync = exposed_gradient_sync(result, list(costs.grad_bytes), data=run.data, bandwidth=bw, latency=lat,
                                     bucket_bytes=run.framework.dp_bucket_bytes, distributed_optimizer=False).exposed
    else:
        sync = data_parallel_sync_time(max(device_grads), par, gpu)
    step = optimizer_step_time(gpu, max(device_grads) / model.dtype_bytes)
    tied = tied_embedding_sync_time(run, gpu, model)
    iteration = pipeline + sync + tied + step
    tflops = paper_flops(run) / (iteration * run.gpus) / 1e12
    row = {"source": run.source, "run": run.label, "t": run.tensor, "p": run.pipeline, "d": run.data, "v": v,
           "b": run.microbatch_size, "M": M, "framework": run.framework.name, "runtime": runtime,
           "pipeline_s": pipeline, "simulated_1f1b_s": result.metrics.makespan, "dp_sync_s": sync,
           "tied_sync_s": tied, "optimizer_s": step,
           "iteration_s": iteration, "tflops_per_gpu": tflops, "efficiency": est.efficiency}
    if run.tflops_per_gpu is not None:
        row["published"] = run.tflops_per_gpu
        row["error"] = tflops / run.tflops_per_gpu - 1
        row["metric"] = "TFLOP/s per GPU"
    else:
        row["published"] = run.iteration_time
        row["error"] = iteration / run.iteration_time - 1
        row["metric"] = "iteration s"
    return row


def table(*, mfu: float | None = None) -> list[dict]:
    return [predict(run, mfu=mfu) for run in PUBLISHED_RUNS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, default=None, help="a constant efficiency instead of the compute model")
    args = parser.parse_args()
    t0 = time.perf_counter()
    rows = table(mfu=args.mfu)
    if args.mfu is None:
        model = (f"size-aware compute model; a100-80gb preset with 2021's GEMM efficiency {GEMM_EFFICIENCY_2021:.3f}, "
                 f"HBM at {HBM_EFFICIENCY:.0%} and NVLink collectives at {NCCL_NVLINK_EFFICIENCY:.0%}")
    else:
        model = f"constant efficiency {args.mfu}, a100-80gb preset"
    print(f"predicted vs published ({model})")
    print(f"  {'run':<24} {'t':>2} {'p':>3} {'v':>2} {'d':>3} {'b':>3} {'M':>5}  {'metric':<16} {'predicted':>9} "
          f"{'published':>9} {'error':>7}   pipeline + DP sync + tied emb. + optimizer (s)")
    for r in rows:
        value = r["tflops_per_gpu"] if r["metric"] != "iteration s" else r["iteration_s"]
        print(f"  {r['run']:<24} {r['t']:>2} {r['p']:>3} {r['v']:>2} {r['d']:>3} {r['b']:>3} {r['M']:>5}  "
              f"{r['metric']:<16} {value:>9.1f} {r['published']:>9.1f} {r['error']:>+7.1%}   "
              f"{r['pipeline_s']:.2f} + {r['dp_sync_s']:.2f} + {r['tied_sync_s']:.2f} + {r['optimizer_s']:.2f}")
    errors = [abs(r["error"]) for r in rows]
    within = sum(e <= 0.10 for e in errors)
    print(f"  {within} of {len(rows)} rows within 10%; mean |error| {sum(errors) / len(errors):.1%}, "
          f"worst {max(errors):.1%}")
    print(f"  ({time.perf_counter() - t0:.1f} s to compute; load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
