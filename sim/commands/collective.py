"""``pipesim collective``: simulate one all-reduce, or sweep N and draw the comparison.

    pipesim collective --algorithm ring --workers 8 --bytes 1e8 --bandwidth 1e10 --latency 1e-5
    pipesim collective --algorithm tree --workers 6 --bytes 4e6 --json
    pipesim collective --sweep 2..64 --bytes 1e8 --bandwidth 1e10 --latency 1e-5 -o reports/collectives
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..collectives import ALGORITHMS, fit_exponent, plot_sweep, simulate_collective, sweep
from .options import int_list, non_negative_float, positive_float, positive_int, print_json

__all__ = ["register", "run"]


def register(sub) -> None:
    p = sub.add_parser("collective", help="simulate an all-reduce algorithm message by message",
                       description="Simulate an all-reduce over N workers on full-duplex NICs "
                                   "(message time = latency + bytes / bandwidth).")
    p.add_argument("--algorithm", "-a", choices=ALGORITHMS, default="ring", help="algorithm (default ring)")
    p.add_argument("--workers", "-N", type=positive_int, default=8, help="workers N (default 8)")
    p.add_argument("--bytes", "-n", dest="nbytes", type=non_negative_float, default=1e8,
                   help="bytes of each worker's vector (default 1e8)")
    p.add_argument("--bandwidth", type=positive_float, default=1e10, help="bytes/s per NIC direction (default 1e10)")
    p.add_argument("--latency", type=non_negative_float, default=1e-5, help="seconds per message (default 1e-5)")
    p.add_argument("--reduce-cost", type=non_negative_float, default=0.0,
                   help="seconds per byte to add a received vector into the buffer (default 0)")
    p.add_argument("--servers", type=positive_int, default=None, help="server nodes of ps-sharded (default N)")
    p.add_argument("--sweep", type=int_list, metavar="NS",
                   help="sweep N over e.g. 2..64 (powers of two) or 2-16, for every algorithm (or --algorithm given "
                        "with --only); writes collectives.csv and collectives.png to -o")
    p.add_argument("--only", action="store_true", help="with --sweep: only the --algorithm")
    p.add_argument("-o", "--output", default="reports/collectives", help="output folder of --sweep")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sweep:
        return _run_sweep(args)
    r = simulate_collective(args.algorithm, workers=args.workers, nbytes=args.nbytes, latency=args.latency,
                            bandwidth=args.bandwidth, reduce_cost=args.reduce_cost, servers=args.servers)
    if not r.complete:  # a bug in an algorithm, never a user error; say so loudly
        raise AssertionError("; ".join(r.problems))
    if args.json:
        print_json(r.to_dict())
        return 0
    print(f"{r.algorithm} all-reduce: N={r.workers} workers ({r.nodes} nodes), {r.nbytes:.6g} bytes each")
    print(f"  time              {r.time:.6g} s")
    print(f"  steps             {r.steps}")
    print(f"  messages          {len(r.messages)}")
    print(f"  peak node bytes   {r.peak_node_bytes:.6g}   (sent + received by the busiest node)")
    print(f"  total bytes       {r.total_bytes:.6g}   (carried by the network)")
    print("  every worker holds the full sum: yes")
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    algorithms = [args.algorithm] if args.only else list(ALGORITHMS)
    table = sweep(algorithms, args.sweep, nbytes=args.nbytes, latency=args.latency, bandwidth=args.bandwidth,
                  reduce_cost=args.reduce_cost)
    if not table["complete"].all():
        raise AssertionError(f"incomplete all-reduce in {table[~table['complete']].to_dict('records')[:2]}")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "collectives.csv", index=False)
    fig = plot_sweep(table)
    fig.savefig(out / "collectives.png", dpi=120)
    fits = []
    for algorithm, rows in table.groupby("algorithm", sort=False):
        fits.append({"algorithm": algorithm,
                     **{f"{c}_exponent": fit_exponent(rows["workers"], rows[c])
                        for c in ("time", "peak_node_bytes", "total_bytes")}})
    if args.json:
        print_json({"table": table.to_dict("records"), "fits": fits,
                    "files": [str(out / "collectives.csv"), str(out / "collectives.png")]})
        return 0
    print(f"all-reduce of {args.nbytes:.6g} bytes, latency {args.latency:g} s, bandwidth {args.bandwidth:g} B/s; "
          f"N in {args.sweep[0]}..{args.sweep[-1]}")
    print("  fitted exponents (y ~ N^k):")
    print(f"  {'algorithm':<18}{'time':>8}{'peak node':>11}{'total':>8}")
    for f in fits:
        print(f"  {f['algorithm']:<18}{_k(f['time_exponent']):>8}{_k(f['peak_node_bytes_exponent']):>11}"
              f"{_k(f['total_bytes_exponent']):>8}")
    print(f"wrote {out / 'collectives.csv'} and {out / 'collectives.png'}")
    return 0


def _k(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"
