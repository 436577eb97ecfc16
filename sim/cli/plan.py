"""``pipesim plan``: the best schedule, parallel layout, micro-batching and recompute under a memory cap.

    pipesim plan --model llama3-8b --gpu h100-sxm --gpus 16 --global-batch 64 -o reports/plan
    pipesim plan --model gpt3-175b --gpu a100-80gb --gpus 64 --global-batch 512 --memory-cap 70e9 \\
        --schedules 1f1b,interleaved-1f1b,zb-h1 --tensor-parallel 4,8 --recompute selective,full --jobs 2 \\
        -o reports/plan
    pipesim plan --model small-gpt --gpu cpu --gpus 2 --global-batch 32 -o /tmp/plan --json
    pipesim plan ... --samples 500 --straggler device=any,factor=1.3,prob=0.1 --rank-by p99   # robust.csv too
    pipesim plan --model small-gpt --gpu cpu --gpus 2 --global-batch 32 -o /tmp/plan --runtime torch --dispatch 5e-5

Writes into DIR: ranked.csv (every feasible synchronous candidate, best first), asynchronous.csv (feasible
candidates of asynchronous schedules, ranked apart), rejected.csv (every other one, with its reason), pareto.csv
and pareto.png (iteration time vs peak memory), winner_gantt.png (the winner's timeline with its memory panel),
schedule.csv (the winner's order in PyTorch's CSV) and plan.json (the winner with its memory breakdown, why it
wins, ``runtime``: the runtime model every candidate was simulated with, and ``launch``: its Megatron-LM arguments,
torchtitan TOML fragment and the CSV's path). ``--emit
megatron|torchtitan|csv`` prints one of them alone, for a launch script::

    pipesim plan --model llama3-70b --gpu h100-sxm --gpus 64 --global-batch 512 -o plan --emit megatron

The search and its rules: :mod:`sim.search.planner`; the formats: :mod:`sim.io.launch_formats`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.schedules import registry as generators
from sim.model.estimate import RECOMPUTE_MODES
from sim.search.planner import DEFAULT_SCHEDULES, Plan, PlanError, PlanSpace, plan, simulate_candidate
from sim.cli.estimate import add_model_options, model_and_gpu_from_args
from sim.files import atomic_path, atomic_paths, check_output_dir, check_writable_dir
from sim.io.launch_formats import EMIT_FORMATS, LaunchSpec, megatron_arguments, torchtitan_toml
from sim.io.figures import save_figure
from sim.io.sweep_plots import pareto_plot
from sim.cli.options import add_runtime_options, int_list, positive_float, positive_int, print_json
from sim.cli.montecarlo_options import (add_montecarlo_options, plan_samples, print_plan_samples, variability_from_args,
    write_plan_samples)

__all__ = ["register", "write_plan"]


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def register(sub) -> None:
    p = sub.add_parser("plan", help="search schedules and parallel layouts for the fastest one that fits",
                       description="Enumerate schedule x p x t x d x micro-batch size x M x chunks x recompute, "
                                   "simulate each candidate exactly, rank those under the memory cap.")
    add_model_options(p)
    p.add_argument("--gpus", "-N", type=positive_int, required=True, help="devices in all, N = t x p x d")
    p.add_argument("--global-batch", "-G", type=positive_int, required=True, help="samples per iteration G")
    p.add_argument("--memory-cap", type=positive_float, default=None,
                   help="bytes per device a plan may use (default: the device's memory)")
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                   help=f"comma-separated schedules (default {','.join(DEFAULT_SCHEDULES)}): "
                        f"{', '.join(generators.names())}")
    p.add_argument("--pipeline-parallel", type=int_list, default=None,
                   help="pipeline degrees p (default: powers of two up to the layers and N)")
    p.add_argument("--tensor-parallel", type=int_list, default=int_list("1,2,4,8"),
                   help="tensor-parallel degrees t (default 1,2,4,8)")
    p.add_argument("--microbatch-size", type=int_list, default=int_list("1,2,4,8"),
                   help="micro-batch sizes b (default 1,2,4,8)")
    p.add_argument("--chunks", type=int_list, default=int_list("2,4"),
                   help="chunks per device for interleaved 1F1B (default 2,4; V-shaped schedules use 2)")
    p.add_argument("--recompute", default=",".join(RECOMPUTE_MODES),
                   help=f"comma-separated recompute modes (default {','.join(RECOMPUTE_MODES)})")
    p.add_argument("--no-sequence-parallel", action="store_true", help="no sequence parallelism with t > 1")
    p.add_argument("--no-zero1", action="store_true", help="replicate the optimizer state over data parallelism")
    add_runtime_options(p)  # --runtime, --dispatch, --post-overhead: every candidate simulated as that runtime runs it
    p.add_argument("--top", type=positive_int, default=10, help="rows to print (default 10)")
    p.add_argument("--jobs", "-j", type=positive_int, default=1, help="simulation worker processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="folder for the tables and figures")
    p.add_argument("--json", action="store_true", help="print the ranked list (top N) and the winner as JSON")
    p.add_argument("--emit", choices=EMIT_FORMATS, default=None,
                   help="print only the winner's launch configuration: Megatron-LM arguments, a torchtitan TOML "
                        "fragment, or PyTorch's schedule CSV (the files are written into DIR as well)")
    add_montecarlo_options(p, rank=True, seed=True)  # --samples: the best candidates re-ranked by a distribution
    p.add_argument("--robust-top", type=positive_int, default=10,
                   help="with --samples: how many of the best candidates to sample and re-rank (default 10); "
                        "written to DIR/robust.csv")
    p.set_defaults(func=run)


def write_plan(result: Plan, folder: str | Path) -> dict[str, Path]:
    """Write the plan's tables and figures into *folder* (created if missing); returns what -> path."""
    from sim.model.models import ModelSpec
    from sim.model.gpus import GpuSpec
    from sim.io.plots import gantt

    folder = check_output_dir(folder)
    written = {}
    tables = (("ranked", result.ranked), ("asynchronous", _asynchronous(result)), ("rejected", result.rejected),
              ("pareto", result.pareto))
    with atomic_paths([folder / f"{key}.csv" for key, _ in tables]) as temps:
        for (key, frame), tmp in zip(tables, temps):
            frame.to_csv(tmp, index=False)
            written[key] = folder / f"{key}.csv"
    written["pareto_png"] = save_figure(pareto_plot(result), folder / "pareto.png", dpi=110)
    if result.winner is not None:
        inputs = result.inputs
        winner = simulate_candidate(ModelSpec(**inputs["model"]), GpuSpec(**inputs["gpu"]), result.winner,
                                    inputs["space"], efficiency=inputs["efficiency"], memory_cap=result.memory_cap)
        title = f"winner: {_describe(result.winner)}"
        written["winner_gantt"] = save_figure(gantt(winner, memory=True, titles=[title]),
                                              folder / "winner_gantt.png", dpi=110)
    launch = None
    if result.winner is not None:
        launch = launch_configuration(result, folder / "schedule.csv")
        if launch["pytorch_csv"] is not None:
            written["schedule_csv"] = folder / "schedule.csv"
    path = folder / "plan.json"
    summary = _summary(result, len(result.ranked))
    summary["launch"] = launch
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    written["json"] = path
    return written


