"""``pipesim demo``: the README's main job writes its reports and keeps its table."""

from __future__ import annotations

import importlib.util
import json

import matplotlib.image as mpimg
import pandas as pd

from sim.cli import main
from sim.io.trace import check_trace


def test_demo_writes_gantts_sweep_and_trace(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["demo", "-o", str(out), "--sweep-devices", "2,4", "--sweep-microbatches", "1..8"]) == 0
    text = capsys.readouterr().out
    # the classroom table: naive 25% against 57.1% for the pipelined schedules; PipeDream's point over 3 iterations
    rows = {(line.split()[0], line.split()[1]): line for line in text.splitlines()
            if line.split()[:1] in (["naive"], ["gpipe"], ["1f1b"], ["pipedream"])}
    assert "25.0%" in rows["naive", "1"] and all("57.1%" in rows[n, "1"] for n in ("gpipe", "1f1b", "pipedream"))
    assert "57.1%" in rows["1f1b", "3"] and "80.0%" in rows["pipedream", "3"]  # 1 - 3/15: the warm-up paid once
    for name in ("gantt_classroom.png", "gantt_pipedream.png", "gantt_1f1b_links.png", "sweep/sweep_utilization.png",
                 "sweep/sweep_heatmap.png", "sweep/sweep_memory.png"):
        assert mpimg.imread(out / name).shape[0] > 100
        assert str(out / name) in text
    check_trace(json.loads((out / "trace_1f1b_links.json").read_text()))
    df = pd.read_csv(out / "sweep" / "sweep.csv", keep_default_na=False)
    assert len(df) == 4 * 2 * 4 and (df["error"] == "").all()
    assert set(df.loc[df["schedule"] == "pipedream", "iterations"]) == {3}
    assert set(df.loc[df["schedule"] != "pipedream", "iterations"]) == {1}
    # the CPU validation run: both schedules really ran, with the one-process gradients
    if importlib.util.find_spec("torch") is None:
        assert "Validation skipped: it needs torch" in text
    else:
        for name in ("gpipe", "1f1b"):
            assert (out / "validation" / f"{name}_K2_M4_mlp.md").exists()
            assert mpimg.imread(out / "validation" / f"{name}_K2_M4_mlp.png").shape[0] > 100
        assert text.count("gradients_match True") == 2
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*"))  # no temporary file left


def test_demo_without_validation_or_sweep(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["demo", "-o", str(out), "--no-sweep", "--no-validate"]) == 0
    assert (out / "gantt_classroom.png").exists()
    assert not (out / "sweep").exists() and not (out / "validation").exists()


def test_demo_bad_input(capsys):
    assert main(["demo", "-K", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error:")


def test_demo_refuses_an_output_that_is_a_file_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "reports"
    blocker.write_text("not a folder")
    assert main(["demo", "-o", str(blocker), "--no-validate"]) == 2
    err = capsys.readouterr()
    assert "is a file" in err.err and "Classroom case" not in err.out


def test_version_has_one_source(capsys):
    import tomllib
    from pathlib import Path

    import pytest

    import sim

    assert sim.__version__ == "0.3.0"
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"pipesim {sim.__version__}"
    project = tomllib.loads((Path(sim.__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sim.__version__"}
