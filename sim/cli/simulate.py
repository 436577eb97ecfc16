"""``pipesim simulate`` and ``pipesim schedules``.

    pipesim simulate --schedule gpipe --devices 4 --microbatches 4
    pipesim simulate --schedule 1f1b -K 8 -M 32 --latency 1e-4 --activation-bytes 4e6 --bandwidth 1e10 --json
    pipesim simulate --schedule-file zbv.csv --chunks 2       # PyTorch's schedule CSV (see pipesim export)
    pipesim simulate --from-pytorch Interleaved1F1B -K 4 -M 8 --chunks 2   # PyTorch's own class (needs torch)
    pipesim simulate -s zbv -K 8 -M 32 --html zbv.html       # an interactive page: zoom, hover, memory
    pipesim simulate -s 1f1b -K 2 -M 8 --latency 2e-4 --runtime torch --dispatch 5e-5 --show-comm
    pipesim schedules
"""

from __future__ import annotations

import argparse

from sim.schedules import registry as generators
from sim import schedules
from sim.results.memory_breakdown import memory_breakdown
from sim.engines.plan import OverlapError, OverlapFB
from sim.results.result import Result
from sim.simulate import ENGINES, simulate
from sim.cli.options import (add_cost_options, add_runtime_options, add_shape_options, add_source_options,
                             costs_from_args, hardware_from_args, non_negative_float, print_json, runtime_costs,
                             schedule_from_args)
from sim.io.units import format_bytes
from sim.cli.montecarlo_options import add_montecarlo_options, run_simulate_samples, variability_from_args

