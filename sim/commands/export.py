"""``pipesim export``: write a schedule as PyTorch's CSV, as text or as JSON.

    pipesim export --schedule zbv --devices 4 --microbatches 8 --format pytorch-csv -o zbv.csv
    pipesim export --schedule interleaved-1f1b -K 4 -M 8 --chunks 2 --format text
    pipesim export --from-pytorch DualPipeV -K 4 -M 8 --format json -o dualpipev.json
    pipesim simulate --schedule-file zbv.csv --latency 1e-4 --activation-bytes 4e6 --bandwidth 1e10

The CSV is what PyTorch's ``_PipelineScheduleRuntime`` loads (one row per rank);
``--torch-version 2.5`` writes the old letters (B = input gradient, no I). Also
the home of the schedule-source options shared with ``pipesim simulate``:
``--schedule NAME`` (a registered generator), ``--schedule-file FILE`` (.csv or
.json) and ``--from-pytorch CLASS`` (PyTorch's own schedule class, needs torch).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .. import generators, schedules
from ..errors import PipesimError
from ..ir import Schedule
from ..passes import lower
from ..pytorch_format import DIALECTS, DialectError, EXPORT_FORMATS, from_pytorch_class, read_schedule_file, write_schedule_file
from .options import add_shape_options, check_file_shape

__all__ = ["register", "run", "add_source_options", "schedule_from_args"]


def add_source_options(p: argparse.ArgumentParser) -> None:
    """--schedule-file, --from-pytorch and --torch-version (``--schedule`` is added by each command)."""
    p.add_argument("--schedule-file", metavar="FILE",
                   help="read the schedule from PyTorch's CSV (.csv, one row per rank) or pipesim's JSON (.json); "
                        "overrides --schedule")
    p.add_argument("--from-pytorch", metavar="CLASS",
                   help="use PyTorch's own schedule class (e.g. GPipe, Interleaved1F1B, ZBVZeroBubble, DualPipeV) "
                        "with --devices, --microbatches and --chunks; needs torch")
    p.add_argument("--torch-version", choices=DIALECTS, default="2.6",
                   help="CSV dialect: 2.6 (I = input gradient, B = full backward; default) or 2.5 (B, no I)")


def schedule_from_args(args: argparse.Namespace, name: str | None = None) -> Schedule:
    """The schedule the flags name: a file, a PyTorch class, or a registered generator."""
    if getattr(args, "schedule_file", None) and getattr(args, "from_pytorch", None):
        raise PipesimError("give either --schedule-file or --from-pytorch, not both")
    imported = getattr(args, "schedule_file", None) or getattr(args, "from_pytorch", None)
    if imported and args.iterations != 1:
        raise PipesimError("--iterations applies to generated schedules; an imported schedule runs as it is written")
    if getattr(args, "schedule_file", None):
        try:
            schedule = read_schedule_file(args.schedule_file, torch_version=args.torch_version)
        except DialectError as exc:
            raise exc.for_cli() from None  # the advice names --torch-version, not the Python argument
        check_file_shape(args, schedule, f"--schedule-file {args.schedule_file}")  # -K/-M/--chunks may not contradict it
        return lower(schedule, recompute=args.recompute)
    if getattr(args, "from_pytorch", None):
        chunks = args.chunks if args.chunks and args.chunks > 1 else 2
        return lower(from_pytorch_class(args.from_pytorch, args.devices, args.microbatches, chunks=chunks),
                     recompute=args.recompute)
    return schedules.generate(name or args.schedule, args.devices, args.microbatches, iterations=args.iterations,
                              recompute=args.recompute, chunks=args.chunks)


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
