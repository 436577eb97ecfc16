"""The runtime model against PyTorch's own runtime: issue 27's targets, printed with the load (never asserted).

    python benchmarks/bench_runtime.py                                  # K=2, M=8, width 256, batch 64
    python benchmarks/bench_runtime.py --schedules gpipe 1f1b --steps 5 --width 256 --batch 64
    python benchmarks/bench_runtime.py --probe                          # probe-sized actions (a forward >= 10 ms)
    python benchmarks/bench_runtime.py --launches 3                     # each schedule three times, summarised
    python benchmarks/bench_runtime.py -K 1 --backend nccl --width 4096 --depth 4 --batch 512   # one GPU
    python benchmarks/bench_runtime.py --runtime megatron --launches 3  # Megatron-LM's own 1F1B (megatron-core)
    python benchmarks/bench_runtime.py --runtime megatron-overlap       # its interleaved 1F1B, overlap_p2p_comm

One ``pipesim validate --runtime torch`` launch per schedule (gloo on CPU, one process per rank), each
profiled step ingested and compared with two predictions from the same trace calibration:

- *without* the runtime model: eager links, no dispatch overhead (the prediction before issue 27);
- *with* it: the ``torch`` profile (PyTorch's posting points on rendezvous links, :mod:`sim.model.runtimes`),
  the dispatch overhead measured as the trace's gaps (:func:`validate.predict.calibrate.dispatch_overhead`),
  and every message's calls and link time drawn from the distributions the profiled steps show (the run of
  median makespan of 64 draws: :mod:`validate.ingest.message_draws`).

A second table is the evidence on how gloo moves messages (:func:`validate.ingest.message_draws.sender_evidence`):
the receives a rank waited for, by what their sender did meanwhile (computing through >= 90% of the wait, or
<= 10%), with the median wait, where the completions lie against the end of the sender's computation, and the
share that took over 1 ms.

A third table is where the slow calls come from (README, "Where the slow calls come from"): per rank, the calls
(``c10d::send`` / ``c10d::recv_``) over 1 ms and how many of them end in one 0.2 ms window of the kernel's scheduler
tick (``CONFIG_HZ``, 4 ms at HZ=250; a stalled call woken by a tick ends at the tick's phase), against the share of
every call's ends in its densest such window (5% if they are spread evenly); and how often a call that collided
with an unexpected message (:func:`validate.ingest.message_draws.call_collisions`) took over 1 ms, against the
other calls.

The model's variants on the same traces (the collision rule off, a stall not holding its pair, ...) are
``benchmarks/bench_runtime_replay.py`` on the folder ``--output`` keeps.

Targets (issue 27): median |makespan error| <= 5%, p10-p90 within +-10%, and each part of the predicted idle
split (dependency / communication / gap, as shares of K x makespan) within 5 points of the measured one: the
mean over the 64 draws against the mean over the profiled steps, by one rule (validate/compare/idle.py); the
split of the median draw against that of the median step is printed beside it (one sample each). The column
"steps" gives how many steps were profiled (by default as many as fill about a second, 5 to 40, as ``validate
--runtime torch`` chooses) and the median error's confidence interval: the order-statistic interval of the median
step (:func:`validate.compare.distributions.median_interval`) over the prediction, i.e. how far the median error
could move with other steps of the same launch. The column
"measured steps vs their median" is the measurement's own spread: what a prediction equal to the median step
would score as p10..p90, so a p10..p90 target tighter than it cannot be met by any single prediction. The column
"spread" asks the question a distribution can answer: the p10 and p90 of the 64 draws' makespans against those of
the profiled steps (``band_error`` in the report's JSON: measured / predicted - 1 at p10 and at p90). The column
"each step replayed" asks the model the per-step question with each step's own inputs
(:mod:`validate.ingest.step_replay`: that step's measured computations, dispatch and message times under the
runtime's posting points and links; ``step_replays`` in the JSON), beside the same replays without the runtime model
(eager links, no call times, no dispatch); "target, each step replayed" holds the same targets with its p10..p90
in place of the one prediction's.
Every line carries the 1-minute load average before and after its launch: on the shared 2-core machine the
figures move with it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CATEGORIES = ("dependency", "communication", "gap")


def _row(name: str, v) -> str:
    s = v.comparison.summary
    model = s["runtime_model"]
    without = model["without"]
    idle = s["idle"]
    idle_p, idle_m = idle.get("predicted_mean", idle["predicted"]), idle.get("measured_mean", idle["measured"])
    worst = max(abs(idle_p[f"{c}_fraction"] - idle_m[f"{c}_fraction"]) for c in CATEGORIES)
    lo, hi = s["makespan_error_range"]
    mlo, mhi = s["makespan_error_median_interval"]
    split = " / ".join(f"{idle_p[f'{c}_fraction']:.1%}:{idle_m[f'{c}_fraction']:.1%}" for c in CATEGORIES)
    one = " / ".join(f"{idle['predicted'][f'{c}_fraction']:.1%}:{idle['measured'][f'{c}_fraction']:.1%}"
                     for c in CATEGORIES)
    ok = abs(s["makespan_error_median"]) <= 0.05 and lo >= -0.10 and hi <= 0.10 and worst <= 0.05
    # every step replayed from its own measurements (validate/ingest/step_replay.py): the model's error step by
    # step, the same targets on its p10..p90 beside the one prediction's above
    r = s["step_replays"]
    rlo, rhi = r["makespan_error_range"]
    rw = r["without"]
    replayed = (f"{r['makespan_error_median']:+.1%} ({rlo:+.1%}..{rhi:+.1%}); without "
                f"{rw['makespan_error_median']:+.1%} ({rw['makespan_error_range'][0]:+.1%}.."
                f"{rw['makespan_error_range'][1]:+.1%})")
    ok_replayed = abs(s["makespan_error_median"]) <= 0.05 and rlo >= -0.10 and rhi <= 0.10 and worst <= 0.05
    steps = np.array(s["step_makespans"])
    measured = float(np.median(steps))
    # the measurement's own spread: each profiled step against the median step (what a perfect predictor of the
    # median would score as p10..p90), the floor under the +-10% target
    own = (steps - measured) / measured
    load = s["load_average"]
    wlo, whi = without["makespan_error_range"]
    qp, qm = s["predicted_makespan_quantiles"], s["measured_makespan_quantiles"]
    band = (f"{qp['p10'] * 1e3:.1f}..{qp['p90'] * 1e3:.1f} : {qm['p10'] * 1e3:.1f}..{qm['p90'] * 1e3:.1f} "
            f"({s['band_error'][0]:+.1%} / {s['band_error'][1]:+.1%})")
    return (f"| {name} | {without['makespan'] * 1e3:.2f} | {without['makespan_error_median']:+.1%} "
            f"({wlo:+.1%}..{whi:+.1%}) | "
            f"{v.comparison.predicted.metrics.makespan * 1e3:.2f} | {measured * 1e3:.2f} | "
            f"{s['makespan_error_median']:+.1%} ({lo:+.1%}..{hi:+.1%}) | {replayed} | "
            f"{len(steps)}, {mlo:+.1%}..{mhi:+.1%} ({s['median_interval_coverage']:.0%}) | "
            f"{np.percentile(own, 10):+.1%}..{np.percentile(own, 90):+.1%} | {band} | {split} | {worst * 100:.1f} | {one} | "
            f"{'ok' if ok else 'MISSED'} | {'ok' if ok_replayed else 'MISSED'} | {load[0]:.2f} / {load[1]:.2f} |")


def kernel_hz() -> int | None:
    """The running kernel's scheduler tick rate (``CONFIG_HZ``), or None where its configuration is not readable."""
    release = os.uname().release
    for path in (f"/boot/config-{release}", "/proc/config.gz"):
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as f:
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=")[1])
        except OSError:
            continue
    return None


