"""Run PyTorch's own pipeline schedules (torch.distributed.pipelining) under torch.profiler, K local processes.

No pipesim executor is involved: each rank builds the validator's stage modules
(:mod:`validate.rank.workloads`), wraps them in ``PipelineStage``, instantiates the PyTorch schedule
class (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ...) and calls its
``step()``, as a training script would. Per schedule (one launch runs several):

1. ``warmup`` untimed steps (the first infers shapes and sets up the channels);
2. ``timed`` steps without the profiler, each after a barrier: the wall time of ``step()``
   (the slowest rank), to see what profiling costs;
3. one step under ``torch.profiler.profile(record_shapes=True)``, for the messages' sizes and peers, then
   ``profiled`` steps under ``torch.profiler.profile()`` with a profiler schedule (``ProfilerStep#N`` marks
   every step), exported per rank with ``export_chrome_trace`` to ``<job>_rank<r>.json`` with the first step's
   message shapes copied in (:mod:`validate.ingest.message_shapes`: with shapes recorded the profiler keeps every
   op's inputs alive, which changes the steps it times).
   ``profiled=None`` lets the timed steps choose how many (:func:`profiled_steps_for`: about
   :data:`PROFILED_SECONDS` of steps, :data:`MIN_PROFILED_STEPS` to :data:`MAX_PROFILED_STEPS`).

A job with ``"runtime": "megatron"`` (or ``"megatron-overlap"``) runs Megatron-LM's schedule functions instead
(:func:`validate.pytorch.megatron.megatron_step`), profiled with ``with_stack=True`` as Megatron profiles; the
steps, the timing and the kept gradients are the same.

Two classes get marks of their own, in PyTorch's ``PP:<action>`` form, around each stage's
``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``: ``Schedule1F1B``,
whose loop records no ranges at all in torch 2.13, and ``ScheduleDualPipeV``, whose overlapped
pairs are one range (the marks time each half exactly). Every other class is profiled as it is.

Backends: gloo on CPU; NCCL with one GPU per rank, the device bound at ``init_process_group``
(``device_id``) so communicators are created eagerly, CUDA activity profiled, inputs on the GPU.

One process per rank is ``python -m validate.pytorch.runtime --spec FILE`` with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in its environment. The launcher watches them; a failing, dying or stuck
rank stops all of them (no process left behind) and raises :class:`TorchRunError` naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from sim.errors import PipesimError
from sim.model.runtimes import get_runtime

from validate.ingest.message_shapes import copy_message_shapes
from validate.request import RENDEZVOUS_FILE
from validate.launch import stop_ranks  # the validator's: terminate, then kill after 3 s, every rank waited for

__all__ = ["TorchRunError", "run_torch_schedules", "annotate_stage", "main", "profiled_steps_for", "cycle_steps",
           "merge_traces", "PROFILED_SECONDS", "MIN_PROFILED_STEPS", "MAX_PROFILED_STEPS", "CYCLE_SECONDS"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the ``validate`` package: the ranks run there with it on PYTHONPATH, so a checkout that was
never installed launches too."""

PROFILED_SECONDS = 1.0
"""Wall time of profiled steps a run aims at when the number is not given. At 1-ms actions a K=2, M=8 step takes
15-45 ms on this CPU and the steps spread -15..+25% around their median (README, "Against PyTorch's runtime"):
5 steps leave the median uncertain by about +-10%, which is past the 5% the prediction is judged by; 40 steps
by about +-3% (:func:`validate.compare.distributions.median_interval`)."""
MIN_PROFILED_STEPS = 5
"""At least this many profiled steps (probe-sized actions take a second each)."""
MAX_PROFILED_STEPS = 40
"""At most this many: the traces grow by about 50 KB per step and rank at 1-ms actions, and ingesting them is what
takes the time."""
CYCLE_SECONDS = 4.0
"""Wall time of profiled steps in one profiler cycle (:func:`cycle_steps`). With ``record_shapes=True`` (the
messages' sizes and peers come from it) a rank of PyTorch's runtime held about 0.4 GB more memory after each
probe-sized step until the profiler stopped (0.6 -> 4.2 GB over nine steps), and from the fifth step on every
backward's matrix products ran 2.5 x as long (fresh pages faulted in): the last of five profiled steps was 18-84%
slower than the others in every launch, 70-90% from the fifth of nine, while twelve unprofiled steps, or nine
profiled without shapes, stayed within 5% (26 Nov 2026, ``interleaved-1f1b``, K=2, M=8, width 2048, batch 128).
The profiler releases what it holds at the end of each cycle; the cycles' traces are merged into one per rank.
Cycles alone left the first cycle's last step slow (ScheduleGPipe at probe size: 1.0-1.4 s against 0.7-0.8), so
the timed steps are now profiled without shapes (:mod:`validate.ingest.message_shapes`). The cycles stay, for one
unprofiled step each: they bound what the profiler itself holds (its events; with Megatron's ``with_stack`` its
Python events), though without shapes no slowdown from that has been measured."""