__all__ = ["register", "simulate_from_args", "summary", "format_table"]


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one schedule and print its figures",
                       description="Simulate one schedule on K devices and print makespan, bubble and memory.")
    p.add_argument("--schedule", "-s", default="1f1b", help=f"schedule name (default 1f1b): {', '.join(generators.names())}")
    add_shape_options(p)
    add_source_options(p)
    add_cost_options(p)
    p.add_argument("--engine", choices=ENGINES, default="auto", help="simulation engine (default auto)")
    p.add_argument("--jitter", type=non_negative_float, default=0.0,
                   help="coefficient of variation of compute times (simpy engine; default 0)")
    p.add_argument("--seed", type=int, default=0, help="random seed for --jitter and --samples")
    p.add_argument("--overlap-fb", metavar="T|P%", type=_overlap_fb, default=None,
                   help="how long an overlapped forward-backward pair (dualpipev, OVERLAP_F_B cells) runs: T seconds "
                        "per pair, or P%% of F+B saved by overlapping (default: F+B, nothing saved)")
    add_runtime_options(p)
    p.add_argument("--show-comm", action="store_true",
                   help="also print the schedule lowered to the runtime's sends, receives and waits")
    p.add_argument("--comm-csv", metavar="FILE",
                   help="also write that lowered schedule as PyTorch's CSV (SEND_F/RECV_F/SEND_B/RECV_B cells)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", metavar="FILE", help="also write the timeline (.csv or .parquet)")
    p.add_argument("--trace", metavar="FILE", help="also write a Chrome trace (.json; open in ui.perfetto.dev)")
    p.add_argument("--html", metavar="FILE", help="also write an interactive page: zoomable Gantt with hover, memory "
                                                  "panel (.html; self-contained, no network)")
    add_montecarlo_options(p, plots=True)  # --samples: a distribution instead of one run (the seed is --seed)
    p.set_defaults(func=run)

    p = sub.add_parser("schedules", help="list the schedules with their source, bubble and memory",
                       description="List the registered schedules.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_schedules)


def _overlap_fb(text: str) -> OverlapFB:
    try:
        return OverlapFB.parse(text)
    except OverlapError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def simulate_from_args(args: argparse.Namespace, name: str | None = None) -> Result:
    """Generate the schedule *name* (default: the flags' --schedule, --schedule-file or --from-pytorch) and
    simulate it with the flags' costs."""
    if name is None:
        schedule = schedule_from_args(args)
    else:
        schedule = schedules.generate(name, args.devices, args.microbatches,
                                      iterations=args.iterations, recompute=args.recompute, chunks=args.chunks)
    # chunks per device as the schedule placed them (V-shaped schedules always use 2)
    costs = runtime_costs(args, costs_from_args(args, schedule.stages, schedule.stages // schedule.devices))
    hardware = hardware_from_args(args, schedule.devices)
    return simulate(schedule, costs, hardware, microbatch_size=args.microbatch_size,
                    engine=getattr(args, "engine", "auto"), jitter=getattr(args, "jitter", 0.0),
                    seed=getattr(args, "seed", 0), overlap_fb=getattr(args, "overlap_fb", None),
                    runtime=getattr(args, "runtime", "pipesim"), post_overhead=getattr(args, "post_overhead", 0.0))


def summary(result: Result, runtime: str = "pipesim") -> dict:
    """The JSON object of ``simulate --json``; *runtime*: the runtime model it was simulated with."""
    from sim.model.runtimes import get_runtime

    s = result.schedule
    profile = get_runtime(runtime)
    out = {"schedule": s.name, "devices": s.devices, "stages": s.stages, "microbatches": s.microbatches,
           "iterations": s.iterations, "runtime": profile.name, "links": profile.links,
           "lowering": profile.lowering(s)}
    out.update(result.metrics.to_dict())
    out["memory_breakdown"] = memory_breakdown(result)  # per device at its peak: why one device needs more
    return out


def format_table(result: Result, runtime: str = "pipesim") -> str:
    from sim.model.runtimes import get_runtime

    m, s = result.metrics, result.schedule
    profile = get_runtime(runtime)
    lines = [
        f"schedule {s.name}: K={s.devices} devices, S={s.stages} stages, M={s.microbatches} micro-batches, "
        f"{s.iterations} iteration(s)",
        f"  runtime           {profile.name} ({profile.links} links, lowering {profile.lowering(s)})",
        f"  makespan          {m.makespan:.6g} s",
        f"  utilization       {m.utilization:.1%}",
        f"  bubble fraction   {m.bubble_fraction:.1%}   (idle share of K x makespan)",
        f"  bubble ratio      {m.bubble_ratio:.3f}   (idle / busy, Megatron's bubble over ideal time)",
        f"  bubble rate (ZB)  {m.bubble_rate_zb:.1%}   (zero-bubble papers: idle share of the longest device span)",
        f"  throughput        {m.throughput:.6g} samples/s",
        "  device   busy (s)    util   peak memory   in-flight   weight versions",
    ]
    for d in range(s.devices):
        lines.append(f"  {d:>6}   {m.busy[d]:<10.6g} {m.device_utilization[d]:>5.1%}   {format_bytes(m.peak_memory[d]):>11}"
                     f"   {m.peak_inflight[d]:>9}   {m.weight_versions[d]:>15}")
    for line in m.memory_overflow:
        lines.append(f"  MEMORY OVERFLOW: {line}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.html:
        from sim.io.pages import check_page_path
        check_page_path(args.html)  # before any simulation
    variability = variability_from_args(args)
    if variability is not None:  # --samples: Monte Carlo (sim.search.montecarlo)
        if args.show_comm or args.comm_csv:
            from sim.simulate import SimulateError  # one run's lowered program; samples have one each
            raise SimulateError("--show-comm and --comm-csv print one run's communication; drop them or --samples")
        return run_simulate_samples(args, variability)
    result = simulate_from_args(args)
    if args.show_comm or args.comm_csv:
        from sim.core.comm_lowering import lower
        from sim.model.runtimes import get_runtime

        s = result.schedule
        program = lower(s, get_runtime(args.runtime).lowering(s), blocking_sends=not result.hardware.overlap)
        if args.comm_csv:
            from sim.io.schedule_io import write_lowered_csv
            write_lowered_csv(program, args.comm_csv)
        if args.show_comm and not args.json:
            print(f"lowered for the {args.runtime} runtime ({program.lowering}):")
            print(program.to_text())
    if args.html:
        from sim.io.pages import timeline_page, write_page
        write_page(timeline_page(result, heading=f"pipesim simulate: {result.schedule.name}"), args.html)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(result, args.timeline)  # a Result: its schedule and source go into Parquet metadata
    if args.trace:
        from sim.io.trace import chrome_trace, write_trace
        write_trace(chrome_trace(result), args.trace)
    if args.json:
        print_json(summary(result, args.runtime) | ({"html": args.html} if args.html else {}))
    else:
        print(format_table(result, args.runtime))
        if args.html:
            print(f"wrote {args.html}")
    return 0


def run_schedules(args: argparse.Namespace) -> int:
    rows = []
    for name in generators.names():
        g = generators.get_generator(name)
        rows.append({"name": name, "summary": g.SUMMARY, "source": g.SOURCE, "bubble": g.BUBBLE, "memory": g.MEMORY})
    if args.json:
        print_json(rows)
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
        print(f"{'':<{width}}    source: {r['source']}")
        print(f"{'':<{width}}    bubble: {r['bubble']}")
        print(f"{'':<{width}}    memory: {r['memory']}")
    return 0
