"""``pipesim gantt``: draw the Gantt chart of one schedule, or several stacked on one time axis.

    pipesim gantt --schedule 1f1b -K 4 -M 8 -o 1f1b.png
    pipesim gantt -s naive -s gpipe -K 4 -M 4 -o lecture.png          # the lecture's picture: 25% vs 57%
    pipesim gantt -s naive,gpipe,1f1b,pipedream -o compare.svg --memory
    pipesim gantt -s 1f1b -K 4 -M 8 --latency 0.05 --activation-bytes 1e6 --bandwidth 4e6 -o links.pdf --json

The format follows the suffix of ``-o`` (.png, .svg or .pdf); the file is written atomically.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import generators
from .options import add_cost_options, add_shape_options, print_json
from .simulate import simulate_from_args, summary
from ..errors import PipesimError

__all__ = ["register", "run", "save_figure", "FIGURE_FORMATS"]

FIGURE_FORMATS = ("png", "svg", "pdf")


class FigureFormatError(PipesimError):
    """An output file name whose suffix names no figure format we write."""


def save_figure(fig, path: str | Path, *, dpi: int = 130) -> Path:
    """Save a matplotlib Figure to *path* (format from the suffix: .png, .svg, .pdf), atomically."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise FigureFormatError(f"cannot write a figure to {str(path)!r}: use a file name ending in "
                                f"{', '.join('.' + f for f in FIGURE_FORMATS)}")
    if path.parent != Path("") and not path.parent.is_dir():
        raise FileNotFoundError(f"folder {str(path.parent)!r} does not exist; create it or pick another -o")
    tmp = path.with_name(path.name + ".tmp")
    extra = {"pil_kwargs": {"compress_level": 3}} if fmt == "png" else {}  # 2x faster than zlib's 6, ~same size
    fig.savefig(tmp, format=fmt, dpi=dpi, **extra)
    tmp.replace(path)
    return path


def schedule_names(values: list[str] | None, default: str = "1f1b") -> list[str]:
    """Repeatable, comma-separable ``--schedule`` values, checked against the registry."""
    names = [n.strip() for v in (values or [default]) for n in v.split(",") if n.strip()]
    if not names:
        raise ValueError("no schedule given; pass --schedule NAME (see `pipesim schedules`)")
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
    p.set_defaults(chunks=None)  # unless --chunks is given, each schedule gets the chunks it is built for
    add_cost_options(p)
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="figure file: .png, .svg or .pdf")
    p.add_argument("--memory", action="store_true", help="add a memory panel (bytes per device) under each chart")
    p.add_argument("--no-transfers", action="store_true", help="do not draw transfers")
    p.add_argument("--labels", choices=("auto", "full", "short", "none"), default="auto",
                   help="box labels: auto (where they fit), full (F2,3), short (micro-batch), none")
    p.add_argument("--json", action="store_true", help="print a JSON summary of what was written")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..plots import gantt  # matplotlib is imported only when drawing

    names = schedule_names(args.schedule)
    results = []
    for name in names:
        chunks = args.chunks or getattr(generators.get_generator(name), "CHUNKS", 1) or 1
        results.append(simulate_from_args(argparse.Namespace(**{**vars(args), "chunks": chunks}), name))
    fig = gantt(results, memory=args.memory, transfers=not args.no_transfers, labels=args.labels)
    path = save_figure(fig, args.output)
    if args.json:
        print_json({"output": str(path), "schedules": [summary(r) for r in results]})
    else:
        for r in results:
            m = r.metrics
            print(f"{r.schedule.name:<10} makespan {m.makespan:.6g}  utilization {m.utilization:.1%}  "
                  f"bubble {m.bubble_fraction:.1%}")
        print(f"wrote {path}")
    return 0
