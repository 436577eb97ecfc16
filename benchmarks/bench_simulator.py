"""Simulator speed: simulated actions per second, against PyTorch's own dry run.

    /tmp/venv/bin/python benchmarks/bench_simulator.py            # in the development sandbox
    .venv/bin/python benchmarks/bench_simulator.py                # after `make test` / `make run` created .venv
    .venv/bin/python benchmarks/bench_simulator.py --quick        # tiny sizes, a few seconds

What is timed: ``sim.simulate`` on 1F1B with links (latency and bandwidth), activation
bytes and memory tracking (the timeline, memory profile and metrics of the Result),
best of a few runs. The schedule is generated and validated beforehand, as a user
would do once and then simulate it under several cost models. Both engines are timed
at K=16, M=128; the simpy engine is timed once there only (too slow at K=64).

PyTorch's reference is its unit-time dry run
``torch.distributed.pipelining.schedules._simulate_comms_compute`` on the same 1F1B
order (compute actions F and B, with the SEND/RECV actions added by its own
``_add_send_recv``), also built beforehand and timed alone. It has no costs, links or
memory: every action takes one step.

"Actions" counts the F and B computations, 2*K*M, for both simulators. The targets
(K=64, M=1024 under 1 s with the fast engine; at least 5x PyTorch's actions/s) are
printed, not asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from sim import Hardware, schedules, simulate, uniform

__all__ = ["Row", "make_case", "time_ours", "torch_order", "time_torch", "run", "format_table", "main"]

TARGET_SECONDS = 1.0  # K=64, M=1024 with the fast engine
TARGET_RATIO = 5.0  # our actions/s over PyTorch's


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    devices: int
    microbatches: int
    actions: int
    """F and B computations: 2*K*M."""
    fast_s: float
    simpy_s: float | None
    torch_s: float | None
    torch_note: str = ""

    @property
    def fast_rate(self) -> float:
        return self.actions / self.fast_s

    @property
    def simpy_rate(self) -> float | None:
        return None if self.simpy_s is None else self.actions / self.simpy_s

    @property
    def torch_rate(self) -> float | None:
        return None if self.torch_s is None else self.actions / self.torch_s

    @property
    def ratio(self) -> float | None:
        return None if self.torch_s is None else self.fast_rate / self.torch_rate


def make_case(devices: int, microbatches: int):
    """1F1B with links and memory: (schedule, costs, hardware), generated and validated."""
    schedule = schedules.one_f_one_b(devices, microbatches).validate()
    costs = uniform(devices, forward=1e-3, backward=2e-3, send_bytes=4e6, activation_bytes=16e6, weight_bytes=1e8)
    hardware = Hardware(devices=devices, latency=2e-5, bandwidth=1e10, memory_capacity=80e9)
    return schedule, costs, hardware


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_ours(schedule, costs, hardware, *, engine: str = "fast", repeats: int = 3) -> float:
    """Best wall seconds of ``sim.simulate`` over *repeats* runs."""
    return _best(lambda: simulate(schedule, costs, hardware, engine=engine), repeats)


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


def run(sizes, *, simpy_sizes=(), repeats: int = 3, torch_sizes=None, log=print) -> list[Row]:
    """Time every (K, M) in *sizes*; simpy only for *simpy_sizes* (once); PyTorch at *torch_sizes* (default: all)."""
    have_torch = _torch_available() if torch_sizes is None or torch_sizes else False  # importing torch takes seconds
    rows = []
    for K, M in sizes:
        schedule, costs, hardware = make_case(K, M)
        log(f"K={K}, M={M}: {len(schedule)} actions ...")
        fast = time_ours(schedule, costs, hardware, engine="fast", repeats=repeats)
        slow = time_ours(schedule, costs, hardware, engine="simpy", repeats=1) if (K, M) in simpy_sizes else None
        torch_s, note = None, ""
        if torch_sizes is not None and (K, M) not in torch_sizes:
            note = "not timed at this size"
        elif not have_torch:
            note = "torch not installed"
        else:
            torch_s = time_torch(schedule, torch_order(schedule), repeats=repeats)
        rows.append(Row(devices=K, microbatches=M, actions=2 * K * M, fast_s=fast, simpy_s=slow,
                        torch_s=torch_s, torch_note=note))
    return rows


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_table(rows: list[Row]) -> str:
    head = (f"{'size':<16}{'actions':>9}{'fast s':>9}{'fast act/s':>13}{'simpy act/s':>13}"
            f"{'torch s':>9}{'torch act/s':>13}{'ratio':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        torch_s = "-" if r.torch_s is None else f"{r.torch_s:.3f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.1f}x"
        lines.append(f"{f'K={r.devices}, M={r.microbatches}':<16}{r.actions:>9,}{r.fast_s:>9.3f}{_rate(r.fast_rate):>13}"
                     f"{_rate(r.simpy_rate):>13}{torch_s:>9}{_rate(r.torch_rate):>13}{ratio:>8}"
                     + (f"  ({r.torch_note})" if r.torch_note else ""))
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[str]:
    """Whether the targets hold, as lines to print."""
    out = []
    big = [r for r in rows if (r.devices, r.microbatches) == (64, 1024)]
    if big:
        ok = big[0].fast_s < TARGET_SECONDS
        out.append(f"target K=64, M=1024 under {TARGET_SECONDS:g} s (fast engine): {big[0].fast_s:.3f} s -> "
                   f"{'MET' if ok else 'NOT MET'}")
    for r in rows:
        if r.ratio is not None:
            ok = r.ratio >= TARGET_RATIO
            out.append(f"target >= {TARGET_RATIO:g}x PyTorch's actions/s at K={r.devices}, M={r.microbatches}: "
                       f"{r.ratio:.1f}x -> {'MET' if ok else 'NOT MET'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (K=4, M=8 and K=8, M=32)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per timing; the best is kept (default 3)")
    args = parser.parse_args(argv)
    if args.quick:
        sizes, simpy_sizes = [(4, 8), (8, 32)], [(4, 8)]
    else:
        sizes, simpy_sizes = [(16, 128), (64, 1024)], [(16, 128)]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  progress goes to stderr
    rows = run(sizes, simpy_sizes=simpy_sizes, repeats=args.repeats, log=log)
    print("1F1B with links (latency 20 us, 10 GB/s, 4 MB activations) and memory tracking; best of "
          f"{args.repeats} (simpy: 1 run); actions = F and B computations (2*K*M)")
    print(format_table(rows))
    for line in targets(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
