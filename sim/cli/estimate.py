"""``pipesim estimate``: per-stage costs and memory of a transformer on a device, from their descriptions.

    pipesim estimate --model gpt3-175b --gpu a100-80gb --tensor-parallel 8 --sequence-parallel \\
        --pipeline-parallel 8 --microbatch-size 1 --recompute selective
    pipesim estimate --model llama3-8b --gpu h100-sxm --pipeline-parallel 4 -s 1f1b -M 8 --json
    pipesim estimate --model small-gpt --gpu cpu --pipeline-parallel 2 --microbatch-size 8 -o costs.csv
    pipesim simulate --schedule 1f1b -K 2 -M 4 --costs costs.csv
    pipesim estimate --model small-gpt --gpu cpu --pipeline-parallel 2 --microbatch-size 8 \\
        --mfu-from reports/validation/1f1b_costs.csv      # efficiency measured by `pipesim validate`

Formulas and their sources: :mod:`sim.model.estimate`; presets: ``--model`` (:mod:`sim.model.models`) and ``--gpu``
(:mod:`sim.model.gpus`).
"""

from __future__ import annotations

import argparse

from sim import schedules
from sim.search.batch import resolve_chunks
from sim.model.cost import load_costs, save_costs
from sim.model.estimate import (RECOMPUTE_MODES, Estimate, EstimateError, Parallelism, calibrate_efficiency, estimate,
    pipeline_hardware, with_seq_len)
from sim.model.gpus import DEFAULT_MFU, GpuSpec, get_gpu
from sim.results.memory_breakdown import memory_breakdown
from sim.model.models import ModelSpec, get_model, preset_names
from sim.model.gpus import preset_names as gpu_names
from sim.simulate import simulate
from sim.cli.options import positive_float, positive_int, print_json
from sim.files import check_writable

__all__ = ["register", "add_model_options", "model_and_gpu_from_args", "unit_interval"]


def unit_interval(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]: a fraction of the peak FLOP/s")
    return value


