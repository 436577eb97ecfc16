"""``pipesim validate --schedule-file FILE``: a saved (here synthesized) order run by both runtimes, pipesim's
executor and PyTorch's ``_PipelineScheduleRuntime`` (loaded from its CSV with the private ``_load_csv``, pinned
here on the installed torch), end to end with gloo on CPU; pipesim's text format read back; bad input one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import schedules
from sim.cli import main
from sim.io.schedule_io import PyTorchFormatError, read_schedule_file, write_schedule_file
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.search.synthesis import synthesize

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> dict[str, Path]:
    found = synthesize(uniform(2, forward=1.0, backward=1.0, weight=1.0), Hardware(devices=2), microbatches=4,
                       memory_limit=2, method="local", seconds=1)
    folder = tmp_path_factory.mktemp("saved")
    return {fmt: write_schedule_file(found.schedule, folder / f"synth.{ext}", fmt)
            for fmt, ext in (("json", "json"), ("text", "txt"), ("pytorch-csv", "csv"))}


@pytest.mark.parametrize("name", ["zb-h1", "zbv", "dualpipev", "interleaved-1f1b"])
def test_the_text_format_reads_back_what_it_wrote(name, tmp_path):
    s = schedules.generate(name, 4, 8)
    back = read_schedule_file(write_schedule_file(s, tmp_path / "s.txt", "text"))
    assert back.actions == s.actions and back.placement == s.placement and back.overlapped == s.overlapped


def test_a_bad_text_file_is_one_error(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("0: 0F0 0B0\n")
    with pytest.raises(PyTorchFormatError, match="starts with '# NAME"):
        read_schedule_file(bad)
    bad.write_text("# x: K=1 S=2 M=1 iterations=1 placement=0\n0: 0F0 0B0\n")
    with pytest.raises(PyTorchFormatError, match="S=2 but its placement names 1"):
        read_schedule_file(bad)


def test_pytorchs_private_runtime_is_there_and_its_absence_is_one_line(monkeypatch):
    """The torch this project pins (2.13) has ``_PipelineScheduleRuntime._load_csv(filename, format)``; a torch
    without it gets UnsupportedScheduleError (a PipesimError: one line, exit 2), not an AttributeError."""
    pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining import schedules as torch_schedules

    from validate.pytorch.schedules import UnsupportedScheduleError, private_runtime

    assert private_runtime() is torch_schedules._PipelineScheduleRuntime
    monkeypatch.delattr(torch_schedules, "_PipelineScheduleRuntime")
    with pytest.raises(UnsupportedScheduleError, match="no _PipelineScheduleRuntime._load_csv"):
        private_runtime()


def test_the_plan_is_the_file_without_updates_and_its_csv_loads_in_pytorch(synthesized, tmp_path):
    pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    from validate.pytorch.schedules import UnsupportedScheduleError, schedule_file_plan

    with pytest.raises(UnsupportedScheduleError, match="2 ranks; the run has 4"):
        schedule_file_plan(str(synthesized["json"]), 4)
    bare, text, notes = schedule_file_plan(str(synthesized["json"]), 2)
    saved = read_schedule_file(synthesized["json"])
    assert len(bare) == len(saved) - saved.stages and not any(a.kind.value == "U" for a in bare)
    path = tmp_path / "plan.csv"
    path.write_text(text)
    runtime = object.__new__(PipelineScheduleMulti)  # PyTorch's loader on what it reads (no process group)
    runtime.pipeline_order, runtime._stages = {}, []
    runtime._num_stages, runtime.pp_group_size, runtime._n_microbatches = 2, 2, 4
    PipelineScheduleMulti._load_csv(runtime, str(path))
    for rank in range(2):
        assert [str(a).replace("I", "B") for a in runtime.pipeline_order[rank]] == [str(a) for a in bare.actions[rank]]


@pytest.mark.parametrize("extra, message", [
    (["-M", "8"], "conflicts with --schedule-file"),
    (["--iterations", "2"], "runs as it is written"),
])
def test_contradicting_flags_are_one_line_and_exit_2(synthesized, extra, message, capsys):
    assert main(["validate", "--schedule-file", str(synthesized["json"])] + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and message in err and err.count("\n") == 1


def test_a_recomputed_order_is_refused_by_the_torch_runtime(tmp_path, capsys):
    pytest.importorskip("torch")
    path = write_schedule_file(schedules.generate("1f1b", 2, 4, recompute=True), tmp_path / "r.json", "json")
    assert main(["validate", "--runtime", "torch", "--schedule-file", str(path), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and "recompute" in err and err.count("\n") == 1


def _cli(*argv: str, timeout: float = 280) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "sim", "validate", *argv, "--json"], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pipesims_executor_runs_the_saved_text_file(synthesized, tmp_path):
    out = _cli("--schedule-file", str(synthesized["text"]), "--workload", "mlp", "--width", "16", "--depth", "1",
               "--batch", "4", "--repeats", "1", "-o", str(tmp_path))
    assert out["gradients_match"] is True
    assert out["schedule"].startswith("synth-txt-")  # named for the file (sim.cli.validate.named_for_file)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("saved", ["synthesized", "zbv"])
def test_pytorchs_runtime_runs_the_saved_csv_with_matching_gradients(saved, synthesized, tmp_path):
    """The synthesized order (a line), and a V (ZB-V saved as pipesim's JSON: two stages per rank, stage 3 back on
    rank 0, the stage -> rank mapping PyTorch's runtime takes from the CSV)."""
    pytest.importorskip("torch.distributed.pipelining")
    path = synthesized["pytorch-csv"] if saved == "synthesized" else write_schedule_file(
        schedules.generate("zbv", 2, 4), tmp_path / "zbv.json", "json")
    out = _cli("--runtime", "torch", "--schedule-file", str(path), "--width", "16", "--depth",
               "1", "--batch", "4", "--repeats", "2", "-o", str(tmp_path))
    assert out["torch_class"] == "_PipelineScheduleRuntime" and out["runtime"] == "torch"
    assert out["gradients_match"] is True
    assert any("_load_csv" in note for note in out["notes"])
    # the report, named for the file (validate.pytorch.schedules.schedule_file_key)
    assert any(p.name.startswith(path.name.replace(".", "-") + "-") and "_K2_M4_" in p.name for p in tmp_path.iterdir())
