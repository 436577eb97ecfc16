"""Ingest benchmark: how well pipesim predicts PyTorch's own pipeline runtime, and what our executor costs beside it.

    python benchmarks/bench_ingest.py                              # both parts, mlp, K=2 (a few minutes on 2 cores)
    python benchmarks/bench_ingest.py --only accuracy --steps 9
    python benchmarks/bench_ingest.py --only ratio --width 512 --microbatches 4
    python benchmarks/bench_ingest.py --only streaming                # 8 ranks x 250 MB of generated GPU traces
    python benchmarks/bench_ingest.py --only streaming --ranks 2 --mb-per-rank 20   # a quick look
    python benchmarks/bench_ingest.py --only fixtures                 # the committed torch 2.13 CPU traces

(a) accuracy: for gpipe, 1f1b, interleaved-1f1b (2 chunks) and zbv on K=2 ranks, ``pipesim validate
    --runtime torch`` runs PyTorch's class (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble) under torch.profiler for ``--steps`` steps, ingests the traces, calibrates
    costs and links from them and simulates the order the class executes. Printed: the median over the
    profiled steps of |measured - predicted| / predicted makespan (target <= 10% at low load), its
    p10-p90, and the measured idle split (dependency / communication / gap).
(b) ratio: pipesim's executor (``pipesim validate``, the same Schedule object in PyTorch's order, the
    same stage modules, K, M and backend) against PyTorch's runtime: pipesim's measured makespan over
    the median wall time of PyTorch's ``step()`` without the profiler (slowest rank). 1.0 = as fast.

(c) streaming: ``--ranks`` Kineto-shaped GPU traces of ``--mb-per-rank`` MB each (1F1B, K = ranks, every
    action a ``PP:`` range holding CPU ops that launch kernels, ``correlation`` ids and ``ac2g`` flows as real
    files have them) are generated in a temporary folder, then ``pipesim ingest`` reads them in a fresh
    process (progress bar on stderr): its wall time and peak resident memory (VmHWM). Target (issue 21):
    8 x 250 MB in <= 60 s with <= 2 GB. The traces are deleted afterwards.

(d) fixtures: ``ingest`` of the committed PyTorch-runtime CPU traces (tests/fixtures/ingest: ScheduleGPipe K=2 M=4,
    Schedule1F1B K=2 M=4 and K=4 M=8, gloo, profiler defaults) predicted with their own calibration and the
    ``torch`` profile, three ways: the runtime model with the median post call and the links' fit (what
    ``pipesim ingest --runtime torch`` printed before), every message of the compared step as measured (calls,
    link and sender times: validate/ingest/messages.py), and the per-message medians over every complete step.
    Error = (measured - predicted) / predicted makespan, as the ingest report prints it. Deterministic (no run).

Figures are printed, never asserted; the 1-minute load average is printed before and after, since on a
shared machine every figure moves with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv")
TARGET = 0.10


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("accuracy", "ratio", "streaming", "fixtures"), default=None)
    p.add_argument("--ranks", type=int, default=8, help="(c) traces to generate (default 8)")
    p.add_argument("--mb-per-rank", type=float, default=250.0, help="(c) MB of JSON per trace (default 250)")
    p.add_argument("--devices", "-K", type=int, default=2)
    p.add_argument("--microbatches", "-M", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="profiled steps per schedule (default 5)")
    p.add_argument("--width", type=int, default=None, help="default: the validator's probe (forward >= 10 ms)")
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    args = p.parse_args(argv)
    if args.only == "streaming":
        return streaming(args.ranks, args.mb_per_rank)
    if args.only == "fixtures":
        return fixtures()
    sizes = {k: v for k, v in (("width", args.width), ("depth", args.depth), ("batch", args.batch)) if v is not None}
    if not sizes:  # one probe for both parts, so pipesim's executor and PyTorch's runtime run the same model
        from validate.environment import size_workload
        from validate.rank.workloads import WorkloadSpec
        spec, note = size_workload(WorkloadSpec(name="mlp"))
        sizes = {"width": spec.width, "depth": spec.depth, "batch": spec.batch}
        print(note)
    print(f"bench_ingest: mlp width {sizes.get('width')}, depth {sizes.get('depth')}, batch {sizes.get('batch')}; "
          f"K={args.devices}, M={args.microbatches}, gloo on CPU, one torch thread per rank")
    print(f"before: {_load()}")
    from validate.pytorch.validation import run_torch_validations

    t0 = time.perf_counter()
    runs = run_torch_validations(CASES, args.devices, args.microbatches, chunks=2, workload="mlp",
                                 workload_options=sizes, steps=args.steps, timeout=900, output_dir=None)
    took = time.perf_counter() - t0
    if args.only in (None, "accuracy"):
        print(f"\n(a) accuracy of the prediction from trace-calibrated costs ({args.steps} profiled steps each, "
              f"one launch, {took:.0f} s)")
        print(f"{'schedule':<17} {'PyTorch class':<24} {'predicted ms':>12} {'measured ms':>12} {'median |err|':>12} "
              f"{'p10..p90 err':>16}  {'idle: dep / comm / gap':<24} target")
        for v in runs:
            s = v.summary
            errs = [(m - s["predicted_makespan"]) / s["predicted_makespan"] for m in s["step_makespans"]]
            med = statistics.median(abs(e) for e in errs)
            idle = s["idle"]["measured"]
            flag = "ok" if med <= TARGET else "MISSED"
            print(f"{v.name:<17} {v.cls:<24} {s['predicted_makespan'] * 1e3:>12.2f} "
                  f"{statistics.median(s['step_makespans']) * 1e3:>12.2f} {med:>12.1%} "
                  f"{s['makespan_error_range'][0]:>+7.1%}..{s['makespan_error_range'][1]:<+7.1%}  "
                  f"{idle['dependency_fraction']:>5.1%} / {idle['communication_fraction']:>5.1%} / "
                  f"{idle['gap_fraction']:>5.1%}   <= {TARGET:.0%} {flag}")
    if args.only in (None, "ratio"):
        print("\n(b) pipesim's executor against PyTorch's runtime (same Schedule order, stage modules, K, M)")
        from validate import run_validations
        reports = run_validations([v.comparison.ingested.schedule for v in runs], args.devices, args.microbatches,
                                  workload="mlp", workload_options=sizes, output_dir=None, timeout=900)
        print(f"{'schedule':<17} {'pipesim executor ms':>20} {'PyTorch step() ms':>18} {'ratio':>7}")
        for v, r in zip(runs, reports):
            ours = r.to_dict()["measured_makespan"]
            theirs = statistics.median(v.step_seconds)
            print(f"{v.name:<17} {ours * 1e3:>20.2f} {theirs * 1e3:>18.2f} {ours / theirs:>7.2f}")
        print("(pipesim: first action start to last action end of its timed run; PyTorch: wall time of step() "
              "after a barrier, slowest rank, median of 3, no profiler)")
    print(f"\nafter: {_load()}")
    return 0


# ------------------------------------------------------------------------------------------- (d) fixtures
FIXTURES = [("gpipe_K2_M4", "ScheduleGPipe", 2, 4), ("1f1b_K2_M4", "Schedule1F1B", 2, 4),
            ("1f1b_K4_M8", "Schedule1F1B", 4, 8)]


def fixtures() -> int:
    from dataclasses import replace

    from sim.simulate import simulate
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.flow import ingest
    from validate.pytorch.schedules import executed_order

    print(f"before: {_load()}")
    print(f"{'trace':<26} {'measured ms':>11} {'no runtime':>10} {'post+fit':>9} {'messages':>9} "
          f"{'medians':>9}  largest call / link (ms)")
    for stem, cls, K, M in FIXTURES:
        paths = sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "ingest").glob(f"torch213_{stem}_rank*"))
        ing = ingest(paths, executed_order(cls, K, M))
        cal = ing.calibration
        measured = ing.measured.metrics.makespan
        err = lambda r: measured / r.metrics.makespan - 1  # noqa: E731
        plain = simulate(ing.schedule, cal.costs, cal.hardware)
        rt = calibrate_runtime(ing.runs(), cal.costs, cal.hardware, "torch", messages=ing.message_model())
        old = replace(rt, messages=None).predict(ing.schedule)[0]
        own = rt.predict(ing.schedule)[0]
        med = replace(rt, messages=ing.message_model(sorted(ing.messages))).predict(ing.schedule)[0]
        calls = list(rt.messages.send_call.values()) + list(rt.messages.recv_call.values())
        print(f"{stem + ' (' + cls.removeprefix('Schedule') + ')':<26} {measured * 1e3:>11.3f} {err(plain):>+10.1%} "
              f"{err(old):>+9.1%} {err(own):>+9.1%} {err(med):>+9.1%}  {max(calls) * 1e3:.2f} / "
              f"{max(rt.messages.link.values(), default=0.0) * 1e3:.2f}")
    print("(no runtime: eager links, no dispatch; post+fit: torch profile, median post call, links' fit; messages: "
          "the compared step's calls, link and sender times; medians: per message over every complete step)")
    print(f"after: {_load()}")
    return 0


# ------------------------------------------------------------------------------------------- (c) streaming
_KERNELS = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, Functor, Array)",
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*)")
_OPS = ("aten::linear", "aten::addmm", "aten::gelu", "aten::layer_norm", "aten::native_layer_norm", "aten::_softmax",
        "aten::matmul", "aten::bmm", "aten::add", "aten::mul", "aten::view", "aten::transpose")


def _event(out, ph, cat, name, pid, tid, ts, dur, args) -> int:
    """One event as Kineto writes it (pretty-printed, one key per line); returns the bytes written."""
    text = (f',\n  {{\n    "ph": "{ph}", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
            f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n{args}\n    }}\n  }}')
    out.write(text)
    return len(text)


def generate_trace(path: Path, rank: int, result, target_bytes: int) -> tuple[int, int]:
    """A Kineto-shaped GPU trace of *result*'s rank *rank*, padded with real-looking ops to ~*target_bytes*.

    Every action is a ``PP:<action>`` range on the CPU thread holding CPU ops, each launching a kernel
    (``cudaLaunchKernel`` + kernel on stream 7, linked by ``correlation`` and ``ac2g`` flows); the kernels
    of an action run inside the action's simulated time, so ingesting the traces gives the simulation back.
    Returns (events, bytes)."""
    from sim.results.timeline import compute_rows

    comp = compute_rows(result.timeline)
    rows = [(float(s) * 1e6, float(e) * 1e6, f"PP:{int(st)}{op}{int(mb)}") for d, st, op, mb, s, e in zip(
        comp["device"], comp["stage"], comp["op"].astype(str), comp["microbatch"], comp["start"], comp["end"])
        if int(d) == rank]
    per_action = max(1, int(target_bytes / max(1, len(rows)) / 1140))  # ~1140 B per op + launch + kernel + flows
    pid, tid = 1000 + rank, 1000 + rank
    events = written = 0
    corr = 1
    with open(path, "w") as out:
        out.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "distributedInfo": {"backend": "nccl", '
                  f'"rank": {rank}, "world_size": {result.schedule.devices}}},\n  "displayTimeUnit": "ms",\n'
                  '  "baseTimeNanoseconds": 1790000000000000000,\n  "traceEvents": [\n  {"ph": "M", "name": '
                  f'"process_name", "pid": {pid}, "tid": 0, "args": {{"name": "python"}}}}')
        for start, end, name in sorted(rows):
            cpu = start - 50.0  # the CPU runs ahead of the GPU
            written += _event(out, "X", "user_annotation", name, pid, tid, cpu, per_action * 2.0 + 2.0,
                              '      "External id": 1, "Record function id": 0, "Ev Idx": 0')
            slot = (end - start) / per_action
            for i in range(per_action):
                t = cpu + 1.0 + 2.0 * i
                written += _event(out, "X", "cpu_op", _OPS[i % len(_OPS)], pid, tid, t, 1.5,
                                  f'      "External id": {corr}, "Record function id": 0, "Ev Idx": {corr}')
                written += _event(out, "X", "cuda_runtime", "cudaLaunchKernel", pid, tid, t + 0.5, 0.8,
                                  f'      "External id": {corr}, "cbid": 211, "correlation": {corr}')
                k0 = start + i * slot
                written += _event(out, "X", "kernel", _KERNELS[i % len(_KERNELS)], 0, 7, k0, slot * 0.9,
                                  f'      "External id": {corr}, "queued": 0, "device": 0, "context": 1, '
                                  f'"stream": 7, "correlation": {corr}, "registers per thread": 96, "shared memory": '
                                  f'0, "blocks per SM": 1.5, "warps per SM": 6, "grid": [132, 1, 1], "block": [128, '
                                  f'1, 1], "est. achieved occupancy %": 9')
                flow = (f',\n  {{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {t + 0.5:.3f}, "cat": '
                        f'"ac2g", "name": "ac2g"}},\n  {{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {k0:.3f}, '
                        f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}')
                out.write(flow)
                written += len(flow)
                events += 5
                corr += 1
            events += 1
        out.write('\n  ],\n  "traceName": "bench"\n}\n')
    return events, written


_MEASURE = """
import sys, time
from sim import schedules
from validate.ingest.flow import ingest, without_updates
K, M, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
t0 = time.perf_counter()
ing = ingest(paths, without_updates(schedules.generate("1f1b", K, M)), progress=True)
took = time.perf_counter() - t0
import resource
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest worker's peak, KiB (0: none)
print(took, hwm * 1024, worker * 1024, ing.measured.metrics.makespan, len(ing.measured.timeline))
"""


def streaming(ranks: int, mb_per_rank: float) -> int:
    """(c): generate, then ingest in a fresh process; print its time and peak memory."""
    import subprocess
    import tempfile

    from sim import schedules
    from sim.model.cost import uniform
    from sim.model.hardware import Hardware
    from sim.simulate import simulate
    from validate.ingest.flow import without_updates

    K, M = ranks, 32
    result = simulate(without_updates(schedules.generate("1f1b", K, M)), uniform(K, forward=0.05, backward=0.1),
                      Hardware(devices=K))
    print(f"(c) streaming: {K} ranks x {mb_per_rank:g} MB of generated Kineto-shaped GPU traces, 1F1B M={M}")
    print(f"before: {_load()}")
    with tempfile.TemporaryDirectory(prefix="pipesim_bench_ingest_") as tmp:
        t0 = time.perf_counter()
        paths, total, events = [], 0, 0
        for r in range(K):
            path = Path(tmp) / f"rank{r}.json"
            n, _ = generate_trace(path, r, result, int(mb_per_rank * 1e6))
            paths.append(str(path))
            total += path.stat().st_size
            events += n
        print(f"generated {total / 1e9:.2f} GB, {events / 1e6:.1f} M events in {time.perf_counter() - t0:.0f} s")
        print(f"ingesting: {_load()}")
        out = subprocess.run([sys.executable, "-c", _MEASURE, str(K), str(M), *paths], text=True,
                             stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
        took, hwm, worker, makespan, rows = out.stdout.split()
        took, hwm, worker = float(took), int(hwm), int(worker)
        peak = hwm + 2 * worker  # the main process and two workers at their peaks at once: an upper bound
        print(f"ingest of {K} x {mb_per_rank:g} MB: {took:.1f} s ({total / 1e6 / took:.0f} MB/s); peak resident: "
              f"main process {hwm / 2**30:.2f} GiB, largest worker {worker / 2**30:.2f} GiB, at most "
              f"{peak / 2**30:.2f} GiB together; measured makespan {float(makespan):.3f} s, {rows} timeline rows "
              f"(target: <= 60 s, <= 2 GiB: {'met' if took <= 60 and peak <= 2 * 2**30 else 'MISSED'})")
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
