"""``pipesim validate``: run a schedule on real devices and compare it with the simulator.

    pipesim validate --schedule 1f1b --devices 2 --microbatches 4                 # mlp on CPU (gloo)
    pipesim validate -s gpipe -K 4 -M 8 --workload emulated --json                # K may exceed the cores
    pipesim validate -s 1f1b -K 4 -M 8 --workload transformer --backend nccl      # one GPU per rank
    pipesim validate --schedule-file mine.csv --runtime torch                     # a saved (synthesized) order

Exit codes: 0 done (the correctness check passed or did not apply), 2 bad input or a failed run
(one line on stderr), 3 the run completed but the correctness check FAILED (the report says so at the top).
Progress goes to stderr unless ``--json`` or ``--quiet``.

Importing this module does not import torch (``pipesim simulate`` works without
it); :func:`run` imports it and, if torch is missing, says how to install it.
"""

from __future__ import annotations

import argparse

from sim.schedules import registry as generators
from sim.cli.options import add_shape_options, positive_float, positive_int, print_json
from sim.errors import PipesimError

__all__ = ["register", "run", "add_validate_options", "run_options", "TorchMissingError", "EXIT_CHECK_FAILED",
           "check_timeline_path", "schedule_file_of", "check_no_generator_flags", "adopt_schedule_file",
           "named_for_file"]

EXIT_CHECK_FAILED = 3
"""Exit code of ``pipesim validate`` when the run completed but the correctness check failed."""


class TorchMissingError(PipesimError):
    """``pipesim validate`` without torch installed."""


_WORKLOAD_SIZES = ("width", "depth", "batch", "d_model", "heads", "seq", "seed")
RUNTIMES_RUN_ELSEWHERE = ("torch", "megatron", "megatron-overlap", "megatron-overlap-flush")
"""``--runtime`` values whose run is another runtime's, profiled and ingested (validate/pytorch/validation.py),
not pipesim's executor."""


def add_validate_options(p: argparse.ArgumentParser, *, torchrun: bool = False) -> None:
    """The options of ``pipesim validate`` (also read by ``python -m validate.torchrun`` under torchrun)."""
    p.add_argument("--schedule", "-s", default="1f1b", help=f"schedule name (default 1f1b): {', '.join(generators.names())}")
    p.add_argument("--runtime", choices=("pipesim", *RUNTIMES_RUN_ELSEWHERE), default="pipesim",
                   help="pipesim: our executor runs the schedule (default); torch: PyTorch's own schedule class "
                        "(torch.distributed.pipelining) runs under torch.profiler and its trace is ingested; "
                        "megatron: Megatron-LM's own schedule function (megatron-core: 1f1b, interleaved-1f1b), the "
                        "same way; megatron-overlap: the same with overlap_p2p_comm, Megatron-LM's training default "
                        "for the interleaved schedule; megatron-overlap-flush: also overlap_p2p_comm_warmup_flush "
                        "(Megatron-LM's --overlap-p2p-communication-warmup-flush)")
    add_shape_options(p, devices=None if torchrun else 2)
    p.add_argument("--workload", default="mlp",
                   help="mlp, transformer or emulated (default mlp), or your own model as package.module:function "
                        "(it gets the number of stages and returns (stage_modules, make_batch, loss); see the README)")
    p.add_argument("--backend", default="gloo", help="gloo (CPU, default) or nccl (one GPU per rank)")
    g = p.add_argument_group("workload sizes (on CPU, when none is given, a probe grows the defaults until one "
                             "stage forward takes >= 10 ms; the report says which sizes it chose)")
    g.add_argument("--width", type=positive_int, default=None, help="mlp width (default 64)")
    g.add_argument("--depth", type=positive_int, default=None, help="blocks / encoder layers per stage (default 2)")
    g.add_argument("--batch", type=positive_int, default=None, help="samples per micro-batch (default 8)")
    g.add_argument("--d-model", dest="d_model", type=positive_int, default=None, help="transformer width (default 32)")
    g.add_argument("--heads", type=positive_int, default=None, help="transformer heads (default 2)")
    g.add_argument("--seq", type=positive_int, default=None, help="transformer sequence length (default 16)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    p.add_argument("--costs", metavar="FILE", help="costs CSV to use instead of calibrating (emulated: the waits)")
    p.add_argument("--hardware", metavar="FILE", help="hardware JSON to use instead of the ping-pong link fit")
    p.add_argument("--calibration", choices=("schedule", "isolated"), default="schedule",
                   help="stage times traced in the schedule itself, each timed run from the run before it (the "
                        "first from the last warm-up run; default) or each stage measured alone")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed runs after the warm-ups; the makespan error is their median with p10-p90 (default 5; "
                        "with --runtime torch, the profiled steps: by default as many as fill about a second, 5 to "
                        "40, so that the median step is known within a few percent; rounded up to whole profiler "
                        "cycles of about 4 s)")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds any single wait of a rank (a receive, a barrier) may take before every rank is "
                        "stopped and the waiting action named; also a rank stopped (SIGSTOP) that long (default 300)")
    p.add_argument("--max-time", dest="max_time", type=positive_float, default=None,
                   help="overall cap in seconds on the whole launch, calibration and every run included "
                        "(default: none)")
    p.add_argument("--timeline", metavar="FILE", help="also write the measured timeline (median run; .csv or .parquet)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--output", "-o", default="reports/validation", help="report folder (default reports/validation)")
    if not torchrun:  # under torchrun rank 0 writes the report, page included (stem.html), and copies nothing
        p.add_argument("--html", metavar="FILE", help="also copy the report's interactive page here (it is always "
                                                      "written beside the report's PNG as <stem>.html)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--fail-at", default=None, help=argparse.SUPPRESS)  # RANK:ACTION, fault injection for tests
    p.add_argument("--schedule-file", metavar="FILE",
                   help="run the order saved in FILE (pipesim's .json or .txt, e.g. from synthesize -o, or PyTorch's "
                        ".csv) instead of --schedule; the file fixes K and M"
                        + (". Under torchrun rank 0 reads it and sends it to every rank (it need exist only on rank "
                           "0's node), and its K must be the world size" if torchrun else
                           ". With --runtime torch, PyTorch's _PipelineScheduleRuntime runs it from its CSV"))
    if torchrun:  # --inject, --iterations-timed: one-machine launches of `pipesim validate` only
        return
    p.add_argument("--inject", metavar="SPEC", default=None,
                   help="every action lasts a duration drawn from a distribution, e.g. "
                        "'lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2' (as simulate --samples): the "
                        "emulated workload's waits, or real stages padded to drawn durations; the report compares "
                        "the measured makespan distribution with the Monte Carlo prediction (KS, p50, p99)")
    p.add_argument("--iterations-timed", dest="iterations_timed", type=positive_int, default=None,
                   help="timed runs for a measured distribution (>= 30; replaces --repeats)")


