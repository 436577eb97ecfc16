"""Sweeps: one row per configuration, figures equal to simulate()'s, rejected configurations as rows."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.cli import main
from sim.model.cost import CostsError, StageCosts, uniform
from hang_guard import communicate_or_dump  # noqa: E402 (tests/hang_guard.py)
from sim.model.hardware import Hardware
from sim.simulate import simulate
from sim.search.sweep import SWEEP_COLUMNS, SWEEP_UNITS, SweepError, read_sweep, run_sweep, write_sweep_csv

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
    from sim.schedules import registry as generators

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


def test_every_row_records_its_inputs_so_sweeps_concatenate():
    a = run_sweep(["gpipe"], [2, 4], [4], costs=COSTS, hardware=LINKS, progress=False)
    b = run_sweep(["gpipe"], [2, 4], [4], costs=COSTS | {"forward": 2.0}, progress=False)
    both = pd.concat([a, b], ignore_index=True)
    assert list(both["forward_s"]) == [1.0, 1.0, 2.0, 2.0]
    assert list(both["backward_s"]) == [2.0] * 4 and list(both["activation_bytes"]) == [3.0] * 4
    assert list(both["latency_s"]) == [0.1, 0.1, 0.0, 0.0]
    assert list(both["bandwidth_bytes_per_s"]) == [70.0, 70.0, math.inf, math.inf]
    assert list(both["recompute_s"]) == [1.0, 1.0, 2.0, 2.0]  # defaults to the forward time
    assert set(both["costs_source"]) == {"uniform"} and set(both["hardware_source"]) == {"flags"}
    # chunked schedules record one device's share, as the flags gave it, not a chunk's
    v = run_sweep(["zbv"], [2], [4], costs=COSTS, progress=False).iloc[0]
    assert (v["chunks"], v["stages"], v["forward_s"], v["send_bytes"], v["weight_bytes"]) == (2, 4, 1.0, 7.0, 5.0)


def test_every_column_has_a_unit_and_the_csv_keeps_error_a_string(tmp_path):
    df = run_sweep(["1f1b", "interleaved-1f1b"], [4], [3, 4], progress=False)
    csv, sidecar = write_sweep_csv(df, tmp_path / "sweep.csv")
    described = json.loads(sidecar.read_text())
    assert list(described) == SWEEP_COLUMNS == list(SWEEP_UNITS)
    assert all(set(v) == {"unit", "meaning"} and v["meaning"] for v in described.values())
    back = read_sweep(csv)
    assert back["error"].map(type).eq(str).all()
    assert list(back["error"] == "") == [True, True, False, True] and "multiple" in back["error"][2]
    ok = back[back["error"] == ""]
    pd.testing.assert_series_equal(ok["makespan"], df[df["error"] == ""]["makespan"], check_names=False)
    # a sweep where every row ran: pandas alone would read an all-empty error column as NaN floats
    clean = run_sweep(["gpipe"], [2], [2], progress=False)
    csv, _ = write_sweep_csv(clean, tmp_path / "clean.csv")
    assert pd.read_csv(csv)["error"].isna().all()
    assert read_sweep(csv)["error"].tolist() == [""]


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b", "pipedream", "pipedream-2bw", "interleaved-1f1b",
                                  "zb-h1", "zb-h2", "zbv"])
def test_closed_form_is_the_schedules_own_and_meets_free_links(name):
    costs = {"forward": 1.0, "backward": 1.0, "weight": 1.0}  # F = B = W: where ZB-V's formula holds
    iterations = 1 if name.startswith("zb") or name == "naive" else 2
    df = run_sweep([name], [2, 3, 4], [4, 6, 8, 12], costs=costs, iterations=iterations, progress=False)
    ok = df[(df["error"] == "") & df["closed_form_utilization"].notna()]
    assert len(ok) >= 4, "the formula must apply somewhere in this grid"
    np.testing.assert_allclose(ok["utilization"], ok["closed_form_utilization"], rtol=1e-12)


def test_closed_form_is_not_gpipes_everywhere():
    gpipe = lambda K, M: M / (M + K - 1)  # noqa: E731
    df = run_sweep(["naive", "pipedream", "zb-h1"], [4], [8], iterations=2, costs={"weight": 1.0}, progress=False)
    cf = dict(zip(df["schedule"], df["closed_form_utilization"]))
    assert cf["naive"] == 0.25 and cf["pipedream"] == pytest.approx(16 / 19) and cf["zb-h1"] != gpipe(4, 8)
    # no formula for these inputs (non-uniform stages, recompute in 1F1B, DualPipeV): NaN, never GPipe's
    odd = run_sweep(["gpipe"], [2], [4], costs=StageCosts(forward=[1, 2], backward=[2, 2]), progress=False)
    assert math.isnan(odd["closed_form_utilization"][0])
    assert math.isnan(run_sweep(["1f1b"], [2], [4], recompute=True, progress=False)["closed_form_utilization"][0])
    assert math.isnan(run_sweep(["dualpipev"], [2], [4], progress=False)["closed_form_utilization"][0])


def test_cli_executors_write_the_same_csv(tmp_path):
    pytest.importorskip("distributed")
    base = ["sweep", "--schedules", "gpipe,zbv", "-K", "2,4", "-M", "1-8", "--latency", "0.1", "--no-progress",
            "--no-plots"]
    outs = {}
    for label, extra in (("one", []), ("processes", ["--jobs", "2"]), ("dask", ["--executor", "dask"])):
        assert main(base + extra + ["-o", str(tmp_path / label)]) == 0
        outs[label] = (tmp_path / label / "sweep.csv").read_bytes()
        assert not (tmp_path / label / "sweep_heatmap.png").exists()
    assert outs["one"] == outs["processes"] == outs["dask"]


@pytest.fixture
def files(tmp_path):
    from sim.model.cost import save_costs
    from sim.model.hardware import save_hardware

    save_costs(uniform(4, forward=0.5), tmp_path / "costs4.csv")
    save_hardware(Hardware(devices=4, latency=0.1), tmp_path / "hw4.json")
    (tmp_path / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    return tmp_path


@pytest.mark.parametrize("flags, message", [
    (["--costs", "missing.csv"], "missing.csv"),
    (["--costs", "binary.csv"], "binary.csv"),
    (["--costs", "costs4.csv", "-K", "2,4"], "has 4 stages but gpipe at K=2 needs 2"),
    (["--costs", "costs4.csv", "-K", "4", "--schedules", "zbv"], "zbv at K=4 needs 8"),
    (["--hardware", "missing.json"], "missing.json"),
    (["--hardware", "binary.csv"], "binary.csv"),
    (["--hardware", "hw4.json", "-K", "2,4,8"], "describes 4 devices but the sweep has K=2,8"),
    (["--executor", "threads"], "unknown executor"),
])
def test_cli_refuses_a_file_that_fits_no_row_before_any_work(files, monkeypatch, capsys, flags, message):
    import sim.search.sweep

    monkeypatch.chdir(files)
    monkeypatch.setattr(sim.search.sweep, "evaluate", lambda *a, **k: pytest.fail("simulated despite a bad input"))
    argv = ["sweep", "--schedules", "gpipe", "-K", "4", "-M", "1-4", "-o", "out", "--no-progress"]
    code = main(argv + flags)  # a repeated flag: the last one wins
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("pipesim: error:") and message in err, err
    assert not (files / "out").exists()


def test_cli_files_that_fit_are_used_and_recorded(files, capsys):
    out = files / "ok"
    assert main(["sweep", "--schedules", "gpipe,1f1b", "-K", "4", "-M", "4,8", "--costs", str(files / "costs4.csv"),
                 "--hardware", str(files / "hw4.json"), "-o", str(out), "--no-progress", "--no-plots"]) == 0
    df = read_sweep(out / "sweep.csv")
    assert (df["error"] == "").all() and set(df["forward_s"]) == {0.5} and set(df["latency_s"]) == {0.1}
    assert set(df["costs_source"]) == {str(files / "costs4.csv")} and set(df["hardware_source"]) == {str(files / "hw4.json")}
    m = simulate(schedules.gpipe(4, 8), uniform(4, forward=0.5), Hardware(devices=4, latency=0.1)).metrics
    assert df[(df["schedule"] == "gpipe") & (df["microbatches"] == 8)]["makespan"].item() == pytest.approx(m.makespan)


def _children(pid: int) -> set[int]:
    """Process ids whose parent is *pid* (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from Linux /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_stops_the_workers_and_writes_nothing(tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM (to the command) while two workers run:
    the command exits, no worker survives, and no CSV that could pass for a complete sweep is left."""
    out = tmp_path / "out"
    # a grid that takes far longer than this test waits: the signal lands while the workers are busy
    argv = [sys.executable, "-m", "sim", "sweep", "--schedules", "1f1b,gpipe", "-K", "16,32,64", "-M", "1-512",
            "--jobs", "2", "--no-progress", "-o", str(out)]
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        workers: set[int] = set()
        for _ in range(600):  # until both workers run (a hang guard, not a timing requirement)
            workers = _children(proc.pid)
            if len(workers) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert len(workers) >= 2, proc.communicate()
        time.sleep(0.3)  # let them get into their batches
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = communicate_or_dump(proc, "the sweep")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    code, word = (130, "interrupted") if how == "ctrl-c" else (143, "terminated")  # 128 + the signal (issue 26)
    assert proc.returncode == code and word in err and "Traceback" not in err, err
    assert not any(_alive(pid) for pid in workers)
    assert not out.exists() or not list(out.iterdir())  # no CSV, no sidecar, no stray temporary file


def _costs_fail_at_k3(schedule):
    if schedule.devices == 3:
        raise CostsError("no costs for K=3; measure them first")
    return uniform(schedule.stages, forward=schedule.microbatches / 4)


def test_costs_and_hardware_as_functions_of_the_schedule():
    df = run_sweep(["1f1b"], [2, 3], [4, 8], costs=_costs_fail_at_k3,
                   hardware=lambda s: Hardware(devices=s.devices, latency=0.5), progress=False)
    assert list(df["error"]) == ["", ""] + ["no costs for K=3; measure them first"] * 2
    assert list(df["forward_s"][:2]) == [1.0, 2.0] and set(df["latency_s"][:2]) == {0.5}
    m = simulate(schedules.one_f_one_b(2, 8), uniform(2, forward=2.0), Hardware(devices=2, latency=0.5)).metrics
    assert df["makespan"][1] == m.makespan
    with pytest.raises(TypeError, match="returned a dict"):
        run_sweep(["1f1b"], [2], [2], costs=lambda s: {"forward": 1}, progress=False)


def _small_sweep():
    from sim.search.sweep import run_sweep
    return run_sweep(["gpipe", "1f1b"], [2, 4], list(range(1, 9)), progress=False)


def test_the_plots_drawn_in_children_are_the_plots_drawn_here(tmp_path, monkeypatch):
    """Forked children draw two of the three figures: the files equal those drawn in this process alone."""
    import multiprocessing

    import sim.cli.sweep as sweep_cli
    df = _small_sweep()
    parallel = sweep_cli.write_sweep_plots(df, tmp_path / "parallel")
    assert not multiprocessing.active_children()  # every child joined
    monkeypatch.setattr(sweep_cli, "_draw_in_child", lambda plot, df, path: None)  # one core: all drawn here
    serial = sweep_cli.write_sweep_plots(df, tmp_path / "serial")
    for key in ("utilization", "heatmap", "memory"):
        assert np.array_equal(mpimg.imread(parallel[key]), mpimg.imread(serial[key])), key


def test_a_child_that_fails_leaves_its_figure_to_the_parent(tmp_path, monkeypatch):
    import sim.cli.sweep as sweep_cli
    monkeypatch.setattr(sweep_cli, "_draw_quietly", lambda plot, df, path: os._exit(1))  # every child fails
    written = sweep_cli.write_sweep_plots(_small_sweep(), tmp_path)
    assert all(mpimg.imread(written[key]).shape[0] > 100 for key in ("utilization", "heatmap", "memory"))


def test_an_error_drawing_a_figure_is_the_parents_to_report(tmp_path, monkeypatch):
    """The child's failure is silent; the parent draws the figure again and its error is reported as usual."""
    import sim.cli.sweep as sweep_cli
    import sim.io.sweep_plots as plots

    def broken(df):
        raise RuntimeError("planted: this figure cannot be drawn")
    monkeypatch.setattr(plots, "sweep_heatmap", broken)
    with pytest.raises(RuntimeError, match="planted"):
        sweep_cli.write_sweep_plots(_small_sweep(), tmp_path)
    assert not (tmp_path / "sweep_heatmap.png").exists()
