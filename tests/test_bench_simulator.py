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
    assert row.fast_s > 0 and row.simpy_s > 0 and row.torch_s is None
    assert row.fast_rate == 12 / row.fast_s
    table = bench.format_table(rows)
    assert "K=2, M=3" in table and "not timed at this size" in table
    assert bench.targets(rows) == []  # no K=64 row, no PyTorch timing: nothing to judge


def test_benchmark_case_has_links_and_memory(bench):
    schedule, costs, hardware = bench.make_case(3, 4)
    assert schedule.name == "1f1b" and not hardware.free_links
    assert min(costs.activation_bytes) > 0 and hardware.memory_capacity


def test_pytorch_dry_run_input_is_complete(bench):
    """The order handed to PyTorch holds every F and B with its SEND/RECV, and its dry run finishes."""
    pytest.importorskip("torch.distributed.pipelining")
    schedule, _, _ = bench.make_case(3, 4)
    order = bench.torch_order(schedule)
    texts = {str(a) for acts in order.values() for a in acts}
    assert {"0F0", "2B3", "0SEND_F0", "1RECV_F0", "2SEND_B3", "1RECV_B3"} <= texts
    assert bench.time_torch(schedule, order, repeats=1) > 0  # asserts inside that no action was lost
    rows = bench.run([(3, 4)], repeats=1, log=lambda _: None)
    assert rows[0].ratio == rows[0].fast_rate / rows[0].torch_rate
    assert len(bench.targets(rows)) == 1
