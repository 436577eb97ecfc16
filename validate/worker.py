"""The per-rank worker: one process per device, started by ``pipesim validate`` or by torchrun.

One machine (``pipesim validate`` starts K of these itself)::

    python -m validate.worker --spec /tmp/.../spec.pt      # RANK, WORLD_SIZE, MASTER_* from the launcher

Several machines (G GPUs each; run on every node; rank 0 writes the report)::

    torchrun --nnodes=2 --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m validate.worker --schedule 1f1b --microbatches 8 --workload transformer --backend nccl -o reports/validation

Under torchrun the worker reads RANK, WORLD_SIZE and LOCAL_RANK from the
environment; K = WORLD_SIZE. Each rank: set up its device and process groups,
estimate clock offsets, calibrate its stages (optional), run the schedule ``warmup``
times (default 2; the last one is timed for the in-schedule calibration) resetting
the weights after each, run it once more for the report, and send everything to rank 0.

A failing rank writes ``rank<r>.error.json`` (rank, action, message) next to the
result file, prints one line to stderr and exits 1 at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

__all__ = ["main", "run_rank"]


def _device(backend: str):
    import torch
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def run_rank(spec: dict) -> dict | None:
    """Run one rank of every job of *spec* (see :func:`validate.comparison.run_validations`).

    Rank 0 returns ``{"jobs": [every rank's payload, per job], "offsets", "uncertainty", "one_host"}``.
    All jobs share one process group, so several schedules cost one launch.
    """
    import torch

    from .comm import Comm
    from .executor import ActionFailed

    torch.set_num_threads(spec.get("threads", 1))
    rank = int(os.environ["RANK"])
    try:
        device = _device(spec["backend"])
        comm = Comm.from_env(spec["backend"], spec["timeout"])
        offsets, uncertainty, one_host = comm.clock_offsets()
        gathered = [comm.gather(_run_job(spec, job, rank, comm, device)) for job in spec["jobs"]]
        comm.barrier()
        comm.close()
        if rank == 0:
            return {"jobs": gathered, "offsets": offsets, "uncertainty": uncertainty, "one_host": one_host}
        return None
    except ActionFailed as exc:
        _fail(spec, rank, str(exc.action) if exc.action else None, exc.message, str(exc))
    except Exception as exc:  # noqa: BLE001 - a rank that fails anywhere must say so and exit
        _fail(spec, rank, None, f"{type(exc).__name__}: {exc}", f"rank {rank} failed: {type(exc).__name__}: {exc}")


def _run_job(spec: dict, job: dict, rank: int, comm, device) -> dict:
    """Calibrate, warm up and run one schedule on this rank; the payload sent to rank 0."""
    import torch

    from sim.ir import Action, boundary_stage

    from . import calibrate
    from .executor import Executor
    from .tracing import Tracer
    from .workloads import WorkloadSpec, boundary_shape, make_stage_runtime, microbatch_data

    schedule = job["schedule"]
    workload = WorkloadSpec(**spec["workload"])
    if comm.world != schedule.devices:
        raise ValueError(f"WORLD_SIZE is {comm.world} but schedule {schedule.name!r} has {schedule.devices} devices")
    costs = job.get("costs")
    S = schedule.stages
    runtimes = {s: make_stage_runtime(workload, s, stages=S, group=schedule.microbatches_per_update, device=device,
                                      costs=costs) for s in schedule.stages_of(rank)}
    measured = None
    if spec.get("calibrate", True):
        per_stage = {}
        for turn in range(comm.world):  # one rank at a time: each stage measured alone, not competing for cores
            if turn == rank:
                per_stage = {s: calibrate.measure_stage(rt, workload) for s, rt in runtimes.items()}
            comm.barrier()
        ping = comm.ping_pong(calibrate.PING_SIZES, device=device)
        measured = {"stages": per_stage, "ping": ping, "overhead": calibrate.executor_overhead()}

    def inputs(mb):
        return None if workload.name == "emulated" else microbatch_data(workload, mb)[0].to(device)

    def message_shape(producer: int):
        if workload.name != "emulated":
            return boundary_shape(workload)
        return (max(1, int(costs.send_bytes[boundary_stage(producer, S)]) // 4),)

    fail_at = None
    if job.get("fail_at"):
        r, _, a = job["fail_at"].partition(":")
        if int(r) == rank:
            fail_at = Action.parse(a)

    warm = []  # the warm-up runs are traced too: per-action costs measured inside the schedule
    for _ in range(spec.get("warmup", 2)):
        warm_tracer = Tracer(rank, device)
        Executor(schedule, rank, runtimes, comm, warm_tracer, inputs=inputs, message_shape=message_shape,
                 device=device).run()
        warm = warm_tracer.finish().compute  # the last one: the first pays for growing memory
        for rt in runtimes.values():
            rt.reset()
    if measured is not None:
        measured["in_schedule"] = calibrate.in_schedule_costs(schedule, warm)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    comm.barrier()
    tracer = Tracer(rank, device)
    Executor(schedule, rank, runtimes, comm, tracer, inputs=inputs, message_shape=message_shape, device=device,
             fail_at=fail_at).run()
    trace = tracer.finish()
    return {
        "rank": rank, "trace": trace, "calibration": measured,
        "grads": {s: rt.grad_log for s, rt in runtimes.items()},
        "weights": {s: rt.weights() for s, rt in runtimes.items()},
        "memory": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def _fail(spec: dict, rank: int, action: str | None, message: str, line: str) -> None:
    out = spec.get("result_dir")
    if out:
        path = Path(out) / f"rank{rank}.error.json"
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
    import torch
    if args.spec:
        spec = torch.load(args.spec, weights_only=False)
        result = run_rank(spec)
        if result is not None:
            tmp = Path(spec["result_path"] + ".tmp")
            torch.save(result, tmp)
            tmp.replace(spec["result_path"])
        return 0
    # torchrun: every rank builds the same spec from the flags; rank 0 also writes the report
    from .comparison import run_validation_distributed
    return run_validation_distributed(args)


if __name__ == "__main__":
    sys.exit(main())
