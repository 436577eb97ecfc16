"""``pipesim sweep``: simulate a grid of schedules x devices x micro-batches; write a CSV and plots.

    pipesim sweep -o reports/sweep                                      # the default grid below
    pipesim sweep --schedules naive,gpipe,1f1b,pipedream --devices 2,4,8,16 --microbatches 1-128 -o DIR --jobs 2
    pipesim sweep --schedules gpipe,1f1b --devices 4 --microbatches 1-16 --activation-bytes 4e6 -o DIR --json
    pipesim sweep --schedules gpipe,1f1b,zb-h1 --devices 2,4,8 --microbatches 1..64 -o DIR --html DIR/sweep.html
    pipesim sweep ... --executor dask --jobs 8                          # a Dask LocalCluster of 8 workers
    pipesim sweep ... --executor dask=tcp://scheduler:8786              # the workers of a running Dask scheduler
    pipesim sweep --schedules 1f1b,zb-h1 -K 4 -M 8,16 --samples 500 --straggler device=any,factor=1.5,prob=0.2 \
        --rank-by p99 -o DIR                                             # distributions per row (sim.search.montecarlo)
    pipesim sweep --schedules gpipe,1f1b,zb-h1 -K 2,4 -M 4-16 --latency 1e-4 --runtime torch --dispatch 5e-5 -o DIR

Lists: '2,4,8', '1..128' (powers of two from 1 to 128), '1-8' (every integer), or a mix.
Writes DIR/sweep.csv (one row per configuration; columns in :data:`sim.search.sweep.SWEEP_COLUMNS`) with
DIR/sweep.columns.json (unit and meaning of each column), then DIR/sweep_utilization.png
(utilization vs M per K, with each schedule's closed form), DIR/sweep_heatmap.png (utilization over
K x M per schedule) and DIR/sweep_memory.png (peak memory vs M), each atomically (``--no-plots``: the CSV only).

A costs or hardware file applies to every row, so a file that cannot be read, or that does not fit
every K of the grid, is refused before any simulation (exit 2); configurations a schedule rejects
stay rows with their reason in ``error``. ``--runtime`` (with ``--dispatch`` and ``--post-overhead``, as for
``pipesim simulate``) simulates every row as that runtime executes it; the ``runtime`` column says which. Ctrl-C or SIGTERM stops the workers at once and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sim.schedules import registry as generators
from sim.search.batch import EXECUTORS, check_executor, resolve_chunks
from sim.model.cost import DISPATCH_COLUMNS, check_totals, load_costs, uniform
from sim.errors import PipesimError
from sim.files import check_output_dir, check_writable_dir
from sim.model.hardware import Hardware, load_hardware
from sim.model.runtimes import DEFAULT_RUNTIME
from sim.search.sweep import run_sweep, write_sweep_csv
from sim.io.figures import FIGURE_FORMATS, save_figure
from sim.cli.options import (add_cost_options, add_runtime_options, add_shape_options, int_list, positive_int,
                             print_json, runtime_costs)
from sim.cli.montecarlo_options import (add_montecarlo_options, describe_sample_columns, print_sweep_ranking,
    sweep_samples, variability_from_args)

__all__ = ["register", "run", "write_sweep", "write_sweep_plots", "DEFAULT_SCHEDULES", "DEFAULT_DEVICES",
           "DEFAULT_MICROBATCHES"]

DEFAULT_SCHEDULES = "naive,gpipe,1f1b,pipedream"
DEFAULT_DEVICES = "2,4,8,16"
DEFAULT_MICROBATCHES = "1..128"


class SweepInputError(PipesimError):
    """A costs or hardware file that cannot serve every row of the sweep."""


def register(sub) -> None:
    p = sub.add_parser("sweep", help="simulate a grid of schedules, K and M; write a CSV and plots",
                       description="Simulate every combination of schedules, devices and micro-batches with the same "
                                   "cost flags; write a tidy CSV and plots to a folder.")
    p.add_argument("--schedules", default=DEFAULT_SCHEDULES,
                   help=f"comma-separated schedules (default {DEFAULT_SCHEDULES}): {', '.join(generators.names())}")
    p.add_argument("--devices", "-K", type=int_list, default=int_list(DEFAULT_DEVICES),
                   help=f"device counts K (default {DEFAULT_DEVICES}); '2,4', '2..16' doubling, '2-8' every integer")
    p.add_argument("--microbatches", "-M", type=int_list, default=int_list(DEFAULT_MICROBATCHES),
                   help=f"micro-batch counts M (default {DEFAULT_MICROBATCHES})")
    add_shape_options(p, lists=True)
    p.set_defaults(chunks=None)  # unless --chunks is given, each schedule gets the chunks it is built for
    add_cost_options(p)
    add_runtime_options(p)  # --runtime, --dispatch, --post-overhead: every row simulated as that runtime runs it
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for sweep.csv and the plots")
    p.add_argument("--format", choices=FIGURE_FORMATS, default="png", help="plot format (default png)")
    p.add_argument("--no-plots", action="store_true", help="write the CSV (and its column sidecar) only")
    p.add_argument("--jobs", "-j", type=positive_int, default=1,
                   help="worker processes, or Dask workers with --executor dask (default 1)")
    p.add_argument("--executor", default="processes", metavar="WHERE",
                   help=f"where the simulations run: {' | '.join(EXECUTORS)} (default processes; Dask needs "
                        f"pip install 'pipesim[dask]')")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print a JSON summary of what was written")
    p.add_argument("--html", metavar="FILE", help="also write the utilization curves as an interactive page: hover "
                                                  "a point for its row (.html; self-contained, no network)")
    add_montecarlo_options(p, rank=True, seed=True)  # --samples: each row's makespan as a distribution
    p.set_defaults(func=run)


def write_sweep_plots(df: pd.DataFrame, folder: str | Path, *, fmt: str = "png") -> dict[str, Path]:
    """The three sweep plots into *folder*; returns what -> path.

    Drawing is matplotlib's Python, one core's work: on a machine with more cores the heatmap and the memory plot
    are drawn by forked children while this process draws the utilization plot (the 2,048-configuration sweep's
    plots, measured on 2 cores: 1.27 s on top of the CSV one after the other, ~0.3 s less this way). A child that
    fails or cannot start leaves its figure to this process, which then reports any error as usual; files are
    written atomically either way.
    """
    from sim.io.sweep_plots import sweep_heatmap, sweep_memory_plot, sweep_utilization_plot  # matplotlib now

    folder = check_output_dir(folder)
    plots = {"utilization": sweep_utilization_plot, "heatmap": sweep_heatmap, "memory": sweep_memory_plot}
    paths = {key: folder / f"sweep_{key}.{fmt}" for key in plots}
    children = {key: _draw_in_child(plots[key], df, paths[key]) for key in ("heatmap", "memory")}
    try:
        save_figure(sweep_utilization_plot(df), paths["utilization"], dpi=110)
        for key, child in children.items():
            if child is not None:
                child.join()
            if child is None or child.exitcode != 0:
                save_figure(plots[key](df), paths[key], dpi=110)
    finally:
        for child in children.values():
            if child is not None and child.is_alive():  # Ctrl-C or an error here: no child left behind
                child.terminate()
                child.join()
    return paths


def _draw_in_child(plot, df: pd.DataFrame, path: Path):
    """A forked process drawing ``plot(df)`` into *path*, or None where that cannot help (one core, no fork)."""
    import multiprocessing
    import os

    if (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    child = multiprocessing.get_context("fork").Process(target=_draw_quietly, args=(plot, df, path), daemon=True)
    try:
        child.start()
    except OSError:  # no process to spare: draw it here
        return None
    return child


def _draw_quietly(plot, df: pd.DataFrame, path: Path) -> None:
    """The child's work: any failure is an exit code (the parent then draws the figure and reports the error)."""
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it terminates this child
    try:
        save_figure(plot(df), path, dpi=110)
    except BaseException:  # noqa: BLE001 - reported by the parent, which draws this figure again
        os._exit(1)
    os._exit(0)


