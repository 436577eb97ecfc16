"""``pipesim page``: self-contained interactive HTML pages.

    pipesim page playground -o playground.html                     # the schedule playground (K <= 8, M <= 32)
    pipesim page playground -o big.html --max-devices 12 --max-microbatches 48

The playground needs no server and no network: open the file in any browser, or put it on a static host.
Timeline pages of a run come from ``--html FILE`` on ``simulate``, ``gantt``, ``validate``, ``ingest`` and
``sweep``.
"""

from __future__ import annotations

import argparse

from sim.cli.options import positive_int
from sim.io.pages import check_page_path, playground_page, write_page

__all__ = ["register", "run_playground"]


def register(sub) -> None:
    p = sub.add_parser("page", help="write an interactive HTML page (the schedule playground)",
                       description="Write a self-contained interactive HTML page: no server, no network.")
    kinds = p.add_subparsers(dest="page", metavar="PAGE", parser_class=type(p))
    kinds.required = True
    q = kinds.add_parser("playground", help="the schedule playground: controls, Gantt, memory, figures",
                         description="Every registered schedule for K = 1..max-devices and M = 1..max-microbatches, "
                                     "simulated in the page as its controls move.")
    q.add_argument("--output", "-o", required=True, metavar="FILE", help="the page to write (.html)")
    q.add_argument("--max-devices", type=positive_int, default=8, help="largest K the page offers (default 8, at most 16)")
    q.add_argument("--max-microbatches", type=positive_int, default=32,
                   help="largest M the page offers (default 32, at most 64)")
    q.set_defaults(func=run_playground)


def run_playground(args: argparse.Namespace) -> int:
    check_page_path(args.output)  # before the schedules are generated
    text = playground_page(max_devices=args.max_devices, max_microbatches=args.max_microbatches)
    path = write_page(text, args.output)
    print(f"wrote {path} ({len(text.encode()) / 1e6:.2f} MB): open it in a browser; it needs no network")
    return 0
