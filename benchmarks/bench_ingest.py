"""Ingest benchmark: how well pipesim predicts PyTorch's own pipeline runtime, and what our executor costs beside it.

    python benchmarks/bench_ingest.py                              # both parts, mlp, K=2 (a few minutes on 2 cores)
    python benchmarks/bench_ingest.py --only accuracy --steps 9
    python benchmarks/bench_ingest.py --only ratio --width 512 --microbatches 4

(a) accuracy: for gpipe, 1f1b, interleaved-1f1b (2 chunks) and zbv on K=2 ranks, ``pipesim validate
    --runtime torch`` runs PyTorch's class (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble) under torch.profiler for ``--steps`` steps, ingests the traces, calibrates
    costs and links from them and simulates the order the class executes. Printed: the median over the
    profiled steps of |measured - predicted| / predicted makespan (target <= 10% at low load), its
    p10-p90, and the measured idle split (dependency / communication / gap).
(b) ratio: pipesim's executor (``pipesim validate``, the same Schedule object in PyTorch's order, the
    same stage modules, K, M and backend) against PyTorch's runtime: pipesim's measured makespan over
    the median wall time of PyTorch's ``step()`` without the profiler (slowest rank). 1.0 = as fast.

Figures are printed, never asserted; the 1-minute load average is printed before and after, since on a
shared machine every figure moves with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv")
TARGET = 0.10


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("accuracy", "ratio"), default=None)
    p.add_argument("--devices", "-K", type=int, default=2)
    p.add_argument("--microbatches", "-M", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="profiled steps per schedule (default 5)")
    p.add_argument("--width", type=int, default=None, help="default: the validator's probe (forward >= 10 ms)")
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    args = p.parse_args(argv)
    sizes = {k: v for k, v in (("width", args.width), ("depth", args.depth), ("batch", args.batch)) if v is not None}
    if not sizes:  # one probe for both parts, so pipesim's executor and PyTorch's runtime run the same model
        from validate.environment import size_workload
        from validate.rank.workloads import WorkloadSpec
        spec, note = size_workload(WorkloadSpec(name="mlp"))
        sizes = {"width": spec.width, "depth": spec.depth, "batch": spec.batch}
        print(note)
    print(f"bench_ingest: mlp width {sizes.get('width')}, depth {sizes.get('depth')}, batch {sizes.get('batch')}; "
          f"K={args.devices}, M={args.microbatches}, gloo on CPU, one torch thread per rank")
    print(f"before: {_load()}")
    from validate.pytorch.validation import run_torch_validations

    t0 = time.perf_counter()
    runs = run_torch_validations(CASES, args.devices, args.microbatches, chunks=2, workload="mlp",
                                 workload_options=sizes, steps=args.steps, timeout=900, output_dir=None)
    took = time.perf_counter() - t0
    if args.only in (None, "accuracy"):
        print(f"\n(a) accuracy of the prediction from trace-calibrated costs ({args.steps} profiled steps each, "
              f"one launch, {took:.0f} s)")
        print(f"{'schedule':<17} {'PyTorch class':<24} {'predicted ms':>12} {'measured ms':>12} {'median |err|':>12} "
              f"{'p10..p90 err':>16}  {'idle: dep / comm / gap':<24} target")
        for v in runs:
            s = v.summary
            errs = [(m - s["predicted_makespan"]) / s["predicted_makespan"] for m in s["step_makespans"]]
            med = statistics.median(abs(e) for e in errs)
            idle = s["idle"]["measured"]
            flag = "ok" if med <= TARGET else "MISSED"
            print(f"{v.name:<17} {v.cls:<24} {s['predicted_makespan'] * 1e3:>12.2f} "
                  f"{statistics.median(s['step_makespans']) * 1e3:>12.2f} {med:>12.1%} "
                  f"{s['makespan_error_range'][0]:>+7.1%}..{s['makespan_error_range'][1]:<+7.1%}  "
                  f"{idle['dependency_fraction']:>5.1%} / {idle['communication_fraction']:>5.1%} / "
                  f"{idle['gap_fraction']:>5.1%}   <= {TARGET:.0%} {flag}")
    if args.only in (None, "ratio"):
        print("\n(b) pipesim's executor against PyTorch's runtime (same Schedule order, stage modules, K, M)")
        from validate import run_validations
        reports = run_validations([v.comparison.ingested.schedule for v in runs], args.devices, args.microbatches,
                                  workload="mlp", workload_options=sizes, output_dir=None, timeout=900)
        print(f"{'schedule':<17} {'pipesim executor ms':>20} {'PyTorch step() ms':>18} {'ratio':>7}")
        for v, r in zip(runs, reports):
            ours = r.to_dict()["measured_makespan"]
            theirs = statistics.median(v.step_seconds)
            print(f"{v.name:<17} {ours * 1e3:>20.2f} {theirs * 1e3:>18.2f} {ours / theirs:>7.2f}")
        print("(pipesim: first action start to last action end of its timed run; PyTorch: wall time of step() "
              "after a barrier, slowest rank, median of 3, no profiler)")
    print(f"\nafter: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
