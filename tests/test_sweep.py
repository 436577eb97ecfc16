"""Sweeps: one row per configuration, figures equal to simulate()'s, rejected configurations as rows."""

from __future__ import annotations

import json
import math

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.cli import main
from sim.cost import CostsError, uniform
from sim.hardware import Hardware
from sim.simulate import simulate
from sim.sweep import SWEEP_COLUMNS, SWEEP_UNITS, SweepError, read_sweep, run_sweep

COSTS = {"forward": 1.0, "backward": 2.0, "activation_bytes": 3.0, "weight_bytes": 5.0, "send_bytes": 7.0}
LINKS = {"latency": 0.1, "bandwidth": 70.0}


def expected(name, K, M, iterations=1):
    r = simulate(schedules.generate(name, K, M, iterations=iterations), uniform(K, **COSTS),
                 Hardware(devices=K, **LINKS))
    return r.metrics


def assert_row_matches(row, m):
    assert row["error"] == ""
    assert row["makespan"] == pytest.approx(m.makespan)
    assert row["utilization"] == pytest.approx(m.utilization)
    assert row["bubble_fraction"] == pytest.approx(m.bubble_fraction)
    assert row["bubble_ratio"] == pytest.approx(m.bubble_ratio)
    assert row["throughput"] == pytest.approx(m.throughput)
    assert row["peak_memory"] == pytest.approx(max(m.peak_memory))
    assert m.peak_memory[int(row["peak_memory_device"])] == max(m.peak_memory)
    assert row["peak_inflight"] == max(m.peak_inflight)
    assert row["weight_versions"] == max(m.weight_versions)


def test_one_row_per_configuration_equal_to_simulate():
    names, ks, ms = ["gpipe", "1f1b", "pipedream"], [1, 2, 4], [1, 3, 8]
    df = run_sweep(names, ks, ms, costs=COSTS, hardware=LINKS, progress=False)
    assert list(df.columns) == SWEEP_COLUMNS
    assert len(df) == len(names) * len(ks) * len(ms)
    assert list(zip(df["schedule"], df["devices"], df["microbatches"])) == \
        [(n, k, m) for n in names for k in ks for m in ms]
    for _, row in df.iterrows():
        assert_row_matches(row, expected(row["schedule"], row["devices"], row["microbatches"]))


def test_gpipe_meets_the_closed_form_on_free_links():
    df = run_sweep(["gpipe"], [2, 4, 8], [1, 4, 16], progress=False)
    np.testing.assert_allclose(df["utilization"], df["closed_form_utilization"])
    np.testing.assert_allclose(df["closed_form_utilization"], 1 - (df["devices"] - 1) / (df["microbatches"] + df["devices"] - 1))


def test_rejected_configurations_become_rows_with_an_error():
    # a costs table for the wrong stage count is rejected per row (Python API; the CLI refuses such a file up front)
    df = run_sweep(["gpipe"], [2, 4], [4], costs=uniform(4), progress=False)
    assert df.loc[0, "error"].startswith("the costs have 4 stages") and df.loc[1, "error"] == ""
    assert df.loc[0, ["makespan", "utilization", "peak_memory"]].isna().all()
    # and so is a shape the schedule itself refuses
    df = run_sweep(["interleaved-1f1b"], [4], [3, 4], progress=False)
    assert "multiple" in df.loc[0, "error"] and df.loc[1, "error"] == ""


def test_processes_give_the_same_table():
    args = (["naive", "1f1b"], [2, 4], [1, 2, 4])
    one = run_sweep(*args, costs=COSTS, hardware=LINKS, progress=False)
    two = run_sweep(*args, costs=COSTS, hardware=LINKS, jobs=2, progress=False)
    pd.testing.assert_frame_equal(one, two)


