"""``pipesim synthesize``: search a schedule for given costs, links and memory cap, check it, print and save it.

    pipesim synthesize -K 4 -M 8 --forward 1 --backward 1 --weight 1 --memory-limit 4      # finds ZB-H1's makespan
    pipesim synthesize -K 8 -M 32 --costs stages.csv --latency 6e-4 --memory-limit 16 --json
    pipesim synthesize -K 4 -M 8 --weight 1 --memory-limit 3 --method ilp                  # exact (pipesim[synth])
    pipesim synthesize -K 4 -M 16 --weight 1 --placement v --memory-limit 4 -o mine.csv --gantt mine.png
    pipesim simulate --schedule-file mine.csv --weight 1                                    # the file runs anywhere

The search is :func:`sim.synthesize` (greedy list scheduler + local search, or the ILP; every order timed by the
exact engine). The schedule printed has been validated (every action once, no deadlock) and its memory, per the
memory model, stays under the cap on every device. Beside it: the lower bound and the gap, every registered flush
schedule under the same cap, and a line saying what the synthesized one gains over the best that fits, and where.

``--memory-limit N``: N micro-batches of activations per device (the zero-bubble paper's M_limit; 1F1B holds K on
its first device, ZB-H2 2K-1); ``--memory-capacity BYTES``: the cap in bytes. ``-o FILE`` writes the schedule
(.csv: PyTorch's schedule CSV, .json or .txt: pipesim's); ``--gantt FILE`` draws it above the best registered
schedule that fits; ``--validate emulated|mlp`` runs it on this machine with the validator and compares measured
with predicted.
"""

from __future__ import annotations

import argparse
import math

from sim.cli.options import (DefaultInt, UsageError, add_cost_options, costs_from_args, hardware_from_args,
                             positive_float, positive_int, print_json)
from sim.errors import PipesimError
from sim.model.cost import StageCosts, load_costs
from sim.search.synthesis import METHODS, OBJECTIVES, Synthesis, synthesize
from sim.search.synthesis_compare import Rival, best_fitting, compare_registered, gain
from sim.search.synthesis_problem import PLACEMENTS, device_costs_to_stages, v_placement

__all__ = ["register", "run", "format_report", "report_json"]

SCHEDULE_FORMATS = {".csv": "pytorch-csv", ".json": "json", ".txt": "text"}


def register(sub) -> None:
    p = sub.add_parser("synthesize", help="search a schedule that minimises the makespan under a memory cap",
                       description="Search per-device action orders (greedy + local search, or an exact ILP) that "
                                   "minimise the makespan without exceeding a per-device memory cap; every result "
                                   "is checked by the exact engine.")
    p.add_argument("--devices", "-K", type=positive_int, default=DefaultInt(4), help="pipeline devices K (default 4)")
    p.add_argument("--microbatches", "-M", type=positive_int, default=DefaultInt(8),
                   help="micro-batches M (default 8)")
    p.add_argument("--placement", choices=PLACEMENTS + ("any",), default="linear",
                   help="linear: stage s on device s; v: 2K stages in a V, s and 2K-1-s on device s; any: search "
                        "both, keep the faster (default linear)")
    p.add_argument("--recompute", action="store_true",
                   help="allow recomputing forwards (R before B, only the checkpoint kept) to stay under the cap")
    p.add_argument("--no-split", dest="split", action="store_false", default=None,
                   help="run each backward as one action (default: split into B and W where --weight > 0)")
    p.add_argument("--memory-limit", type=positive_float, default=None, metavar="N",
                   help="cap: N micro-batches of activations per device (1F1B: K); or --memory-capacity BYTES")
    p.add_argument("--weight-memory", dest="weight_memory", type=_fraction, default=None, metavar="FRACTION",
                   help="share of a micro-batch's activations its W still needs after B (the zero-bubble paper's "
                        "M_W / M_B; B frees the rest; default 1: all kept until W, or the costs file's "
                        "weight_activation_bytes)")
    p.add_argument("--objective", choices=OBJECTIVES, default="makespan",
                   help="makespan: the iteration's first start to last end (default); span: the longest device's "
                        "first start to last end first (the zero-bubble paper's cost and bubble rate)")
    p.add_argument("--method", choices=METHODS, default="auto",
                   help="auto (default: ilp where small and PuLP is installed, else local), greedy, local, ilp")
    p.add_argument("--seconds", type=positive_float, default=None,
                   help="search budget in seconds (local search; ILP time limit, default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the local search's move order (default 0)")
    add_cost_options(p)
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write the schedule: .csv (PyTorch's schedule CSV), .json or .txt (pipesim's)")
    p.add_argument("--torch-version", default="2.6", help="PyTorch CSV dialect of -o .csv (default 2.6)")
    p.add_argument("--gantt", metavar="FILE", help="draw the schedule above the best registered one (.png/.svg/.pdf)")
    p.add_argument("--validate", choices=("emulated", "mlp"), default=None,
                   help="run the schedule with the validator on this machine and compare measured with predicted")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _fraction(text: str) -> float:
    """A number between 0 and 1 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction between 0 and 1")
    return value


def _costs(args: argparse.Namespace) -> StageCosts:
    """Costs per stage of the placement: a V takes a costs file of 2K stage rows, or K device rows (or the flags)
    with each device's work cut over its two stages."""
    K = args.devices
    if args.placement in ("linear", "any"):
        return costs_from_args(args, K)
    if args.costs and load_costs(args.costs).stages == 2 * K:
        return costs_from_args(args, 2 * K)
    return device_costs_to_stages(costs_from_args(args, K), v_placement(K))


