"""``pipesim demo``: the main job of the README's run command (``make run``).

    pipesim demo                 # K=4, M=4, the classroom case; writes reports/
    pipesim demo -o reports
    pipesim demo -o /tmp/demo --no-sweep

Simulates naive, GPipe, 1F1B and PipeDream on the same uniform costs and prints
their figures side by side (PipeDream also over 3 iterations, beside 1F1B: one
iteration alone cannot show that it never flushes), then writes into the output
folder (each file atomically):

- ``gantt_classroom.png``: naive, GPipe and 1F1B stacked on one time axis (the lecture's
  picture: naive 25% utilization against 57% for the pipelined schedules at K=M=4; the
  black ticks are the weight updates, which take no time here);
- ``gantt_pipedream.png``: 1F1B and PipeDream over 3 iterations: 1F1B flushes after
  every iteration, PipeDream does not (80% utilization), iteration starts dashed and the
  weight version each micro-batch uses written in its boxes;
- ``gantt_1f1b_links.png``: 1F1B at K=4, M=8 over links with latency and finite
  bandwidth, transfers drawn under each device, memory panel with the capacity line;
- ``trace_1f1b_links.json``: the same run as a Chrome trace (open it in https://ui.perfetto.dev);
- ``sweep/``: a sweep of the four schedules over K in 2,4,8 and M in 1..64 (CSV and plots;
  PipeDream over 3 iterations);
- ``validation/``: GPipe and 1F1B run for real on 2 CPU processes (gloo, a small MLP), predicted
  against measured (markdown, Gantt, trace, calibrated costs); skipped with a note without torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sim import schedules
from sim.model.cost import uniform
from sim.files import check_output_dir
from sim.model.hardware import Hardware
from sim.simulate import simulate
from sim.cli.options import int_list, positive_int

__all__ = ["register", "run", "DEMO_SCHEDULES"]

DEMO_SCHEDULES = ("naive", "gpipe", "1f1b", "pipedream")
PIPEDREAM_ITERATIONS = 3  # PipeDream's point is the missing flush: it shows from the second iteration on
_MIB = 2.0**20
# the linked 1F1B run: 1 MiB of activations per micro-batch over 4 MiB/s links with 50 ms latency (0.3 s a transfer)
_LINKS = {"latency": 0.05, "bandwidth": 4 * _MIB, "memory_capacity": 6 * _MIB}
_SWEEP_DEVICES, _SWEEP_MICROBATCHES = "2,4,8", "1..64"  # moderate, so that `make run` stays well under a minute


def register(sub) -> None:
    p = sub.add_parser("demo", help="the README's main job: compare the classic schedules, write reports/",
                       description="Simulate naive, GPipe, 1F1B and PipeDream on the classroom case; write Gantt "
                                   "charts, a sweep and a Chrome trace to the output folder.")
    p.add_argument("--devices", "-K", type=positive_int, default=4)
    p.add_argument("--microbatches", "-M", type=positive_int, default=4)
    p.add_argument("--output", "-o", default="reports", help="folder for the reports (default reports/)")
    p.add_argument("--sweep-devices", type=int_list, default=int_list(_SWEEP_DEVICES),
                   help=f"K values of the demo sweep (default {_SWEEP_DEVICES})")
    p.add_argument("--sweep-microbatches", type=int_list, default=int_list(_SWEEP_MICROBATCHES),
                   help=f"M values of the demo sweep (default {_SWEEP_MICROBATCHES})")
    p.add_argument("--no-sweep", action="store_true", help="skip the sweep")
    p.add_argument("--no-validate", action="store_true", help="skip the CPU validation run (needs torch)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sim.io.plots import gantt
    from sim.search.sweep import run_sweep
    from sim.io.trace import chrome_trace, write_trace
    from sim.io.figures import save_figure
    from sim.cli.sweep import write_sweep

    K, M = args.devices, args.microbatches
    out = check_output_dir(args.output)
    costs = uniform(K, forward=1.0, backward=2.0, activation_bytes=1.0, weight_bytes=1.0)
    print(f"Classroom case: K={K} devices, M={M} micro-batches, forward 1, backward 2, free links\n")
    print(f"{'schedule':<10} {'iterations':>10} {'makespan':>9} {'utilization':>12} {'bubble':>7}  "
          f"{'in-flight per device':<22} weight versions")
    runs = [(name, 1) for name in DEMO_SCHEDULES] + [("1f1b", PIPEDREAM_ITERATIONS), ("pipedream", PIPEDREAM_ITERATIONS)]
    results = {}
    for name, iterations in runs:
        r = simulate(schedules.generate(name, K, M, iterations=iterations), costs)
        results[name, iterations] = r
        m = r.metrics
        print(f"{name:<10} {iterations:>10} {m.makespan:>9.4g} {m.utilization:>12.1%} {m.bubble_fraction:>7.1%}  "
              f"{str(m.peak_inflight):<22} {m.weight_versions}")
    print(f"(PipeDream over one iteration runs as 1F1B; over {PIPEDREAM_ITERATIONS} it never flushes, 1F1B flushes "
          f"after each)")

    written: list[tuple[str, Path]] = []
    classroom = [results[name, 1] for name in DEMO_SCHEDULES if name != "pipedream"]
    written.append(("Gantt, naive / GPipe / 1F1B stacked", save_figure(gantt(classroom), out / "gantt_classroom.png")))
    no_flush = [results[name, PIPEDREAM_ITERATIONS] for name in ("1f1b", "pipedream")]
    written.append((f"Gantt, 1F1B vs PipeDream, {PIPEDREAM_ITERATIONS} iterations",
                    save_figure(gantt(no_flush, titles=["1F1B (flush every iteration)", "PipeDream (no flush)"]),
                                out / "gantt_pipedream.png")))

    linked = simulate(schedules.generate("1f1b", 4, 8),
                      uniform(4, forward=1.0, backward=2.0, send_bytes=_MIB, activation_bytes=_MIB, weight_bytes=_MIB),
                      Hardware(devices=4, **_LINKS))
    written.append(("Gantt, 1F1B K=4 M=8 over slow links, memory",
                    save_figure(gantt(linked, memory=True), out / "gantt_1f1b_links.png")))
    written.append(("Chrome trace of that run (ui.perfetto.dev)",
                    write_trace(chrome_trace(linked), out / "trace_1f1b_links.json")))

    if not args.no_sweep:
        sweep_costs = {"forward": 1.0, "backward": 2.0, "activation_bytes": _MIB, "weight_bytes": _MIB}
        flushed = [n for n in DEMO_SCHEDULES if n != "pipedream"]
        df = pd.concat([run_sweep(flushed, args.sweep_devices, args.sweep_microbatches, costs=sweep_costs),
                        run_sweep(["pipedream"], args.sweep_devices, args.sweep_microbatches, costs=sweep_costs,
                                  iterations=PIPEDREAM_ITERATIONS)], ignore_index=True)
        for what, path in write_sweep(df, out / "sweep").items():
            written.append((f"sweep {what} ({len(df)} configurations)" if what == "csv" else f"sweep {what}", path))

    print(f"\n1F1B at K=4, M=8 over links (latency {_LINKS['latency']} s, {_LINKS['bandwidth'] / _MIB:g} MiB/s, "
          f"1 MiB per transfer): makespan {linked.metrics.makespan:.4g}, utilization {linked.metrics.utilization:.1%}")
    print(f"\nWrote to {out}/:")
    width = max(len(w) for w, _ in written)
    for what, path in written:
        print(f"  {what:<{width}}  {path}")

    if not args.no_validate:
        _validate_on_cpu(out / "validation")
    return 0


def _validate_on_cpu(out: Path) -> None:
    """Run GPipe and 1F1B for real on 2 CPU processes and print predicted against measured."""
    try:
        import torch  # noqa: F401  (only to say plainly why the run is skipped)
    except ImportError:
        print("\nValidation skipped: it needs torch (pip install 'pipesim[validate]').")
        return
    from validate import run_validations
    from validate.compare.report import format_summary

    print("\nValidating GPipe and 1F1B on this machine: 2 CPU processes (gloo), an MLP of width 512, K=2, M=4 ...",
          flush=True)
    # big enough that each action takes milliseconds, so timer and messaging noise stay small beside it
    sizes = {"width": 512, "depth": 4, "batch": 64}
    for report in run_validations(["gpipe", "1f1b"], 2, 4, workload="mlp", workload_options=sizes, output_dir=out):
        print(format_summary(report))
