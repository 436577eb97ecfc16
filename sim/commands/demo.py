"""``pipesim demo``: the main job of the README's run command.

    pipesim demo                 # K=4, M=4, the classroom case
    pipesim demo -o reports

Simulates naive, GPipe, 1F1B and PipeDream on the same uniform costs and prints
their figures side by side.
"""

from __future__ import annotations

import argparse

from .. import schedules
from ..cost import uniform
from ..simulate import simulate
from .options import positive_int

__all__ = ["register", "run"]

DEMO_SCHEDULES = ("naive", "gpipe", "1f1b", "pipedream")


def register(sub) -> None:
    p = sub.add_parser("demo", help="the README's main job: compare the classic schedules",
                       description="Simulate naive, GPipe, 1F1B and PipeDream on the classroom case.")
    p.add_argument("--devices", "-K", type=positive_int, default=4)
    p.add_argument("--microbatches", "-M", type=positive_int, default=4)
    p.add_argument("--output", "-o", default="reports", help="folder for the reports (default reports/)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    K, M = args.devices, args.microbatches
    costs = uniform(K, forward=1.0, backward=2.0, activation_bytes=1.0, weight_bytes=1.0)
    print(f"Classroom case: K={K} devices, M={M} micro-batches, forward 1, backward 2, free links\n")
    print(f"{'schedule':<10} {'makespan':>9} {'utilization':>12} {'bubble':>7}  {'in-flight per device':<22} weight versions")
    for name in DEMO_SCHEDULES:
        r = simulate(schedules.generate(name, K, M), costs)
        m = r.metrics
        print(f"{name:<10} {m.makespan:>9.4g} {m.utilization:>12.1%} {m.bubble_fraction:>7.1%}  "
              f"{str(m.peak_inflight):<22} {m.weight_versions}")
    return 0