def register(sub) -> None:
    p = sub.add_parser("validate", help="run a schedule on real devices and compare it with the simulator",
                       description="Run a schedule with torch.distributed (one process per device), simulate it with "
                                   "calibrated costs, and write predicted vs measured under reports/.")
    add_validate_options(p)
    p.set_defaults(func=run)


def run_options(args: argparse.Namespace):
    """The :class:`validate.request.RunOptions` of *args* (also for the torchrun path).

    Workload sizes the user gave are passed; the others are left out, so the probe can choose them.
    """
    from validate.request import DEFAULT_REPEATS, RunOptions  # no torch: validate.request is plain data

    sizes = {k: getattr(args, k) for k in _WORKLOAD_SIZES if getattr(args, k, None) is not None}
    return RunOptions(schedule=args.schedule, devices=getattr(args, "devices", None), microbatches=args.microbatches,
                      iterations=args.iterations, recompute=args.recompute, chunks=args.chunks,
                      workload=args.workload, backend=args.backend, costs=args.costs, hardware=args.hardware,
                      timeout=args.timeout, max_time=args.max_time, threads=args.threads, output_dir=args.output,
                      fail_at=args.fail_at, calibration=args.calibration,
                      repeats=args.repeats or DEFAULT_REPEATS,
                      workload_options=sizes)


def check_timeline_path(path: str) -> None:
    """Refuse a ``--timeline`` file that could not be written, before anything runs: a .csv or .parquet name in
    a folder we may write into (:func:`sim.io.timeline_io.write_timeline` writes it after the run)."""
    import os
    from pathlib import Path

    from sim.files import OutputError, check_writable_dir
    from sim.io.timeline_io import ExportError

    target = Path(path)
    if target.suffix.lower() not in (".csv", ".parquet"):
        raise ExportError(f"cannot write a timeline to {path!r}: use a .csv or .parquet file name")
    if target.is_dir():
        raise OutputError(f"cannot write {path}: it is an existing folder; give a file name")
    folder = check_writable_dir(target.parent if str(target.parent) else Path("."))  # creates nothing
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"cannot write {path}: the file is not writable")
    if folder.is_dir():  # where permissions say yes but the file system says no (/proc, a read-only mount)
        import tempfile
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        os.close(fd)
        os.unlink(probe)


