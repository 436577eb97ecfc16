"""Three validator / ingest defects, each from the user's side:

1. report names carry the backend (a gloo and an nccl run of one schedule in one ``-o`` folder wrote the same files,
   the second over the first), in both runtimes; gloo's names stay as they were;
2. the replay line of a ``--schedule-file`` run is the real ``pipesim simulate --schedule-file PATH ...`` command
   (it said "save it and give --schedule-file"), and running it gives the prediction back;
3. ``pipesim ingest --runtime NAME`` on a trace whose names say another runtime recorded it warns (one stderr line,
   one report note) and still predicts; where the names say nothing, nothing is said.

No GPU here: the nccl runs are the report path with the launch replaced by an in-process run (as
tests/test_validate_report.py), or PyTorch's runtime's comparison of committed traces.
"""

from __future__ import annotations

import glob
import json
import shlex
from pathlib import Path

import pytest

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.cli.ingest import recorded_runtime, runtime_mismatch
from sim.model.cost import COLUMNS, uniform
from sim.model.hardware import Hardware
from sim.simulate import simulate
from validate.compare.report import backend_tag
from validate.ingest.flow import without_updates

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


# ------------------------------------------------------------------------------------------ 1. names and backend
def test_the_backend_tag_keeps_gloos_names_and_marks_any_other():
    assert backend_tag("gloo") == ""
    assert backend_tag("nccl") == "_nccl"


def _fake_launch(sched, spec):
    """Every rank's result of an in-process run with a fixed calibration (no processes, no GPU)."""
    from validate.rank.inprocess import run_in_process
    from validate.request import StageCalibration

    result = run_in_process(sched, spec)
    assert not result["errors"]
    for r in result["ranks"]:
        costs = {c: 0.0 for c in COLUMNS}
        costs.update(forward=1e-3, backward=2e-3, send_bytes=64.0)
        r.calibration = StageCalibration(before={s: dict(costs) for s in r.grads},
                                         after={s: dict(costs) for s in r.grads}, in_schedule={},
                                         ping=[1e-5, 2e-5, 3e-5, 4e-5, 5e-5] if r.rank == 0 else None, overhead=1e-5)
    return result["ranks"]


def _mock_launch(monkeypatch, seen: dict):
    """``pipesim validate`` with :func:`validate.run.run_validations` replaced: the report path of the given
    backend, after an in-process run in place of the K processes."""
    pytest.importorskip("torch")
    import validate.run as run
    from validate.rank.workloads import WorkloadSpec

    spec = WorkloadSpec(name="mlp", width=8, depth=1, batch=2)

    def fake(scheds, devices, microbatches, **kw):
        seen.update(kw)
        sched = run.schedule_of(scheds[0], devices, microbatches, 1, False, None)
        return [run.build_report(sched, spec, kw["backend"], _fake_launch(sched, spec), given_costs=None,
                                 hardware=None, output_dir=kw["output_dir"], calibration="isolated",
                                 schedule_file=kw.get("schedule_file"))]

    monkeypatch.setattr(run, "run_validations", fake)


def test_gloo_and_nccl_runs_of_one_schedule_write_separate_reports(tmp_path, monkeypatch, capsys):
    """Through the command line, the launch mocked: the second backend's run must not replace the first's files."""
    seen = {}
    _mock_launch(monkeypatch, seen)
    out = tmp_path / "out"
    written = {}
    for backend in ("gloo", "nccl"):
        assert main(["validate", "-s", "1f1b", "-K", "2", "-M", "3", "--backend", backend, "-o", str(out),
                     "--json"]) == 0
        assert seen["backend"] == backend
        written[backend] = {k: Path(v) for k, v in json.loads(capsys.readouterr().out)["paths"].items()}
    gloo, nccl = written["gloo"], written["nccl"]
    assert gloo["report"].name == "1f1b_K2_M3_mlp_R1.md"  # gloo's names as they always were
    assert nccl["report"].name == "1f1b_K2_M3_mlp_nccl_R1.md"
    assert not {p.name for p in gloo.values()} & {p.name for p in nccl.values()}
    assert all(p.exists() for p in [*gloo.values(), *nccl.values()])  # both runs' files kept
    assert "backend `gloo`" in gloo["report"].read_text() and "backend `nccl`" in nccl["report"].read_text()


