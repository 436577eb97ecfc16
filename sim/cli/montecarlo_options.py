"""The Monte Carlo options shared by ``simulate``, ``sweep`` and ``plan``: samples, what varies, what to rank by.

    pipesim simulate -s 1f1b,zb-h1 -K 4 -M 8 --samples 1000 --variability lognormal:0.1 \\
        --straggler device=any,factor=1.5,prob=0.2 --json
    pipesim sweep --schedules 1f1b,zb-h1 -K 4 -M 8,16 --samples 500 --variability lognormal:0.1 --rank-by p99 -o DIR

Each specification string is parsed by :mod:`sim.engines.variability`; a mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse

from pathlib import Path

from sim.cli.options import (UsageError, costs_from_args, runtime_costs, hardware_from_args, positive_int, print_json,
    schedule_from_args)
from sim.engines.variability import Variability
from sim.search.montecarlo import MAX_SAMPLES, RANK_STATISTICS, MonteCarlo, monte_carlo

__all__ = ["add_montecarlo_options", "variability_from_args", "sampling_requested", "run_simulate_samples",
           "format_samples"]


def add_montecarlo_options(p: argparse.ArgumentParser, *, rank: bool = False, plots: bool = False,
                           seed: bool = False) -> None:
    """--samples, --variability, --link-variability, --straggler, --slow-link, --pause; with *rank* --rank-by,
    with *plots* --mc-plots, with *seed* --seed (simulate has its own, shared with --jitter)."""
    g = p.add_argument_group("variability (Monte Carlo: a distribution of step times instead of one number)")
    g.add_argument("--samples", type=positive_int, default=None,
                   help=f"Monte Carlo samples with random durations (at most {MAX_SAMPLES:,}); reports mean, std "
                        f"and p50/p90/p99 of makespan, throughput and bubble")
    g.add_argument("--variability", metavar="DIST",
                   help="each computation's duration: lognormal:CV (mean-1 factor), normal:CV (truncated at 0) or "
                        "empirical:FILE (resample a measured timeline's per-(stage, kind) durations)")
    g.add_argument("--link-variability", metavar="DIST", help="each transfer's seconds: lognormal:CV or normal:CV")
    g.add_argument("--straggler", action="append", default=[], metavar="SPEC",
                   help="a slow device: device=N|any,factor=F[,prob=P] (repeatable)")
    g.add_argument("--slow-link", action="append", default=[], metavar="SPEC",
                   help="a slow directed link: src=A,dst=B,factor=F[,prob=P] (repeatable)")
    g.add_argument("--pause", metavar="SPEC",
                   help="periodic pauses: every=0.5s,length=20ms[,device=N|all][,aligned] (GC, checkpoint writes)")
    if seed:
        g.add_argument("--seed", type=int, default=0, help="random seed of the samples (default 0)")
    if plots:
        g.add_argument("--mc-plots", metavar="DIR", help="with --samples: write the makespan CDF and the p50/p99 "
                                                         "samples' Gantt charts into DIR")
    if rank:
        g.add_argument("--rank-by", choices=RANK_STATISTICS, default=None,
                       help="rank by this statistic of the makespan over the samples (default: mean with "
                            "--samples, else the deterministic run)")


def sampling_requested(args: argparse.Namespace) -> bool:
    """Whether any variability option was given (then --samples is needed)."""
    return bool(args.variability or args.link_variability or args.straggler or args.slow_link or args.pause)


def variability_from_args(args: argparse.Namespace) -> Variability | None:
    """The variability of the flags, or None without --samples; variability flags without --samples are refused
    (they would be silently ignored)."""
    if args.samples is None:
        if sampling_requested(args):
            raise UsageError("--variability, --link-variability, --straggler, --slow-link and --pause need "
                             "--samples N (how many random runs to draw)")
        if getattr(args, "rank_by", None) not in (None, "nominal"):
            raise UsageError(f"--rank-by {args.rank_by} needs --samples N")
        return None
    return Variability.parse(args.variability, links=args.link_variability, stragglers=args.straggler,
                             slow_links=args.slow_link, pause=args.pause)


def _runs_from_args(args: argparse.Namespace, variability: Variability) -> dict[str, MonteCarlo]:
    """``simulate --samples``: one Monte Carlo run per schedule of ``--schedule`` (comma-separated names share the
    seed, so they are compared on the same draws), or of the schedule file."""
    names = [n.strip() for n in args.schedule.split(",") if n.strip()] if "," in (args.schedule or "") else [None]
    runs: dict[str, MonteCarlo] = {}
    for name in names:
        schedule = schedule_from_args(args, name)
        costs = runtime_costs(args, costs_from_args(args, schedule.stages, schedule.stages // schedule.devices))
        hardware = hardware_from_args(args, schedule.devices)
        label = schedule.name if schedule.name not in runs else f"{schedule.name}#{len(runs)}"
        runs[label] = monte_carlo(schedule, costs, hardware, samples=args.samples, variability=variability,
                                  seed=args.seed, microbatch_size=args.microbatch_size,
                                  overlap_fb=getattr(args, "overlap_fb", None),
                                  runtime=getattr(args, "runtime", "pipesim"),
                                  post_overhead=getattr(args, "post_overhead", 0.0))
    return runs


def _record(mc: MonteCarlo) -> dict:
    s = mc.schedule
    out = {"schedule": s.name, "devices": s.devices, "stages": s.stages, "microbatches": s.microbatches,
           "iterations": s.iterations}
    out.update(mc.summary())
    return out


def format_samples(mc: MonteCarlo) -> str:
    """The text table of one Monte Carlo run."""
    d, s = mc.summary(), mc.schedule
    lines = [f"schedule {s.name}: K={s.devices}, S={s.stages}, M={s.microbatches}, {s.iterations} iteration(s); "
             f"{d['samples']} samples, seed {d['seed']}" + (f", runtime {mc.runtime}" if mc.runtime != "pipesim" else ""),
             "                  nominal       mean        std        p50        p90        p99"]
    for name, unit in (("makespan", "s"), ("throughput", "/s"), ("bubble", "")):
        q = d[f"{name}_quantiles"]
        lines.append(f"  {name + ' ' + unit:<14} {d['nominal_' + name]:>10.5g} {d[name + '_mean']:>10.5g} "
                     f"{d[name + '_std']:>10.4g} {q['p50']:>10.5g} {q['p90']:>10.5g} {q['p99']:>10.5g}")
    cp = d["critical_path"]
    if cp is not None:  # None: a summary without one (every engine's samples follow it since this round)
        lines.append("  device   on critical path   share of its seconds")
        for dev, (on, share) in enumerate(zip(cp["on_path_share"], cp["time_share"])):
            lines.append(f"  {dev:>6}   {on:>16.1%}   {share:>20.1%}")
        if cp["links_time_share"] > 0:
            lines.append(f"  links    {'':>16}   {cp['links_time_share']:>20.1%}")
    lines.extend(f"  note: {n}" for n in d["notes"])
    return "\n".join(lines)


def run_simulate_samples(args: argparse.Namespace, variability: Variability) -> int:
    """``pipesim simulate --samples N``: print the distributions; with --mc-plots DIR also draw them."""
    if args.engine == "simpy" or args.jitter:
        raise UsageError("--samples runs the fast engine's Monte Carlo; --jitter and --engine simpy are the simpy "
                         "engine's single random run: use --variability lognormal:CV instead")
    if args.timeline or args.trace:
        raise UsageError("--timeline and --trace write one run; with --samples use --mc-plots DIR (the p50 and p99 "
                         "samples' Gantt charts)")
    folder = None
    if args.mc_plots:
        from sim.files import check_output_dir

        folder = check_output_dir(args.mc_plots)
    runs = _runs_from_args(args, variability)
    written: dict[str, str] = {}
    if folder is not None:
        written = {k: str(v) for k, v in write_samples_plots(runs, folder).items()}
    if args.json:
        records = [_record(mc) for mc in runs.values()]
        out = records[0] if len(records) == 1 else {"runs": records}
        if written:
            out["plots"] = written
        print_json(out)
        return 0
    print("\n\n".join(format_samples(mc) for mc in runs.values()))
    for path in written.values():
        print(f"wrote {path}")
    return 0


def write_samples_plots(runs: dict[str, MonteCarlo], folder: Path) -> dict[str, Path]:
    """makespan_cdf.png (every run) and tail_gantt_<schedule>.png (its p50 and p99 samples) into *folder*."""
    from sim.io.figures import save_figure
    from sim.io.distribution_plots import makespan_cdf, tail_gantt

    out = {"cdf": save_figure(makespan_cdf(runs), Path(folder) / "makespan_cdf.png", dpi=110)}
    for label, mc in runs.items():
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in label)
        out[f"tail_gantt_{label}"] = save_figure(tail_gantt(mc), Path(folder) / f"tail_gantt_{safe}.png", dpi=90)
    return out


# ---------------------------------------------------------------------------------------------- sweep and plan
def sweep_samples(df, args: argparse.Namespace, variability: Variability, costs, hardware):
    """``sweep --samples``: the sweep table with the Monte Carlo columns of every row that ran
    (:data:`sim.search.montecarlo.SWEEP_SAMPLE_UNITS`), ranked by ``--rank-by`` (default mean)."""
    import pandas as pd

    from sim.search.montecarlo import SWEEP_SAMPLE_UNITS, sample_rows

    extra = sample_rows(df.to_dict(orient="records"), variability=variability, samples=args.samples,
                        seed=args.seed, rank=args.rank_by or "mean", costs=costs, hardware=hardware,
                        microbatch_size=args.microbatch_size, runtime=args.runtime,
                        post_overhead=args.post_overhead or 0.0)
    return pd.concat([df, pd.DataFrame(extra, index=df.index, columns=list(SWEEP_SAMPLE_UNITS))], axis=1)


def describe_sample_columns(sidecar: Path) -> None:
    """Add the Monte Carlo columns' units to a sweep's column sidecar (``sweep.columns.json``)."""
    import json

    from sim.files import atomic_path
    from sim.search.montecarlo import SWEEP_SAMPLE_UNITS

    described = json.loads(Path(sidecar).read_text())
    described.update({c: {"unit": u, "meaning": m} for c, (u, m) in SWEEP_SAMPLE_UNITS.items()})
    with atomic_path(sidecar) as tmp:
        tmp.write_text(json.dumps(described, indent=1) + "\n")


def _critical(row) -> str:
    """", most critical device D", or nothing where the row names none."""
    device = row.get("critical_device")
    return "" if device is None or device != device else f", most critical device {int(device)}"


def print_sweep_ranking(df, statistic: str, top: int = 5) -> None:
    """The best rows by the ranked statistic, with their nominal makespan beside it."""
    ranked = df[df["robust_rank"].notna()].sort_values("robust_rank").head(top)
    column = "makespan" if statistic == "nominal" else f"makespan_{statistic}"
    print(f"ranked by the {statistic} makespan per training sample, over "
          f"{int(ranked['samples'].iloc[0]) if len(ranked) else 0} samples each:")
    for _, row in ranked.iterrows():
        work = row["microbatches"] * row["iterations"] * row["microbatch_size"]
        print(f"  {int(row['robust_rank']):>3}. {row['schedule']:<18} K={row['devices']:<3} M={row['microbatches']:<5} "
              f"{statistic} makespan {row[column]:.5g} s = {work / row[column]:.4g} samples/s (nominal "
              f"{row['makespan']:.5g} s, mean slowdown {row['slowdown_mean']:.3f}{_critical(row)})")


PLAN_SAMPLE_COLUMNS = ["robust_rank", "schedule", "pipeline", "tensor", "data", "microbatch_size", "microbatches",
                       "chunks", "recompute", "iteration_time", "iteration_time_mean", "iteration_time_p50",
                       "iteration_time_p90", "iteration_time_p99", "slowdown_mean", "critical_device", "rank"]


def plan_samples(result, model, gpu, space, args: argparse.Namespace, variability: Variability):
    """``plan --samples``: the first ``--robust-top`` ranked candidates sampled and re-ranked by ``--rank-by``
    (default mean) of their iteration time (the pipeline's sampled makespan plus the data-parallel gradient sync,
    which does not vary here). A DataFrame of :data:`PLAN_SAMPLE_COLUMNS`; ``rank`` is the deterministic rank."""
    import pandas as pd

    from sim.search.montecarlo import rank_by
    from sim.search.planner import simulate_candidate

    statistic = args.rank_by or "mean"
    rows = []
    for i, row in enumerate(result.ranked.head(args.robust_top).to_dict(orient="records")):
        nominal = simulate_candidate(model, gpu, row, space, efficiency=args.mfu, memory_cap=args.memory_cap)
        mc = monte_carlo(nominal.schedule, nominal.costs, nominal.hardware, samples=args.samples,
                         variability=variability, seed=args.seed, microbatch_size=nominal.microbatch_size,
                         runtime=space.runtime, post_overhead=space.post_overhead or 0.0)
        sync = float(row["dp_sync"]) if row.get("dp_sync") == row.get("dp_sync") else 0.0  # NaN: no data parallelism
        d = mc.summary()
        q = d["makespan_quantiles"]
        rows.append({**{c: row[c] for c in PLAN_SAMPLE_COLUMNS[1:10]},
                     "iteration_time_mean": d["makespan_mean"] + sync, "iteration_time_p50": q["p50"] + sync,
                     "iteration_time_p90": q["p90"] + sync, "iteration_time_p99": q["p99"] + sync,
                     "slowdown_mean": d["slowdown_mean"],
                     "critical_device": None if d["critical_path"] is None else d["critical_path"]["slowest_device"],
                     "rank": i + 1, "_key": rank_by(mc, statistic) + sync})
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values(["_key", "rank"], kind="stable").reset_index(drop=True)
        frame["robust_rank"] = range(1, len(frame) + 1)
        frame = frame.drop(columns="_key")
    return frame.reindex(columns=PLAN_SAMPLE_COLUMNS)


def write_plan_samples(frame, folder: Path) -> Path:
    """``robust.csv``: :func:`plan_samples`'s table, atomically."""
    from sim.files import atomic_path

    path = Path(folder) / "robust.csv"
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return path


def print_plan_samples(frame, statistic: str, samples: int) -> None:
    print(f"  robustness: the first {len(frame)} ranked candidates over {samples} samples each, ranked by the "
          f"{statistic} iteration time")
    print("  robust  rank  nominal (s)     mean (s)      p99 (s)  slowdown  candidate")
    for _, row in frame.iterrows():
        print(f"  {int(row['robust_rank']):>6}  {int(row['rank']):>4}  {row['iteration_time']:>11.4g}  "
              f"{row['iteration_time_mean']:>11.4g}  {row['iteration_time_p99']:>11.4g}  {row['slowdown_mean']:>8.3f}  "
              f"{row['schedule']} p={row['pipeline']} t={row['tensor']} d={row['data']} b={row['microbatch_size']} "
              f"M={row['microbatches']} v={row['chunks']} {row['recompute']}")
