"""``pipesim validate`` under torchrun: every node runs this; each rank runs its part and rank 0 writes the report.

Several machines (G GPUs each; run on every node)::

    torchrun --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m validate.torchrun --schedule 1f1b --microbatches 8 --workload transformer --backend nccl -o reports/validation

The options are ``pipesim validate``'s (:mod:`sim.cli.validate`) less ``--devices``: K = WORLD_SIZE. Each rank
builds the same :class:`validate.request.RunRequest` from them and runs it (:func:`validate.rank.worker.run_rank`);
rank 0 compares and writes the report. Exit code 3: the correctness check failed; 2: bad input, one line on stderr
from the first rank of each node (``LOCAL_RANK`` 0), no traceback.

``--schedule-file FILE`` runs a saved order with pipesim's executor: rank 0 reads FILE and sends its bytes to every
other rank through torchrun's store (the TCP store its agents share, at MASTER_ADDR:MASTER_PORT), so every rank
runs the same order, the file need exist only on rank 0's node, and a stale copy elsewhere is never read.
``--runtime torch`` (PyTorch's own schedule classes) is one machine's launch, ``pipesim validate --runtime
torch``: its ranks are local processes whose profiler traces no clock alignment joins across hosts; here it is
refused before anything starts (it used to be ignored: pipesim's executor ran instead).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from sim.cli.validate import (EXIT_CHECK_FAILED, RUNTIMES_RUN_ELSEWHERE, add_validate_options, adopt_schedule_file,
                              check_no_generator_flags, check_timeline_path, named_for_file, run_options)
from sim.core.ir import Schedule
from sim.errors import EXIT_BAD_INPUT, PipesimError, one_line
from sim.model.hardware import load_hardware
from validate.compare.report import format_summary
from validate.errors import ValidationError
from validate.rank.worker import run_rank
from validate.request import RunRequest, WorkloadSpec
from validate.run import build_report, check_request, prepare_job, schedule_of

__all__ = ["main", "run_torchrun", "shared_schedule_file"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun ... -m validate.torchrun", description=__doc__.splitlines()[0])
    add_validate_options(parser, torchrun=True)
    args = parser.parse_args(argv)
    try:
        return run_torchrun(args)
    except (PipesimError, OSError) as exc:  # bad input: one line per node, as `pipesim validate` (sim.cli) prints it
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"pipesim validate (torchrun): error: {one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


def run_torchrun(args) -> int:
    """The torchrun path: every rank runs its part; rank 0 compares and writes the report (exit 3: check failed)."""
    world = int(os.environ["WORLD_SIZE"])
    if getattr(args, "runtime", "pipesim") in RUNTIMES_RUN_ELSEWHERE:
        raise ValidationError(f"--runtime {args.runtime} runs on one machine (pipesim validate --runtime "
                              f"{args.runtime}); under torchrun only pipesim's executor runs (its clocks are aligned "
                              f"across hosts): drop --runtime {args.runtime}")
    notes = []
    saved = None
    if args.schedule_file is not None:  # first: rank 0's answer is what every other rank waits for
        check_no_generator_flags(args)
        saved, digest = shared_schedule_file(args.schedule_file, int(os.environ["RANK"]), world, args.timeout)
        adopt_schedule_file(args, saved, args.schedule_file)
        saved = named_for_file(saved, args.schedule_file, digest)  # its report's name: the file's (one machine's too)
        notes.append(f"schedule file {args.schedule_file} (SHA-256 {digest}), read by rank 0 and sent to every rank")
    opts = run_options(args)
    check_request(workload=opts.workload, backend=opts.backend, devices=1)
    if args.timeline:
        check_timeline_path(args.timeline)
    spec = WorkloadSpec(name=opts.workload, **opts.workload_options)
    sched = saved if saved is not None else schedule_of(opts.schedule, world, opts.microbatches, opts.iterations,
                                                         opts.recompute, opts.chunks)
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
    if not result.clocks.one_host:  # several hosts: the ping-pong offsets checked against the messages themselves
        from validate.rank.tracing import pair_check
        ranks = result.jobs[0]
        notes.append(pair_check([[r.traces[i] for r in ranks] for i in range(len(ranks[0].traces))], result.clocks))
    report = build_report(sched, spec if job.lr is None else replace(spec, lr=job.lr), opts.backend,
                          result.jobs[0], clocks=result.clocks, given_costs=job.costs, hardware=hardware,
                          output_dir=opts.output_dir, calibration=opts.calibration, chunks=opts.chunks,
                          extra_notes=notes, schedule_file=args.schedule_file)
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(report.measured.timeline, args.timeline)
    print(format_summary(report))
    return EXIT_CHECK_FAILED if report.failed else 0


_FILE, _REFUSED = b"F", b"E"  # the first byte of the store's value: the file follows, or rank 0's error line


def shared_schedule_file(path: str, rank: int, world: int, timeout: float) -> tuple[Schedule, str]:
    """The schedule of ``--schedule-file PATH`` on this rank, the same on every rank, and the SHA-256 of its bytes.

    Rank 0 reads the file and puts its name and bytes into torchrun's store; every rank (0 included) parses those
    bytes, so all run one order whatever the other nodes hold at PATH. A file rank 0 refuses (missing, unreadable,
    not a schedule, K not the world size) is rank 0's one line; the others read it from the store and stop with
    it instead of waiting. A world of one reads the file itself (no store is needed)."""
    if world == 1:
        schedule = _read_for_cli(path)
        _check_world(schedule, path, world)
        return schedule, hashlib.sha256(Path(path).read_bytes()).hexdigest()
    store = _torchrun_store(timeout)
    key = (f"pipesim/schedule-file/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    if rank == 0:
        try:
            data = _read_bytes(path)
            _read_for_cli(path)  # refused here with the user's path in the message
            schedule = _parse(Path(path).name, data)  # what every rank runs: these bytes, not a second read
            _check_world(schedule, path, world)
        except (PipesimError, OSError) as exc:
            store.set(key, _REFUSED + one_line(exc).encode())
            raise
        store.set(key, _FILE + Path(path).name.encode() + b"\0" + data)
        return schedule, hashlib.sha256(data).hexdigest()
    try:
        value = store.get(key)  # waits until rank 0 has answered, at most the store's timeout
    except RuntimeError as exc:  # torch's store timeout (DistStoreError is a RuntimeError)
        raise ValidationError(f"rank {rank}: no answer from rank 0 on --schedule-file within {timeout:g} s "
                              f"(--timeout): {one_line(exc)}") from None
    if value[:1] == _REFUSED:
        raise ValidationError(f"rank 0 refused --schedule-file: {value[1:].decode(errors='replace')}")
    name, _, data = value[1:].partition(b"\0")
    return _parse(name.decode(), data), hashlib.sha256(data).hexdigest()


def _read_for_cli(path: str) -> Schedule:
    from sim.io.schedule_io import DialectError, read_schedule_file
    try:
        return read_schedule_file(path)
    except DialectError as exc:  # the advice names the flag, as `pipesim validate --schedule-file` says it
        raise exc.for_cli() from None


def _torchrun_store(timeout: float):
    """A client of the store torchrun's agents host at MASTER_ADDR:MASTER_PORT (torch 2.13,
    ``torch/distributed/rendezvous.py``, ``_create_c10d_store``: with TORCHELASTIC_USE_AGENT_STORE=True every
    rank connects to the agent's store as a client; ``init_process_group`` does the same later)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ValidationError("--schedule-file with several ranks needs torchrun's shared store to send rank 0's file "
                              "to every rank, and this launch has none (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or not "
                              "started by torchrun)")
    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(seconds=timeout))


def _read_bytes(path: str) -> bytes:
    from sim.io.schedule_io import PyTorchFormatError
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise PyTorchFormatError(f"schedule file {path}: cannot read it: {exc.strerror or exc}") from None


def _parse(name: str, data: bytes) -> Schedule:
    """The schedule in *data*, read as a file called *name* (its suffix picks the format)."""
    from sim.files import atomic_path
    from sim.io.schedule_io import read_schedule_file

    with tempfile.TemporaryDirectory(prefix="pipesim-schedule-") as folder:
        copy = Path(folder) / Path(name).name
        with atomic_path(copy) as partial:  # the project's one way to write a file (tests/test_hostile_inputs.py)
            partial.write_bytes(data)
        return read_schedule_file(copy)


def _check_world(schedule: Schedule, path: str, world: int) -> None:
    if schedule.devices != world:
        raise ValidationError(f"--schedule-file {path} is a schedule of {schedule.devices} ranks; torchrun started "
                              f"{world} (WORLD_SIZE: nnodes x nproc-per-node)")


if __name__ == "__main__":
    sys.exit(main())
