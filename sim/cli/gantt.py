"""``pipesim gantt``: draw the Gantt chart of one schedule, or several stacked on one time axis.

    pipesim gantt --schedule 1f1b -K 4 -M 8 -o 1f1b.png
    pipesim gantt -s naive -s gpipe -K 4 -M 4 -o lecture.png          # the lecture's picture: 25% vs 57%
    pipesim gantt -s naive,gpipe,1f1b,pipedream -o compare.svg --memory
    pipesim gantt -s 1f1b,pipedream --iterations 3 -o no_flush.png    # PipeDream's point: no flush
    pipesim gantt -s 1f1b -K 4 -M 8 --latency 0.05 --activation-bytes 1e6 --bandwidth 4e6 -o links.pdf --json
    pipesim gantt --schedule-file zbv.csv -s zbv -o mine_vs_generated.png
    pipesim gantt --from-pytorch Interleaved1F1B -K 4 -M 8 --chunks 2 -o torch.png   # needs torch
    pipesim gantt -s gpipe,1f1b -K 4 -M 8 -o g.png --html g.html      # and an interactive page of the same

The format follows the suffix of ``-o`` (.png, .svg or .pdf); the file is written atomically.
With ``--schedule-file`` or ``--from-pytorch`` that schedule is drawn first, then any ``--schedule``.
"""

from __future__ import annotations

import argparse

from sim.schedules import registry as generators
from sim.errors import PipesimError
from sim.io.figures import check_figure_path, save_figure
from sim.cli.options import add_cost_options, add_shape_options, add_source_options, print_json
from sim.cli.simulate import simulate_from_args, summary

__all__ = ["register", "run", "schedule_names"]

def schedule_names(values: list[str] | None, default: str | None = "1f1b") -> list[str]:
    """Repeatable, comma-separable ``--schedule`` values, checked against the registry."""
    names = [n.strip() for v in (values or ([default] if default else [])) for n in v.split(",") if n.strip()]
    if not names and default:
        raise PipesimError("no schedule given; pass --schedule NAME (see `pipesim schedules`)")
    for name in names:
        generators.get_generator(name)  # raises, listing the valid names
    return names


def register(sub) -> None:
    p = sub.add_parser("gantt", help="draw Gantt charts of schedules (stacked for comparison)",
                       description="Simulate one or more schedules on the same costs and draw their timelines "
                                   "stacked on one time axis.")
    p.add_argument("--schedule", "-s", action="append", metavar="NAME",
                   help=f"schedule(s) to draw; repeat or separate with commas (default 1f1b): "
                        f"{', '.join(generators.names())}")
    add_shape_options(p)
    add_source_options(p)
    p.set_defaults(chunks=None)  # unless --chunks is given, each schedule gets the chunks it is built for
    add_cost_options(p)
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="figure file: .png, .svg or .pdf")
    p.add_argument("--memory", action="store_true",
                   help="add a memory panel under each chart: bytes per device, or micro-batches in flight when "
                        "no byte sizes are given")
    p.add_argument("--no-transfers", action="store_true", help="do not draw transfers")
    p.add_argument("--labels", choices=("auto", "full", "short", "none"), default="auto",
                   help="box labels: auto (where they fit), full (F2,3), short (micro-batch), none")
    p.add_argument("--json", action="store_true", help="print a JSON summary of what was written")
    p.add_argument("--html", metavar="FILE", help="also write the charts as an interactive page: zoom, hover, memory "
                                                  "(.html; self-contained, no network)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sim.io.plots import gantt  # matplotlib is imported only when drawing

    check_figure_path(args.output)  # before any simulation
    if args.html:
        from sim.io.pages import check_page_path
        check_page_path(args.html)
    imported = bool(args.schedule_file or args.from_pytorch)
    names = schedule_names(args.schedule, default=None if imported else "1f1b")
    results = [simulate_from_args(args)] if imported else []  # the file's or PyTorch's schedule
    for name in names:
        chunks = args.chunks or generators.default_chunks(name)
        results.append(simulate_from_args(argparse.Namespace(**{**vars(args), "chunks": chunks}), name))
    fig = gantt(results, memory=args.memory, transfers=not args.no_transfers, labels=args.labels)
    path = save_figure(fig, args.output)
    if args.html:
        from sim.io.pages import timeline_page, write_page
        write_page(timeline_page(results, heading="pipesim gantt: " + ", ".join(r.schedule.name for r in results)),
                   args.html)
    if args.json:
        print_json({"output": str(path), "schedules": [summary(r) for r in results]}
                   | ({"html": args.html} if args.html else {}))
    else:
        for r in results:
            m = r.metrics
            print(f"{r.schedule.name:<10} makespan {m.makespan:.6g}  utilization {m.utilization:.1%}  "
                  f"bubble {m.bubble_fraction:.1%}")
        if args.memory and not any(max(r.metrics.peak_memory or [0.0]) > 0 for r in results):
            print("memory panels: micro-batches in flight (no byte sizes given; see --activation-bytes)")
        print(f"wrote {path}" + (f" and {args.html}" if args.html else ""))
    return 0