@pytest.mark.parametrize("kwargs, message", [
    ({"schedules": ["nope"]}, "unknown schedule"),
    ({"devices": []}, "no devices"),
    ({"microbatches": [0]}, "positive integers"),
    ({"jobs": 0}, "jobs"),
])
def test_bad_arguments_raise_sweep_error(kwargs, message):
    args = {"schedules": ["gpipe"], "devices": [2], "microbatches": [2]} | kwargs
    with pytest.raises(SweepError, match=message):
        run_sweep(args.pop("schedules"), args.pop("devices"), args.pop("microbatches"), **args)


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["naive", "gpipe", "1f1b", "pipedream"]), K=st.integers(1, 5), M=st.integers(1, 9),
       iterations=st.integers(1, 2))
def test_any_row_equals_simulate(name, K, M, iterations):
    df = run_sweep([name], [K], [M], iterations=iterations, costs=COSTS, hardware=LINKS, progress=False)
    assert len(df) == 1
    assert_row_matches(df.iloc[0], expected(name, K, M, iterations))


def test_cli_sweep_writes_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--schedules", "gpipe,1f1b", "--devices", "2,4", "--microbatches", "1..8", "-o", str(out),
            "--activation-bytes", "3", "--weight-bytes", "5", "--latency", "0.1", "--bandwidth", "70",
            "--no-progress", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 2 * 2 * 4 and summary["errors"] == 0
    df = read_sweep(summary["outputs"]["csv"])
    assert len(df) == 16 and list(df.columns) == SWEEP_COLUMNS
    for _, row in df.iterrows():  # the CSV's figures are simulate's (send bytes follow --activation-bytes)
        m = simulate(schedules.generate(row["schedule"], row["devices"], row["microbatches"]),
                     uniform(row["devices"], activation_bytes=3, send_bytes=3, weight_bytes=5, grad_bytes=5),
                     Hardware(devices=row["devices"], **LINKS)).metrics
        assert row["makespan"] == pytest.approx(m.makespan) and row["peak_memory"] == pytest.approx(max(m.peak_memory))
    for key in ("utilization", "heatmap", "memory"):
        image = mpimg.imread(summary["outputs"][key])
        assert image.shape[0] > 100
    assert not list(out.glob("*.tmp"))


def test_cli_sweep_default_text_output(tmp_path, capsys):
    assert main(["sweep", "--schedules", "naive", "-K", "2-3", "-M", "1,4", "-o", str(tmp_path), "--jobs", "2",
                 "--format", "svg"]) == 0
    out = capsys.readouterr().out
    assert "4 configurations (0 rejected" in out and "naive" in out and "sweep_heatmap.svg" in out
    assert (tmp_path / "sweep_memory.svg").exists()


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--schedules", "gpipe,nope", "-o", "d"], "unknown schedule 'nope'"),
    (["sweep", "--devices", "0", "-o", "d"], "is not a positive integer"),
    (["sweep", "--microbatches", "8..2", "-o", "d"], "doubling range"),
    (["sweep", "--jobs", "0", "-o", "d"], "must be at least 1"),
    (["sweep", "--format", "bmp", "-o", "d"], "invalid choice"),
])
def test_cli_sweep_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error:") and message in err
    assert not (tmp_path / "d").exists()


def test_each_schedule_gets_its_own_chunks_and_natural_rejections_are_rows():
    from sim import generators

    v_shaped = [n for n in generators.names() if getattr(generators.get_generator(n), "CHUNKS", 1) == 2]
    picky = "pipedream-2bw" if "pipedream-2bw" in generators.names() else None
    if not v_shaped or picky is None:
        pytest.skip("needs a V-shaped schedule and pipedream-2bw registered")
    df = run_sweep(["1f1b", v_shaped[0], picky], [4], [2, 8], progress=False)
    rows = {(r["schedule"], r["microbatches"]): r for _, r in df.iterrows()}
    assert rows[("1f1b", 8)]["stages"] == 4 and rows[(v_shaped[0], 8)]["stages"] == 8
    assert rows[(v_shaped[0], 8)]["error"] == "" and rows[(picky, 8)]["error"] == ""
    assert rows[(picky, 2)]["error"] != "" and math.isnan(rows[(picky, 2)]["makespan"])
    m = simulate(schedules.generate(v_shaped[0], 4, 8, chunks=2), uniform(4).split_into_chunks(2)).metrics
    assert rows[(v_shaped[0], 8)]["makespan"] == pytest.approx(m.makespan)
