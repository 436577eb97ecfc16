"""DP x PP on real processes: D copies of a K-stage GPipe pipeline on CPU with gloo, real all-reduce.

    python -m validate.dp                                   # 2 stages x 2 replicas, 4 micro-batches
    python -m validate.dp --stages 2 --replicas 2 --microbatches 4 --forward 0.02 --backward 0.04 --json

What runs: D x K processes; rank d*K + s is stage s of pipeline copy d (the layout
of :mod:`sim.replication`). Each rank walks its action list of
``schedules.gpipe(K, M)`` literally: F receives the activation from the previous
stage (gloo send/recv), runs a real ``Linear + Tanh`` stage and sends its output
on; B runs the real backward and sends the input gradient back; before U the
rank all-reduces its weight gradients with the other copies of its stage
(``torch.distributed.all_reduce`` on a per-stage group: the real collective),
then takes an SGD step. Compute time is emulated: every F and B waits (sleeps) until
``--forward`` / ``--backward`` seconds have passed (the real work is far
shorter), so the timeline can be predicted from those costs.

What is checked: (1) the all-reduced gradients equal those of one-process
training of the whole model on all D x M micro-batches (loss averaged over the
global batch); (2) the measured timeline against
:func:`sim.replication.simulate_replicated` with the same costs and the link
latency and bandwidth measured by ping-pong in the same run (makespan and
per-action start errors, reported, not asserted).

Calls torch.distributed directly (this module is its own small launcher; the
pipeline validator's wrapper, :mod:`validate.comm`, serves the single-pipeline case).
Units: seconds, bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sim import schedules
from sim.cost import StageCosts
from sim.hardware import Hardware
from sim.ir import ActionKind
from sim.replication import Replication, simulate_replicated

__all__ = ["run_dp_validation", "reference_grads", "main"]

clock = time.perf_counter  # CLOCK_MONOTONIC: one clock for every process of this host


def _stage(width: int, stage: int) -> torch.nn.Module:
    torch.manual_seed(1000 + stage)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())


def _data(width: int, batch: int, copy: int, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(copy * 100_003 + mb)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def _wait_until(t_end: float) -> None:
    """The emulated device: a timed wait (sleeping, so 4 ranks on 2 cores do not starve each other)."""
    delay = t_end - clock()
    if delay > 0:
        time.sleep(delay)


def _rank_main(rank: int, cfg: dict, port: int, out: str) -> None:
    K, D, M, width, batch = cfg["stages"], cfg["replicas"], cfg["microbatches"], cfg["width"], cfg["batch"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=K * D, timeout=timedelta(seconds=cfg["timeout"]))
    copy, s = divmod(rank, K)
    groups = [dist.new_group([c * K + q for c in range(D)]) for q in range(K)]  # every rank creates every group
    model = _stage(width, s)
    params = list(model.parameters())
    schedule = schedules.gpipe(K, M)
    scale = 1.0 / (D * M * batch * width)  # global mean of the squared error

    # ping-pong between ranks 0 and 1 for the link model (latency + bytes / bandwidth)
    ping = []
    if rank in (0, 1):
        for size in (1, 1 << 14, 1 << 18):
            buf = torch.zeros(size)
            times = []
            for _ in range(8):
                t0 = clock()
                if rank == 0:
                    dist.send(buf, 1), dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0), dist.send(buf, 0)
                times.append((clock() - t0) / 2)
            ping.append((size * 4, float(np.median(times[2:]))))
    # warm-up: autograd's first backward and the group's first all-reduce are slow; keep them out of the trace
    for _ in range(2):
        y = model(torch.randn(batch, width, requires_grad=s > 0))  # the same graph shape as the traced B
        y.backward(torch.randn_like(y))
        dist.all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), group=groups[s])
    for p in params:
        p.grad = None
    dist.barrier()
    t_start = clock()
    rows, kept = [], {}
    for a in schedule.actions[s]:
        if a.kind is ActionKind.F:
            x = torch.empty(batch, width)
            if s == 0:
                x, _ = _data(width, batch, copy, a.mb)
            else:
                dist.recv(x, rank - 1)
            t0 = clock()
            x.requires_grad_(s > 0)
            y = model(x)
            _wait_until(t0 + cfg["forward"])
            rows.append((rank, s, a.mb, "F", t0, clock()))
            kept[a.mb] = (x, y)
            if s < K - 1:
                dist.send(y.detach(), rank + 1)
        elif a.kind is ActionKind.B:
            x, y = kept.pop(a.mb)
            if s == K - 1:
                grad = None
            else:
                grad = torch.empty(batch, width)
                dist.recv(grad, rank + 1)
            t0 = clock()
            if grad is None:
                _, target = _data(width, batch, copy, a.mb)
                ((y - target) ** 2).sum().mul(scale).backward()
            else:
                y.backward(grad)
            _wait_until(t0 + cfg["backward"])
            rows.append((rank, s, a.mb, "B", t0, clock()))
            if s > 0:
                dist.send(x.grad, rank - 1)
        elif a.kind is ActionKind.U:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            t0 = clock()
            dist.all_reduce(flat, group=groups[s])  # the real collective among the D copies of stage s
            rows.append((rank, s, a.mb, "ALLREDUCE", t0, clock()))
            grads = flat.clone()
            t0 = clock()
            with torch.no_grad():
                offset = 0
                for p in params:
                    n = p.numel()
                    p -= 0.05 * flat[offset:offset + n].view_as(p)
                    offset += n
            rows.append((rank, s, a.mb, "U", t0, clock()))
    torch.save({"rank": rank, "rows": rows, "t_start": t_start, "grads": grads, "ping": ping,
                "param_bytes": float(sum(p.numel() * p.element_size() for p in params))},
               Path(out) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def reference_grads(*, stages: int, replicas: int, microbatches: int, width: int, batch: int) -> list[torch.Tensor]:
    """One process, the whole model, all D x M micro-batches: the flat weight gradient of every stage."""
    model = torch.nn.Sequential(*[_stage(width, s) for s in range(stages)])
    scale = 1.0 / (replicas * microbatches * batch * width)
    for copy in range(replicas):
        for mb in range(microbatches):
            x, target = _data(width, batch, copy, mb)
            ((model(x) - target) ** 2).sum().mul(scale).backward()
    return [torch.cat([p.grad.reshape(-1) for p in stage.parameters()]) for stage in model]


def _fit_link(ping: list[tuple[float, float]]) -> tuple[float, float]:
    sizes, times = np.array([p[0] for p in ping]), np.array([p[1] for p in ping])
    slope, intercept = np.polyfit(sizes, times, 1)
    return max(float(intercept), 0.0), (1.0 / slope if slope > 0 else float("inf"))


def run_dp_validation(*, stages: int = 2, replicas: int = 2, microbatches: int = 4, forward: float = 0.02,
                      backward: float = 0.04, width: int = 64, batch: int = 8, timeout: float = 120.0) -> dict:
    """Run DP x PP for real, check gradients, and compare the timeline with the prediction."""
    from validate.comm import free_port

    cfg = {"stages": stages, "replicas": replicas, "microbatches": microbatches, "forward": forward,
           "backward": backward, "width": width, "batch": batch, "timeout": timeout}
    with tempfile.TemporaryDirectory(prefix="pipesim-dp-") as out:
        mp.spawn(_rank_main, args=(cfg, free_port(), out), nprocs=stages * replicas, join=True)
        ranks = [torch.load(Path(out) / f"rank{r}.pt") for r in range(stages * replicas)]

    # (1) gradients against one-process training
    ref = reference_grads(stages=stages, replicas=replicas, microbatches=microbatches, width=width, batch=batch)
    grad_error = max(float((r["grads"] - ref[r["rank"] % stages]).abs().max()) for r in ranks)
    grad_scale = max(float(g.abs().max()) for g in ref)

    # (2) the measured timeline against the prediction
    t0 = min(r["t_start"] for r in ranks)
    measured = pd.DataFrame([row for r in ranks for row in r["rows"]],
                            columns=["device", "stage", "microbatch", "op", "start", "end"])
    measured[["start", "end"]] -= t0
    latency, bandwidth = _fit_link(ranks[0]["ping"])
    K, N = stages, stages * replicas
    costs = StageCosts(forward=[forward] * K, backward=[backward] * K, send_bytes=[batch * width * 4.0] * K,
                       grad_bytes=[ranks[s]["param_bytes"] for s in range(K)],
                       update=[float(measured[(measured.op == "U") & (measured.stage == s)].eval("end - start").mean())
                               for s in range(K)])
    run = simulate_replicated(schedules.gpipe(K, microbatches), costs, Replication(data_parallel=replicas),
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
        "compute": f"emulated: F waits {forward} s, B {backward} s (real Linear+Tanh underneath)",
        "grad_max_abs_error": grad_error, "grad_max_abs": grad_scale,
        "grads_match": grad_error <= 1e-5 * max(1.0, grad_scale),
        "link_latency": latency, "link_bandwidth": bandwidth,
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
    p.add_argument("--forward", type=float, default=0.02, help="emulated F seconds (default 0.02)")
    p.add_argument("--backward", type=float, default=0.04, help="emulated B seconds (default 0.04)")
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
    print(f"  link (ping-pong fit): latency {r['link_latency']:.3g} s, bandwidth {r['link_bandwidth']:.3g} B/s")
    print(f"  makespan: measured {r['measured_makespan']:.4g} s, predicted {r['predicted_makespan']:.4g} s "
          f"({r['makespan_relative_error']:.1%} off)")
    print(f"  action starts: mean |error| {r['action_start_error_mean'] * 1e3:.2f} ms, max "
          f"{r['action_start_error_max'] * 1e3:.2f} ms over {r['actions_compared']} actions")
    print(f"  all-reduce: measured {r['measured_allreduce_seconds'] * 1e3:.2f} ms, predicted "
          f"{r['predicted_allreduce_seconds'] * 1e3:.2f} ms (mean per stage)")
    return 0 if r["grads_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