def run(args: argparse.Namespace) -> int:
    if args.memory_limit is not None and args.memory_capacity is not None:
        raise UsageError("give the cap either as --memory-limit N (micro-batches) or --memory-capacity BYTES")
    if args.output and _format(args.output) is None:
        raise UsageError(f"-o {args.output}: use a .csv, .json or .txt file")
    if args.gantt:
        from sim.io.figures import check_figure_path

        check_figure_path(args.gantt)
    costs = _costs(args)
    hardware = hardware_from_args(args, args.devices)
    if hardware.memory_capacity is not None and args.memory_limit is None:
        memory_bytes = hardware.memory_capacity
    else:
        memory_bytes = None
    found = synthesize(costs, hardware, microbatches=args.microbatches, placement=args.placement, split=args.split,
                       recompute=args.recompute, memory_bytes=memory_bytes, memory_limit=args.memory_limit,
                       method=args.method, seconds=args.seconds, seed=args.seed, weight_memory=args.weight_memory,
                       objective=args.objective)
    rivals = compare_registered(found, costs, hardware)
    if args.output:
        from sim.io.schedule_io import write_schedule_file

        write_schedule_file(found.schedule, args.output, _format(args.output), torch_version=args.torch_version)
    if args.gantt:
        _draw(found, best_fitting(rivals), args.gantt)
    validation = None
    if args.validate:
        validation = _validate(found, costs, args.validate)
    if args.json:
        out = report_json(found, rivals, memory_limit=args.memory_limit)
        if validation is not None:
            out["validation"] = validation
        print_json(out)
    else:
        print(format_report(found, rivals, memory_limit=args.memory_limit))
        if validation is not None:
            grads = {True: "gradients match", False: "GRADIENTS DIFFER", None: "gradients not checked (emulated)"}
            low, high = validation["error_range"]
            print(f"validation ({args.validate}): median run measured {validation['measured']:.6g} s, predicted "
                  f"{validation['predicted']:.6g} s; error over the runs {validation['error']:+.1%} (p10-p90 "
                  f"{low:+.1%}..{high:+.1%}), "
                  f"{grads[validation['gradients_match']]}; report in {validation['report']}")
    return 0


def _format(path: str) -> str | None:
    from pathlib import Path

    return SCHEDULE_FORMATS.get(Path(path).suffix.lower())


def _cap_text(found: Synthesis, memory_limit: float | None) -> str:
    p = found.problem
    kept = "" if p.weight_memory is None else f" (W keeps {p.weight_memory:.0%} of them after B)"
    if memory_limit is not None:
        return f"{memory_limit:g} micro-batches of activations per device{kept}"
    if all(math.isinf(c) for c in p.cap):
        return "no memory cap"
    return "cap " + ", ".join(f"{c:.4g}" for c in p.cap) + " bytes per device"


