"""Predicted against published: the estimate and the simulator on the runs of Megatron-LM's papers.

    .venv/bin/python benchmarks/bench_fidelity.py            # the table, with the default size-aware compute model
    .venv/bin/python benchmarks/bench_fidelity.py --mfu 0.5  # the same with one constant efficiency, for contrast

For every row of :data:`sim.model.published_runs.PUBLISHED_RUNS` (Narayanan et al. 2021 Table 1; MT-NLG 530B):
estimate the per-stage costs on the ``a100-80gb`` preset (:func:`sim.model.estimate.estimate`), simulate the
1F1B schedule with the row's M = global batch / data-parallel degree micro-batches on the pipeline's links, add the
data-parallel gradient all-reduce after the flush (these 2021 runs did not overlap it) and the optimizer step,
and compare with the paper: teraFLOP/s per GPU counted as the paper counts it, or the iteration time. The
configuration rules shared by all rows are in :mod:`sim.model.published_runs`; no row is tuned.

Deterministic (no timing of this machine), so ``tests/test_estimate_fidelity.py`` asserts the same figures.
"""

from __future__ import annotations

import argparse
import os
import time

from sim import schedules
from sim.model.efficiency import optimizer_step_time
from sim.model.estimate import Parallelism, data_parallel_sync_time, estimate, pipeline_hardware
from sim.model.gpus import get_gpu
from sim.model.published_runs import PUBLISHED_RUNS, PublishedRun, gpt_model, paper_flops
from sim.simulate import simulate


def predict(run: PublishedRun, *, mfu: float | None = None) -> dict:
    """The prediction of one published row: iteration time (s), teraFLOP/s per GPU, and their errors."""
    gpu = get_gpu("a100-80gb")
    model = gpt_model(run)
    par = Parallelism(tensor=run.tensor, pipeline=run.pipeline, data=run.data, microbatch_size=1, recompute="full")
    est = estimate(model, gpu, par, efficiency=mfu)
    M = run.global_batch // run.data
    schedule = schedules.generate("1f1b", run.pipeline, M, recompute=True)
    result = simulate(schedule, est.costs, pipeline_hardware(gpu, par))
    grads = max(est.costs.grad_bytes)  # one stage per device in 1F1B: the busiest device's gradients
    params = max(est.costs.weight_bytes) / model.dtype_bytes
    sync = data_parallel_sync_time(grads, par, gpu)
    step = optimizer_step_time(gpu, params)
    iteration = result.metrics.makespan + sync + step
    tflops = paper_flops(run) / (iteration * run.gpus) / 1e12
    row = {"source": run.source, "run": run.label, "t": run.tensor, "p": run.pipeline, "d": run.data, "M": M,
           "pipeline_s": result.metrics.makespan, "dp_sync_s": sync, "optimizer_s": step,
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
    model = "size-aware compute model" if args.mfu is None else f"constant efficiency {args.mfu}"
    print(f"predicted vs published ({model}, a100-80gb preset)")
    print(f"  {'run':<24} {'t':>2} {'p':>3} {'d':>3} {'M':>5}  {'metric':<16} {'predicted':>9} {'published':>9} "
          f"{'error':>7}   pipeline + DP sync + optimizer (s)")
    for r in rows:
        value = r["tflops_per_gpu"] if r["metric"] != "iteration s" else r["iteration_s"]
        print(f"  {r['run']:<24} {r['t']:>2} {r['p']:>3} {r['d']:>3} {r['M']:>5}  {r['metric']:<16} {value:>9.1f} "
              f"{r['published']:>9.1f} {r['error']:>+7.1%}   {r['pipeline_s']:.2f} + {r['dp_sync_s']:.2f} + "
              f"{r['optimizer_s']:.2f}")
    errors = [abs(r["error"]) for r in rows]
    within = sum(e <= 0.10 for e in errors)
    print(f"  {within} of {len(rows)} rows within 10%; mean |error| {sum(errors) / len(errors):.1%}, "
          f"worst {max(errors):.1%}")
    print(f"  ({time.perf_counter() - t0:.1f} s to compute; load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