def test_pytorchs_runtime_names_its_reports_and_traces_by_backend(tmp_path):
    """``--runtime torch``: the comparison of committed PyTorch traces, written once as a gloo run and once as an nccl
    run into one folder: the report and the kept rank traces of each stay."""
    pytest.importorskip("torch")
    from validate.pytorch.schedules import pytorch_schedule
    from validate.pytorch.validation import _compare, torch_report_stem
    from validate.rank.workloads import WorkloadSpec

    schedule, notes = pytorch_schedule("ScheduleGPipe", 2, 4)
    spec = WorkloadSpec(name="mlp", width=16, depth=1, batch=4)
    assert torch_report_stem("gpipe", schedule, spec.label, "gloo") == f"gpipe_K2_M4_{spec.label}_torch"
    traces = sorted(glob.glob(str(FIXTURES / "torch213_gpipe_K2_M4_rank*.json.gz")))
    run = {"traces": traces, "step_seconds": [1e-3], "load": (0.0, 0.0), "grads": None}
    paths = {}
    for backend in ("gloo", "nccl"):
        v = _compare("gpipe", "ScheduleGPipe", schedule, list(notes), run, spec, backend, None, None, tmp_path,
                     key="gpipe", source={})
        paths[backend] = {Path(p).name for p in v.paths.values()}
    assert f"gpipe_K2_M4_{spec.label}_torch.md" in paths["gloo"]
    assert f"gpipe_K2_M4_{spec.label}_nccl_torch.md" in paths["nccl"]
    assert f"gpipe_K2_M4_{spec.label}_nccl_torch_rank1.json.gz" in paths["nccl"]
    assert not paths["gloo"] & paths["nccl"]
    assert paths["gloo"] | paths["nccl"] <= {p.name for p in tmp_path.iterdir()}


