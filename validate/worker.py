"""The per-rank worker: one process per device, started by ``pipesim validate`` or by torchrun.

One machine (``pipesim validate`` starts K of these itself)::

    python -m validate.worker --spec /tmp/.../spec.pt      # RANK, WORLD_SIZE, MASTER_* from the launcher

Several machines (G GPUs each; run on every node; rank 0 writes the report)::

    torchrun --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m validate.worker --schedule 1f1b --microbatches 8 --workload transformer --backend nccl -o reports/validation

Under torchrun the worker reads RANK, WORLD_SIZE and LOCAL_RANK from the
environment; K = WORLD_SIZE. Each rank, for every job (schedule) of the request:

1. calibrate: each stage measured alone, one rank at a time ("before");
2. warm up ``warmup`` times (the last run traced: the in-schedule calibration of the first
   timed run);
3. ``repeats`` timed runs, each a complete run of the schedule from fresh weights,
   traced (each trace also calibrates the prediction of the run after it, on rank 0:
   :mod:`validate.prediction`); the update logs of the first are kept (copied to the CPU after it);
4. calibrate again ("after": the spread of the two is part of the noise floor);

then rank 0 gathers one :class:`validate.request.RankResult` per rank and job.
Clock offsets between hosts are estimated before and after all jobs (the drift is reported).

Launched by ``pipesim validate``, a rank dies with its parent (``PR_SET_PDEATHSIG``) and
is pinned to its own core when the request says so. A failing rank writes
``rank<r>.error.json`` (rank, action, message) next to the result file, prints one
line to stderr and exits 1 at once. Rank 0 appends progress lines to ``progress.log``
there (the launcher shows them), or prints them to stderr under torchrun.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from .request import RankResult, RunRequest, StageCalibration

__all__ = ["main", "run_rank", "run_torchrun", "host_id", "die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def host_id() -> str:
    """A per-boot id of this host: two machines of one hostname (containers, clones) differ, one machine agrees."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # not Linux: the hostname is the best we have
        import socket
        return "host:" + socket.gethostname()


def die_with_parent(parent: int | None = None) -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG); False elsewhere.

    *parent*: the pid that started us; if it is already gone (we were re-parented), exit now.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    return True


def _device(backend: str):
    import torch
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


class _Progress:
    """Progress lines of rank 0: to the launcher's file, or to stderr under torchrun."""

    def __init__(self, rank: int, folder: str | None) -> None:
        self.on = rank == 0
        self.path = Path(folder) / "progress.log" if folder else None

    def __call__(self, line: str) -> None:
        if not self.on:
            return
        if self.path is None:
            print(f"pipesim validate: {line}", file=sys.stderr, flush=True)
        else:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def run_rank(req: RunRequest) -> dict | None:
    """Run one rank of every job of *req* (see :func:`validate.comparison.run_validations`).

    Rank 0 returns ``{"jobs": [[RankResult per rank] per job], "offsets", "uncertainty", "one_host",
    "drift"}``; the other ranks None. All jobs share one process group, so several schedules cost one launch.
    """
    import torch

    from .comm import Comm
    from .executor import ActionFailed

    from .environment import keep_freed_memory

    torch.set_num_threads(req.threads)
    keep_freed_memory()  # every timed run reuses mapped pages (a varying count of page faults made one run in 5 slow)
    rank = int(os.environ["RANK"])
    try:
        core = None
        if req.cores is not None:
            core = req.cores[rank % len(req.cores)]
            os.sched_setaffinity(0, {core})
        device = _device(req.backend)
        comm = Comm.from_env(req.backend, req.timeout, device=device)
        progress = _Progress(rank, req.result_dir)
        host = host_id()
        groups = comm.data_parallel_groups(req.devices, req.replicas) if req.replicas > 1 else None
        before = comm.clock_offsets(host)
        gathered = [comm.gather(_run_job(req, job, rank, comm, device, progress, host, core, groups))
                    for job in req.jobs]
        after = comm.clock_offsets(host)
        comm.barrier()
        comm.close()
        if rank == 0:
            offsets, uncertainty, one_host = before
            drift = [abs(a - b) for a, b in zip(after[0], offsets)]
            return {"jobs": gathered, "offsets": offsets, "uncertainty": uncertainty, "one_host": one_host,
                    "drift": drift}
        return None
    except ActionFailed as exc:
        _fail(req, rank, str(exc.action) if exc.action else None, exc.message, str(exc))
    except Exception as exc:  # noqa: BLE001 - a rank that fails anywhere must say so and exit
        _fail(req, rank, None, f"{type(exc).__name__}: {exc}", f"rank {rank} failed: {type(exc).__name__}: {exc}")


