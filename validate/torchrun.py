"""``pipesim validate`` under torchrun: every node runs this; each rank runs its part and rank 0 writes the report.

Several machines (G GPUs each; run on every node)::

    torchrun --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m validate.torchrun --schedule 1f1b --microbatches 8 --workload transformer --backend nccl -o reports/validation

The options are ``pipesim validate``'s (:mod:`sim.cli.validate`) less ``--devices``: K = WORLD_SIZE. Each rank
builds the same :class:`validate.request.RunRequest` from them and runs it (:func:`validate.rank.worker.run_rank`);
rank 0 compares and writes the report. Exit code 3: the correctness check failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from sim.cli.validate import EXIT_CHECK_FAILED, add_validate_options, check_timeline_path, run_options
from sim.model.hardware import load_hardware
from validate.compare.report import format_summary
from validate.rank.worker import run_rank
from validate.request import RunRequest, WorkloadSpec
from validate.run import build_report, check_request, prepare_job, schedule_of

__all__ = ["main", "run_torchrun"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun ... -m validate.torchrun", description=__doc__.splitlines()[0])
    add_validate_options(parser, torchrun=True)
    return run_torchrun(parser.parse_args(argv))


def run_torchrun(args) -> int:
    """The torchrun path: every rank runs its part; rank 0 compares and writes the report (exit 3: check failed)."""
    world = int(os.environ["WORLD_SIZE"])
    opts = run_options(args)
    check_request(workload=opts.workload, backend=opts.backend, devices=1)
    if args.timeline:
        check_timeline_path(args.timeline)
    spec = WorkloadSpec(name=opts.workload, **opts.workload_options)
    sched = schedule_of(opts.schedule, world, opts.microbatches, opts.iterations, opts.recompute, opts.chunks)
    if spec.user:  # every rank checks the user's model (and learns its boundary shapes) before the run
        from validate.rank.user_model import prepare_for
        spec = prepare_for(spec, [sched], opts.workload_options)
    job = prepare_job(sched, spec, opts.costs, opts.fail_at)
    request = RunRequest(jobs=(job,), workload=spec, backend=opts.backend, timeout=opts.timeout,
                         threads=opts.threads, repeats=opts.repeats)
    result = run_rank(request)
    if result is None:
        return 0
    hardware = load_hardware(opts.hardware) if opts.hardware else None
    notes = []
    if not result.clocks.one_host:  # several hosts: the ping-pong offsets checked against the messages themselves
        from validate.rank.tracing import pair_check
        ranks = result.jobs[0]
        notes.append(pair_check([[r.traces[i] for r in ranks] for i in range(len(ranks[0].traces))], result.clocks))
    report = build_report(sched, spec if job.lr is None else replace(spec, lr=job.lr), opts.backend,
                          result.jobs[0], clocks=result.clocks, given_costs=job.costs, hardware=hardware,
                          output_dir=opts.output_dir, calibration=opts.calibration, chunks=opts.chunks,
                          extra_notes=notes)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(report.measured.timeline, args.timeline)
    print(format_summary(report))
    return EXIT_CHECK_FAILED if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