def schedule_file_of(args: argparse.Namespace):
    """The schedule of ``--schedule-file`` (None without it), read and checked before anything starts; *args* take
    its shape (K, M) and its name as the schedule's label. -K/-M that contradict the file, --iterations and
    --recompute are refused: a saved order runs as it is written."""
    path = getattr(args, "schedule_file", None)
    if path is None:
        return None
    from sim.io.schedule_io import DialectError, read_schedule_file

    check_no_generator_flags(args)
    try:
        schedule = read_schedule_file(path)
    except DialectError as exc:
        raise exc.for_cli() from None
    return adopt_schedule_file(args, schedule, path)


def check_no_generator_flags(args: argparse.Namespace) -> None:
    """--iterations and --recompute with ``--schedule-file``: refused (they shape generated schedules only)."""
    from sim.cli.options import UsageError

    if args.iterations != 1 or args.recompute:
        raise UsageError("--iterations and --recompute apply to generated schedules; a --schedule-file runs as it "
                         "is written")


def adopt_schedule_file(args: argparse.Namespace, schedule, path: str):
    """*schedule*, read from ``--schedule-file`` *path*, checked against -K/-M/--chunks of *args* (a contradiction is
    refused); *args* take its shape and its name as the label. Also the torchrun path's (:mod:`validate.torchrun`)."""
    from sim.cli.options import check_file_shape

    check_file_shape(args, schedule, f"--schedule-file {path}")
    args.devices, args.microbatches, args.schedule = schedule.devices, schedule.microbatches, schedule.name
    return schedule


def named_for_file(schedule, path: str, digest: str | None = None):
    """*schedule*, read from *path*, renamed as its reports are named (pipesim's executor names them after the
    schedule): the file's name and digest (:func:`validate.pytorch.schedules.schedule_file_key`), so that two
    files (two synthesized orders, both called 'synthesized') never write one report, a file called ``1f1b.csv``
    never overwrites a generated 1f1b's, and its replay line never names the 1f1b generator. *digest*: the
    SHA-256 of the bytes *schedule* was read from (default: read *path* again)."""
    from validate.pytorch.schedules import schedule_file_key, schedule_file_name

    name = schedule_file_key(path)[0] if digest is None else schedule_file_name(path, digest)
    return schedule.replace_actions(schedule.actions, name=name, overlapped=schedule.overlapped)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "html", None):
        from sim.io.pages import check_page_path
        check_page_path(args.html)  # before the run
    saved = schedule_file_of(args)
    if getattr(args, "runtime", "pipesim") in RUNTIMES_RUN_ELSEWHERE:
        if getattr(args, "inject", None) or getattr(args, "iterations_timed", None):
            raise PipesimError("--inject and --iterations-timed run our executor (pipesim's runtime); drop "
                               f"--runtime {args.runtime}")
        from validate.pytorch.validation import run_command
        return run_command(args)  # sizes the user left out are chosen by the same probe as below
    from validate.errors import check_names
    check_names(getattr(args, "workload", "mlp"), getattr(args, "backend", "gloo"))  # before the slow torch import
    if getattr(args, "timeline", None):  # refused now, not after the run (issue 26 item 9)
        check_timeline_path(args.timeline)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TorchMissingError("the validator needs torch: pip install 'pipesim[validate]'") from None
    import sys

    from validate.run import run_validation
    from validate.compare.report import format_summary

    opts = run_options(args)
    quiet = args.json or args.quiet
    progress = None if quiet else (lambda line: print(f"pipesim validate: {line}", file=sys.stderr, flush=True))
    if saved is not None:
        saved = named_for_file(saved, args.schedule_file)
    report = run_validation(saved if saved is not None else opts.schedule, opts.devices, opts.microbatches,
                            progress=progress, **opts.run_keywords(),
                            inject=getattr(args, "inject", None),
                            iterations_timed=getattr(args, "iterations_timed", None),
                            schedule_file=args.schedule_file if saved is not None else None)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(report.measured.timeline, args.timeline)
    if args.html and report.paths.get("html"):
        from pathlib import Path

        from sim.io.pages import write_page
        write_page(Path(report.paths["html"]).read_text(encoding="utf-8"), args.html)
    if args.json:
        d = report.to_dict()
        d.pop("calibration")
        print_json(d)
    else:
        print(format_summary(report))
        if report.distribution is not None:  # --inject: predicted against measured distributions
            print("\n".join(["makespan distribution (--inject " + report.inject + "):"]
                            + ["  " + line for line in report.distribution.lines() if line]))
    return EXIT_CHECK_FAILED if report.failed else 0
