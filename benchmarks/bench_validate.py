"""Validator benchmarks: prediction accuracy against the noise floor, and our executor's overhead against PyTorch's.

    python benchmarks/bench_validate.py                      # everything (several minutes on 2 cores)
    python benchmarks/bench_validate.py --only accuracy
    python benchmarks/bench_validate.py --only accuracy --stress   # two CPU-burning processes beside it
    python benchmarks/bench_validate.py --only overhead --repeats 5

(a) accuracy, the targets of issue 10 (printed, never asserted), each row one
    ``run_validations`` report with ``--repeats`` timed runs (default 5), each run predicted from the
    run before it (the first from the last warm-up run; column ``warm-up``: the median error had every
    run been predicted from the warm-up run, as before this rolling prediction):
    - mlp and transformer (sized by the probe: a forward >= 10 ms), K=2, GPipe and 1F1B:
      median |error| <= 5% and p10-p90 within +-10%;
    - every registered schedule, mlp, K=2: median |error| <= 10%;
    - emulated, K=4, every registered schedule: median |error| <= 2%.
    A row is ``ok`` when it meets its target, ``noise`` when it does not but the report
    itself says the error is not significant (noise floor >= |error|: the report did not
    claim a wrong number), and ``MISSED`` when a confident report missed its target.
    With ``--stress`` every row must be ``ok`` or ``noise``.
(b) overhead: one training iteration of our executor (traced, as the validator runs it) against
    ``torch.distributed.pipelining`` (``PipelineStage`` with ``ScheduleGPipe`` / ``Schedule1F1B``)
    on the same stage modules, data, K, M and backend, in the same processes (same cores, threads,
    malloc settings), alternating; both timed the same way: a barrier, then each rank times its own
    part of the iteration, and the iteration takes the largest of those. Ratio of the medians of
    ``--repeats`` iterations per side (default 5; target <= 1.05).

Every table line carries the 1-minute load average (accuracy rows: before and after their launch); on a
shared machine figures move with it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def _burn(stop) -> None:  # one core's worth of pure Python arithmetic
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x += i * i


def _row(group: str, r, target: float, spread: float | None) -> str:
    d = r.to_dict()
    err, (lo, hi), noise = d["makespan_error"], d["makespan_error_range"], d["noise"]
    met = abs(err) <= target and (spread is None or (abs(lo) <= spread and abs(hi) <= spread))
    verdict = "ok" if met else ("noise" if not d["significant"] else "MISSED")
    return (f"{group:<12} {d['schedule']:<17} {d['devices']:>2} {d['microbatches']:>3} {d['predicted_makespan'] * 1e3:>9.1f} "
            f"{d['measured_makespan'] * 1e3:>9.1f} {err:>+7.1%} [{lo:+.1%}, {hi:+.1%}] {_warm(d):>7} {noise:>6.1%} "
            f"{str(d['significant']):>5}  <= {target:.0%}{'' if spread is None else f' (p10-p90 +-{spread:.0%})'} "
            f"{verdict}  [load {d['load_average'][0]:.2f} -> {d['load_average'][1]:.2f}; check {d['gradients_match']}]")


def _warm(d: dict) -> str:
    """The median error had every run been predicted from the last warm-up run ('-': one prediction for all)."""
    warm = d["makespan_error_from_warmup"]
    return "-" if warm is None else f"{warm:+.1%}"


def accuracy(args) -> None:
    from sim.schedules import registry as generators
    from validate import run_validations
    print("(a) accuracy: median makespan error of the prediction over the timed runs, its p10-p90, the noise floor")
    print(f"{'group':<12} {'schedule':<17} {'K':>2} {'M':>3} {'pred ms':>9} {'meas ms':>9} {'error':>7} "
          f"{'p10..p90':<18} {'warm-up':>7} {'noise':>6} {'sig':>5}  target")
    names = list(generators.names())
    groups = [("mlp", ["gpipe", "1f1b"], 2, 8, 0.05, 0.10, {}), ("transformer", ["gpipe", "1f1b"], 2, 8, 0.05, 0.10, {}),
              ("mlp", names, 2, 4, 0.10, None, {}), ("emulated", names, 4, 8, 0.02, None, {})]
    for workload, scheds, K, M, target, spread, opts in groups:
        if args.workload and workload != args.workload:
            continue
        label = f"{workload}" if spread is None or workload == "emulated" else f"{workload}*"
        for r in run_validations(scheds, K, M, workload=workload, output_dir=None, timeout=600, repeats=args.repeats,
                                 workload_options=opts or None):
            print(_row(label, r, target, spread), flush=True)
            if r.failed:
                print(f"    correctness: {r.check.summary()}", flush=True)
    print("(* = sized by the probe, gpipe/1f1b target with its p10-p90 bound; warm-up = the median error had every "
          "run been predicted from the last warm-up run, not each from the run before it)")


def _duration_ratio(report) -> str:
    """Mean measured duration of F and B over their calibrated cost: where a makespan error comes from."""
    from sim.results.timeline import compute_rows
    comp = compute_rows(report.measured.timeline)
    pred = compute_rows(report.predicted.timeline)
    out = []
    for op in ("F", "B"):
        m = (comp.loc[comp["op"] == op, "end"] - comp.loc[comp["op"] == op, "start"]).mean()
        p = (pred.loc[pred["op"] == op, "end"] - pred.loc[pred["op"] == op, "start"]).mean()
        out.append(f"{op} {m / p:.2f}")
    return ", ".join(out)


# ------------------------------------------------------------------- ours against PyTorch's runtime
def _pair_worker(argv: list[str]) -> None:
    """One rank that runs the same pipeline iteration with both runtimes, alternately, in one process.

    Same process, core, thread count, malloc settings, stage modules, data, K, M and gloo on both
    sides, and one clock: before every timed iteration all ranks meet at a barrier; each rank times
    the iteration from there to the end of its own part of it; the iteration's time is the largest
    over the ranks. The two runtimes alternate (and swap which goes first every round), so both see
    the same machine load. Rank 0 prints one JSON line: the per-iteration times of each side.
    """
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from sim import schedules
    from validate.rank.comm import Comm
    from validate.environment import keep_freed_memory
    from validate.rank.executor import Executor
    from validate.rank.tracing import Tracer
    from validate.rank.workloads import WorkloadSpec, build_stage_module, microbatch_data, rank_setup
    p = argparse.ArgumentParser()
    p.add_argument("--schedule"), p.add_argument("--microbatches", type=int), p.add_argument("--rounds", type=int)
    p.add_argument("--warmup", type=int), p.add_argument("--core", type=int, default=-1)
    p.add_argument("--width", type=int), p.add_argument("--depth", type=int), p.add_argument("--batch", type=int)
    a = p.parse_args(argv)
    if a.core >= 0:
        os.sched_setaffinity(0, {a.core})
    torch.set_num_threads(1)
    keep_freed_memory()
    comm = Comm.from_env("gloo", 600.0)  # the default group (PyTorch's side) plus our up/down groups
    rank, world, cpu = comm.rank, comm.world, torch.device("cpu")
    spec = WorkloadSpec(name="mlp", width=a.width, depth=a.depth, batch=a.batch)
    M = a.microbatches

    ours_schedule = schedules.generate(a.schedule, world, M)
    setup = rank_setup(spec, ours_schedule, rank, cpu)

    def ours() -> None:  # as the validator runs it: traced
        Executor(ours_schedule, rank, setup.runtimes, comm, Tracer(rank, cpu), inputs=setup.inputs,
                 message_shape=setup.message_shape, device=cpu).run()

    module = build_stage_module(spec, rank)
    stage = PipelineStage(module, rank, world, cpu)
    torch_schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[a.schedule](
        stage, M, loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
    data = [microbatch_data(spec, m) for m in range(M)]
    x, target = torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data])
    opt = torch.optim.SGD(module.parameters(), lr=spec.lr)

    def theirs() -> None:
        if rank == 0:
            torch_schedule.step(x)
        elif rank == world - 1:
            torch_schedule.step(target=target)
        else:
            torch_schedule.step()
        opt.step()
        opt.zero_grad()

    def timed(step) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        step()
        own = [time.perf_counter() - t0]
        everyone = [None] * world
        dist.all_gather_object(everyone, own)
        return max(e[0] for e in everyone)

    times = {"ours": [], "pytorch": []}
    for r in range(a.warmup + a.rounds):
        order = [("ours", ours), ("pytorch", theirs)]
        for name, step in order if r % 2 == 0 else order[::-1]:
            t = timed(step)
            if name == "ours":
                for rt in setup.runtimes.values():  # back to the first weights: not part of the iteration
                    rt.reset()
            if r >= a.warmup:
                times[name].append(t)
    if rank == 0:
        print(json.dumps(times), flush=True)
    comm.close()


def _pair_run(name: str, K: int, M: int, args) -> dict[str, list[float]]:
    import json

    from validate.rank.comm import free_port
    from validate.environment import pinning
    cores, _ = pinning(K, "gloo")
    port = str(free_port())
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(K):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(K), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
            out = open(Path(tmp) / f"{r}.out", "w")
            cmd = [sys.executable, __file__, "--pair-worker", "--schedule", name, "--microbatches", str(M),
                   "--rounds", str(args.repeats), "--warmup", str(args.warmup), "--width", str(args.width),
                   "--depth", str(args.depth), "--batch", str(args.batch),
                   "--core", str(cores[r] if cores else -1)]
            procs.append((subprocess.Popen(cmd, env=env, stdout=out, cwd=str(ROOT)), out))
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
            raise RuntimeError(f"a rank of the {name} comparison failed (exit codes "
                               f"{[p.returncode for p, _ in procs]})")
        return json.loads((Path(tmp) / "0.out").read_text().splitlines()[-1])


def overhead(args) -> None:
    K, M = args.devices, args.microbatches
    print(f"(b) overhead: one training iteration, ours vs torch.distributed.pipelining (gloo, K={K}, M={M}, "
          f"mlp width {args.width} depth {args.depth} batch {args.batch}; same processes, alternating; "
          f"barrier, then each rank times its part, the largest over the ranks; {args.warmup} warm-up, "
          f"median of {args.repeats})")
    print(f"{'schedule':<8} {'ours ms':>9} {'PyTorch ms':>11} {'ratio':>7}  {'ours p10..p90':>15} "
          f"{'PyTorch p10..p90':>17}  target")
    for name in ("gpipe", "1f1b"):
        load = _load()
        times = _pair_run(name, K, M, args)
        o, t = statistics.median(times["ours"]), statistics.median(times["pytorch"])

        def spread(v):
            q = statistics.quantiles(v, n=10, method="inclusive") if len(v) > 1 else [v[0]] * 9
            return f"{q[0] * 1e3:.1f}..{q[-1] * 1e3:.1f}"
        print(f"{name:<8} {o * 1e3:>9.2f} {t * 1e3:>11.2f} {o / t:>7.3f}  {spread(times['ours']):>15} "
              f"{spread(times['pytorch']):>17}  <= 1.05 {'ok' if o / t <= 1.05 else 'MISSED'}  "
              f"[{load} before, {_load()} after]", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pair-worker"]:
        _pair_worker(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("accuracy", "overhead"))
    p.add_argument("--workload", choices=("emulated", "mlp", "transformer"), help="accuracy: only this workload")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2, help="overhead: untimed iterations per side first")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per report; overhead: timed iterations per side")
    p.add_argument("--stress", action="store_true", help="two CPU-burning processes run beside the benchmark")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    stop, burners = multiprocessing.Event(), []
    if args.stress:
        burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(2)]
        for b in burners:
            b.start()
        print(f"--stress: 2 CPU-burning processes running beside the benchmark ({_load()} at start)")
    try:
        if args.only in (None, "accuracy"):
            accuracy(args)
        if args.only in (None, "overhead"):
            overhead(args)
    finally:
        stop.set()
        for b in burners:
            b.join(5)
            if b.is_alive():
                b.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