# --------------------------------------------------------------------------------- 2. replay of a schedule file
def test_a_schedule_files_replay_line_is_a_command_that_gives_the_prediction_back(tmp_path, monkeypatch, capsys):
    """The line names the file as the user gave it (quoted: a space in the path), the written costs and
    hardware; run as printed, ``pipesim simulate`` predicts the report's makespan."""
    from sim.io.schedule_io import write_schedule_file

    seen = {}
    _mock_launch(monkeypatch, seen)
    folder = tmp_path / "my runs"
    folder.mkdir()
    path = write_schedule_file(schedules.generate("zbv", 2, 4), folder / "it's zbv.json", "json")
    monkeypatch.chdir(tmp_path)
    given = f"my runs/{Path(path).name}"  # relative, as typed
    assert main(["validate", "--schedule-file", given, "-o", "out", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert seen["schedule_file"] == given
    replay = d["replay"]
    assert "save it" not in replay
    assert replay.startswith(f"pipesim simulate --schedule-file {shlex.quote(given)} --costs ")
    words = shlex.split(replay)
    assert words[3] == given and words[words.index("--costs") + 1] == d["paths"]["costs"]
    assert words[words.index("--hardware") + 1] == d["paths"]["hardware"]
    assert main(words[1:] + ["--json"]) == 0  # copied as printed
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["makespan"] == pytest.approx(d["predicted_makespan"], rel=1e-9)


def test_replay_command_keeps_the_generator_line_and_the_advice_without_a_file():
    from validate.run import replay_command

    sched = schedules.generate("1f1b", 2, 4)
    assert replay_command(sched, "c.csv", "h.json") == "pipesim simulate -s 1f1b -K 2 -M 4 --costs c.csv --hardware h.json"
    named = sched.replace_actions(sched.actions, name="mine-json-0123abcd", overlapped=sched.overlapped)
    assert "--schedule-file" in replay_command(named, "c.csv", "h.json")  # an API Schedule: no file to name
    assert replay_command(named, "c.csv", "h.json", schedule_file="a b.csv") == (
        "pipesim simulate --schedule-file 'a b.csv' --costs c.csv --hardware h.json")


# ------------------------------------------------------------------------------ 3. ingest under another runtime
def _simulated(name, K, M):
    sched = without_updates(schedules.generate(name, K, M))
    return simulate(sched, uniform(sched.stages, forward=1e-3, backward=2e-3, send_bytes=4096),
                    Hardware(devices=K, latency=2e-4))


def _write(folder: Path, traces) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, t in enumerate(traces):
        (folder / f"rank{r}.json").write_text(json.dumps(t))
        paths.append(str(folder / f"rank{r}.json"))
    return paths


def test_the_runtime_a_trace_names():
    assert recorded_runtime(("PP",)) == "torch" and recorded_runtime(("PP", "overlap")) == "torch"
    assert recorded_runtime(("single",)) == "torch" and recorded_runtime(("megatron",)) == "megatron"
    assert recorded_runtime(("pattern",)) is None and recorded_runtime(("inferred",)) is None
    assert recorded_runtime(()) is None
    assert runtime_mismatch(("PP",), "torch") is None and runtime_mismatch(("PP",), None) is None
    assert runtime_mismatch(("PP",), "deepspeed").startswith(
        "the trace was recorded under PyTorch's runtime; predicting it as deepspeed's compares two different runtimes")


def _ingest(capsys, paths, *flags, out: Path):
    assert main(["ingest", *paths, *flags, "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), [line for line in captured.err.splitlines() if "warning" in line]


def test_ingest_under_another_runtime_warns_once_and_still_predicts(tmp_path, capsys):
    res = _simulated("1f1b", 2, 4)
    pp = _write(tmp_path / "pp", traces_from(res, "PP"))
    d, warnings = _ingest(capsys, pp, "-s", "1f1b", "-M", "4", "--runtime", "deepspeed", out=tmp_path / "a")
    assert warnings == ["pipesim ingest: warning: the trace was recorded under PyTorch's runtime; predicting it as "
                        "deepspeed's compares two different runtimes (a what-if, not a validation of deepspeed; "
                        "--runtime torch models the one that ran)"]
    assert d["predicted_makespan"] > 0  # predicted, not refused
    assert d["runtime_model"]["trace_runtime"] == "torch"
    assert any("recorded under PyTorch's runtime" in n for n in d["notes"])
    report = Path(d["paths"]["report"]).read_text()
    assert "recorded under PyTorch's runtime; predicting it as deepspeed's" in report
    # the same trace under its own runtime: nothing said
    d, warnings = _ingest(capsys, pp, "-s", "1f1b", "-M", "4", "--runtime", "torch", out=tmp_path / "b")
    assert warnings == [] and not any("recorded under" in n for n in d["notes"])


def test_a_megatron_trace_predicted_as_pytorchs_runtime_warns(tmp_path, capsys):
    res = _simulated("1f1b", 2, 4)
    paths = _write(tmp_path / "m", traces_from(res, "megatron", step_marker=7))
    d, warnings = _ingest(capsys, paths, "--from-megatron", "1f1b", "-M", "4", "--runtime", "torch",
                          out=tmp_path / "o")
    assert len(warnings) == 1 and "recorded under Megatron-LM's runtime; predicting it as torch's" in warnings[0]
    _, warnings = _ingest(capsys, paths, "--from-megatron", "1f1b", "-M", "4", "--runtime", "megatron",
                          out=tmp_path / "o2")
    assert warnings == []


def test_a_real_pytorch_trace_predicted_as_pipesims_executor_warns_in_text_mode_too(tmp_path, capsys):
    """The committed ScheduleGPipe traces (``Forward i`` ranges): one warning line, not repeated as a note."""
    traces = sorted(glob.glob(str(FIXTURES / "torch213_gpipe_K2_M4_rank*.json.gz")))
    assert main(["ingest", *traces, "--from-pytorch", "GPipe", "-K", "2", "-M", "4", "--runtime", "pipesim",
                 "-o", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("recorded under PyTorch's runtime") == 1
    assert "pipesim ingest: warning: the trace was recorded under PyTorch's runtime; predicting it as pipesim's" in err


def test_a_trace_that_names_no_runtime_gets_no_warning(tmp_path, capsys):
    res = _simulated("1f1b", 2, 4)
    paths = _write(tmp_path / "p", traces_from(res, "pattern"))
    d, warnings = _ingest(capsys, paths, "-s", "1f1b", "-M", "4", "--runtime", "deepspeed",
                          "--action-pattern", r"(?P<kind>fwd|bwd)_s(?P<stage>\d+)_mb(?P<mb>\d+)", out=tmp_path / "o")
    assert warnings == [] and d["runtime_model"]["trace_runtime"] is None