def profiled_steps_for(step_seconds: Sequence[float]) -> int:
    """How many steps to profile when the user gave no number: as many as fill :data:`PROFILED_SECONDS` at the
    median of *step_seconds* (the timed, unprofiled steps; every rank sees the same all-reduced times, so every rank
    chooses the same number), within [:data:`MIN_PROFILED_STEPS`, :data:`MAX_PROFILED_STEPS`]."""
    times = sorted(t for t in step_seconds if t > 0)
    if not times:
        return MIN_PROFILED_STEPS
    median = times[(len(times) - 1) // 2]
    return max(MIN_PROFILED_STEPS, min(MAX_PROFILED_STEPS, int(PROFILED_SECONDS / median)))


def cycle_steps(profiled: int, step_seconds: Sequence[float]) -> int:
    """Profiled steps per profiler cycle: as many as fill :data:`CYCLE_SECONDS` at the median of *step_seconds*
    (every rank sees the same all-reduced times), at least 1 and at most *profiled*."""
    times = sorted(t for t in step_seconds if t > 0)
    if not times:
        return profiled
    median = times[(len(times) - 1) // 2]
    return max(1, min(profiled, int(CYCLE_SECONDS / median)))


def merge_traces(paths: Sequence[Path], out: Path, shapes_from: Path | None = None) -> None:
    """One Chrome trace at *out* holding the events of every trace in *paths* (one rank's profiler cycles, on one
    clock: the first file's header, each file's events shifted by the difference of their ``baseTimeNanoseconds``);
    with *shapes_from* (a trace of one step profiled with ``record_shapes=True``), every step's messages get their
    sizes and peers from it (:func:`validate.ingest.message_shapes.copy_message_shapes`). The cycle files and
    *shapes_from* are removed. Written to a temporary name and renamed, so no half-written trace is left."""
    merged = None
    for path in paths:
        trace = json.loads(Path(path).read_text())
        if merged is None:
            merged = trace
            continue
        shift = (trace.get("baseTimeNanoseconds", 0) - merged.get("baseTimeNanoseconds", 0)) / 1e3  # ns -> us
        events = trace.get("traceEvents", [])
        if shift:
            for e in events:
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] += shift
        merged["traceEvents"].extend(events)
    if shapes_from is not None:
        shaped = json.loads(Path(shapes_from).read_text()).get("traceEvents", [])
        copy_message_shapes(shaped, merged["traceEvents"])
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(json.dumps(merged))
    os.replace(tmp, out)
    for path in [*paths, *([shapes_from] if shapes_from is not None else [])]:
        if Path(path) != out:
            Path(path).unlink(missing_ok=True)


_GRACE = 30.0
"""Seconds past the timeout before the launcher stops the ranks itself (their own waits time out first)."""


class TorchRunError(PipesimError):
    """A rank of a PyTorch pipeline run failed, died or timed out; the message names it."""


# --------------------------------------------------------------------------------------------- rank side
def annotate_stage(stage) -> None:
    """Mark *stage*'s computations with PyTorch's ``PP:<stage><F|B|I|W><mb>`` ranges (torch needed).

    For runtimes that record none (torch 2.13's ``Schedule1F1B``) or that run two actions in one range
    (``ScheduleDualPipeV``'s overlapped pairs). Call it once per ``PipelineStage`` before ``step()``.
    """
    from torch.profiler import record_function

    s = stage.stage_index
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
        with record_function(f"PP:{s}F{fwd_chunk_id}"):
            return forward(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(bwd_chunk_id, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        with record_function(f"PP:{s}{'B' if full else 'I'}{bwd_chunk_id}"):
            return backward(bwd_chunk_id, *args, **kwargs)

    def backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs):
        with record_function(f"PP:{s}W{bwd_chunk_id}"):
            return weight(bwd_chunk_id, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


_ANNOTATED = ("Schedule1F1B", "ScheduleDualPipeV")


def _torch_step(spec: dict, workload, job: dict, rank: int, device, loss) -> tuple:
    """PyTorch's schedule class of *job* on this rank's ``PipelineStage``s: ``(step, modules)`` as
    :func:`validate.pytorch.megatron.megatron_step` gives them."""
    import torch
    from torch.distributed import pipelining

    from validate.pytorch.schedules import torch_schedule
    from validate.rank.workloads import build_stage_module, microbatch_data

    S, M = len(job["placement"]), job["microbatches"]
    local = [s for s, r in enumerate(job["placement"]) if r == rank]
    stages = []
    for s in local:
        stage = pipelining.PipelineStage(build_stage_module(workload, s).to(device), s, S, device)
        if job["cls"] in _ANNOTATED:
            annotate_stage(stage)
        stages.append(stage)
    sched = torch_schedule(job, stages, M, loss, spec["out_dir"], rank)  # a class by name, or a schedule file's CSV
    data = [microbatch_data(workload, m) for m in range(M)]
    inputs = (torch.cat([x for x, _ in data]).to(device),) if 0 in local else ()
    target = torch.cat([t for _, t in data]).to(device) if S - 1 in local else None
    return (lambda: sched.step(*inputs, target=target)), {st.stage_index: st.submod for st in stages}


def _run_job(spec: dict, job: dict, rank: int, device, dist) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from validate.rank.workloads import WorkloadSpec, user_stage_loss

    workload = WorkloadSpec(**spec["workload"])
    if workload.user:  # the user's model brings its loss (a micro-batch mean, as PyTorch's loss_fn is)
        loss = lambda out, target: user_stage_loss(workload, out, target, 1)  # noqa: E731
    else:
        loss = lambda out, target: torch.nn.functional.mse_loss(out, target)  # noqa: E731
    megatron = get_runtime(job.get("runtime", "torch")).family == "megatron"
    if megatron:  # Megatron-LM's schedule functions (validate.pytorch.megatron)
        from validate.pytorch.megatron import end_megatron, megatron_step
        run_step, modules = megatron_step(workload, job, rank, device, loss)
    else:
        run_step, modules = _torch_step(spec, workload, job, rank, device, loss)

    def zero_grad():
        for module in modules.values():
            module.zero_grad(set_to_none=True)

    def step():
        dist.barrier()
        run_step()
        zero_grad()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(spec["warmup"]):
        step()
    seconds = []
    for _ in range(spec["timed"]):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        run_step()
        sync()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's step
        seconds.append(float(took.item()))
        zero_grad()
    profiled = spec["profiled"] or profiled_steps_for(seconds)
    path = Path(spec["out_dir"]) / f"{job['name']}_rank{rank}.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # one step profiled with record_shapes=True, for the messages' sizes and peers alone: with it on, the profiler
    # keeps every op's inputs alive and the steps it times change (validate.ingest.message_shapes)
    shaped = path.with_name(f"{path.stem}_shapes.json")
    with profile(activities=activities, record_shapes=True) as shapes_profile:
        step()
        sync()
    shapes_profile.export_chrome_trace(str(shaped))
    # in cycles of a few seconds (CYCLE_SECONDS), each cycle one unprofiled warm-up step then its profiled ones,
    # written to a file of its own and merged below
    per_cycle = cycle_steps(profiled, seconds)
    cycles = -(-profiled // per_cycle)
    parts = [path.with_name(f"{path.stem}_cycle{c}.json") for c in range(cycles)]
    written = iter(parts)
    # Megatron profiles with its Python functions (megatron/training/training.py, --use-pytorch-profiler:
    # record_shapes and with_stack): its forward_step / backward_step calls are what the trace is read by; the
    # shapes come from the step above
    with profile(activities=activities, record_shapes=False, with_stack=megatron,
                 schedule=schedule(wait=0, warmup=1, active=per_cycle, repeat=cycles),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(next(written)))) as prof:
        for i in range(cycles * (1 + per_cycle)):
            step()
            sync()
            if i % (1 + per_cycle) == per_cycle:
                # every rank done with a cycle's last step before any stops its profiler: the stop (collecting and
                # writing the trace) holds the rank's pinned core for up to a second, and a rank still finishing the
                # step waited on it (its peer's gloo thread answers on that core)
                dist.barrier()
            prof.step()
    merge_traces(parts, path, shapes_from=shaped)
    # one more step, its gradients kept for the correctness check (validate.correctness.checks.check_step_gradients):
    # no optimizer runs between steps, so this step's gradient is that of the first mini-batch on the initial weights
    run_step()
    grads = Path(spec["out_dir"]) / f"{job['name']}_rank{rank}_grads.pt"
    torch.save({s: {k: p.grad.detach().cpu() for k, p in module.named_parameters() if p.grad is not None}
                for s, module in modules.items()}, grads)
    zero_grad()
    if megatron:
        end_megatron()
    return {"trace": str(path), "step_seconds": seconds, "grads": str(grads)}


def _worker(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = Path(spec["out_dir"])
    try:
        import datetime

        import torch
        import torch.distributed as dist

        from validate.rank.comm import init_method  # the launcher's private file store, no TCP store

        torch.set_num_threads(spec["threads"])
        if spec.get("cores"):  # one core per rank, as pipesim's executor pins its ranks
            os.sched_setaffinity(0, {spec["cores"][rank % len(spec["cores"])]})
        if spec["backend"] == "nccl":
            local = int(os.environ.get("LOCAL_RANK", rank))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
            dist.init_process_group("nccl", init_method=init_method(), rank=rank, world_size=world, device_id=device,
                                    timeout=datetime.timedelta(seconds=spec["timeout"]))
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", init_method=init_method(), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=spec["timeout"]))
        results = {job["name"]: _run_job(spec, job, rank, device, dist) for job in spec["jobs"]}
        dist.barrier()
        dist.destroy_process_group()
        (out / f"rank{rank}.done.json").write_text(json.dumps(results))
        return 0
    except Exception as exc:  # noqa: BLE001 - a rank that fails anywhere says so and exits
        (out / f"rank{rank}.error.json").write_text(json.dumps(
            {"rank": rank, "message": f"{type(exc).__name__}: {exc}".splitlines()[0],
             "traceback": traceback.format_exc()}))
        print(f"rank {rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m validate.pytorch.runtime", description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="the JSON spec written by run_torch_schedules")
    return _worker(p.parse_args(argv).spec)


# --------------------------------------------------------------------------------------------- launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # Linux: the rank gets SIGTERM when the launcher dies
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _failure(workdir: Path, codes: list[int | None]) -> str:
    errors = []
    for path in sorted(workdir.glob("rank*.error.json")):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    peer_lost = ("Connection reset", "Connection closed", "closed by peer", "Broken pipe", "timed out", "Timed out")
    own = [e for e in errors if not any(p in e["message"] for p in peer_lost)]
    if own or errors:
        e = min(own or errors, key=lambda e: e["rank"])
        return f"rank {e['rank']} of the PyTorch run failed: {e['message']}"
    rank = next(r for r, c in enumerate(codes) if c not in (None, 0))
    log = workdir / f"rank{rank}.log"
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] if log.exists() else []
    how = f"was killed by signal {-codes[rank]}" if codes[rank] < 0 else f"exited with code {codes[rank]}"
    return f"rank {rank} of the PyTorch run {how}" + (f": {tail[0]}" if tail else "")


def run_torch_schedules(jobs: list[dict], *, workload: dict, backend: str = "gloo", warmup: int = 2, timed: int = 3,
                        profiled: int | None = 5, timeout: float = 300.0, threads: int = 1,
                        workdir: str | os.PathLike, cores: Sequence[int] | None = None) -> dict[str, dict]:
    """Run every job (``{"name", "cls", "microbatches", "placement"}``, one K) on K local processes.

    *profiled*: steps under the profiler per job (None: as many as :func:`profiled_steps_for` gives).
    Returns name -> ``{"traces": [path per rank], "step_seconds": [unprofiled step times]}``; the traces
    are written under *workdir*; *cores*: rank r runs on core ``cores[r]`` (None: not pinned). Raises :class:`TorchRunError` when a rank fails, dies or times out.
    """
    devices = {max(job["placement"]) + 1 for job in jobs}
    if len(devices) != 1:
        raise TorchRunError("run_torch_schedules needs jobs of one number of ranks; launch them separately")
    world = devices.pop()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"jobs": jobs, "workload": workload, "backend": backend, "warmup": warmup, "timed": timed,
            "profiled": profiled, "timeout": timeout, "threads": threads, "out_dir": str(workdir),
            "cores": list(cores) if cores is not None else None}
    (workdir / "spec.json").write_text(json.dumps(spec))
    root = str(PACKAGE_ROOT)
    port = str(_free_port())
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"), OMP_NUM_THREADS=str(threads),
                       PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
            env[RENDEZVOUS_FILE] = str(workdir / "rendezvous")  # torch's TCP store would listen on every interface
            log = open(workdir / f"rank{rank}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "validate.pytorch.runtime", "--spec",
                                           str(workdir / "spec.json")], env=env, cwd=root, stdout=subprocess.DEVNULL,
                                          stderr=log, preexec_fn=_die_with_parent))
        deadline = time.monotonic() + timeout + _GRACE
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                time.sleep(0.2)  # let the first failing rank's peers write their own errors
                codes = [p.poll() for p in procs]
                stop_ranks(procs)
                raise TorchRunError(_failure(workdir, codes))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                stop_ranks(procs)
                raise TorchRunError(f"the PyTorch run passed its timeout of {timeout:g} s (+{_GRACE:g} s); ranks "
                                    f"{[r for r, c in enumerate(codes) if c is None]} were stopped")
            time.sleep(0.05)
    finally:
        stop_ranks(procs)
        for log in logs:
            log.close()
    done = [json.loads((workdir / f"rank{r}.done.json").read_text()) for r in range(world)]
    return {job["name"]: {"traces": [d[job["name"]]["trace"] for d in done],
                          "step_seconds": done[0][job["name"]]["step_seconds"],
                          "grads": [d[job["name"]]["grads"] for d in done]} for job in jobs}


if __name__ == "__main__":
    sys.exit(main())
