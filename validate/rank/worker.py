"""The per-rank worker: one process per device, started by ``pipesim validate`` (or, under torchrun, by
:mod:`validate.torchrun`).

One machine (``pipesim validate`` starts K of these itself)::

    python -m validate.rank.worker --spec /tmp/.../spec.pt      # RANK, WORLD_SIZE, MASTER_* from the launcher

The worker reads RANK, WORLD_SIZE and LOCAL_RANK from the environment; K = WORLD_SIZE. It knows neither the
command line nor the orchestrator: it runs the :class:`validate.request.RunRequest` it is given. Each rank, for every job (schedule) of the request:

1. calibrate: each stage measured alone, one rank at a time ("before");
2. warm up ``warmup`` times (the last run traced: the in-schedule calibration of the first
   timed run);
3. ``repeats`` timed runs, each a complete run of the schedule from fresh weights,
   traced (each trace also calibrates the prediction of the run after it, on rank 0:
   :mod:`validate.predict.prediction`); the update logs of the first are kept (copied to the CPU after it);
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

from validate.request import LaunchResult, RankResult, RunRequest, StageCalibration

__all__ = ["main", "run_rank", "host_id", "die_with_parent", "HOST_ID_OVERRIDE"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


HOST_ID_OVERRIDE = "PIPESIM_HOST_ID"
"""Environment variable, for tests only: this rank's host id instead of the boot id, so that two torchrun
agents on one machine look like two nodes and the clock offsets between them are estimated for real
(``tests/test_multinode.py``). Never set it on a real cluster: ranks of one host would be told apart."""


def host_id() -> str:
    """A per-boot id of this host: two machines of one hostname (containers, clones) differ, one machine agrees."""
    override = os.environ.get(HOST_ID_OVERRIDE)
    if override:
        return f"override:{override}"
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


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # <malloc.h>


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process (``mallopt``); False where that is not glibc.

    Why: a probe-sized mlp stage allocates and frees tens of MiB per action (weights of 16 MiB,
    each update a new version). glibc serves blocks above its mmap threshold with ``mmap`` and
    returns them on free, and trims the heap top above its trim threshold; both thresholds move
    with the history of the process. So a timed run re-faults a varying amount of memory: on the
    2-core VM one of five runs of 1F1B K=2 took 77,600 minor page faults on rank 0 (300 MiB zeroed
    again) and ran 6% slower, the others 0-20,000. With mmap off (``M_MMAP_MAX`` 0) and no trimming,
    a run after the warm-up reuses pages already mapped: 0-5 faults per run. The cost is that a
    rank's resident memory stays at its peak, which a validation run reaches anyway.
    """
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to set
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok)


def run_rank(req: RunRequest) -> LaunchResult | None:
    """Run one rank of every job of *req* (see :func:`validate.run.run_validations`).

    Rank 0 returns every rank's result of every job with the clock offsets; the other ranks None. All jobs share one process group, so several schedules cost one launch.
    """
    import torch

    from validate.rank.comm import Comm
    from validate.rank.executor import ActionFailed


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
            drift = tuple(abs(a - b) for a, b in zip(after.offsets, before.offsets))
            return LaunchResult(jobs=tuple(tuple(ranks) for ranks in gathered), clocks=replace(before, drift=drift))
        return None
    except ActionFailed as exc:
        _fail(req, rank, str(exc.action) if exc.action else None, exc.message, str(exc))
    except Exception as exc:  # noqa: BLE001 - a rank that fails anywhere must say so and exit
        _fail(req, rank, None, f"{type(exc).__name__}: {exc}", f"rank {rank} failed: {type(exc).__name__}: {exc}")


def _run_job(req: RunRequest, job, rank: int, comm, device, progress, host: str, core: int | None,
             groups=None) -> RankResult:
    """Calibrate, warm up, run the timed repeats and calibrate again; the payload sent to rank 0.

    DP x PP (``req.replicas`` > 1): this rank is device ``rank % K`` of pipeline copy ``rank // K``,
    trains on that copy's micro-batches and all-reduces each update's gradient with the other copies
    (:class:`validate.rank.replicated.ReplicatedStage`) - the same executor, comm and tracer as a single pipeline.
    """
    import torch

    from validate.predict import calibrate
    from validate.rank.measure import executor_overhead

    run = _JobRun(req, job, rank, comm, device, progress, groups)
    before = run.calibrate_alone("calibrating each stage alone") if req.calibrate else {}
    measured_stages = run.setup.runtimes
    padded = run.inject_real(before)  # --inject on real stages: padded to drawn durations from here on
    overhead = executor_overhead()
    ping = run.ping_links()
    warm, warm_overhead = run.warm_up()
    padded = run.settle_padding(padded)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    traces, grads, weights, allreduces = run.timed_runs()
    run.setup.runtimes = measured_stages  # measured alone again as they are, without the padding
    after = run.calibrate_alone("calibrating again (noise floor)") if req.calibrate else {}
    schedule = job.schedule
    cal = StageCalibration(before=before, after=after, in_schedule=calibrate.in_schedule_costs(schedule, warm),
                           ping=ping, overhead=overhead,
                           action_overhead=calibrate.in_schedule_overhead(schedule, warm_overhead), padded=padded)
    return RankResult(rank=rank, traces=traces, calibration=cal, grads=grads, weights=weights,
                      allreduces=allreduces,
                      memory=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                      device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", host=host,
                      core=core)


