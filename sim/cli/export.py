"""``pipesim export``: write a schedule as PyTorch's CSV, as text or as JSON.

    pipesim export --schedule zbv --devices 4 --microbatches 8 --format pytorch-csv -o zbv.csv
    pipesim export --schedule interleaved-1f1b -K 4 -M 8 --chunks 2 --format text
    pipesim export --from-pytorch DualPipeV -K 4 -M 8 --format json -o dualpipev.json
    pipesim simulate --schedule-file zbv.csv --latency 1e-4 --activation-bytes 4e6 --bandwidth 1e10

The CSV is what PyTorch's ``_PipelineScheduleRuntime`` loads (one row per rank);
``--torch-version 2.5`` writes the old letters (B = input gradient, no I). The
schedule-source options (``--schedule-file``, ``--from-pytorch``) are :mod:`sim.cli.options`'.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sim.schedules import registry as generators
from sim.io.schedule_io import EXPORT_FORMATS, write_schedule_file
from sim.cli.options import add_shape_options, add_source_options, schedule_from_args

__all__ = ["register", "run"]


def register(sub) -> None:
    p = sub.add_parser("export", help="write a schedule as PyTorch's CSV, text or JSON",
                       description="Write a schedule to a file: PyTorch's schedule CSV (loadable by its runtime), "
                                   "text (one line per device) or JSON (pipesim's, everything included).")
    p.add_argument("--schedule", "-s", default="1f1b",
                   help=f"schedule name (default 1f1b): {', '.join(generators.names())}")
    add_shape_options(p)
    add_source_options(p)
    p.add_argument("--format", "-f", choices=EXPORT_FORMATS, default="pytorch-csv",
                   help="pytorch-csv (default), text or json")
    p.add_argument("--output", "-o", metavar="FILE", help="output file (default: print to stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    if args.output:
        path = write_schedule_file(schedule, args.output, args.format, torch_version=args.torch_version)
        print(f"wrote {path} ({args.format}: {schedule.name}, K={schedule.devices}, S={schedule.stages}, "
              f"M={schedule.microbatches})", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:  # one writer for files and stdout alike
        path = write_schedule_file(schedule, Path(tmp) / "schedule", args.format, torch_version=args.torch_version)
        sys.stdout.write(path.read_text())
    return 0
