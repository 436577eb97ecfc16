"""``pipesim demo``: the README's main job writes its reports and keeps its table."""

from __future__ import annotations

import importlib.util
import json

import matplotlib.image as mpimg
import pandas as pd

from sim.cli import main
from sim.trace import check_trace


def test_demo_writes_gantts_sweep_and_trace(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["demo", "-o", str(out), "--sweep-devices", "2,4", "--sweep-microbatches", "1..8"]) == 0
    text = capsys.readouterr().out
    # the classroom table: naive 25% against 57.1% for the pipelined schedules
    lines = {line.split()[0]: line for line in text.splitlines() if line.split()[:1] in
             (["naive"], ["gpipe"], ["1f1b"], ["pipedream"])}
    assert "25.0%" in lines["naive"] and all("57.1%" in lines[n] for n in ("gpipe", "1f1b", "pipedream"))
    for name in ("gantt_classroom.png", "gantt_1f1b_links.png", "sweep/sweep_utilization.png",
                 "sweep/sweep_heatmap.png", "sweep/sweep_memory.png"):
        assert mpimg.imread(out / name).shape[0] > 100
        assert str(out / name) in text
    check_trace(json.loads((out / "trace_1f1b_links.json").read_text()))
    df = pd.read_csv(out / "sweep" / "sweep.csv", keep_default_na=False)
    assert len(df) == 4 * 2 * 4 and (df["error"] == "").all()
    # the CPU validation run: both schedules really ran, with the one-process gradients
    if importlib.util.find_spec("torch") is None:
        assert "Validation skipped: it needs torch" in text
    else:
        for name in ("gpipe", "1f1b"):
            assert (out / "validation" / f"{name}_K2_M4_mlp.md").exists()
            assert mpimg.imread(out / "validation" / f"{name}_K2_M4_mlp.png").shape[0] > 100
        assert text.count("gradients_match True") == 2
    assert not list(out.rglob("*.tmp"))


def test_demo_without_validation_or_sweep(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["demo", "-o", str(out), "--no-sweep", "--no-validate"]) == 0
    assert (out / "gantt_classroom.png").exists()
    assert not (out / "sweep").exists() and not (out / "validation").exists()


def test_demo_bad_input(capsys):
    assert main(["demo", "-K", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error:")
