"""``pipesim validate``: run a schedule on real devices and compare it with the simulator.

    pipesim validate --schedule 1f1b --devices 2 --microbatches 4                 # mlp on CPU (gloo)
    pipesim validate -s gpipe -K 4 -M 8 --workload emulated --json                # K may exceed the cores
    pipesim validate -s 1f1b -K 4 -M 8 --workload transformer --backend nccl      # one GPU per rank

Importing this module does not import torch (``pipesim simulate`` works without
it); :func:`run` imports it and, if torch is missing, says how to install it.
"""

from __future__ import annotations

import argparse

from sim import generators
from sim.commands.options import add_shape_options, positive_float, positive_int, print_json
from sim.errors import PipesimError

__all__ = ["register", "run", "add_validate_options", "request_from_args", "TorchMissingError"]


class TorchMissingError(PipesimError):
    """``pipesim validate`` without torch installed."""

_WORKLOAD_SIZES = ("width", "depth", "batch", "d_model", "heads", "seq", "seed")


def add_validate_options(p: argparse.ArgumentParser, *, torchrun: bool = False) -> None:
    """The options of ``pipesim validate`` (also read by ``python -m validate.worker`` under torchrun)."""
    p.add_argument("--schedule", "-s", default="1f1b", help=f"schedule name (default 1f1b): {', '.join(generators.names())}")
    p.add_argument("--runtime", choices=("pipesim", "torch"), default="pipesim",
                   help="pipesim: our executor runs the schedule (default); torch: PyTorch's own schedule class "
                        "(torch.distributed.pipelining) runs under torch.profiler and its trace is ingested")
    add_shape_options(p, devices=None if torchrun else 2)
    p.add_argument("--workload", default="mlp", help="mlp, transformer or emulated (default mlp)")
    p.add_argument("--backend", default="gloo", help="gloo (CPU, default) or nccl (one GPU per rank)")
    g = p.add_argument_group("workload sizes")
    g.add_argument("--width", type=positive_int, default=64, help="mlp width (default 64)")
    g.add_argument("--depth", type=positive_int, default=2, help="blocks / encoder layers per stage (default 2)")
    g.add_argument("--batch", type=positive_int, default=8, help="samples per micro-batch (default 8)")
    g.add_argument("--d-model", dest="d_model", type=positive_int, default=32, help="transformer width (default 32)")
    g.add_argument("--heads", type=positive_int, default=2, help="transformer heads (default 2)")
    g.add_argument("--seq", type=positive_int, default=16, help="transformer sequence length (default 16)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    p.add_argument("--costs", metavar="FILE", help="costs CSV to use instead of calibrating (emulated: the waits)")
    p.add_argument("--hardware", metavar="FILE", help="hardware JSON to use instead of the ping-pong link fit")
    p.add_argument("--calibration", choices=("schedule", "isolated"), default="schedule",
                   help="stage times from the traced warm-up run of the schedule (default) or each stage alone")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds before a stuck run is stopped, every rank included (default 300)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--output", "-o", default="reports/validation", help="report folder (default reports/validation)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--fail-at", default=None, help=argparse.SUPPRESS)  # RANK:ACTION, fault injection for tests


def register(sub) -> None:
    p = sub.add_parser("validate", help="run a schedule on real devices and compare it with the simulator",
                       description="Run a schedule with torch.distributed (one process per device), simulate it with "
                                   "calibrated costs, and write predicted vs measured under reports/.")
    add_validate_options(p)
    p.set_defaults(func=run)


def request_from_args(args: argparse.Namespace, *, devices: int | None = None) -> dict:
    return {"schedule": args.schedule, "devices": devices or args.devices, "microbatches": args.microbatches,
            "iterations": args.iterations, "recompute": args.recompute, "chunks": args.chunks,
            "workload": args.workload, "backend": args.backend, "costs": args.costs, "hardware": args.hardware,
            "timeout": args.timeout, "threads": args.threads, "output_dir": args.output,
            "fail_at": args.fail_at, "calibration": args.calibration, "workload_options": {k: getattr(args, k) for k in _WORKLOAD_SIZES}}


def run(args: argparse.Namespace) -> int:
    if getattr(args, "runtime", "pipesim") == "torch":
        from .torch_validation import run_command
        return run_command(args)
    from .errors import check_names
    check_names(getattr(args, "workload", "mlp"), getattr(args, "backend", "gloo"))  # before the slow torch import
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TorchMissingError("the validator needs torch: pip install 'pipesim[validate]'") from None
    from .comparison import run_validation
    from .report import format_summary

    req = request_from_args(args)
    report = run_validation(req["schedule"], req["devices"], req["microbatches"], workload=req["workload"],
                            backend=req["backend"], iterations=req["iterations"], recompute=req["recompute"],
                            chunks=req["chunks"], costs=req["costs"], hardware=req["hardware"],
                            output_dir=req["output_dir"], timeout=req["timeout"], threads=req["threads"],
                            fail_at=req["fail_at"], workload_options=req["workload_options"],
                            calibration=req["calibration"])
    if args.json:
        d = report.to_dict()
        d.pop("calibration")
        print_json(d)
    else:
        print(format_summary(report))
    return 0