def write_sweep(df: pd.DataFrame, folder: str | Path, *, fmt: str = "png", plots: bool = True) -> dict[str, Path]:
    """Write sweep.csv, its column sidecar and (with *plots*) the three sweep plots into *folder*."""
    folder = check_output_dir(folder)
    csv, sidecar = write_sweep_csv(df, folder / "sweep.csv")
    written = {"csv": csv, "columns": sidecar}
    if plots:
        written.update(write_sweep_plots(df, folder, fmt=fmt))
    return written


def _shapes(args: argparse.Namespace, names: list[str]) -> list[tuple[str, int, int]]:
    """(schedule, K, stages) of every shape in the grid."""
    out = []
    for name in names:
        generators.get_generator(name)  # an unknown name: one line listing the valid ones
        chunks = resolve_chunks(name, args.chunks)
        out.extend((name, k, k * chunks) for k in args.devices)
    return out


def _costs_spec(args: argparse.Namespace, shapes: list[tuple[str, int, int]]):
    """The --costs file, read once and checked against every shape, or the cost flags as uniform() arguments."""
    if not args.costs:
        return {"forward": args.forward, "backward": args.backward, "weight": args.weight, "update": args.update,
                "recompute": args.recompute_cost, "send_bytes": args.activation_bytes,
                "activation_bytes": args.activation_bytes, "weight_bytes": args.weight_bytes,
                "grad_bytes": args.weight_bytes,
                **({} if args.dispatch is None else dict.fromkeys(DISPATCH_COLUMNS, args.dispatch))}
    costs = _read(load_costs, args.costs, "costs")  # missing, binary, malformed: exit 2, before any work
    misfits = sorted({(name, k, stages) for name, k, stages in shapes if stages != costs.stages})
    if misfits:
        listed = ", ".join(f"{name} at K={k} needs {stages}" for name, k, stages in misfits[:4])
        more = f" and {len(misfits) - 4} more" if len(misfits) > 4 else ""
        raise SweepInputError(f"costs file {args.costs!r} has {costs.stages} stages but {listed}{more}; a costs file "
                              f"fits one stage count: sweep only the K it was made for, or use the cost flags")
    return runtime_costs(args, costs)


