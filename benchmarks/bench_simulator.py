"""Simulator speed as a user meets it: whole runs in process, whole CLI commands, against PyTorch's dry run.

    .venv/bin/python benchmarks/bench_simulator.py            # the full benchmark (about a minute)
    .venv/bin/python benchmarks/bench_simulator.py --quick    # tiny sizes, a few seconds

What is timed (1F1B with links: latency 20 us, 10 GB/s, 4 MB activations sent, 16 MB kept, memory tracked):

- **in process, end to end**: ``sim.schedules.one_f_one_b(K, M)`` (generation and validation) +
  ``sim.simulate`` + ``result.metrics`` (which include the memory peaks). Best of at least a few runs
  and a quarter of a second (:data:`BUDGET_S`), in a process that has run once already with numba's
  kernels loaded: the steady state of a notebook or a sweep (a one-off command is the CLI figure). The
  column "+ frames" adds what is built only on demand: the timeline DataFrame and the memory step
  function.
- **the CLI**: ``pipesim simulate ... --json`` as a fresh process, start-up included; median of a few.
- **PyTorch**: its unit-time dry run ``torch.distributed.pipelining.schedules._simulate_comms_compute``
  on the same 1F1B order (F and B, with the SEND/RECV its own ``_add_send_recv`` adds), built
  beforehand and timed alone, in the same run, best of the same number of runs and time budget. It has no costs, links or memory: every action takes
  one step. The ratio is its time over our end-to-end time.
- **scale**: K=256, M=8192 (about 4.2 M actions) end to end in a fresh process, with its peak
  resident memory (``ru_maxrss``).

"Actions" counts the F and B computations, 2*K*M, for both simulators. Every figure is printed with
the 1-minute load average: the machine is shared, so compare figures taken at similar loads. The
targets are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from anywhere: time this checkout's sim, not an installed one
    sys.path.insert(0, str(ROOT))

from sim import Hardware, schedules, simulate, uniform  # noqa: E402

__all__ = ["Row", "make_costs", "end_to_end", "time_in_process", "torch_order", "time_torch", "time_cli",
           "measure_scale", "run", "format_table", "targets", "main"]

TARGET_RATE = 1e6  # actions/s, K=64 M=1024 end to end in process
TARGET_CLI_S = 0.6  # the K=64 M=1024 command
TARGET_SMALL_CLI_S = 0.25  # `pipesim simulate -s gpipe -K 4 -M 4 --json`
TARGET_TORCH_RATIO = 50.0  # at K=16, M=128: PyTorch's dry run over our end to end
TARGET_SCALE_BYTES = 2 * 2**30  # K=256 M=8192 peak resident memory
LINK_FLAGS = ["--latency", "2e-5", "--bandwidth", "1e10", "--activation-bytes", "4e6"]  # the command of issue 13


def _load() -> float:
    return os.getloadavg()[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    devices: int
    microbatches: int
    actions: int
    """F and B computations: 2*K*M."""
    e2e_s: float
    """generate + validate + simulate + metrics (with memory peaks), best of the repeats."""
    frames_s: float | None
    """the same plus the timeline DataFrame and the memory step function."""
    simpy_s: float | None
    torch_s: float | None
    load: float
    """1-minute load average when the row was measured."""
    torch_note: str = ""

    @property
    def rate(self) -> float:
        return self.actions / self.e2e_s

    @property
    def ratio(self) -> float | None:
        """PyTorch's dry run time over our end-to-end time."""
        return None if self.torch_s is None else self.torch_s / self.e2e_s


def make_costs(devices: int):
    """(costs, hardware) of the benchmark: 1F1B with links and memory."""
    costs = uniform(devices, forward=1e-3, backward=2e-3, send_bytes=4e6, activation_bytes=16e6, weight_bytes=1e8)
    hardware = Hardware(devices=devices, latency=2e-5, bandwidth=1e10, memory_capacity=80e9)
    return costs, hardware


def end_to_end(devices: int, microbatches: int, *, engine: str = "auto", frames: bool = False):
    """What a user runs: generate and validate 1F1B, simulate it, read the metrics (and the frames if asked)."""
    schedule = schedules.one_f_one_b(devices, microbatches)
    costs, hardware = make_costs(devices)
    result = simulate(schedule, costs, hardware, engine=engine)
    metrics = result.metrics
    if frames:
        result.timeline, result.memory.usage  # noqa: B018  built on demand: this is their cost
    return schedule, metrics


BUDGET_S = 0.25
"""Each timing repeats its run at least ``repeats`` times and until it has spent this long: a sub-millisecond
run is taken hundreds of times, so a moment of load on the shared machine does not decide the figure."""