def _count_list(text: str) -> list[int]:
    try:
        return [positive_int(x.strip()) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive integers separated by commas") from None


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--model, --gpu, --seq-len, --mfu: shared by ``estimate`` and ``plan``."""
    p.add_argument("--model", required=True, metavar="NAME|FILE.json",
                   help=f"model preset ({', '.join(preset_names())}) or a JSON file")
    p.add_argument("--gpu", required=True, metavar="NAME|FILE.json",
                   help=f"device preset ({', '.join(gpu_names())}; cpu is measured now) or a JSON file")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sample (default: the model's)")
    p.add_argument("--mfu", type=unit_interval, default=None,
                   help="override the size-aware compute model (per-GEMM roofline, sim.model.efficiency) with one "
                        f"constant fraction of peak FLOP/s (devices without kernel figures, e.g. cpu: {DEFAULT_MFU})")
    p.add_argument("--flash-attention", action="store_true",
                   help="time the attention core as FlashAttention (no s x s score traffic)")


def model_and_gpu_from_args(args: argparse.Namespace) -> tuple[ModelSpec, GpuSpec]:
    return with_seq_len(get_model(args.model), args.seq_len), get_gpu(args.gpu)


def register(sub) -> None:
    p = sub.add_parser("estimate", help="per-stage costs and memory of a transformer on a device",
                       description="Estimate per-stage F/B/W times and bytes of a model on a device "
                                   "(Narayanan et al. 2021 FLOPs, Korthikanti et al. 2022 activations).")
    add_model_options(p)
    p.add_argument("--tensor-parallel", "-T", type=positive_int, default=1, help="tensor-parallel degree t (default 1)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with t > 1)")
    p.add_argument("--pipeline-parallel", "-P", type=positive_int, default=1, help="pipeline devices p (default 1)")
    p.add_argument("--chunks", "-V", type=positive_int, default=None,
                   help="model chunks per pipeline device (default: the schedule's own, else 1)")
    p.add_argument("--data-parallel", "-D", type=positive_int, default=1,
                   help="data-parallel replicas d (matters with --zero1; default 1)")
    p.add_argument("--zero1", action="store_true", help="shard the optimizer state over the d replicas (ZeRO-1)")
    p.add_argument("--microbatch-size", "-b", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none",
                   help="activation recomputation (Korthikanti et al. 2022; default none)")
    p.add_argument("--layers-per-stage", type=_count_list, default=None, metavar="A,B,...",
                   help="blocks per stage (default: the min-max partitioner on the estimated costs)")
    p.add_argument("--mfu-from", metavar="COSTS.csv", default=None,
                   help="calibrate the efficiency from a measured costs file of the same layout "
                        "(pipesim validate's *_costs.csv or an ingested trace's)")
    p.add_argument("--schedule", "-s", default=None, help="also simulate this schedule (needs -M)")
    p.add_argument("--microbatches", "-M", type=positive_int, default=None, help="micro-batches for -s")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--output", "-o", metavar="COSTS.csv", default=None,
                   help="write the costs file that `pipesim simulate --costs` reads")
    p.set_defaults(func=run)


def _parallelism(args: argparse.Namespace) -> Parallelism:
    chunks = args.chunks if args.schedule is None else resolve_chunks(args.schedule, args.chunks)
    return Parallelism(tensor=args.tensor_parallel, sequence_parallel=args.sequence_parallel,
                       pipeline=args.pipeline_parallel, chunks=chunks or 1, data=args.data_parallel,
                       microbatch_size=args.microbatch_size, recompute=args.recompute, zero1=args.zero1,
                       flash_attention=args.flash_attention)


def run(args: argparse.Namespace) -> int:
    if (args.schedule is None) != (args.microbatches is None):
        raise EstimateError("give -s SCHEDULE and -M MICROBATCHES together to simulate the estimate")
    model, gpu = model_and_gpu_from_args(args)
    par = _parallelism(args)
    if args.output:
        check_writable(args.output)  # before any work: a path that cannot be written is one line, not a late failure
    efficiency = args.mfu
    calibrated = None
    if args.mfu_from:
        at_peak = estimate(model, gpu, par, efficiency=1.0, layers_per_stage=args.layers_per_stage)
        efficiency = calibrated = calibrate_efficiency(load_costs(args.mfu_from), at_peak)
    est = estimate(model, gpu, par, efficiency=efficiency, layers_per_stage=args.layers_per_stage)
    out = est.to_dict()
    out["calibrated_from"] = args.mfu_from
    out["mfu_given"] = args.mfu is not None
    for row in out["stages"]:
        lo, hi = row.pop("layers")
        row["layers"], row["first_layer"] = hi - lo, lo
    if args.schedule is not None:
        schedule = schedules.generate(args.schedule, par.pipeline, args.microbatches,
                                      recompute=par.recompute == "full", chunks=par.chunks)
        result = simulate(schedule, est.costs, pipeline_hardware(gpu, par, memory_capacity=gpu.memory_bytes),
                          microbatch_size=par.microbatch_size)
        out.update(schedule=schedule.name, microbatches=args.microbatches, makespan=result.metrics.makespan,
                   bubble_fraction=result.metrics.bubble_fraction, peak_memory=result.metrics.peak_memory,
                   memory_breakdown=memory_breakdown(result), memory_overflow=result.metrics.memory_overflow)
    if args.output:
        save_costs(est.costs, args.output, comments=[
            f"pipesim estimate: {model.name} on {gpu.name}, t={par.tensor} p={par.pipeline} v={par.chunks} "
            f"b={par.microbatch_size} s={model.seq_len} recompute={par.recompute} efficiency={est.efficiency:.4g} "
            f"({est.compute_model})"])
        out["output"] = args.output
    if args.json:
        print_json(out)
    else:
        print(_format(est, out, calibrated))
    return 0


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _format(est: Estimate, out: dict, calibrated: float | None) -> str:
    par, m = est.parallelism, est.model
    if calibrated is not None:
        how = f"calibrated from {out['calibrated_from']}"
    elif est.compute_model == "constant":
        how = "--mfu" if out.get("mfu_given") else "default: this device has no kernel figures"
    else:
        how = "the size-aware compute model's, kernel by kernel"
    lines = [f"{m.name} ({m.parameters / 1e9:.3g}B parameters) on {est.gpu.name}: t={par.tensor}"
             f"{' +SP' if par.sequence_parallel else ''} p={par.pipeline} v={par.chunks} b={par.microbatch_size} "
             f"s={m.seq_len} recompute={par.recompute}, efficiency {est.efficiency:.3g} ({how})",
             f"  kept per block and micro-batch between F and B (activation_bytes_per_layer): "
             f"{_gib(est.activation_bytes_per_layer)} GiB (Korthikanti et al. 2022, Table 2)",
             f"  held per block while its backward runs (working_bytes_per_layer, the transient peak): "
             f"{_gib(est.working_bytes_per_layer)} GiB",
             "  stage  layers   F (ms)   B (ms)   W (ms)   act GiB  ckpt GiB  weights GiB  grads GiB  optim GiB  "
             "send MiB"]
    for r in out["stages"]:
        lines.append(f"  {r['stage']:>5}  {r['layers']:>6}  {r['forward'] * 1e3:>7.3g}  {r['backward'] * 1e3:>7.3g}  "
                     f"{r['weight'] * 1e3:>7.3g}  {_gib(r['activation_bytes']):>8}  {_gib(r['checkpoint_bytes']):>8}  "
                     f"{_gib(r['weight_bytes']):>11}  {_gib(r['grad_bytes']):>9}  {_gib(r['optimizer_bytes']):>9}  "
                     f"{r['send_bytes'] / 2**20:>8.3g}")
    if par.recompute == "full":
        lines.append("  act: the transient set of the one block being recomputed (+ embedding/output), per micro-batch "
                     "in its backward; ckpt: the blocks' inputs kept per in-flight micro-batch")
    else:
        lines.append("  act: kept per in-flight micro-batch between F and B; ckpt: the stage input (with recompute)")
    if "makespan" in out:
        lines.append(f"  {out['schedule']} with M={out['microbatches']}: makespan {out['makespan']:.4g} s, "
                     f"bubble {out['bubble_fraction']:.1%}")
        lines.append("  device  peak GiB  = weights + grads + optimizer + activations + stashed")
        for b in out["memory_breakdown"]:
            lines.append(f"  {b['device']:>6}  {_gib(b['peak']):>8}  = {_gib(b['weights'])} + {_gib(b['grads'])} + "
                         f"{_gib(b['optimizer'])} + {_gib(b['activations'])} + {_gib(b['stashed_weights'])}")
        for line in out["memory_overflow"]:
            lines.append(f"  MEMORY OVERFLOW: {line}")
    if "output" in out:
        lines.append(f"  wrote {out['output']}")
    return "\n".join(lines)
