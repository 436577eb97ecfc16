"""Keeps ``benchmarks/bench_simulator.py`` from rotting: its functions run at a tiny size (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_simulator.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_simulator", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_benchmark_runs_at_a_tiny_size(bench):
    rows = bench.run([(2, 3)], simpy_sizes=[(2, 3)], repeats=1, torch_sizes=[], log=lambda _: None)
    (row,) = rows
    assert (row.devices, row.microbatches, row.actions) == (2, 3, 12)
    assert row.e2e_s > 0 and row.frames_s > 0 and row.simpy_s > 0 and row.torch_s is None and row.load >= 0
    assert row.rate == 12 / row.e2e_s
    table = bench.format_table(rows)
    assert "K=2, M=3" in table and "not timed at this size" in table and "load" in table
    assert bench.targets(rows) == []  # no K=64 row, no PyTorch timing, no CLI or scale run: nothing to judge


def test_end_to_end_is_what_a_user_runs(bench):
    """Generation, validation, simulation with links and memory: the metrics come out with memory peaks."""
    schedule, metrics = bench.end_to_end(3, 4, frames=True)
    assert schedule.name == "1f1b" and len(schedule) == 2 * 3 * 4 + 3
    assert min(metrics.peak_memory) > 0 and metrics.makespan > 0
    costs, hardware = bench.make_costs(3)
    assert not hardware.free_links and min(costs.activation_bytes) > 0


def test_cli_and_scale_probes_run(bench):
    seconds, load = bench.time_cli(["simulate", "-s", "gpipe", "-K", "2", "-M", "2", "--json"], repeats=1)
    assert seconds > 0 and load >= 0
    scale = bench.measure_scale(2, 3)
    assert scale["actions"] == 2 * 2 * 3 + 2 and scale["maxrss"] > 0 and scale["seconds"] > 0
    lines = bench.targets([], {"simulate -s gpipe -K 4 -M 4 --json": (0.1, 1.0)},
                          dict(scale, actions=4_194_560, maxrss=3 * 2**30))
    assert "<= 0.25 s: 0.100 s -> MET" in lines[0] and "NOT MET" in lines[1]


def test_pytorch_dry_run_input_is_complete(bench):
    """The order handed to PyTorch holds every F and B with its SEND/RECV, and its dry run finishes."""
    pytest.importorskip("torch.distributed.pipelining")
    from sim import schedules

    schedule = schedules.one_f_one_b(3, 4)
    order = bench.torch_order(schedule)
    texts = {str(a) for acts in order.values() for a in acts}
    assert {"0F0", "2B3", "0SEND_F0", "1RECV_F0", "2SEND_B3", "1RECV_B3"} <= texts
    assert bench.time_torch(schedule, order, repeats=1) > 0  # asserts inside that no action was lost
    rows = bench.run([(3, 4)], repeats=1, log=lambda _: None)
    assert rows[0].ratio == rows[0].torch_s / rows[0].e2e_s
