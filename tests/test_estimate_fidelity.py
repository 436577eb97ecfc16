"""The compute model against published runs (benchmarks/bench_fidelity.py's table), held to what it reaches.

Deterministic (no timing): each row is an estimate of the paper's configuration on the a100-80gb preset, a
simulation of its 1F1B pipeline and the gradient all-reduce after it. The bounds are the errors the model has today
(README, "Estimate fidelity"); a change that moves a row out of them fails here and must update both.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sim.model.published_runs import MT_NLG_530B, NARAYANAN_2021_TABLE1, paper_flops

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fidelity.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fidelity", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(bench):
    return {r["run"]: r for r in bench.table()}


def test_the_published_figures_are_the_papers_own():
    """Narayanan et al.'s eq. (3) with the MT-NLG row reproduces the paper's 126 TFLOP/s per GPU at 60.1 s."""
    first = MT_NLG_530B[0]
    assert paper_flops(first) / (60.1 * 2240) / 1e12 == pytest.approx(125.7, abs=0.1)
    assert [r.gpus for r in NARAYANAN_2021_TABLE1] == [32, 64, 128, 256, 512, 1024, 1536, 1920, 2520, 3072]
    assert all(r.data * r.tensor * r.pipeline == r.gpus for r in NARAYANAN_2021_TABLE1 + MT_NLG_530B)


def test_unpipelined_rows_are_within_ten_percent(rows):
    """Narayanan Table 1 rows without pipeline parallelism (1.7B-18.4B): per-GEMM roofline, attention and
    element-wise traffic, tensor-parallel all-reduces and the gradient all-reduce reproduce them within 10%."""
    for run in NARAYANAN_2021_TABLE1:
        if run.pipeline == 1:
            assert abs(rows[run.label]["error"]) <= 0.10, rows[run.label]


def test_pipelined_rows_keep_todays_error(rows):
    """Rows with p > 1 come out 15-26% fast, the MT-NLG iteration times 33-40% fast (README: DeepSpeed's runtime
    reached 126 TFLOP/s per GPU where Megatron-LM's reached 163 on the same 530B model and GPU)."""
    for run in NARAYANAN_2021_TABLE1:
        if run.pipeline > 1:
            assert 0.10 <= rows[run.label]["error"] <= 0.26, rows[run.label]
    for run in MT_NLG_530B:
        assert -0.40 <= rows[run.label]["error"] <= -0.33, rows[run.label]


def test_efficiency_follows_model_size(rows):
    """The size effect a constant cannot show: achieved throughput grows from 18.4B to 1T as in the paper."""
    tflops = [rows[r.label]["tflops_per_gpu"] for r in NARAYANAN_2021_TABLE1 if r.tensor == 8]
    published = [r.tflops_per_gpu for r in NARAYANAN_2021_TABLE1 if r.tensor == 8]
    assert tflops == sorted(tflops) and published[-1] > published[0] and tflops[-1] > tflops[0] * 1.2