def _densest(phases: list[float], period: float, width: float) -> int:
    """How many of *phases* fall in the densest window of *width* on a circle of *period*."""
    p = sorted(x % period for x in phases)
    return max((sum(1 for y in p if (y - x) % period <= width) for x in p), default=0)


def stall_phases(traces: list[str], tick_us: float, slow_us: float = 1000.0,
                 width_us: float = 200.0) -> list[tuple[int, int, int, float]]:
    """Per rank trace: (calls, calls over *slow_us*, how many of those end in the densest *width_us* window of the
    scheduler tick *tick_us*, the share of every call's end in its own densest such window), microseconds."""
    out = []
    for path in traces:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        calls = [e for e in events if e.get("ph") == "X" and e.get("name") in ("c10d::send", "c10d::recv_")]
        ends = [e["ts"] + e["dur"] for e in calls]
        slow = [t for t, e in zip(ends, calls) if e["dur"] > slow_us]
        out.append((len(calls), len(slow), _densest(slow, tick_us, width_us),
                    _densest(ends, tick_us, width_us) / len(ends) if ends else 0.0))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", choices=("torch", "megatron", "megatron-overlap", "megatron-overlap-flush"),
                   default="torch",
                   help="whose schedules run: PyTorch's classes (default) or Megatron-LM's functions (1f1b, and "
                        "interleaved-1f1b with -K above 2; megatron-overlap: interleaved-1f1b with overlap_p2p_comm; "
                        "megatron-overlap-flush: with overlap_p2p_comm_warmup_flush too)")
    p.add_argument("--schedules", nargs="+", default=None,
                   help="default: gpipe 1f1b interleaved-1f1b zbv dualpipev (torch), 1f1b [interleaved-1f1b] "
                        "(megatron)")
    p.add_argument("-K", "--devices", type=int, default=2)
    p.add_argument("-M", "--microbatches", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--depth", type=int, default=None, help="layers per stage (default: the workload's own)")
    p.add_argument("--backend", default="gloo", help="gloo (CPU, default) or nccl (one GPU per rank)")
    p.add_argument("--steps", type=int, default=None,
                   help="profiled steps per schedule (default: as validate chooses, about a second of steps, 5 to 40)")
    p.add_argument("--probe", action="store_true", help="probe-sized actions instead of --width/--batch")
    p.add_argument("--output", default=None,
                   help="also write the reports and rank traces there (with --launches N, one folder per launch: "
                        "launch1, launch2, ...; for bench_runtime_replay.py)")
    p.add_argument("--launches", type=int, default=1,
                   help="launch every schedule this many times (in turn) and summarise the median errors: one "
                        "launch's median error moves by up to 10 points from the next's")
    args = p.parse_args(argv)
    if args.schedules is None:
        args.schedules = {"torch": ["gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev"],
                          "megatron": ["1f1b"] + (["interleaved-1f1b"] if args.devices > 2 else []),
                          "megatron-overlap": ["interleaved-1f1b"],
                          "megatron-overlap-flush": ["interleaved-1f1b"]}[args.runtime]

    from validate.ingest.message_draws import collision_evidence
    from validate.pytorch.validation import run_torch_validations

    options = None if args.probe else {"width": args.width, "batch": args.batch}
    if args.depth is not None and options is not None:
        options["depth"] = args.depth
    size = "probe-sized actions" if args.probe else " ".join(f"--{k} {v}" for k, v in options.items())
    where = f"gloo on CPU ({os.cpu_count()} cores)" if args.backend == "gloo" else f"{args.backend}, one GPU per rank"
    if args.backend == "nccl":
        import torch
        where += f" ({torch.cuda.get_device_name()}, torch {torch.__version__})"
    steps = args.steps if args.steps else "about a second of (5 to 40)"
    print(f"validate --runtime {args.runtime}, K={args.devices}, M={args.microbatches}, {size}, {steps} profiled steps, "
          f"{where}")
    print("| schedule | without model (ms) | error without (p10..p90) | with model (ms) | measured (ms) | error with (p10..p90) "
          "| each step replayed: error (p10..p90); without model "
          "| steps: n, the median error's interval (coverage) "
          "| measured steps vs their median (p10..p90) | spread (ms): draws p10..p90 : steps p10..p90 (error at p10 / p90) "
          "| idle split, mean of draws : mean of steps (dep / comm / gap) "
          "| worst split miss (pts) | idle split, median draw : median step | target | target, each step replayed "
          "| load before / after |")
    print("|---|---:|---:|---:|---:|---|---|---|---|---|---|---:|---|---|---|---|")
    evidence, stalls, posting = [], [], []
    keep = tempfile.TemporaryDirectory(prefix="bench-runtime-") if args.output is None else None
    output = args.output or keep.name  # the raw traces, for the tick table
    hz = kernel_hz()
    tick = 1e6 / (hz or 250)
    errors: dict[str, list[float]] = {}
    for launch in range(args.launches):  # the schedules in turn, launch after launch: a load change hits them all
        for name in args.schedules:
            try:
                [v] = run_torch_validations([name], args.devices, args.microbatches, workload="mlp",
                                            workload_options=options, backend=args.backend, steps=args.steps,
                                            runtime=args.runtime,
                                            output_dir=output if args.launches == 1 or args.output is None
                                            else os.path.join(output, f"launch{launch + 1}"))
            except Exception as exc:  # a class PyTorch lacks at this shape: say so and go on
                print(f"| {name} | - | - | - | - | {type(exc).__name__}: {str(exc).splitlines()[0][:80]} "
                      f"| | | | | | | | | | {os.getloadavg()[0]:.2f} |")
                continue
            print(_row(name, v), flush=True)
            if "posting" in v.summary:  # Megatron's batches against the lowering (validate/ingest/posting.py)
                posting.append((name, v.summary["posting"]))
            errors.setdefault(name, []).append(v.summary["makespan_error_median"])
            evidence.append((name, v.summary["runtime_model"].get("sender_evidence") or {}))
            traces = [str(v.paths[k]) for k in sorted(v.paths) if k.startswith("trace_rank")]  # read now: the next
            stalls.append((name, stall_phases(traces, tick), collision_evidence(v.comparison.ingested)))  # overwrites
    communicated = any(e.get("waited") for _, e in evidence) or any(n for _, ph, _ in stalls for n, *_ in ph)
    if not communicated:
        print("\nno messages (one rank): no communication tables")
    else:
        print("\n| schedule | waited-for receives | sender computing: n, median wait (us) | sender idle: n, median wait "
              "(us) | in between: n, median (us) | completion - end of sender's computation, median (us) | over 1 ms |")
        print("|---|---:|---|---|---|---:|---:|")
        us = lambda x: "-" if x is None else f"{x * 1e6:.0f}"  # noqa: E731
        for name, e in evidence:
            if not e:
                continue
            cells = [f"{e[k]['n']}, {us(e[k]['median_wait_s'])}" for k in ("sender_computing", "sender_idle",
                                                                            "sender_between")]
            share = e["over_1ms_share"]
            print(f"| {name} | {e['waited']} | {' | '.join(cells)} | "
                  f"{us(e['completion_minus_sender_compute_end_median_s'])} | "
                  f"{'-' if share is None else f'{share:.0%}'} |")
        print(f"\n| schedule | rank | calls | over 1 ms | of those, ending in one 0.2 ms window of the {tick / 1e3:g} ms tick "
              f"| every call: share in its densest 0.2 ms window | collided calls: over 1 ms | other calls: over 1 ms |")
        print("|---|---:|---:|---:|---:|---:|---|---|")
        share = lambda c: f"{c['slow']} of {c['calls']}" + (f" ({c['slow_share']:.0%})" if c["calls"] else "")  # noqa: E731
        for name, phases, col in stalls:
            for rank, (n, slow, dense, dense_all) in enumerate(phases):
                print(f"| {name} | {rank} | {n} | {slow} | {dense} | {dense_all:.0%} | "
                      f"{share(col['collided']) if rank == 0 else ''} | {share(col['other']) if rank == 0 else ''} |")
        print(f"scheduler tick: CONFIG_HZ={hz if hz else 'unknown (250 assumed)'}")
    for name, check in posting:
        print(f"{name}: posting points " + ("match the trace on every rank and step" if check["matches"] else
                                            f"differ: {check['difference']}"))
    if args.launches > 1:
        print(f"\n| schedule | median error of each launch | median over the {args.launches} launches | mean | "
              f"launches within 5% |")
        print("|---|---|---:|---:|---:|")
        for name, errs in errors.items():
            print(f"| {name} | {', '.join(f'{e:+.1%}' for e in errs)} | {float(np.median(errs)):+.1%} | "
                  f"{float(np.mean(errs)):+.1%} | {sum(abs(e) <= 0.05 for e in errs)} of {len(errs)} |")
    if keep is not None:
        keep.cleanup()
    print(f"load average now {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