def _best(fn, repeats: int) -> float:
    """Best wall seconds of *fn* over at least *repeats* runs and at least :data:`BUDGET_S` seconds."""
    best = float("inf")
    runs, spent = 0, 0.0
    while runs < repeats or spent < BUDGET_S:
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, runs, spent = min(best, took), runs + 1, spent + took
    return best


def time_in_process(devices: int, microbatches: int, *, repeats: int = 3, frames: bool = False,
                    engine: str = "auto") -> float:
    """Best wall seconds of :func:`end_to_end` in a process that runs many (the compiled kernel loaded, as in a
    sweep or a notebook), after one warm-up run."""
    from sim.core import listsched

    listsched._compiled_kernel()  # steady state: what a process that simulates repeatedly ends up using
    end_to_end(devices, microbatches, engine=engine)
    return _best(lambda: end_to_end(devices, microbatches, engine=engine, frames=frames), repeats)


def torch_order(schedule):
    """The schedule as PyTorch's pipeline_order (rank -> list of _Action), SEND/RECV added by ``_add_send_recv``."""
    from torch.distributed.pipelining import schedules as ts  # private API: the benchmark compares against it

    kinds = {"F": ts.F, "B": ts.B}
    compute = {d: [ts._Action(a.stage, kinds[a.kind.value], a.mb) for a in acts if a.kind.value in kinds]
               for d, acts in schedule.actions.items()}
    placement = schedule.placement
    return ts._add_send_recv(compute, stage_to_rank=lambda s: placement[s], num_stages=schedule.stages)


def time_torch(schedule, order, *, repeats: int = 3) -> float:
    """Best wall seconds of PyTorch's ``_simulate_comms_compute`` on *order* (which it does not modify)."""
    from torch.distributed.pipelining import schedules as ts

    placement = schedule.placement

    def once():
        out = ts._simulate_comms_compute(order, lambda s: placement[s], schedule.stages)
        done = sum(a is not None and a.is_compute_op for acts in out.values() for a in acts)
        assert done == 2 * schedule.devices * schedule.total_microbatches, "PyTorch's dry run lost actions"

    return _best(once, repeats)


def _torch_available() -> bool:
    try:
        import torch.distributed.pipelining.schedules  # noqa: F401
    except Exception:  # torch missing, or built without distributed
        return False
    return True


def time_cli(args: list[str], *, repeats: int = 3) -> tuple[float, float]:
    """Median wall seconds of ``python -m sim ARGS`` as a fresh process (start-up included), and the load."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), _load()


_SCALE_PROBE = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from benchmarks.bench_simulator import end_to_end
schedule, metrics = end_to_end({K}, {M})
seconds = time.perf_counter() - t0
print(json.dumps({{"seconds": seconds, "actions": len(schedule), "makespan": metrics.makespan,
                  "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
"""


def measure_scale(devices: int, microbatches: int) -> dict:
    """End to end in a fresh process (imports and numba's kernel load included): seconds, actions, peak bytes."""
    code = _SCALE_PROBE.format(root=str(ROOT), K=devices, M=microbatches)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), load=_load())


def run(sizes, *, simpy_sizes=(), repeats: int = 3, torch_sizes=None, log=print) -> list[Row]:
    """Time every (K, M) in *sizes*; simpy only for *simpy_sizes* (once); PyTorch at *torch_sizes* (default: all)."""
    have_torch = _torch_available() if torch_sizes is None or torch_sizes else False  # importing torch takes seconds
    rows = []
    for K, M in sizes:
        log(f"K={K}, M={M} ...")
        e2e = time_in_process(K, M, repeats=repeats)
        frames = time_in_process(K, M, repeats=repeats, frames=True)
        slow = time_in_process(K, M, repeats=1, engine="simpy") if (K, M) in simpy_sizes else None
        torch_s, note = None, ""
        if torch_sizes is not None and (K, M) not in torch_sizes:
            note = "not timed at this size"
        elif not have_torch:
            note = "torch not installed"
        else:
            schedule = schedules.one_f_one_b(K, M)
            torch_s = time_torch(schedule, torch_order(schedule), repeats=repeats)
        rows.append(Row(devices=K, microbatches=M, actions=2 * K * M, e2e_s=e2e, frames_s=frames, simpy_s=slow,
                        torch_s=torch_s, load=_load(), torch_note=note))
    return rows


def _rate(actions: int, seconds: float | None) -> str:
    return "-" if seconds is None else f"{actions / seconds:,.0f}"


