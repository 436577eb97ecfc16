"""``pipesim ingest``: compare a real PyTorch pipeline run (its torch.profiler traces) with pipesim's prediction.

    pipesim ingest rank0.json rank1.json -s 1f1b -K 2 -M 8 -o reports/ingest
    pipesim ingest traces/*.json.gz --from-pytorch Interleaved1F1B -K 4 -M 8 --chunks 2 -o out --json
    pipesim ingest run/*.json --schedule-file my_schedule.csv -o out --ranks 0,1,2,3
    pipesim ingest r0.json r1.json -s gpipe -K 2 -M 4 --action-pattern '(?P<kind>fwd|bwd)_(?P<mb>\\d+)' -o out

One trace per rank (``.json`` or ``.json.gz``, as ``export_chrome_trace`` or
``tensorboard_trace_handler`` write them). The schedule is given as for ``pipesim simulate``.
Writes under ``-o``: ``<stem>.md``, ``.png`` (predicted and measured Gantt on one time axis),
``_trace.json`` (both, one Chrome trace), ``.json`` (the figures), and the trace's calibration
as ``_costs.csv`` / ``_hardware.json``. Needs no torch (except ``--from-pytorch``).
"""

from __future__ import annotations

import argparse
import sys

from sim.schedules import registry as generators
from sim.errors import PipesimError
from sim.cli.options import add_shape_options, add_source_options, schedule_from_args, costs_from_args, hardware_from_args, positive_float, print_json

__all__ = ["register", "run"]


class IngestUsageError(PipesimError):
    """Options of ``pipesim ingest`` that do not fit together."""


def _ranks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ranks, e.g. 0,1,2,3") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are integers >= 0, e.g. 0,1,2,3")
    return values


def register(sub) -> None:
    p = sub.add_parser("ingest", help="compare torch.profiler traces of a real pipeline run with the prediction",
                       description="Read one torch.profiler (Chrome / Kineto) trace per rank of a "
                                   "torch.distributed.pipelining run, turn its actions into a measured timeline, "
                                   "calibrate costs and links from it, simulate the same schedule and write "
                                   "predicted vs measured, with the measured idle time split into dependency, "
                                   "communication and runtime gaps.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="one trace per rank (.json or .json.gz)")
    p.add_argument("--schedule", "-s", default=None,
                   help=f"the schedule the run used: {', '.join(generators.names())} (or --schedule-file / "
                        f"--from-pytorch)")
    add_shape_options(p)
    add_source_options(p)
    p.add_argument("--ranks", type=_ranks, default=None,
                   help="rank of each trace, in order (default: the trace's distributedInfo, else rank<N> in its name)")
    p.add_argument("--action-pattern", action="append", default=[], metavar="REGEX",
                   help="regular expression for another runtime's action names, with named groups kind "
                        "(F/B/I/W/U or forward/backward/input/weight/update), mb and optionally stage; repeatable")
    p.add_argument("--step", type=int, default=None, help="profiled step to compare (default: the last complete one)")
    p.add_argument("--clock", choices=("auto", "shared", "pairs"), default="auto",
                   help="auto (one clock when every trace names the same host, else align by send/receive pairs), "
                        "shared or pairs")
    p.add_argument("--costs", metavar="FILE", help="predict with this costs CSV instead of the trace's calibration")
    p.add_argument("--hardware", metavar="FILE", help="predict with this hardware JSON instead of the trace's link fit")
    p.add_argument("--microbatch-size", type=positive_float, default=1.0, help="samples per micro-batch (throughput)")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="report folder")
    p.add_argument("--timeline", metavar="FILE", help="also write the measured timeline (.csv or .parquet)")
    p.add_argument("--html", metavar="FILE", help="also copy the report's interactive page here (it is always written "
                                                  "beside the report's PNG as <stem>.html)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # K defaults to the number of traces; the hardware file is used as given
    p.set_defaults(func=run, devices=None, microbatches=None, memory_capacity=None, no_overlap=False)


def _schedule(args: argparse.Namespace):
    """The schedule the flags name; PyTorch's single-stage classes as their runtime executes them."""
    if args.devices is None:
        args.devices = len(args.traces)
    if args.microbatches is None and not args.schedule_file:
        raise IngestUsageError("give the run's micro-batches per step with -M (--microbatches)")
    if args.from_pytorch and not args.schedule_file:
        if args.iterations != 1:
            raise IngestUsageError("--iterations applies to generated schedules; a profiled step is one iteration")
        from validate.pytorch.schedules import SINGLE_STAGE, pytorch_schedule, torch_class_for
        try:
            cls = torch_class_for(args.from_pytorch)
        except PipesimError:
            cls = None
        if cls in SINGLE_STAGE:
            return pytorch_schedule(cls, args.devices, args.microbatches, chunks=args.chunks)
    if not (args.schedule or args.schedule_file or args.from_pytorch):
        raise IngestUsageError("give the schedule the run used: --schedule NAME with -K/-M, --schedule-file FILE or "
                               "--from-pytorch CLASS")
    return schedule_from_args(args), []


def run(args: argparse.Namespace) -> int:
    from sim.files import check_output_dir, check_writable
    from sim.simulate import simulate
    from validate.ingest.flow import ingest
    from validate.ingest.report import compare_ingested, format_summary, report_stem, write_ingest_report

    check_output_dir(args.output)
    if args.timeline:
        check_writable(args.timeline)
    if args.html:
        from sim.io.pages import check_page_path
        check_page_path(args.html)
    schedule, notes = _schedule(args)
    # given costs / links are checked before the traces are read
    given_costs = costs_from_args(args, schedule.stages) if args.costs else None
    given_hw = hardware_from_args(args, schedule.devices) if args.hardware else None
    ing = ingest(args.traces, schedule, ranks=args.ranks, action_patterns=args.action_pattern, step=args.step,
                 clock=args.clock, microbatch_size=args.microbatch_size)
    costs = ing.calibration.costs if given_costs is None else given_costs
    hardware = ing.calibration.hardware if given_hw is None else given_hw
    if given_costs is not None:
        notes.append(f"predicted with the costs of {args.costs}, not the trace's calibration")
    if given_hw is not None:
        notes.append(f"predicted with the links of {args.hardware}, not the trace's fit")
    predicted = simulate(ing.schedule, costs, hardware, microbatch_size=args.microbatch_size)
    comparison = compare_ingested(ing, predicted, extra={"notes": notes})
    s = ing.schedule
    paths = write_ingest_report(comparison, args.output, stem=report_stem(predicted, "ingest"),
                                title=f"Ingested run vs prediction: {s.name}, K={s.devices}, S={s.stages}, "
                                      f"M={s.microbatches}",
                                costs=given_costs, hardware=given_hw)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(ing.measured, args.timeline)  # a Result: schedule and source go into Parquet metadata
    if args.html:
        from sim.io.pages import write_page
        write_page(paths["html"].read_text(encoding="utf-8"), args.html)
    if args.json:
        out = dict(comparison.summary)
        out["paths"] = {k: str(v) for k, v in paths.items()}
        print_json(out)
    else:
        print(format_summary(comparison, paths))
        for note in notes:
            print(f"  note: {note}", file=sys.stderr)
    return 0
