"""``pipesim sweep``: simulate a grid of schedules x devices x micro-batches; write a CSV and plots.

    pipesim sweep -o reports/sweep                                      # the default grid below
    pipesim sweep --schedules naive,gpipe,1f1b,pipedream --devices 2,4,8,16 --microbatches 1..128 -o DIR
    pipesim sweep --schedules gpipe,1f1b --devices 4 --microbatches 1-16 --activation-bytes 4e6 -o DIR --jobs 2 --json

Lists: '2,4,8', '1..128' (powers of two from 1 to 128), '1-8' (every integer), or a mix.
Writes DIR/sweep.csv (one row per configuration; columns in :data:`sim.sweep.SWEEP_COLUMNS`),
DIR/sweep_utilization.png (utilization vs M per K, with GPipe's closed form), DIR/sweep_heatmap.png
(utilization over K x M per schedule) and DIR/sweep_memory.png (peak memory vs M), each atomically.
"""

from __future__ import annotations

import argparse
from argparse import Namespace
from functools import partial
from pathlib import Path

import pandas as pd

from .. import generators
from ..files import atomic_path, check_output_dir
from ..ir import Schedule
from ..sweep import run_sweep
from .gantt import FIGURE_FORMATS, save_figure
from .options import (add_cost_options, add_shape_options, costs_from_args, hardware_from_args, int_list, positive_int,
                      print_json)

__all__ = ["register", "run", "write_sweep", "DEFAULT_SCHEDULES", "DEFAULT_DEVICES", "DEFAULT_MICROBATCHES"]

DEFAULT_SCHEDULES = "naive,gpipe,1f1b,pipedream"
DEFAULT_DEVICES = "2,4,8,16"
DEFAULT_MICROBATCHES = "1..128"


def register(sub) -> None:
    p = sub.add_parser("sweep", help="simulate a grid of schedules, K and M; write a CSV and plots",
                       description="Simulate every combination of schedules, devices and micro-batches with the same "
                                   "cost flags; write a tidy CSV and plots to a folder.")
    p.add_argument("--schedules", default=DEFAULT_SCHEDULES,
                   help=f"comma-separated schedules (default {DEFAULT_SCHEDULES}): {', '.join(generators.names())}")
    p.add_argument("--devices", "-K", type=int_list, default=int_list(DEFAULT_DEVICES),
                   help=f"device counts K (default {DEFAULT_DEVICES}); '2,4', '2..16' doubling, '2-8' every integer")
    p.add_argument("--microbatches", "-M", type=int_list, default=int_list(DEFAULT_MICROBATCHES),
                   help=f"micro-batch counts M (default {DEFAULT_MICROBATCHES})")
    add_shape_options(p, lists=True)
    p.set_defaults(chunks=None)  # unless --chunks is given, each schedule gets the chunks it is built for
    add_cost_options(p)
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for sweep.csv and the plots")
    p.add_argument("--format", choices=FIGURE_FORMATS, default="png", help="plot format (default png)")
    p.add_argument("--jobs", "-j", type=positive_int, default=1, help="worker processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print a JSON summary of what was written")
    p.set_defaults(func=run)


def _costs(args: Namespace, schedule: Schedule):
    return costs_from_args(args, schedule.stages, schedule.stages // schedule.devices)


def _hardware(args: Namespace, schedule: Schedule):
    return hardware_from_args(args, schedule.devices)


def write_sweep(df: pd.DataFrame, folder: str | Path, *, fmt: str = "png") -> dict[str, Path]:
    """Write sweep.csv and the three sweep plots into *folder* (created if missing); returns what -> path."""
    from ..plots import sweep_heatmap, sweep_memory_plot, sweep_utilization_plot  # matplotlib only when drawing

    folder = check_output_dir(folder)  # sim.files: a file where the folder should be is refused in one line
    csv = folder / "sweep.csv"
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False)
    written = {"csv": csv}
    for key, plot in (("utilization", sweep_utilization_plot), ("heatmap", sweep_heatmap),
                      ("memory", sweep_memory_plot)):
        written[key] = save_figure(plot(df), folder / f"sweep_{key}.{fmt}", dpi=110)
    return written


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    # the flags, without the parser's function, travel to the workers; costs and hardware are built per K there
    flags = Namespace(**{k: v for k, v in vars(args).items() if k != "func"})
    df = run_sweep(names, args.devices, args.microbatches, iterations=args.iterations, recompute=args.recompute,
                   chunks=args.chunks, costs=partial(_costs, flags), hardware=partial(_hardware, flags),
                   microbatch_size=args.microbatch_size, jobs=args.jobs, progress=not args.no_progress)
    written = write_sweep(df, args.output, fmt=args.format)
    errors = int((df["error"] != "").sum())
    if args.json:
        print_json({"rows": len(df), "errors": errors, "outputs": {k: str(v) for k, v in written.items()}})
        return 0
    ok = df[df["error"] == ""]
    print(f"{len(df)} configurations ({errors} rejected by their schedule) -> {written['csv']}")
    if len(ok):
        best = ok.loc[ok.groupby("schedule", sort=False)["utilization"].idxmax()]
        for _, row in best.iterrows():
            print(f"  {row['schedule']:<10} best utilization {row['utilization']:.1%} at K={row['devices']}, "
                  f"M={row['microbatches']}")
    for key in ("utilization", "heatmap", "memory"):
        print(f"wrote {written[key]}")
    return 0