def _calibrate_alone(comm, rank: int, setup, workload) -> dict[int, dict[str, float]]:
    """Every stage of this rank measured alone: one rank at a time, so ranks sharing cores do not compete."""
    from . import calibrate
    per_stage = {}
    for turn in range(comm.world):
        if turn == rank:
            per_stage = {s: calibrate.measure_stage(rt, workload) for s, rt in setup.runtimes.items()}
        comm.barrier()
    return per_stage


def _run_job(req: RunRequest, job, rank: int, comm, device, progress, host: str, core: int | None,
             groups=None) -> RankResult:
    """Calibrate, warm up, run the timed repeats and calibrate again; the payload sent to rank 0.

    DP x PP (``req.replicas`` > 1): this rank is device ``rank % K`` of pipeline copy ``rank // K``,
    trains on that copy's micro-batches and all-reduces each update's gradient with the other copies
    (:class:`validate.dp.ReplicatedStage`) - the same executor, comm and tracer as a single pipeline.
    """
    import torch

    from sim.ir import Action

    from . import calibrate
    from .executor import Executor
    from .tracing import Tracer
    from .workloads import rank_setup

    schedule = job.schedule
    K = schedule.devices
    workload = req.workload if job.lr is None else replace(req.workload, lr=job.lr)
    if comm.world != K * req.replicas:
        raise ValueError(f"WORLD_SIZE is {comm.world} but schedule {schedule.name!r} has {K} devices"
                         + (f" x {req.replicas} replicas" if req.replicas > 1 else ""))
    copy, local = divmod(rank, K)
    setup = rank_setup(workload, schedule, local, device, job.costs, data_offset=copy * schedule.total_microbatches)
    pipeline = comm if req.replicas == 1 else comm.pipeline(copy * K)
    allreduces: list = []
    if req.replicas > 1 or req.pad:
        from .dp import ReplicatedStage
        setup.runtimes = {s: ReplicatedStage(rt, s, costs=job.costs if req.pad else None, comm=comm,
                                             group=groups[s] if groups else None, replicas=req.replicas,
                                             log=allreduces)
                          for s, rt in setup.runtimes.items()}
    fail_at = None
    if job.fail_at:
        r, _, a = job.fail_at.partition(":")
        if int(r) == rank:
            fail_at = Action.parse(a)

    def run_once(tracer, fault=None):
        Executor(schedule, local, setup.runtimes, pipeline, tracer, inputs=setup.inputs,
                 message_shape=setup.message_shape, device=device, fail_at=fault).run()

    def reset():
        for rt in setup.runtimes.values():
            rt.reset()

    before: dict = {}
    if req.calibrate:
        progress(f"{schedule.name}: calibrating each stage alone")
        before = _calibrate_alone(comm, rank, setup, workload)
    overhead = calibrate.executor_overhead()
    # ranks 0 and 1 ping-pong while every other rank waits at a barrier: on 2 cores, ranks busy with
    # their own work meanwhile put up to 1 ms into a 50 us latency
    comm.barrier()
    ping = comm.ping_pong(calibrate.PING_SIZES, device=device)
    comm.barrier()
    warm, warm_overhead = [], []
    for i in range(req.warmup):  # the warm-up runs are traced too: per-action costs measured inside the schedule
        progress(f"{schedule.name}: warm-up {i + 1}/{req.warmup}")
        tracer = Tracer(rank, device)
        run_once(tracer)
        trace = tracer.finish()
        warm, warm_overhead = trace.compute, trace.overhead  # the last one: the first pays for growing memory
        reset()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    traces, grads, weights, first_allreduces = [], {}, {}, []
    for r in range(req.repeats):
        progress(f"{schedule.name}: timed run {r + 1}/{req.repeats}")
        comm.barrier()
        allreduces.clear()
        tracer = Tracer(rank, device)
        run_once(tracer, fail_at if r == 0 else None)
        traces.append(tracer.finish())  # resolves CUDA events: the one synchronisation, after the run
        if r == 0:  # copied out after the run, never inside it
            logs = {s: rt.update_log() for s, rt in setup.runtimes.items()}
            grads = {s: g for s, (g, _) in logs.items()}
            weights = {s: w for s, (_, w) in logs.items()}
            first_allreduces = list(allreduces)
        reset()
    after: dict = {}
    if req.calibrate:
        progress(f"{schedule.name}: calibrating again (noise floor)")
        after = _calibrate_alone(comm, rank, setup, workload)
    cal = StageCalibration(before=before, after=after, in_schedule=calibrate.in_schedule_costs(schedule, warm),
                           ping=ping, overhead=overhead,
                           action_overhead=calibrate.in_schedule_overhead(schedule, warm_overhead))
    return RankResult(rank=rank, traces=traces, calibration=cal, grads=grads, weights=weights,
                      allreduces=first_allreduces,
                      memory=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                      device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", host=host,
                      core=core)