class _JobRun:
    """One job (schedule) on this rank: its stage runtimes, and each phase of its measurement as a method."""

    def __init__(self, req: RunRequest, job, rank: int, comm, device, progress, groups) -> None:
        from sim.core.ir import Action

        from validate.rank.workloads import rank_setup

        self.req, self.job, self.rank, self.comm, self.device, self.progress = req, job, rank, comm, device, progress
        self.schedule = schedule = job.schedule
        K = schedule.devices
        self.workload = req.workload if job.lr is None else replace(req.workload, lr=job.lr)
        if comm.world != K * req.replicas:
            raise ValueError(f"WORLD_SIZE is {comm.world} but schedule {schedule.name!r} has {K} devices"
                             + (f" x {req.replicas} replicas" if req.replicas > 1 else ""))
        copy, self.local = divmod(rank, K)
        self.setup = rank_setup(self.workload, schedule, self.local, device, job.costs,
                                data_offset=copy * schedule.total_microbatches, inject=req.inject)
        self.pipeline = comm if req.replicas == 1 else comm.pipeline(copy * K)
        self.allreduces: list = []
        if req.replicas > 1 or req.pad:
            from validate.rank.replicated import ReplicatedStage
            self.setup.runtimes = {s: ReplicatedStage(rt, s, costs=job.costs if req.pad else None, comm=comm,
                                                      group=groups[s] if groups else None, replicas=req.replicas,
                                                      log=self.allreduces)
                                   for s, rt in self.setup.runtimes.items()}
        self.fail_at = None
        if job.fail_at:
            r, _, a = job.fail_at.partition(":")
            if int(r) == rank:
                self.fail_at = Action.parse(a)

    def inject_real(self, measured: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        """With ``--inject`` on real stages: wrap them so every action lasts its padded cost times its drawn factor
        (:func:`validate.rank.inject.inject_real`; *measured*: the stages' costs alone). Returns the baselines
        (stage -> column -> seconds; empty when nothing is injected or the stages are emulated, which draw their
        waits themselves)."""
        if self.req.inject is None or self.workload.name == "emulated":
            return {}
        from validate.rank.inject import inject_real
        from validate.rank.workloads import Sleeper

        if not measured:
            raise ValueError("--inject on a real workload pads to the stages' costs measured alone: calibrate first")
        self.setup.runtimes, padded = inject_real(self.setup.runtimes, self.local, self.schedule.devices,
                                                  self.schedule.stages, self.req.inject, measured, Sleeper)
        return padded

    def settle_padding(self, padded: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        """Injected real stages, after the warm-up: the baselines of the timed runs, raised to cover the real
        computations the warm-up saw (:meth:`validate.rank.inject.InjectedStage.settle_padding`)."""
        if not padded:
            return padded
        return {s: rt.settle_padding() for s, rt in self.setup.runtimes.items()}

    def run_once(self, tracer, fault=None) -> None:
        from validate.rank.executor import Executor

        setup = self.setup
        Executor(self.schedule, self.local, setup.runtimes, self.pipeline, tracer, inputs=setup.inputs,
                 message_shape=setup.message_shape, device=self.device, fail_at=fault).run()

    def reset(self) -> None:
        for rt in self.setup.runtimes.values():
            rt.reset()

    def calibrate_alone(self, what: str) -> dict[int, dict[str, float]]:
        """Every stage of this rank measured alone: one rank at a time, so ranks sharing cores do not compete."""
        from validate.rank.measure import measure_stage

        self.progress(f"{self.schedule.name}: {what}")
        per_stage = {}
        for turn in range(self.comm.world):
            if turn == self.rank:
                per_stage = {s: measure_stage(rt, self.workload) for s, rt in self.setup.runtimes.items()}
            self.comm.barrier()
        return per_stage

    def ping_links(self) -> list[float] | None:
        """Ranks 0 and 1 ping-pong while every other rank waits at a barrier: on 2 cores, ranks busy with their
        own work meanwhile put up to 1 ms into a 50 us latency."""
        from validate.predict.calibrate import PING_SIZES

        self.comm.barrier()
        ping = self.comm.ping_pong(PING_SIZES, device=self.device)
        self.comm.barrier()
        return ping

    def warm_up(self) -> tuple[list, list]:
        """The untimed runs, traced too: per-action costs measured inside the schedule (the last run's: the first
        pays for growing memory)."""
        from validate.rank.tracing import Tracer

        warm, warm_overhead = [], []
        for i in range(self.req.warmup):
            self.progress(f"{self.schedule.name}: warm-up {i + 1}/{self.req.warmup}")
            tracer = Tracer(self.rank, self.device)
            self.run_once(tracer)
            trace = tracer.finish()
            warm, warm_overhead = trace.compute, trace.overhead
            self.reset()
        return warm, warm_overhead

    def timed_runs(self) -> tuple[list, dict, dict, list]:
        """The timed repeats: their traces, and of the first the gradients and weights of every update and the
        all-reduces (copied out after the run, never inside it)."""
        from validate.rank.tracing import Tracer

        traces, grads, weights, first_allreduces = [], {}, {}, []
        for r in range(self.req.repeats):
            self.progress(f"{self.schedule.name}: timed run {r + 1}/{self.req.repeats}")
            self.comm.barrier()
            self.allreduces.clear()
            tracer = Tracer(self.rank, self.device)
            self.run_once(tracer, self.fail_at if r == 0 else None)
            traces.append(tracer.finish())  # resolves CUDA events: the one synchronisation, after the run
            if r == 0:
                logs = {s: rt.update_log() for s, rt in self.setup.runtimes.items()}
                grads = {s: g for s, (g, _) in logs.items()}
                weights = {s: w for s, (_, w) in logs.items()}
                first_allreduces = list(self.allreduces)
            self.reset()
        return traces, grads, weights, first_allreduces


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
    """One rank of a one-machine launch: ``--spec FILE`` written by :func:`validate.launch.launch`."""
    parser = argparse.ArgumentParser(prog="python -m validate.rank.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="spec file written by pipesim validate (one-machine launches)")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