def format_report(found: Synthesis, rivals: list[Rival], *, memory_limit: float | None = None) -> str:
    """The text ``pipesim synthesize`` prints."""
    p, m = found.problem, found.result.metrics
    split = "B/W split" if p.split else "backward unsplit"
    lines = [f"synthesized schedule: K={p.devices} devices, M={p.microbatches} micro-batches, {p.stages} stages "
             f"({'V' if p.stages > p.devices else 'linear'} placement), {split}"
             f"{', recompute allowed' if p.recompute else ''}; {_cap_text(found, memory_limit)}",
             f"  makespan      {found.makespan:.6g} s",
             f"  lower bound   {found.bound:.6g} s   gap {max(found.gap, 0.0):.2%}"  # not -0.00% at the bound
             f"{'   (optimal)' if found.optimal else ''}",
             f"  found by      {found.method} in {found.seconds:.2f} s ({found.evaluations} orders timed by the "
             f"exact engine), starting from {found.start}",
             f"  bubble rate (ZB) {m.bubble_rate_zb:.2%}   bubble fraction {m.bubble_fraction:.2%}",
             "  peak memory   " + ", ".join(_amount(v, p.units) for v in m.peak_memory)
             + "   (cap " + ", ".join(_amount(c, p.units) for c in p.cap) + ")"]
    lines += [f"  note: {n}" for n in found.notes]
    lines.append("registered schedules under the same costs, links and cap:")
    for r in rivals:
        over = "" if r.fits else "   over the cap (peak " + ", ".join(_amount(v, p.units) for v in r.peak) + ")"
        lines.append(f"  {r.name:<18} {r.makespan:<12.6g}{over}")
    best = best_fitting(rivals)
    lines.append("gain: " + (gain(found, best).line() if best else "no registered schedule fits the cap"))
    lines.append("schedule:")
    lines.append(found.schedule.to_text())
    return "\n".join(lines)


def _amount(value: float, units: bool) -> str:
    if math.isinf(value):
        return "none"
    return f"{value:.3g} mb" if units else f"{value:.4g} B"


def report_json(found: Synthesis, rivals: list[Rival], *, memory_limit: float | None = None) -> dict:
    """The JSON object of ``pipesim synthesize --json``."""
    from sim.io.schedule_io import to_json

    p = found.problem
    best = best_fitting(rivals)
    out = {
        "devices": p.devices, "microbatches": p.microbatches, "stages": p.stages, "placement": list(p.placement),
        "split": p.split, "recompute": p.recompute, "memory_limit": memory_limit, "weight_memory": p.weight_memory,
        "cap": [None if math.isinf(c) else c for c in p.cap], "cap_units": "microbatches" if p.units else "bytes",
        "makespan": found.makespan, "bound": found.bound, "gap": found.gap, "optimal": found.optimal,
        "method": found.method, "start": found.start, "seconds": found.seconds, "evaluations": found.evaluations,
        "notes": list(found.notes), "metrics": found.result.metrics.to_dict(),
        "registered": [{"name": r.name, "makespan": r.makespan, "fits": r.fits, "peak": list(r.peak)} for r in rivals],
        "gain": None, "schedule": to_json(found.schedule),
    }
    if best is not None:
        g = gain(found, best)
        out["gain"] = {"rival": g.rival, "seconds": g.seconds, "fraction": g.fraction, "idle": g.idle,
                       "line": g.line()}
    return out


def _draw(found: Synthesis, best: Rival | None, path: str) -> None:
    from sim.io.figures import save_figure
    from sim.io.plots import gantt

    results = [found.result] + ([best.result] if best is not None else [])
    titles = [f"synthesized: {found.makespan:.4g} s (bound {found.bound:.4g} s)"]
    if best is not None:
        titles.append(f"{best.name}, the best registered schedule under the same cap: {best.makespan:.4g} s")
    units = "micro-batches of activation" if found.problem.units else None  # no byte sizes: the synthesis' units
    save_figure(gantt(results, titles=titles, memory=True, memory_units=units), path)


def _validate(found: Synthesis, costs: StageCosts, workload: str) -> dict:
    """Run the schedule with the validator (our executor, one process per device) and compare."""
    try:
        from validate.run import run_validation  # sim/cli's one lazy call into validate: torch is needed here only
    except ImportError as exc:
        raise PipesimError(f"--validate needs the validator and torch: pip install 'pipesim[validate]' ({exc})") \
            from None
    options = {"costs": costs} if workload == "emulated" else {}
    report = run_validation(found.schedule, found.problem.devices, found.problem.microbatches, workload=workload,
                            output_dir="reports/synthesis", **options)
    runs = report.makespans or (report.measured.metrics.makespan,)
    predictions = report.predictions or (report.predicted.metrics.makespan,) * len(runs)
    i = report.median_run if report.median_run < len(runs) else 0
    return {"measured": runs[i], "predicted": predictions[i],  # the run of median makespan and its prediction
            "error": report.makespan_error, "error_range": list(report.makespan_error_range),
            "gradients_match": report.gradients_match,
            "report": str(report.paths.get("report", "reports/synthesis"))}
