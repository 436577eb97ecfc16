"""The runtime model's variants on saved PyTorch-runtime traces, paired: every variant predicts the same steps.

    python benchmarks/bench_runtime.py --steps 10 --output runs/a          # launch once, keep the traces
    python benchmarks/bench_runtime_replay.py runs/a [runs/b ...] [--variants default no-freezes ...]

One launch's median error moves by up to 12 points from the next's on the shared 2-core machine (README, "Against
PyTorch's runtime"), so a change to the model is judged on the same traces, before and after. For each folder (a
``validate --runtime torch`` or ``bench_runtime.py --output`` folder: each schedule's report JSON and its rank
traces) and schedule, each variant's median makespan error over the profiled steps (measured / predicted - 1, as
the report computes it) and the worst part of its idle split (the mean of the draws against the mean of the steps,
in points); then per variant the mean |median error|, how many are within 5% and the mean worst split. The README's
paired figures ("Each run from one profiled step", "A stall holds the pair", "A call posts as it returns") come from
it. Nothing is launched: each trace is ingested and predicted again (torch is imported for the schedule classes
only).

Variants (:data:`VARIANTS`): ``default`` (what ``validate --runtime torch`` predicts), ``no-freezes`` (a drawn
stall does not hold its pair of ranks), ``pooled-dispatch`` (every run charges the dispatch overhead of all steps),
``by-step`` (each run's message times from its own step too), ``no-collisions`` (the calls that collide with an
unexpected message drawn from all calls, not apart: the default before 26 Nov 2026's "A call posts as it returns"),
``collisions`` (the collision rule forced on: what an older checkout, whose default was without it, needs),
``no-call-overhead`` (no runtime time charged around the calls: the default before 26 Nov 2026's "The runtime's
own time around a call").
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VARIANTS = {
    "default": {},
    "no-freezes": {"freezes": False},
    "pooled-dispatch": {"per_step_dispatch": False},
    "by-step": {"by_step": True},
    "no-collisions": {"collisions": False},
    "collisions": {"collisions": True},
    "no-call-overhead": {"call_overhead": False},
}


@dataclass(frozen=True)
class Replayed:
    """One variant's prediction of one run's profiled steps."""

    variant: str
    predicted: float
    """Seconds: the run of median makespan of the draws."""
    error_median: float
    """Median over the profiled steps of measured / predicted - 1."""
    split_worst: float
    """Points of K x makespan: the largest |predicted - measured| over dependency, communication and gap."""
    dependency: tuple[float, float]
    """(predicted, measured) dependency share, mean of the draws and of the steps."""
    step_stalls: tuple[int, ...] = ()
    """With ``stalls=True``: per profiled step, its stalls (:func:`validate.ingest.message_draws.step_stalls`)."""
    draw_stalls: tuple[int, ...] = ()
    """With ``stalls=True``: per draw, its stalls (:func:`validate.ingest.message_draws.drawn_stalls`)."""
    draw_spans: tuple[float, ...] = ()
    """With ``stalls=True``: per draw, its makespan (seconds)."""


def replay(traces: list[str], torch_class: str, devices: int, microbatches: int, *, batch: int = 64,
           variants: list[str] = ("default",), stalls: bool = False) -> tuple[list[float], list[Replayed]]:
    """The profiled steps' makespans of *traces* (one per rank) and each variant's prediction of them; *stalls*:
    with every step's and every draw's count of stalls (calls and waited-for transfers over 1 ms)."""
    from validate.compare.idle import CATEGORIES, mean_split, split_idle
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.flow import ingest
    from validate.ingest.message_draws import message_distributions, predict_drawn
    from validate.pytorch.schedules import pytorch_schedule

    schedule, _ = pytorch_schedule(torch_class, devices, microbatches)
    ing = ingest(traces, schedule, microbatch_size=batch)
    spans = [r.metrics.makespan for _, r in sorted(ing.steps.items())]
    if stalls:
        from validate.ingest.message_draws import drawn_stalls, step_stalls
        in_steps = tuple(step_stalls(ing.messages.get(k, {}), ing.steps[k]) for k in sorted(ing.steps))
    measured = mean_split([split_idle(ing.steps[k], ing.communication(k, runtime="torch")) for k in sorted(ing.steps)])
    out = []
    for name in variants:
        options = dict(VARIANTS[name])
        per_step_dispatch = options.pop("per_step_dispatch", True)
        overhead = getattr(ing, "call_overhead", None) if options.pop("call_overhead", True) else None
        dist = message_distributions(ing.messages, results=ing.steps, schedule=ing.schedule,
                                     **_accepted(message_distributions,
                                                 spans=ing.comm_spans if per_step_dispatch else None,
                                                 overhead=overhead))
        cal = ing.calibration
        rt = calibrate_runtime(ing.runs(), cal.costs, cal.hardware, "torch", draws=dist)
        record = [] if stalls else None
        if rt.draws is not None:
            result, _, drawn, splits = predict_drawn(schedule, rt.costs, rt.hardware, rt.runtime, rt.draws,
                                                     microbatch_size=batch,
                                                     **_accepted(predict_drawn, **options, record=record))
        else:  # no message could be timed: the medians, one run
            result, ran = rt.predict(schedule, microbatch_size=batch)
            splits, drawn = [split_idle(result, ran.communication)], [result.metrics.makespan]
        counted = {}
        if stalls and record:
            counted = {"step_stalls": in_steps, "draw_spans": tuple(float(x) for x in drawn),
                       "draw_stalls": tuple(drawn_stalls(schedule, *drawn_run) for drawn_run in record)}
        p = result.metrics.makespan
        split = mean_split(splits)
        worst = max(abs(split[f"{c}_fraction"] - measured[f"{c}_fraction"]) for c in CATEGORIES)
        out.append(Replayed(name, p, float(np.median([(m - p) / p for m in spans])), 100 * worst,
                            (split["dependency_fraction"], measured["dependency_fraction"]), **counted))
    return spans, out


STALL_GROUPS = 5
"""Stall counts 0, 1, 2, 3 and 4 or more."""


def stall_cells(spans: list[float], row: Replayed) -> str:
    """The stall table's cells of one run (``--stalls``): stalls per step, the share of steps (draws) with each
    number of stalls, and the median makespan at each number, measured : predicted. A step's makespan at 1-ms
    actions on gloo is mostly set by how many calls or transfers stalled to the scheduler's tick (README, "Why a
    launch's median moves"); this says whether the draws have the steps' number of stalls and, at each number,
    their makespan."""
    if not row.draw_stalls:
        return "- | - | - | -"
    groups = [np.minimum(np.asarray(row.step_stalls), STALL_GROUPS - 1),
              np.minimum(np.asarray(row.draw_stalls), STALL_GROUPS - 1)]
    times = [np.asarray(spans), np.asarray(row.draw_spans)]

    def share(n):
        return " : ".join(f"{np.mean(g == n):.0%}" for g in groups)

    def median(n):
        return " : ".join(f"{np.median(t[g == n]) * 1e3:.1f}" if (g == n).any() else "-" for g, t in zip(groups, times))

    return (f"{np.mean(row.step_stalls):.2f} : {np.mean(row.draw_stalls):.2f} | "
            + " / ".join(share(n) for n in range(STALL_GROUPS)) + " | "
            + " / ".join(median(n) for n in range(STALL_GROUPS))
            + f" | {np.median(spans) * 1e3:.1f} : {np.median(row.draw_spans) * 1e3:.1f}")


def _accepted(function, **options) -> dict:
    """The *options* *function* takes: an older checkout first on PYTHONPATH (``git worktree add /tmp/old REV``,
    then ``PYTHONPATH=/tmp/old python benchmarks/bench_runtime_replay.py ...``) predicts the same traces with the
    code of then, whose functions lack this round's keywords (its default is then's default)."""
    import inspect

    return {k: v for k, v in options.items() if k in inspect.signature(function).parameters}


def runs_in(folder: Path) -> list[tuple[str, dict, list[str]]]:
    """(stem, report JSON, rank traces) of every PyTorch-runtime run saved in *folder*."""
    found = []
    for report in sorted(folder.glob("*_torch.json")):
        stem = report.name[: -len(".json")]
        traces = sorted(str(t) for t in folder.glob(f"{stem}_rank*.json.gz"))
        if traces:
            found.append((stem, json.loads(report.read_text()), traces))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--variants", nargs="+", default=["default", "no-freezes"], choices=list(VARIANTS))
    p.add_argument("--batch", type=int, default=64, help="the runs' micro-batch size (bench_runtime.py's default)")
    p.add_argument("--stalls", action="store_true",
                   help="also tabulate, for the first variant, the steps and the draws by their number of stalls "
                        "(calls and waited-for transfers over 1 ms) and the median makespan at each number")
    args = p.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir() or not runs_in(folder):
            print(f"bench_runtime_replay: no saved PyTorch-runtime run (<stem>_torch.json and its rank traces) in "
                  f"{folder}", file=sys.stderr)
            return 2
    head = " | ".join(f"{v}: error, worst split (pts)" for v in args.variants)
    print(f"| folder | schedule | load before / after | {head} |")
    print("|---|---|---|" + "---|" * len(args.variants))
    totals: dict[str, list[Replayed]] = {v: [] for v in args.variants}
    stall_rows = []
    for folder in args.folders:
        for stem, report, traces in runs_in(folder):
            spans, rows = replay(traces, report["torch_class"], report["devices"], report["microbatches"],
                                 batch=args.batch, variants=args.variants, stalls=args.stalls)
            load = report.get("load_average") or [float("nan")] * 2
            cells = " | ".join(f"{r.error_median:+.1%}, {r.split_worst:.1f}" for r in rows)
            print(f"| {folder.name} | {stem.split('_K')[0]} | {load[0]:.2f} / {load[1]:.2f} | {cells} |", flush=True)
            for r in rows:
                totals[r.variant].append(r)
            if args.stalls:
                stall_rows.append(f"| {folder.name} | {stem.split('_K')[0]} | {stall_cells(spans, rows[0])} |")
    if stall_rows:
        print(f"\nStalls ({args.variants[0]}; steps : draws): a stall is a call or a waited-for transfer over 1 ms")
        print("| folder | schedule | stalls per step (mean) | share with 0 / 1 / 2 / 3 / 4+ | median makespan (ms) with "
              "0 / 1 / 2 / 3 / 4+ | median (ms) |")
        print("|---|---|---|---|---|---|")
        print("\n".join(stall_rows))
    print()
    for v, rows in totals.items():
        errors = np.abs([r.error_median for r in rows])
        print(f"{v}: mean |median error| {errors.mean():.1%}, within 5% in {int((errors <= 0.05).sum())} of "
              f"{len(rows)}, mean worst split {np.mean([r.split_worst for r in rows]):.1f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