def format_table(rows: list[Row]) -> str:
    head = (f"{'size':<16}{'actions':>9}{'e2e s':>9}{'e2e act/s':>13}{'+frames s':>11}{'simpy act/s':>13}"
            f"{'torch s':>9}{'torch/ours':>12}{'load':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        torch_s = "-" if r.torch_s is None else f"{r.torch_s:.3f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.1f}x"
        frames = "-" if r.frames_s is None else f"{r.frames_s:.3f}"
        lines.append(f"{f'K={r.devices}, M={r.microbatches}':<16}{r.actions:>9,}{r.e2e_s:>9.3f}"
                     f"{_rate(r.actions, r.e2e_s):>13}{frames:>11}{_rate(r.actions, r.simpy_s):>13}{torch_s:>9}"
                     f"{ratio:>12}{r.load:>7.2f}" + (f"  ({r.torch_note})" if r.torch_note else ""))
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def targets(rows: list[Row], cli: dict | None = None, scale: dict | None = None) -> list[str]:
    """Whether the targets hold, as lines to print (each with the load it was measured at)."""
    out = []
    for r in rows:
        if (r.devices, r.microbatches) == (64, 1024):
            out.append(f"target >= {TARGET_RATE:,.0f} actions/s at K=64, M=1024 end to end in process: "
                       f"{r.rate:,.0f} -> {_verdict(r.rate >= TARGET_RATE)} (load {r.load:.2f})")
        if r.ratio is not None and (r.devices, r.microbatches) == (16, 128):
            out.append(f"target >= {TARGET_TORCH_RATIO:g}x PyTorch's dry run at K=16, M=128 (its dry run alone over "
                       f"our end to end): {r.ratio:.1f}x -> {_verdict(r.ratio >= TARGET_TORCH_RATIO)} "
                       f"(load {r.load:.2f})")
    for label, (seconds, load) in (cli or {}).items():
        limit = TARGET_SMALL_CLI_S if "-K 4 -M 4" in label else TARGET_CLI_S
        out.append(f"target CLI `{label}` <= {limit:g} s: {seconds:.3f} s -> {_verdict(seconds <= limit)} "
                   f"(load {load:.2f})")
    if scale:
        out.append(f"target K=256, M=8192 ({scale['actions']:,} actions) under {TARGET_SCALE_BYTES / 2**30:g} GiB: "
                   f"peak {scale['maxrss'] / 2**30:.2f} GiB in {scale['seconds']:.1f} s -> "
                   f"{_verdict(scale['maxrss'] < TARGET_SCALE_BYTES)} (load {scale['load']:.2f})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (K=4, M=8 and K=8, M=32), no scale run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per timing; the best is kept (default 3)")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  progress goes to stderr
    if args.quick:
        sizes, simpy_sizes, scale_size = [(4, 8), (8, 32)], [(4, 8)], None
        commands = [["simulate", "-s", "gpipe", "-K", "4", "-M", "4", "--json"]]
    else:
        sizes, simpy_sizes, scale_size = [(16, 128), (64, 1024)], [(16, 128)], (256, 8192)
        commands = [["simulate", "-s", "gpipe", "-K", "4", "-M", "4", "--json"],
                    ["simulate", "-s", "1f1b", "-K", "64", "-M", "1024", *LINK_FLAGS, "--json"]]
    rows = run(sizes, simpy_sizes=simpy_sizes, repeats=args.repeats, log=log)
    cli = {}
    for command in commands:
        log(f"pipesim {' '.join(command)} ...")
        cli[" ".join(command)] = time_cli(command, repeats=args.repeats)
    scale = None
    if scale_size:
        log(f"K={scale_size[0]}, M={scale_size[1]} in a fresh process ...")
        scale = measure_scale(*scale_size)
    print("1F1B with links (latency 20 us, 10 GB/s, 4 MB activations) and memory tracking; in process: best of "
          f"{args.repeats} (simpy: 1 run), after a warm-up run; actions = F and B computations (2*K*M)")
    print(format_table(rows))
    for label, (seconds, load) in cli.items():
        print(f"CLI  pipesim {label}: {seconds:.3f} s wall (median of {args.repeats}, fresh process; load {load:.2f})")
    if scale:
        print(f"scale K={scale_size[0]}, M={scale_size[1]}: {scale['actions']:,} actions end to end in "
              f"{scale['seconds']:.1f} s (fresh process, imports included), peak resident "
              f"{scale['maxrss'] / 2**30:.2f} GiB (load {scale['load']:.2f})")
    for line in targets(rows, cli, scale):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
