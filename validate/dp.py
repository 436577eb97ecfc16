"""DP x PP on real processes: D copies of a K-stage GPipe pipeline, real all-reduce, through the one validator.

    python -m validate.dp                                   # 2 stages x 2 replicas, 4 micro-batches
    python -m validate.dp --stages 2 --replicas 2 --microbatches 4 --forward 0.02 --backward 0.04 --json

What runs: D x K processes started by :func:`validate.launch.launch` (the launcher of
``pipesim validate``: same clean-up on failure, SIGTERM and parent death); rank d*K + p
is device p of pipeline copy d (the layout of :mod:`sim.engines.replication`). Every rank is
the validator's worker running :class:`validate.rank.executor.Executor` on its action list of
``schedules.gpipe(K, M)`` over :class:`validate.rank.comm.Comm` (a
:class:`validate.rank.comm.PipelineView` shifts device numbers to the copy's ranks); copy d
trains on micro-batches d*M .. d*M+M-1. Stages are the real ``mlp`` workload (Linear +
GELU); :class:`validate.rank.replicated.ReplicatedStage` wraps each one: before U it all-reduces the update's
gradient with the other copies of its stage (``Comm.all_reduce`` on a per-stage group,
the real collective; sum / D = the global mean), and it pads F and B with a wait up to
``--forward`` / ``--backward`` seconds, so the times are predictable while the
gradients stay real.

What is checked: (1) the all-reduced gradients equal those of one-process training of
the whole model on all D x M micro-batches (loss averaged over the global batch;
:func:`validate.correctness.reference.reference_grads`, float64); (2) the measured timeline, from the
validator's tracer, against :func:`sim.engines.replication.simulate_replicated` with the same
costs plus the executor overhead per action measured in the warm-up run (as
:func:`validate.run_validation` adds it) and the link fitted to the validator's ping-pong
(makespan and per-action start errors, reported, not asserted). Units: seconds, bytes.
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd
import torch

from sim.core.ir import ActionKind, decode_key


__all__ = ["run_dp_validation", "main"]


def _measured(ranks, stages: int) -> pd.DataFrame:
    """F, B, U and ALLREDUCE rows of every rank (device = global rank); U starts after its all-reduce."""
    rows = []
    for r in ranks:
        reduced = {s: (a, b) for s, a, b in r.allreduces}
        for key, start, end in r.traces[0].compute:
            s, kind, mb = decode_key(key, stages)
            op = list(ActionKind)[kind].value
            if op == "U" and s in reduced:
                a, b = reduced[s]
                rows.append((r.rank, s, mb, "ALLREDUCE", a, b))
                start = b
            rows.append((r.rank, s, mb, op, start, end))
    tl = pd.DataFrame(rows, columns=["device", "stage", "microbatch", "op", "start", "end"])
    t0 = tl["start"].min()
    tl[["start", "end"]] -= t0
    return tl


def run_dp_validation(*, stages: int = 2, replicas: int = 2, microbatches: int = 4, forward: float = 0.02,
                      backward: float = 0.04, width: int = 64, batch: int = 8, timeout: float = 120.0) -> dict:
    """Run DP x PP for real, check gradients, and compare the timeline with the prediction."""
    from sim import schedules
    from sim.model.cost import uniform
    from sim.model.hardware import Hardware
    from sim.engines.replication import Replication, simulate_replicated

    from validate.predict.calibrate import PING_SIZES, fit_link, with_overhead
    from validate.launch import launch
    from validate.correctness.reference import reference_grads
    from validate.request import Job, RunRequest, WorkloadSpec

    spec = WorkloadSpec(name="mlp", width=width, depth=1, batch=batch)
    schedule = schedules.gpipe(stages, microbatches)
    pad = uniform(stages, forward=forward, backward=backward, send_bytes=float(batch * width * 4))
    request = RunRequest(jobs=(Job(schedule=schedule, costs=pad),), workload=spec, timeout=timeout, warmup=1,
                         repeats=1, calibrate=False, replicas=replicas, pad=True)
    result = launch(request, timeout=timeout)
    ranks = sorted(result.jobs[0], key=lambda r: r.rank)

    # (1) gradients against one-process training on the global batch
    ref = reference_grads(spec, stages, replicas * microbatches)
    grad_error = max(float((r.grads[s][0][k] - ref[s][k]).abs().max()) for r in ranks for s in r.grads for k in ref[s])
    grad_scale = max(float(v.abs().max()) for s in ref for v in ref[s].values())

    # (2) the measured timeline against the prediction
    measured = _measured(ranks, stages)
    latency, bandwidth = fit_link(list(zip(PING_SIZES, ranks[0].calibration.ping)))
    N = stages * replicas
    step = measured[measured.op == "U"].eval("end - start").groupby(measured["stage"]).mean()
    param_bytes = float(sum(v.numel() * v.element_size() for v in ref[0].values()))
    costs = uniform(stages, forward=forward, backward=backward, send_bytes=float(batch * width * 4),
                    grad_bytes=param_bytes)
    costs = type(costs)(**dict(costs.to_dict(), update=[float(step.get(s, 0.0)) for s in range(stages)]))
    # the executor's own time around each action, measured in the warm-up run, as run_validation adds it
    per_copy: dict[int, dict[str, list[float]]] = {}
    for r in ranks:
        for s, cols in (r.calibration.action_overhead or {}).items():
            for col, seconds in cols.items():
                per_copy.setdefault(s, {}).setdefault(col, []).append(seconds)
    overhead = {s: {col: sum(v) / len(v) for col, v in cols.items()} for s, cols in per_copy.items()}
    costs = with_overhead(costs, overhead)
    run = simulate_replicated(schedule, costs, Replication(data_parallel=replicas),
                              Hardware(devices=N, latency=latency, bandwidth=bandwidth))
    pred = run.timeline[run.timeline["src"] < 0]
    keys = ["device", "stage", "microbatch", "op"]
    both = measured[measured.op != "ALLREDUCE"].merge(pred[keys + ["start", "end"]], on=keys,
                                                       suffixes=("_measured", "_predicted"))
    start_error = (both["start_measured"] - both["start_predicted"]).abs()
    measured_makespan = float(measured["end"].max())
    predicted_makespan = run.metrics.makespan
    ar = measured[measured.op == "ALLREDUCE"]
    return {
        "stages": stages, "replicas": replicas, "microbatches": microbatches, "processes": N, "backend": "gloo",
        "compute": f"padded: F waits until {forward} s, B {backward} s (a real Linear+GELU stage underneath)",
        "grad_max_abs_error": grad_error, "grad_max_abs": grad_scale,
        "grads_match": grad_error <= 1e-5 * max(1.0, grad_scale),
        "link_latency": latency, "link_bandwidth": bandwidth, "executor_overhead_per_stage_s": overhead,
        "measured_makespan": measured_makespan, "predicted_makespan": predicted_makespan,
        "makespan_relative_error": abs(measured_makespan - predicted_makespan) / predicted_makespan,
        "action_start_error_mean": float(start_error.mean()), "action_start_error_max": float(start_error.max()),
        "actions_compared": int(len(both)), "actions_measured": int((measured.op != "ALLREDUCE").sum()),
        "measured_allreduce_seconds": float((ar["end"] - ar["start"]).mean()),
        "predicted_allreduce_seconds": float((run.allreduces["end"] - run.allreduces["start"]).mean()),
        "measured_timeline": measured, "predicted_timeline": run.timeline,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m validate.dp", description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--forward", type=float, default=0.02, help="F padded to this many seconds (default 0.02)")
    p.add_argument("--backward", type=float, default=0.04, help="B padded to this many seconds (default 0.04)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run_dp_validation(stages=args.stages, replicas=args.replicas, microbatches=args.microbatches,
                          forward=args.forward, backward=args.backward)
    r.pop("measured_timeline"), r.pop("predicted_timeline")
    if args.json:
        print(json.dumps(r, indent=2))
        return 0 if r["grads_match"] else 1
    print(f"DP x PP: {r['stages']} stages x {r['replicas']} replicas = {r['processes']} gloo processes on CPU; "
          f"{r['compute']}")
    print(f"  gradients vs one-process training: max |diff| {r['grad_max_abs_error']:.3g} "
          f"(max |grad| {r['grad_max_abs']:.3g}) -> {'match' if r['grads_match'] else 'MISMATCH'}")
    print(f"  link (ping-pong fit): latency {r['link_latency']:.3g} s, bandwidth {r['link_bandwidth']:.3g} B/s; "
          "executor overhead per action (added to the prediction): "
          + "; ".join(f"stage {s} " + ", ".join(f"{c} {v * 1e6:.0f} us" for c, v in cols.items() if v)
                      for s, cols in sorted(r["executor_overhead_per_stage_s"].items())))
    print(f"  makespan: measured {r['measured_makespan']:.4g} s, predicted {r['predicted_makespan']:.4g} s "
          f"({r['makespan_relative_error']:.1%} off)")
    print(f"  action starts: mean |error| {r['action_start_error_mean'] * 1e3:.2f} ms, max "
          f"{r['action_start_error_max'] * 1e3:.2f} ms over {r['actions_compared']} actions")
    print(f"  all-reduce: measured {r['measured_allreduce_seconds'] * 1e3:.2f} ms, predicted "
          f"{r['predicted_allreduce_seconds'] * 1e3:.2f} ms (mean per stage)")
    return 0 if r["grads_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