def _json_default(value):
    if isinstance(value, PlanSpace):
        return {f: getattr(value, f) for f in value.__slots__}
    return float(value)


def _asynchronous(result: Plan):
    import pandas as pd

    return result.asynchronous if result.asynchronous is not None else pd.DataFrame()


def launch_configuration(result: Plan, csv_path: Path) -> dict:
    """The winner in the forms people launch (:mod:`sim.io.launch_formats`); writes PyTorch's CSV to *csv_path*."""
    from sim import schedules
    from sim.io.schedule_io import PyTorchFormatError, write_pytorch_csv
    from sim.model.models import ModelSpec

    w, space = result.winner, result.inputs["space"]
    model = ModelSpec(**result.inputs["model"])
    spec = LaunchSpec.from_plan_row(model, w, layers_per_stage=w["layers_per_stage"],
                                    sequence_parallel=space.sequence_parallel, distributed_optimizer=space.zero1)
    csv_note, written = None, None
    try:  # PyTorch's CSV has no recompute action: torch checkpoints inside the stage module, so the order without R
        schedule = schedules.generate(spec.schedule, spec.pipeline, spec.microbatches, chunks=spec.chunks)
        written = str(write_pytorch_csv(schedule, csv_path))
    except PyTorchFormatError as exc:
        csv_note = str(exc).splitlines()[0]
    return {"megatron": megatron_arguments(spec), "torchtitan": torchtitan_toml(spec, schedule_csv=written),
            "pytorch_csv": written, "pytorch_csv_note": csv_note, "layers_per_stage": list(spec.layers_per_stage)}


def _describe(row: dict) -> str:
    v = f" v={int(row['chunks'])}" if int(row["chunks"]) > 1 else ""
    split = f" split={row['split']}" if isinstance(row.get("split"), str) and row.get("split") else ""
    return (f"{row['schedule']} p={int(row['pipeline'])}{v} t={int(row['tensor'])} d={int(row['data'])} "
            f"b={int(row['microbatch_size'])} M={int(row['microbatches'])} recompute={row['recompute']}{split}")


def _runtime(result: Plan) -> dict:
    """The runtime model the plan was simulated with (``runtime`` of plan.json and ``--json``)."""
    from sim.model.runtimes import get_runtime

    space = result.inputs.get("space") or PlanSpace()
    profile = get_runtime(space.runtime)
    return {"name": profile.name, "links": profile.links, "dispatch_s": space.dispatch,
            "post_overhead_s": space.post_overhead, "description": profile.description}


def _summary(result: Plan, top: int) -> dict:
    reasons = result.rejected["stage"].value_counts().to_dict() if len(result.rejected) else {}
    return {"runtime": _runtime(result), "candidates": result.candidates, "simulated": result.simulated, "memory_probes": result.probes,
            "feasible": len(result.ranked), "asynchronous_feasible": len(_asynchronous(result)),
            "rejected": len(result.rejected), "rejected_by_stage": reasons, "memory_cap": result.memory_cap,
            "refined_for_overlap": result.refined, "winner": result.winner, "explanation": result.explanation,
            "ranked": result.ranked.head(top).to_dict(orient="records"),
            "asynchronous": _asynchronous(result).head(top).to_dict(orient="records")}


