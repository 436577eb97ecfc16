"""Validator benchmarks: prediction accuracy, and our executor's overhead against PyTorch's own runtime.

    python benchmarks/bench_validate.py                 # everything (a few minutes on 2 cores)
    python benchmarks/bench_validate.py --only accuracy
    python benchmarks/bench_validate.py --only overhead --width 512 --devices 2 --microbatches 4

(a) accuracy: |measured - predicted| / predicted makespan, the prediction being
    ``sim.simulate`` with the calibrated costs. Emulated workload, K=4, M=8, GPipe and
    1F1B (target <= 5%); mlp workload, K=2, one torch thread per rank (target <= 10%).
(b) overhead: iteration time of our executor against ``torch.distributed.pipelining``
    (``PipelineStage`` with ``ScheduleGPipe`` / ``Schedule1F1B``) on the same stage
    modules, K, M and backend; ratio ours / PyTorch (target <= 1.10). Both run
    ``--iterations`` iterations back to back after one warm-up iteration; time per
    iteration = (last end - first start) / iterations on the host clock.

Figures are printed, never asserted: on a shared machine they move with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def accuracy(args) -> None:
    from validate import run_validation
    print("(a) accuracy: makespan error of the prediction (calibrated costs + ping-pong link fit)")
    print(f"{'workload':<10} {'schedule':<8} {'K':>2} {'M':>3} {'predicted ms':>13} {'measured ms':>12} {'error':>8}  target")
    cases = [("emulated", "gpipe", 4, 8, {}), ("emulated", "1f1b", 4, 8, {}),
             ("mlp", "gpipe", 2, 8, {"width": args.width, "depth": args.depth, "batch": args.batch}),
             ("mlp", "1f1b", 2, 8, {"width": args.width, "depth": args.depth, "batch": args.batch})]
    for workload, name, K, M, opts in cases:
        if args.workload and workload != args.workload:
            continue
        r = run_validation(name, K, M, workload=workload, output_dir=None, timeout=600, workload_options=opts)
        d = r.to_dict()
        target = 0.05 if workload == "emulated" else 0.10
        flag = "ok" if abs(d["makespan_error"]) <= target else "MISSED"
        print(f"{workload:<10} {name:<8} {K:>2} {M:>3} {d['predicted_makespan'] * 1e3:>13.2f} "
              f"{d['measured_makespan'] * 1e3:>12.2f} {d['makespan_error']:>+8.1%}  <= {target:.0%} {flag}"
              + ("  (compute emulated)" if workload == "emulated" else "")
              + f"  [action time measured/calibrated: {_duration_ratio(r)}]")


def _duration_ratio(report) -> str:
    """Mean measured duration of F and B over their calibrated cost: where a makespan error comes from."""
    from sim.timeline import compute_rows
    comp = compute_rows(report.measured.timeline)
    pred = compute_rows(report.predicted.timeline)
    out = []
    for op in ("F", "B"):
        m = (comp.loc[comp["op"] == op, "end"] - comp.loc[comp["op"] == op, "start"]).mean()
        p = (pred.loc[pred["op"] == op, "end"] - pred.loc[pred["op"] == op, "start"]).mean()
        out.append(f"{op} {m / p:.2f}")
    return ", ".join(out)


# ------------------------------------------------------------------------------- PyTorch's runtime
def _torch_worker(argv: list[str]) -> None:
    """One rank of torch.distributed.pipelining on our stage modules; rank 0 prints seconds per iteration."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from validate.workloads import WorkloadSpec, build_stage_module, microbatch_data
    p = argparse.ArgumentParser()
    p.add_argument("--schedule"), p.add_argument("--microbatches", type=int), p.add_argument("--iterations", type=int)
    p.add_argument("--width", type=int), p.add_argument("--depth", type=int), p.add_argument("--batch", type=int)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    spec = WorkloadSpec(name="mlp", width=a.width, depth=a.depth, batch=a.batch)
    module = build_stage_module(spec, rank)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[a.schedule]
    sched = cls(stage, a.microbatches, loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
    data = [microbatch_data(spec, m) for m in range(a.microbatches)]
    x = torch.cat([d[0] for d in data])
    target = torch.cat([d[1] for d in data])
    opt = torch.optim.SGD(module.parameters(), lr=spec.lr)

    def step():
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=target)
        else:
            sched.step()
        opt.step()
        opt.zero_grad()

    step()  # warm-up (shape inference, allocations)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.iterations):
        step()
    t1 = time.perf_counter()
    spans = [None] * world
    dist.all_gather_object(spans, (t0, t1))
    if rank == 0:
        print((max(s[1] for s in spans) - min(s[0] for s in spans)) / a.iterations, flush=True)
    dist.destroy_process_group()


def _torch_iteration(name: str, K: int, M: int, args) -> float:
    from validate.comm import free_port
    port = str(free_port())
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(K):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(K), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
            out = open(Path(tmp) / f"{r}.out", "w")
            procs.append((subprocess.Popen([sys.executable, __file__, "--torch-worker", "--schedule", name,
                                            "--microbatches", str(M), "--iterations", str(args.iterations),
                                            "--width", str(args.width), "--depth", str(args.depth),
                                            "--batch", str(args.batch)], env=env, stdout=out), out))
        try:
            for p, out in procs:
                p.wait(timeout=600)
                out.close()
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p, _ in procs):
            raise RuntimeError("a torch.distributed.pipelining rank failed")
        return float((Path(tmp) / "0.out").read_text().split()[-1])


def overhead(args) -> None:
    from validate import run_validation
    K, M = args.devices, args.microbatches
    print(f"(b) overhead: seconds per iteration, ours vs torch.distributed.pipelining (gloo, K={K}, M={M}, "
          f"mlp width {args.width} depth {args.depth} batch {args.batch}, {args.iterations} iterations, "
          f"median of {args.repeats})")
    print(f"{'schedule':<8} {'ours ms':>9} {'PyTorch ms':>11} {'ratio':>7}  target")
    opts = {"width": args.width, "depth": args.depth, "batch": args.batch}
    for name in ("gpipe", "1f1b"):
        ours, theirs = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            r = run_validation(name, K, M, workload="mlp", iterations=args.iterations, output_dir=None, timeout=600,
                               workload_options=opts)
            ours.append(r.measured.metrics.makespan / args.iterations)
            theirs.append(_torch_iteration(name, K, M, args))
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"{name:<8} {o * 1e3:>9.2f} {t * 1e3:>11.2f} {o / t:>7.2f}  <= 1.10 {'ok' if o / t <= 1.10 else 'MISSED'}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--torch-worker"]:
        _torch_worker(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("accuracy", "overhead"))
    p.add_argument("--workload", choices=("emulated", "mlp"), help="accuracy: only this workload")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    if args.only in (None, "accuracy"):
        accuracy(args)
    if args.only in (None, "overhead"):
        overhead(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