def _fail(req: RunRequest, rank: int, action: str | None, message: str, line: str) -> None:
    if req.result_dir:
        path = Path(req.result_dir) / f"rank{rank}.error.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": rank, "action": action, "message": message,
                                   "traceback": traceback.format_exc()}))
        tmp.replace(path)
    print(f"pipesim worker: {line}", file=sys.stderr, flush=True)
    os._exit(1)  # at once: do not wait for peers in destroy_process_group


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validate.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="spec file written by pipesim validate (one-machine launches)")
    from .command import add_validate_options
    add_validate_options(parser, torchrun=True)
    args = parser.parse_args(argv)
    if args.spec:
        parent = os.environ.get("PIPESIM_PARENT_PID")
        die_with_parent(int(parent) if parent else None)  # before the slow torch import
        import torch
        payload = torch.load(args.spec, weights_only=False)
        result = run_rank(payload["request"])
        if result is not None:
            tmp = Path(payload["result_path"] + ".tmp")
            torch.save(result, tmp)
            tmp.replace(payload["result_path"])
        return 0
    # torchrun: every rank builds the same request from the flags; rank 0 also writes the report
    return run_torchrun(args)


def run_torchrun(args) -> int:
    """The torchrun path: every rank runs its part; rank 0 compares and writes the report (exit 3: check failed)."""
    from .command import EXIT_CHECK_FAILED, request_options
    from .comparison import _schedule, build_report, check_request, prepare_job
    from .report import format_summary
    from .request import WorkloadSpec

    world = int(os.environ["WORLD_SIZE"])
    opts = request_options(args)
    check_request(workload=opts["workload"], backend=opts["backend"], devices=1)
    spec = WorkloadSpec(name=opts["workload"], **opts["workload_options"])
    sched = _schedule(opts["schedule"], world, opts["microbatches"], opts["iterations"], opts["recompute"],
                      opts["chunks"])
    job = prepare_job(sched, spec, opts["costs"], opts["fail_at"])
    request = RunRequest(jobs=(job,), workload=spec, backend=opts["backend"], timeout=opts["timeout"],
                         threads=opts["threads"], repeats=opts["repeats"])
    result = run_rank(request)
    if result is None:
        return 0
    from sim.hardware import load_hardware
    hardware = load_hardware(opts["hardware"]) if opts["hardware"] else None
    report = build_report(sched, spec if job.lr is None else replace(spec, lr=job.lr), opts["backend"],
                          dict(result, ranks=result["jobs"][0]), given_costs=job.costs, hardware=hardware,
                          output_dir=opts["output_dir"], calibration=opts["calibration"], chunks=opts["chunks"])
    print(format_summary(report))
    return EXIT_CHECK_FAILED if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
