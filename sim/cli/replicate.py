"""``pipesim replicate``: a pipeline schedule with replicated stages and/or data parallelism (DP x PP).

    pipesim replicate --schedule 1f1b -K 4 -M 8 --data-parallel 2 --weight-bytes 1e8 --bandwidth 1e10
    pipesim replicate --schedule pipedream -K 3 -M 8 --replicas 2,1,1 --weight-bytes 4e7 --bandwidth 1e9 --json
    pipesim replicate -s gpipe -K 4 -M 4 --data-parallel 2 --weight-bytes 4e6 --bandwidth 4e6 \\
        --no-overlap-allreduce --gantt /tmp/dp.png

Devices: copy d of the pipeline is devices d*W .. d*W+W-1 (W = K without --replicas).
D defaults to 2, or to 1 when --replicas is given (replicated stages in one pipeline; add -D for both).
The gradient all-reduce among the replicas of each stage is simulated message by
message (sim.engines.collectives) on the same links (--latency, --bandwidth, or --hardware
with D x W devices). Gradient bytes per stage = --weight-bytes (or grad_bytes of --costs).
"""

from __future__ import annotations

import argparse

from sim.schedules import registry as generators
from sim import schedules
from sim.engines.replication import SYNC_ALGORITHMS, Replication, simulate_replicated
from sim.cli.options import (add_cost_options, add_shape_options, costs_from_args, hardware_from_args, positive_int,
    print_json)

__all__ = ["register", "run"]


def _replicas(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every replica count must be at least 1")
    return values


def register(sub) -> None:
    p = sub.add_parser("replicate", help="simulate DP x PP or replicated stages, with the gradient all-reduce",
                       description="Simulate D copies of a pipeline (data parallelism) and/or replicated stages "
                                   "(PipeDream's 1F1B-RR), with each stage's gradient all-reduce on the links.")
    p.add_argument("--schedule", "-s", default="1f1b", help=f"base schedule (default 1f1b): {', '.join(generators.names())}")
    add_shape_options(p)
    add_cost_options(p)
    p.add_argument("--data-parallel", "-D", type=positive_int, default=None,
                   help="pipeline copies D (default 2; 1 with --replicas, which replicates stages inside one copy)")
    p.add_argument("--replicas", type=_replicas, default=None, metavar="R0,R1,...",
                   help="replicas of each pipeline device (default 1 each); micro-batches dealt round-robin")
    p.add_argument("--algorithm", choices=SYNC_ALGORITHMS, default="ring", help="all-reduce algorithm (default ring)")
    p.add_argument("--no-overlap-allreduce", action="store_true",
                   help="start every all-reduce after the whole flush (default: as soon as its stage is done)")
    p.add_argument("--gantt", metavar="FILE", help="also draw the Gantt chart (.png/.svg/.pdf)")
    p.add_argument("--timeline", metavar="FILE", help="also write the timeline (.csv or .parquet)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedules.generate(args.schedule, args.devices, args.microbatches, iterations=args.iterations,
                                  recompute=args.recompute, chunks=args.chunks)
    costs = costs_from_args(args, schedule.stages, schedule.stages // schedule.devices)
    # --replicas alone asks for replicated stages in one pipeline (README: 2,1,1 on 4 devices), not DP on top
    data_parallel = args.data_parallel if args.data_parallel is not None else (1 if args.replicas else 2)
    rep = Replication(data_parallel=data_parallel, replicas=args.replicas, algorithm=args.algorithm,
                      overlap=not args.no_overlap_allreduce)
    hardware = hardware_from_args(args, rep.devices(schedule))
    run_ = simulate_replicated(schedule, costs, rep, hardware, microbatch_size=args.microbatch_size)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(run_.timeline, args.timeline, schedule=run_.as_result(costs, hardware).schedule.name,
                       source="simulated", extra={k: run_.summary()[k] for k in ("data_parallel", "replicas", "algorithm")})
    if args.gantt:
        from sim.io.plots import gantt
        from sim.io.figures import save_figure
        save_figure(gantt(run_.as_result(costs, hardware)), args.gantt)
    out = run_.summary()
    if args.json:
        out["allreduces"] = run_.allreduces.to_dict("records")
        print_json(out)
        return 0
    m = run_.metrics
    print(f"{schedule.name} x D={rep.data_parallel}, replicas {out['replicas']}: {run_.devices} devices, "
          f"{rep.algorithm} all-reduce {'overlapped with the drain' if rep.overlap else 'after the flush'}")
    print(f"  makespan          {m.makespan:.6g} s")
    print(f"  utilization       {m.utilization:.1%}")
    print(f"  throughput        {m.throughput:.6g} samples/s")
    print(f"  all-reduce time   {out['allreduce_seconds']:.6g} s (sum over stages and updates)")
    print(f"  U waiting on sync {max(run_.sync_wait):.6g} s (worst device)")
    print("  stage update  start        end          bytes")
    for r in run_.allreduces.itertuples(index=False):
        print(f"  {r.stage:>5} {r.update:>6}  {r.start:<12.6g} {r.end:<12.6g} {r.bytes:.4g}")
    for note in run_.notes:
        print(f"  note: {note}")
    return 0
