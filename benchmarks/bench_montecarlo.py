"""Monte Carlo benchmark (issue 22): speed of the batched sampler, and predicted against measured distributions.

    python benchmarks/bench_montecarlo.py                 # speed and accuracy
    python benchmarks/bench_montecarlo.py --speed-only    # no validator runs (no torch needed)
    python benchmarks/bench_montecarlo.py --accuracy-only --only mlp --runs 300   # some accuracy rows

Speed targets: 1,000 samples of 1F1B K=16 M=128 with links in <= 1 s; 1,000 samples of K=64 M=1024 in <= 20 s
(lognormal CV 0.1 on every computation and transfer, a straggler of factor 1.5 with probability 0.2). The first
call of a process also loads (or compiles) the kernel: printed apart.

Accuracy targets: emulated K=4 M=8 and mlp K=2 M=8, schedules 1f1b and zb-h1, ``--inject
'lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2'``: KS distance <= 0.10, p50 and p99 within 5 % of the
measured ones. Every figure is printed with the load average beside it; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sim  # noqa: E402


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "n/a"


VARIABILITY = dict(variability="lognormal:0.1", links="lognormal:0.1", stragglers=["device=any,factor=1.5,prob=0.2"])


def speed() -> None:
    print("speed: 1,000 Monte Carlo samples (lognormal 0.1 compute and links, straggler 1.5 p=0.2)")
    # a schedule past sim.jit's compile threshold: the nominal run's kernels load (or compile) too
    warm = sim.schedules.one_f_one_b(8, 256)
    t0 = time.perf_counter()
    sim.monte_carlo(warm, sim.uniform(8), sim.Hardware(devices=8, latency=1e-5), samples=2, **VARIABILITY)
    print(f"  first call of the process (kernels loaded, or compiled on a fresh checkout): "
          f"{time.perf_counter() - t0:.2f} s   load {load()}")
    for K, M, target in ((16, 128, 1.0), (64, 1024, 20.0)):
        schedule = sim.schedules.one_f_one_b(K, M)
        costs = sim.uniform(K, forward=0.01, backward=0.02, activation_bytes=4e6)
        hardware = sim.Hardware(devices=K, latency=2e-5, bandwidth=1e10)
        t0 = time.perf_counter()
        mc = sim.monte_carlo(schedule, costs, hardware, samples=1000, seed=0, **VARIABILITY)
        seconds = time.perf_counter() - t0
        d = mc.summary()
        print(f"  1F1B K={K:<3} M={M:<5} {len(schedule):>8,} actions: {seconds:6.2f} s (target <= {target:g} s, "
              f"{'met' if seconds <= target else 'MISSED'}); p50 {d['makespan_quantiles']['p50']:.4g} s, "
              f"p99 {d['makespan_quantiles']['p99']:.4g} s   load {load()}")


MLP = {"width": 1024, "batch": 64, "depth": 2}
"""The mlp stages of the accuracy rows: a forward of ~3 ms alone on this machine, so that 300 padded runs take
minutes (validate.rank.inject pads each real action to ~2.5x its time in the schedule)."""


def speed_runtime() -> None:
    """The torch runtime's samples (rendezvous engine, one compiled walk per sample): no target, for scale."""
    schedule = sim.schedules.one_f_one_b(16, 128)
    costs = sim.uniform(16, forward=0.01, backward=0.02, activation_bytes=4e6)
    hardware = sim.Hardware(devices=16, latency=2e-5, bandwidth=1e10)
    sim.monte_carlo(schedule, costs, hardware, samples=2, runtime="torch", **VARIABILITY)  # kernels loaded
    t0 = time.perf_counter()
    sim.monte_carlo(schedule, costs, hardware, samples=1000, seed=0, runtime="torch", **VARIABILITY)
    print(f"  1F1B K=16  M=128  --runtime torch (rendezvous engine, a walk per sample): "
          f"{time.perf_counter() - t0:6.2f} s   load {load()}")


def accuracy(runs: int, only: str | None = None) -> None:
    try:
        from validate.run import run_validation
    except ImportError as exc:
        print(f"accuracy: skipped, the validator needs torch ({exc})")
        return

    inject = "lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2"
    print(f"accuracy: --inject '{inject}', {runs} timed iterations each; a correct prediction's expected KS "
          f"distance is about 0.87 / sqrt(n) = {0.87 / runs ** 0.5:.3f}")
    print(f"  {'case':<26} {'p50 pred':>9} {'p50 meas':>9} {'err':>7} {'p99 pred':>9} {'p99 meas':>9} {'err':>7} "
          f"{'KS':>6} {'crit':>6} {'n':>4}  verdict")
    for workload, K in (("emulated", 4), ("mlp", 2)):
        if only and workload != only:
            continue
        for name in ("1f1b", "zb-h1"):
            case = f"{workload} K={K} M=8 {name}"
            before = load()
            report = run_validation(name, K, 8, workload=workload, output_dir=None, inject=inject,
                                    iterations_timed=runs, workload_options=MLP if workload == "mlp" else None)
            c = report.distribution
            ok = c.ks <= 0.10 and abs(c.p50_error) <= 0.05 and abs(c.p99_error) <= 0.05
            print(f"  {case:<26} {c.predicted_p50:>9.4g} {c.measured_p50:>9.4g} {c.p50_error:>+7.1%} "
                  f"{c.predicted_p99:>9.4g} {c.measured_p99:>9.4g} {c.p99_error:>+7.1%} {c.ks:>6.3f} "
                  f"{c.ks_critical:>6.3f} {c.measured_samples:>4}  {'met' if ok else 'MISSED'} (paired: median "
                  f"{c.paired_error:+.1%}, p10 {c.paired_range[0]:+.1%}, p90 {c.paired_range[1]:+.1%})   "
                  f"load {before} -> {load()}", flush=True)
            for note in c.notes:
                print(f"      {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--runs", type=int, default=300,
                        help="timed iterations per accuracy case (default 300: KS <= 0.10 needs n well past 100)")
    parser.add_argument("--only", choices=("emulated", "mlp"), default=None, help="one workload's accuracy rows")
    parser.add_argument("--accuracy-only", action="store_true")
    args = parser.parse_args()
    print(f"pipesim Monte Carlo benchmark, {os.cpu_count()} cores, load {load()}")
    if not args.accuracy_only:
        speed()
        speed_runtime()
    if not args.speed_only:
        accuracy(args.runs, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
