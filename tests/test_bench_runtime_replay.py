"""Keeps ``benchmarks/bench_runtime_replay.py`` from rotting: it re-predicts a saved gloo run of PyTorch's
interleaved 1F1B (the fixture of tests/test_runtime_messages.py) under two variants, paired."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "benchmarks" / "bench_runtime_replay.py"
TRACES = [ROOT / "tests" / "fixtures" / "ingest" / f"torch213_interleaved_K2_M8_gloo_rank{r}.json.gz" for r in (0, 1)]


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("bench_runtime_replay", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_variants_predict_the_same_steps(bench):
    spans, rows = bench.replay([str(t) for t in TRACES], "ScheduleInterleaved1F1B", 2, 8,
                               variants=["default", "no-freezes", "no-call-overhead"])
    assert len(spans) == 10
    default, alone, bare = rows
    assert (default.variant, alone.variant, bare.variant) == ("default", "no-freezes", "no-call-overhead")
    # the stall rule's effect on this trace: dependency 9.7% -> 9.0% of K x makespan (8.4% measured)
    assert default.dependency[1] == alone.dependency[1] and default.dependency[0] < alone.dependency[0] - 0.005
    assert abs(default.error_median) < 0.1 and abs(alone.error_median) < 0.1
    # the runtime's time around each call: the prediction 2.2 ms longer (+3.2% -> -1.7%), the split 2.6 -> 1.3 points
    assert bare.predicted < default.predicted - 2e-3 and bare.split_worst > default.split_worst + 0.5


def test_a_saved_folder_is_read_and_a_wrong_one_refused(bench, tmp_path, capsys):
    stem = "interleaved-1f1b_K2_M8_mlp_torch"
    for r, trace in enumerate(TRACES):
        shutil.copy(trace, tmp_path / f"{stem}_rank{r}.json.gz")
    (tmp_path / f"{stem}.json").write_text(json.dumps({"torch_class": "ScheduleInterleaved1F1B", "devices": 2,
                                                       "microbatches": 8, "load_average": [1.1, 1.2]}))
    assert bench.main([str(tmp_path), "--variants", "default"]) == 0
    out = capsys.readouterr().out
    assert f"| {tmp_path.name} | interleaved-1f1b | 1.10 / 1.20 |" in out and "default: mean |median error|" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bench.main([str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no saved PyTorch-runtime run" in err[0]


def test_stalls_table_counts_the_steps_and_the_draws_alike(bench, tmp_path, capsys):
    """``--stalls``: the steps' mean number of stalls is what ``step_stalls`` gives for each ingested step, and the
    draws' what ``drawn_stalls`` gives for each recorded draw (5-11 per step in this trace)."""
    spans, (row,) = bench.replay([str(t) for t in TRACES], "ScheduleInterleaved1F1B", 2, 8, variants=["default"],
                                 stalls=True)
    assert len(row.step_stalls) == len(spans) == 10 and len(row.draw_stalls) == len(row.draw_spans) == 64
    assert min(row.step_stalls) >= 3 and np.mean(row.draw_stalls) > 2
    assert row.predicted in row.draw_spans  # the run of median makespan is one of the draws
    stem = "interleaved-1f1b_K2_M8_mlp_torch"
    for r, trace in enumerate(TRACES):
        shutil.copy(trace, tmp_path / f"{stem}_rank{r}.json.gz")
    (tmp_path / f"{stem}.json").write_text(json.dumps({"torch_class": "ScheduleInterleaved1F1B", "devices": 2,
                                                       "microbatches": 8}))
    assert bench.main([str(tmp_path), "--variants", "default", "--stalls"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"| {tmp_path.name} | interleaved-1f1b |")
                and " : " in ln)
    assert line.split(" | ")[2] == f"{np.mean(row.step_stalls):.2f} : {np.mean(row.draw_stalls):.2f}"
