"""``pipesim collective``: simulate one all-reduce, or sweep N and print the lecture's table.

    pipesim collective --algorithm ring --workers 8 --bytes 1e8 --bandwidth 1e10 --latency 1e-5
    pipesim collective --algorithm tree --workers 6 --bytes 4e6 --json
    pipesim collective --sweep 2..64 --bytes 1e8 --bandwidth 1e10 --latency 1e-5 -o reports/collectives

``--sweep`` prints the lecture's comparison (parameter server, sequential, ring, parallel,
recursive halving: time in steps, peak node bandwidth, total bandwidth) with the growth the
lecture expects beside the growth fitted to the simulation (:func:`sim.engines.collectives.fit_order`),
and writes ``collectives.csv`` and ``collectives.png`` (steps, seconds, peak and total bytes).
"""

from __future__ import annotations

import argparse
import math

from sim.engines.collectives import ALGORITHMS, MEASURES, order_table, simulate_collective, sweep
from sim.io.sweep_plots import collective_sweep_plot
from sim.files import atomic_paths, check_output_dir
from sim.cli.options import bandwidth_float, int_list, positive_int, print_json

__all__ = ["register", "run"]


def finite_non_negative(text: str) -> float:
    """A finite number >= 0 (latency, reduction cost, bytes): 'inf' and 'nan' are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def register(sub) -> None:
    p = sub.add_parser("collective", help="simulate an all-reduce algorithm message by message",
                       description="Simulate an all-reduce over N workers on full-duplex NICs "
                                   "(message time = latency + bytes / bandwidth).")
    p.add_argument("--algorithm", "-a", choices=ALGORITHMS, default="ring",
                   help="algorithm (default ring); parallel: the lecture's all-to-all in one step; "
                        "direct: reduce-scatter + all-gather, each worker exchanging with every other")
    p.add_argument("--workers", "-N", type=positive_int, default=8, help="workers N (default 8)")
    p.add_argument("--bytes", "-n", dest="nbytes", type=finite_non_negative, default=1e8,
                   help="bytes of each worker's vector (default 1e8)")
    p.add_argument("--bandwidth", type=bandwidth_float, default=1e10,
                   help="bytes/s per NIC direction (default 1e10; inf: unlimited)")
    p.add_argument("--latency", type=finite_non_negative, default=1e-5, help="seconds per message (default 1e-5)")
    p.add_argument("--reduce-cost", type=finite_non_negative, default=0.0,
                   help="seconds per byte to add a received vector into the buffer (default 0)")
    p.add_argument("--servers", type=positive_int, default=None, help="server nodes of ps-sharded (default N)")
    p.add_argument("--sweep", type=int_list, metavar="NS",
                   help="sweep N over e.g. 2..64 (powers of two) or 2-16, for every algorithm (or --algorithm given "
                        "with --only); prints the lecture's table, writes collectives.csv and collectives.png to -o")
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
    out = check_output_dir(args.output)  # before the slow part
    algorithms = [args.algorithm] if args.only else list(ALGORITHMS)
    table = sweep(algorithms, args.sweep, nbytes=args.nbytes, latency=args.latency, bandwidth=args.bandwidth,
                  reduce_cost=args.reduce_cost)
    if not table["complete"].all():
        raise AssertionError(f"incomplete all-reduce in {table[~table['complete']].to_dict('records')[:2]}")
    orders = order_table(table)
    paths = [out / "collectives.csv", out / "collectives.png"]
    with atomic_paths(paths) as (csv, png):
        table.to_csv(csv, index=False)
        collective_sweep_plot(table).savefig(png, dpi=110, format="png")
    if args.json:
        print_json({"table": table.to_dict("records"), "orders": [_order_record(row) for _, row in orders.iterrows()],
                    "files": [str(p) for p in paths]})
        return 0
    print(f"All-reduce of {args.nbytes:.6g} bytes per worker, latency {args.latency:g} s, "
          f"bandwidth {args.bandwidth:g} B/s, N = {', '.join(str(n) for n in args.sweep)}")
    print(_format_orders(orders, len(args.sweep)))
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


_COLUMNS = [col for col, _ in MEASURES]
_W_NAME, _W_EXP, _W_FIT = 19, 9, 16


def _format_orders(orders, n_values: int) -> str:
    """The lecture's table: expected O(.) and fitted growth per measure; '!' marks a disagreement."""
    head1 = f"{'':<{_W_NAME}}" + "".join(f"{t:<{_W_EXP + _W_FIT + 2}}" for t in
                                         ("time (steps)", "peak node bandwidth", "total bandwidth")) + "seconds"
    head2 = f"{'algorithm':<{_W_NAME}}" + f"{'expected':<{_W_EXP}}{'fitted':<{_W_FIT + 2}}" * 3 + "fitted"
    lines = ["The lecture's table: expected growth O(.) beside the growth fitted to the simulated columns", "",
             head1, head2]
    agree = total = 0
    lecture_done = False
    for _, row in orders.iterrows():
        if not row["lecture"] and not lecture_done:
            lines.append("(not in the lecture)")
            lecture_done = True
        cells = f"{row['lecture'] or row['algorithm']:<{_W_NAME}}"
        for col in _COLUMNS:
            expected, fit, ok = row[f"{col}_expected"], row[f"{col}_fit"], row[f"{col}_agrees"]
            mark = "" if ok is None or ok else " !"
            cells += f"{'O(' + expected + ')' if expected else '':<{_W_EXP}}{fit.text() + mark:<{_W_FIT + 2}}"
            if expected:
                total += 1
                agree += bool(ok)
        lines.append(cells + row["time_fit"].text())
    lines += ["",
              "fitted: N^k is c N^k; ~N^k is c N^k + b N^(k-1) (leading term and the next); log N is a + b log N;",
              "each with R^2 >= 0.999 in log-log, the simplest that fits; 'no power law' shows the best R^2 reached.",
              "time in steps = rounds of messages; bandwidth = bytes sent + received (peak: the busiest node).",
              f"{agree} of {total} entries of the lecture's table agree with the simulation"
              + ("" if agree == total else " ('!': disagrees)") + "."]
    if n_values < 4:
        lines.append(f"only {n_values} values of N: give at least 4 (e.g. --sweep 2..64) to fit ~N^k")
    return "\n".join(lines)


def _order_record(row) -> dict:
    record = {"algorithm": row["algorithm"], "lecture": row["lecture"]}
    for col in _COLUMNS + ["time"]:
        fit = row[f"{col}_fit"]
        record[col] = {"expected": row[f"{col}_expected"] or None, "order": fit.order or None, "model": fit.model,
                       "exponent": fit.exponent, "r2": fit.r2, "agrees": row[f"{col}_agrees"]}
    return record
