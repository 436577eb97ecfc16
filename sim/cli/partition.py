"""``pipesim partition``: split per-layer costs into pipeline stages and write a costs file.

    pipesim partition --layers layers.csv --devices 4 -o costs.csv
    pipesim partition --layers layers.csv --devices 8 --replicate --bandwidth 1e10 --json
    pipesim simulate --schedule 1f1b --devices 4 --costs costs.csv

Without --replicate or --bandwidth it runs GPipe's balancing (exact min-max); with
either it runs PipeDream's planner (communication and replication included).
"""

from __future__ import annotations

import argparse
import math

from sim.model.cost import save_costs
from sim.errors import PipesimError
from sim.model.layers import load_layers
from sim.model.partition import gpipe_partition, pipedream_partition
from sim.cli.options import positive_float, positive_int, print_json

__all__ = ["register", "run"]


def register(sub) -> None:
    p = sub.add_parser("partition", help="split per-layer costs into stages (GPipe or PipeDream planner)",
                       description="Split L layers into stages: GPipe's exact min-max balancing, or PipeDream's "
                                   "planner with communication and stage replication.")
    p.add_argument("--layers", required=True, metavar="FILE",
                   help="layers CSV: layer,forward,backward,activation_bytes,parameter_bytes")
    p.add_argument("--devices", "-K", type=positive_int, required=True, help="devices K")
    p.add_argument("--method", choices=("auto", "gpipe", "pipedream"), default="auto",
                   help="auto (default): pipedream when --replicate or --bandwidth is given, else gpipe")
    p.add_argument("--replicate", action="store_true", help="let PipeDream's planner replicate stages")
    p.add_argument("--bandwidth", type=positive_float, default=None,
                   help="link bandwidth in bytes/s for activations and weight sync (default unlimited)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("-o", "--output", metavar="COSTS.csv", help="write the per-stage costs file for simulate --costs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    layers = load_layers(args.layers)
    if not any(layers.compute):  # every stage would take 0 s and the predicted throughput, 1 / 0, print as inf
        raise PipesimError(f"every layer of {args.layers} takes 0 s (forward + backward): there is nothing to "
                           f"balance; give the layers their times")
    method = args.method
    if method == "auto":
        method = "pipedream" if args.replicate or args.bandwidth is not None else "gpipe"
    if method == "gpipe":
        if args.replicate:
            raise PipesimError("--replicate needs PipeDream's planner; drop --method gpipe")
        part = gpipe_partition(layers, args.devices)
    else:
        part = pipedream_partition(layers, args.devices, bandwidth=args.bandwidth or math.inf,
                                   replicate=args.replicate)
    if args.output:
        replicated = any(r > 1 for r in part.replicas)
        save_costs(part.stage_costs(layers), args.output, comments=[
            f"pipesim partition --method {method} --devices {args.devices} of {args.layers}: {part.stages} stages",
            f"layers per stage: {[hi - lo for lo, hi in part.bounds]}; replicas per stage: {list(part.replicas)}"
            + (" (simulate with --devices equal to the number of stages)" if replicated else ""),
        ])
    if args.json:
        out = part.to_dict(layers)
        out["costs_file"] = args.output
        print_json(out)
        return 0
    print(f"{method} partition of {layers.layers} layers onto {part.devices} devices: {part.stages} stages")
    print(f"  {'stage':>5}  {'layers':<24}{'count':>6}{'replicas':>9}{'time/sample (s)':>17}")
    for s, (lo, hi) in enumerate(part.bounds):
        span = f"{lo}..{hi - 1} ({layers.names[lo]}..{layers.names[hi - 1]})"
        print(f"  {s:>5}  {span:<24}{hi - lo:>6}{part.replicas[s]:>9}{part.stage_times[s]:>17.6g}")
    if any(part.comm_times):
        print(f"  boundary send+receive times (s): {', '.join(f'{t:.6g}' for t in part.comm_times)}")
    print(f"  slowest stage       {part.time_per_sample:.6g} s per micro-batch")
    print(f"  stage-time variance {part.variance:.6g} s^2")
    print(f"  predicted throughput {part.throughput:.6g} micro-batches/s (steady state, 1 / slowest stage)")
    if args.output:
        print(f"wrote {args.output}")
    return 0