def run(args: argparse.Namespace) -> int:
    variability = variability_from_args(args)  # None without --samples; a bad specification fails before the search
    model, gpu = model_and_gpu_from_args(args)
    check_writable_dir(args.output)  # before the search: an unwritable -o is one line now, not after minutes
    if args.emit and args.json:
        raise PlanError("give --emit or --json, not both: each prints one thing on stdout")
    space = PlanSpace(schedules=tuple(_names(args.schedules)),
                      pipeline=tuple(args.pipeline_parallel) if args.pipeline_parallel else None,
                      tensor=tuple(args.tensor_parallel), microbatch_sizes=tuple(args.microbatch_size),
                      chunks=tuple(args.chunks), recompute=tuple(_names(args.recompute)),
                      sequence_parallel=not args.no_sequence_parallel, zero1=not args.no_zero1,
                      runtime=args.runtime, dispatch=args.dispatch, post_overhead=args.post_overhead)
    result = plan(model, gpu, gpus=args.gpus, global_batch=args.global_batch, memory_cap=args.memory_cap,
                  space=space, efficiency=args.mfu, jobs=args.jobs, progress=not args.no_progress)
    written = write_plan(result, args.output)
    robust = None
    if variability is not None:
        robust = plan_samples(result, model, gpu, space, args, variability)
        written["robust"] = write_plan_samples(robust, args.output)
    if args.emit:
        return _emit(args.emit, written)
    if args.json:
        out = _summary(result, args.top)
        out["launch"] = json.loads(Path(written["json"]).read_text())["launch"]
        if robust is not None:
            out["robust"] = {"rank_by": args.rank_by or "mean", "samples": args.samples,
                             "ranked": robust.to_dict(orient="records")}
        out["outputs"] = {k: str(v) for k, v in written.items()}
        print_json(out)
        return 0
    if space.runtime != "pipesim" or space.dispatch or space.post_overhead:
        r = _runtime(result)
        print(f"runtime {r['name']} ({r['links']} links, dispatch {r['dispatch_s'] or 0:g} s, post overhead "
              f"{r['post_overhead_s']:g} s): every candidate simulated as it executes the schedule")
    print(f"{result.candidates} candidates: {result.simulated} simulated (and {result.probes} memory probes with "
          f"fewer micro-batches), {len(result.ranked)} fit under "
          f"{result.memory_cap / 2**30:.1f} GiB, {len(result.rejected)} rejected")
    if len(result.rejected):
        for stage, count in result.rejected["stage"].value_counts().items():
            example = result.rejected[result.rejected["stage"] == stage].iloc[0]
            print(f"  rejected ({stage}): {count}, e.g. {_describe(example)}: {example['reason']}")
    if len(result.ranked):
        print("  rank  iteration (s)  tokens/s     MFU   bubble  peak GiB  candidate")
        for i, row in result.ranked.head(args.top).iterrows():
            print(f"  {i + 1:>4}  {row['iteration_time']:>13.4g}  {row['tokens_per_s']:>8.4g}  {row['mfu']:>6.1%}  "
                  f"{row['bubble_fraction']:>6.1%}  {row['peak_memory'] / 2**30:>8.1f}  {_describe(row)}")
        print("  winner's memory at its peak (GiB): device: weights + grads + optimizer + activations + stashed")
        for b in result.winner["memory_breakdown"]:
            print(f"    {b['device']}: {b['weights'] / 2**30:.2f} + {b['grads'] / 2**30:.2f} + "
                  f"{b['optimizer'] / 2**30:.2f} + {b['activations'] / 2**30:.2f} + "
                  f"{b['stashed_weights'] / 2**30:.2f} = {b['peak'] / 2**30:.2f}")
    asynchronous = _asynchronous(result)
    if len(asynchronous):
        best = asynchronous.iloc[0]
        print(f"  asynchronous schedules, ranked apart (they train on stale weights): {len(asynchronous)} fit; the "
              f"fastest, {_describe(best)}, takes {best['iteration_time']:.4g} s")
    for line in result.explanation:
        print(line)
    if robust is not None and len(robust):
        print_plan_samples(robust, args.rank_by or "mean", args.samples)
    for key, path in written.items():
        print(f"wrote {path}")
    return 0


def _emit(fmt: str, written: dict) -> int:
    """Print the winner's launch configuration in *fmt* alone (for a launch script); the files are in -o."""
    summary = json.loads(Path(written["json"]).read_text())
    launch = summary.get("launch")
    if launch is None:
        raise PlanError(f"no candidate fits, so there is nothing to launch; see {written['json']}")
    if fmt == "csv":
        if launch["pytorch_csv"] is None:
            raise PlanError(f"the winner cannot be written in PyTorch's CSV: {launch['pytorch_csv_note']}")
        print(Path(launch["pytorch_csv"]).read_text(), end="")
    else:
        print(launch[fmt])
    return 0