def _check_cost_totals(args: argparse.Namespace, costs) -> None:
    """Refuse, as ``simulate`` does, costs whose sums pass the largest float over the sweep's most micro-batches
    (``--forward 1e308``): every row would fail the same way, so the sweep is refused, not written as rows
    that each say so. Sums grow with M, so the largest M of the grid decides."""
    most = max(args.microbatches) * args.iterations
    for k in sorted(set(args.devices)) if isinstance(costs, dict) else [None]:
        check_totals(uniform(k, **costs) if k is not None else costs, most)


def _read(loader, path: str, what: str):
    try:
        return loader(path)
    except UnicodeDecodeError:  # a binary file: the decoder's message names neither the file nor the fix
        raise SweepInputError(f"{what} file {path!r} is not a text file (not UTF-8); give the {what} CSV/JSON "
                              f"that pipesim writes") from None


def _hardware_spec(args: argparse.Namespace):
    """The --hardware file, read once and checked against every K, or the link flags as Hardware() arguments."""
    if not args.hardware:
        return {"latency": args.latency, "bandwidth": args.bandwidth, "memory_capacity": args.memory_capacity,
                "overlap": not args.no_overlap}
    hw = _read(load_hardware, args.hardware, "hardware")
    misfits = sorted({k for k in args.devices if k != hw.devices})
    if misfits:
        raise SweepInputError(f"hardware file {args.hardware!r} describes {hw.devices} devices but the sweep has "
                              f"K={','.join(map(str, misfits))}; sweep -K {hw.devices} only, or use the link flags")
    if args.memory_capacity is not None or args.no_overlap:
        hw = Hardware(devices=hw.devices, latency=hw.latency, bandwidth=hw.bandwidth,
                      memory_capacity=args.memory_capacity or hw.memory_capacity,
                      overlap=hw.overlap and not args.no_overlap)
    return hw


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    if not names:
        raise SweepInputError("--schedules is empty; give at least one (see `pipesim schedules`)")
    # everything that concerns every row is checked here, before the first simulation
    check_executor(args.executor)
    variability = variability_from_args(args)  # None without --samples
    shapes = _shapes(args, names)
    costs, hardware = _costs_spec(args, shapes), _hardware_spec(args)
    if args.html:
        from sim.io.pages import check_page_path
        check_page_path(args.html)
    _check_cost_totals(args, costs)
    if not args.no_plots:
        from sim.io.sweep_plots import check_plot_size  # matplotlib: loaded for the plots anyway

        check_plot_size(args.devices)
    check_writable_dir(args.output)  # creates nothing: a refused or failed sweep leaves no empty folder behind
    df = run_sweep(names, args.devices, args.microbatches, iterations=args.iterations, recompute=args.recompute,
                   chunks=args.chunks, costs=costs, hardware=hardware, microbatch_size=args.microbatch_size,
                   jobs=args.jobs, executor=args.executor, progress=not args.no_progress,
                   costs_source=args.costs or "uniform", hardware_source=args.hardware or "flags",
                   runtime=args.runtime, post_overhead=args.post_overhead)
    if variability is not None:  # every row that ran, sampled in this process (one compiled call per row)
        df = sweep_samples(df, args, variability, costs, hardware)
    written = write_sweep(df, args.output, fmt=args.format, plots=not args.no_plots)
    if args.html:
        from sim.io.pages import sweep_page, write_page
        written["html"] = write_page(sweep_page(df, heading=f"pipesim sweep: {', '.join(names)}"), args.html)
    if variability is not None:
        describe_sample_columns(written["columns"])
    errors = int((df["error"] != "").sum())
    if args.json:
        print_json({"rows": len(df), "errors": errors, "runtime": args.runtime, "outputs": {k: str(v) for k, v in written.items()}})
        return 0
    ok = df[df["error"] == ""]
    runtime = f", runtime {args.runtime}" if args.runtime != DEFAULT_RUNTIME else ""
    print(f"{len(df)} configurations{runtime} ({errors} rejected; the error column says why) -> {written['csv']}")
    if len(ok):
        best = ok.loc[ok.groupby("schedule", sort=False)["utilization"].idxmax()]
        for _, row in best.iterrows():
            print(f"  {row['schedule']:<10} best utilization {row['utilization']:.1%} at K={row['devices']}, "
                  f"M={row['microbatches']}")
    if variability is not None and len(ok):
        print_sweep_ranking(df, args.rank_by or "mean")
    for key in ("columns", "utilization", "heatmap", "memory", "html"):
        if key in written:
            print(f"wrote {written[key]}")
    return 0
