"""Real traces: PyTorch's own schedules (torch.distributed.pipelining, gloo, 2 CPU ranks) under torch.profiler.

One launch (a session fixture) runs ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B on a tiny
MLP and writes their traces and reports; every test reads those. Ingestion must recover every action
of each (in the order PyTorch's runtime executed), the ingested timelines must keep the simulator's
invariants, and bad inputs must give one line and exit code 2.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.model.cost import load_costs  # noqa: E402
from sim.model.hardware import load_hardware  # noqa: E402
from sim.io.schedule_io import PyTorchFormatError, from_pytorch_class  # noqa: E402
from sim.io.trace import check_trace  # noqa: E402
from validate.ingest.flow import ingest, without_updates  # noqa: E402
from validate.pytorch.schedules import executed_order  # noqa: E402
from validate.ingest.actions import extract_rank  # noqa: E402
from validate.ingest.reader import read_trace  # noqa: E402

NAMES = ("gpipe", "1f1b", "interleaved-1f1b")
K, M = 2, 4


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    from validate.pytorch.validation import run_torch_validations
    out = tmp_path_factory.mktemp("torch_runs")
    validations = run_torch_validations(NAMES, K, M, chunks=2, workload="mlp", steps=2, warmup=1, timed=1,
                                        timeout=240, workload_options={"width": 16, "depth": 1, "batch": 2},
                                        output_dir=out)
    return {v.name: v for v in validations}


@pytest.mark.parametrize("name", NAMES)
def test_every_action_of_the_pytorch_run_is_recovered(runs, check, name):
    v = runs[name]
    ing = v.comparison.ingested
    assert set(ing.measured.schedule) == set(ing.schedule)  # every action, none extra
    assert ing.order_differences == ()  # in the order the runtime executed
    assert len(ing.steps) == 2
    for result in ing.steps.values():
        check(result, modelled=False)
        assert len(result.timeline[result.timeline["src"] >= 0]) > 0  # transfer rows from the p2p events
    assert set(ing.forms) == ({"single"} if name == "gpipe" else {"PP"})
    assert ing.clock.shared and ing.clock.violations == 0


def test_gpipe_forward_ranges_are_split_at_their_receive(runs):
    """ScheduleGPipe's 'Forward i' on rank 1 holds the receive: the forward computes from its completion."""
    trace = read_trace(runs["gpipe"].paths["trace_rank1"])
    rec = extract_rank(trace, 1, [0, 1])
    received = {(m.producer, m.step): m.complete for m in rec.messages if m.direction == "recv"}
    forwards = [a for a in rec.actions if a.kind == "F"]
    assert len(forwards) == 2 * M and all(a.form == "single" for a in forwards)
    for a in forwards:
        done = received[((0, "F", a.mb), a.step)]
        assert a.start < done <= a.end  # the receive completed inside the range
        assert a.compute_start == pytest.approx(max(a.start, done))


def test_1f1b_is_compared_with_what_its_runtime_executes(runs):
    v = runs["1f1b"]
    ran = v.comparison.ingested.measured.schedule
    executed = executed_order("Schedule1F1B", K, M)
    assert all(ran.actions[d] == executed.actions[d] for d in range(K))
    assert all(executed.actions[d] == without_updates(schedules.one_f_one_b(K, M)).actions[d] for d in range(K))
    try:
        from_pytorch_class("1F1B", K, M)
    except PyTorchFormatError:  # torch 2.13's declared order numbers the last rank's forwards from 1
        assert any("numbers the last rank's forwards from 1" in n for n in v.summary["notes"])


def test_the_reports_are_complete(runs):
    for name, v in runs.items():
        paths = v.paths
        assert {"report", "figure", "trace", "json", "costs", "hardware", "trace_rank0", "trace_rank1"} <= set(paths)
        d = json.loads(paths["json"].read_text())
        for key in ("predicted_makespan", "measured_makespan", "makespan_error", "makespan_error_range",
                    "predicted_bubble_fraction", "measured_bubble_fraction", "start_error_median", "idle",
                    "unprofiled_step_seconds", "torch_class"):
            assert key in d, key
        # the predicted spread beside the measured one: quantiles of the draws and of the steps, errors at p10/p90
        qp, qm = d["predicted_makespan_quantiles"], d["measured_makespan_quantiles"]
        assert qp["p10"] <= qp["p50"] <= qp["p90"] and qm["p10"] <= qm["p50"] <= qm["p90"]
        assert d["band_error"] == pytest.approx([qm["p10"] / qp["p10"] - 1, qm["p90"] / qp["p90"] - 1])
        assert min(d["step_makespans"]) <= qm["p10"] and qm["p90"] <= max(d["step_makespans"])
        # every profiled step replayed from its own measurements (validate/ingest/step_replay.py)
        replays = d["step_replays"]
        assert replays["measured_s"] == pytest.approx(d["step_makespans"]) and replays["runtime"] == "torch"
        assert len(replays["replayed_s"]) == len(replays["without"]["replayed_s"]) == d["profiled_steps"]
        assert replays["makespan_error_median"] == pytest.approx(
            float(np.median([m / p - 1 for m, p in zip(replays["measured_s"], replays["replayed_s"])])))
        idle = d["idle"]["measured"]
        assert idle["dependency_fraction"] + idle["communication_fraction"] + idle["gap_fraction"] == \
            pytest.approx(d["measured_bubble_fraction"], abs=1e-9)
        check_trace(json.loads(paths["trace"].read_text()))
        assert load_costs(paths["costs"]).stages == v.comparison.predicted.schedule.stages
        assert load_hardware(paths["hardware"]).devices == K
        text = paths["report"].read_text()
        assert "## PyTorch's runtime" in text and "## Idle time: where the bubble goes" in text
        assert f"each of the {d['profiled_steps']} profiled steps replayed from its own measured" in text


def test_the_timed_steps_are_profiled_without_shapes_and_their_messages_have_them(runs):
    """record_shapes keeps every op's inputs alive (validate.ingest.message_shapes): the timed steps record none,
    their point-to-point calls carry the sizes and peers of the step profiled with shapes, and that step's trace
    is gone."""
    from validate.ingest.message_shapes import carries_a_message

    for name, v in runs.items():
        for rank in range(K):
            path = v.paths[f"trace_rank{rank}"]
            events = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
            messages = [e for e in events if carries_a_message(e["name"])]
            assert messages and all("Input Dims" in e["args"] for e in messages), name
            assert not any("Input Dims" in e.get("args", {}) for e in events if e["name"] == "aten::addmm"), name
            assert not list(path.parent.glob("*_shapes.json")), name
            calls = [e["args"] for e in messages if e["name"] == "c10d::send"]
            assert calls and all(a["Input Dims"][0][0][-1] == 16 and a["Concrete Inputs"][2] == str(1 - rank)
                                 for a in calls), name  # a width-16 activation or gradient, to the other rank


def test_pipesim_ingest_reads_the_real_traces(runs, tmp_path, capsys):
    v = runs["interleaved-1f1b"]
    rc = main(["ingest", str(v.paths["trace_rank0"]), str(v.paths["trace_rank1"]), "--from-pytorch",
               "Interleaved1F1B", "-M", str(M), "--chunks", "2", "-o", str(tmp_path), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["stages"] == 4 and d["measured_makespan"] > 0


def _real(runs, name, tmp_path):
    """Plain .json copies of the real traces of *name* (rank order)."""
    out = []
    for r in range(K):
        path = tmp_path / f"{name}_rank{r}.json"
        path.write_bytes(gzip.decompress(runs[name].paths[f"trace_rank{r}"].read_bytes()))
        out.append(path)
    return out


@pytest.mark.parametrize("case", ["truncated", "missing rank", "no annotations", "mismatch"])
def test_bad_real_traces_give_one_line_and_exit_2(runs, tmp_path, capsys, case):
    paths = _real(runs, "gpipe", tmp_path)
    args = ["--from-pytorch", "GPipe", "-M", str(M), "-K", str(K)]
    if case == "truncated":
        text = paths[1].read_text()
        paths[1].write_text(text[: len(text) * 2 // 3])
    elif case == "missing rank":
        paths = paths[:1]
    elif case == "no annotations":  # no names and no autograd events: nothing to read the actions from either
        for p in paths:
            p.write_text(p.read_text().replace('"Forward ', '"Fwd ').replace('"Backward ', '"Bwd ')
                         .replace('"autograd::engine::evaluate_function', '"engine'))
    else:
        args = ["-s", "interleaved-1f1b", "--chunks", "2", "-M", str(M)]
    rc = main(["ingest", *map(str, paths), *args, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("pipesim: error: "), err
    expected = {"truncated": "truncated", "missing rank": "no trace for rank(s) [1]",
                "no annotations": "has no pipeline actions", "mismatch": "does not match schedule"}[case]
    assert expected in err[0]


def test_real_gpipe_traces_without_their_names_are_read_from_the_op_structure(runs, tmp_path):
    """The validator's run (a barrier opens each step, record_shapes on): the actions come back from the ops."""
    paths = _real(runs, "gpipe", tmp_path)
    for p in paths:
        p.write_text(p.read_text().replace('"Forward ', '"Fwd ').replace('"Backward ', '"Bwd '))
    ing = ingest(list(map(str, paths)), executed_order("ScheduleGPipe", K, M))
    assert ing.forms == ("inferred",) and ing.actions_inferred == 2 * K * M


@pytest.mark.parametrize("args,message", [
    (["-s", "zb-h1"], "PyTorch has no schedule class for 'zb-h1'"),
    (["-s", "gpipe", "--workload", "emulated"], "runs real stage modules"),
    (["-s", "gpipe", "--iterations", "2"], "--iterations"),
])
def test_validate_runtime_torch_refuses_in_one_line(capsys, args, message):
    rc = main(["validate", "--runtime", "torch", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_validate_runtime_torch_command_prints_the_comparison(runs, monkeypatch, capsys, tmp_path):
    import validate.pytorch.validation as tv
    seen = {}

    def fake(names, devices, microbatches, **kw):
        seen.update(kw, names=names, devices=devices, microbatches=microbatches)
        return [runs["1f1b"]]

    monkeypatch.setattr(tv, "run_torch_validations", fake)
    copy = tmp_path / "copy.html"
    assert main(["validate", "--runtime", "torch", "-s", "1f1b", "-K", "2", "-M", "4", "--width", "16",
                 "-o", str(tmp_path), "--json", "--html", str(copy)]) == 0
    # no --repeats: the run chooses how many steps to profile (validate.pytorch.runtime.profiled_steps_for)
    assert seen["names"] == ["1f1b"] and seen["workload_options"]["width"] == 16 and seen["steps"] is None
    d = json.loads(capsys.readouterr().out)
    assert d["torch_class"] == "Schedule1F1B" and "paths" in d
    # --html copies the interactive page the report wrote beside its PNG
    assert copy.read_bytes() == pathlib.Path(runs["1f1b"].paths["html"]).read_bytes()
    # a number given is a number kept
    assert main(["validate", "--runtime", "torch", "-s", "1f1b", "-K", "2", "-M", "4", "--width", "16",
                 "-o", str(tmp_path), "--repeats", "7", "--json"]) == 0
    assert seen["steps"] == 7


def test_the_nccl_path_binds_each_rank_to_its_gpu_at_init(tmp_path, monkeypatch):
    """No GPU here: the worker's NCCL branch runs with torch.cuda and the process group mocked. It must bind
    the device at init_process_group (device_id: communicators are created eagerly, no lazy per-pair setup)."""
    import datetime

    import torch.distributed as dist

    from validate.pytorch import runtime as torch_runtime
    calls = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: None)
    monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("WORLD_SIZE", "2"), monkeypatch.setenv("LOCAL_RANK", "1")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"jobs": [], "workload": {}, "backend": "nccl", "warmup": 1, "timed": 1, "profiled": 1,
                                "timeout": 30, "threads": 1, "out_dir": str(tmp_path)}))
    assert torch_runtime.main(["--spec", str(spec)]) == 0
    assert calls["backend"] == "nccl" and calls["set_device"] == 1
    assert calls["device_id"] == torch.device("cuda", 1) and calls["timeout"] == datetime.timedelta(seconds=30)
    assert (tmp_path / "rank1.done.json").exists()


def test_the_torch_runtime_sizes_the_workload_and_pins_ranks_like_the_executor(monkeypatch):
    """Without a size option, PyTorch's run gets the same >= 10 ms probe and one core per rank as pipesim's
    executor (tiny actions measure the OS, not the model: +370% errors before); a size the user gives wins."""
    import validate.pytorch.runtime as tr
    import validate.pytorch.validation as tv

    seen = {}

    class Stop(Exception):
        pass

    def fake_run(jobs, *, workload, cores=None, **kw):
        seen.update(workload=workload, cores=cores)
        raise Stop

    monkeypatch.setattr(tr, "run_torch_schedules", fake_run)
    monkeypatch.setattr(tv, "size_workload", lambda spec, threads: (replace(spec, width=999), "sized by a probe"))
    monkeypatch.setattr(tv, "pinning", lambda devices, backend: ((0, 1), "pinned"))
    with pytest.raises(Stop):
        tv.run_torch_validations(["gpipe"], 2, 4, output_dir=None)
    assert seen["workload"]["width"] == 999 and seen["cores"] == (0, 1)
    with pytest.raises(Stop):
        tv.run_torch_validations(["gpipe"], 2, 4, workload_options={"width": 16}, output_dir=None)
    assert seen["workload"]["width"] == 16


def test_the_spread_band_compares_quantiles_of_draws_and_steps():
    """The band error is measured / predicted - 1 at p10 and at p90: 0 when the draws spread as the steps do, and
    it sees a spread the prediction lacks (one value predicted, steps spread +-20%)."""
    from validate.pytorch.validation import _band

    steps = [0.8, 0.9, 1.0, 1.1, 1.2]
    same = _band(np.array(steps), steps)
    assert same["band_error"] == pytest.approx([0.0, 0.0])
    narrow = _band(np.array([1.0] * 64), steps)
    lo, hi = narrow["band_error"]
    assert lo == pytest.approx(np.percentile(steps, 10) - 1) and hi == pytest.approx(np.percentile(steps, 90) - 1)
    assert lo < -0.1 and hi > 0.1


def test_the_ranks_run_from_the_folder_that_holds_the_package():
    """The launcher puts PACKAGE_ROOT on the ranks' PYTHONPATH: from a checkout that was never installed, a rank
    must find ``validate`` there (it was once validate/ itself, so only an installed copy could run)."""
    from validate.pytorch.runtime import PACKAGE_ROOT
    assert (PACKAGE_ROOT / "validate" / "pytorch" / "runtime.py").is_file()


def test_one_rank_is_validated_with_its_computations_drawn(tmp_path):
    """K=1 (what one GPU runs): no messages, yet the prediction draws each computation from the profiled steps
    (validate.ingest.message_draws), and the report says so; this once failed writing its runtime-model line."""
    from validate.pytorch.validation import run_torch_validations

    from validate.compare.distributions import median_interval
    from validate.pytorch.runtime import profiled_steps_for

    [v] = run_torch_validations(["zbv"], 1, 4, workload="mlp", warmup=1, timed=3, timeout=240,
                                workload_options={"width": 16, "depth": 1, "batch": 2}, output_dir=tmp_path)
    model = v.summary["runtime_model"]
    assert model["message_draws"]["messages"] == 0 and model["message_draws"]["link_median_s"] is None
    report = v.paths["report"].read_text()
    assert "no messages; each run's computation durations" in report
    assert v.summary["gradients_match"]
    # no number of steps given: the timed steps chose it (about a second of steps, 5 to 40), the same on every rank
    s = v.summary
    assert s["profiled_steps"] == profiled_steps_for(v.step_seconds) >= 5
    # the median error comes with the interval the profiled steps leave it
    lo, hi, coverage = median_interval(s["step_makespans"])
    p = v.comparison.predicted.metrics.makespan
    assert s["makespan_error_median_interval"] == pytest.approx([lo / p - 1, hi / p - 1])
    assert lo <= sorted(s["step_makespans"])[(len(s["step_makespans"]) - 1) // 2] <= hi
    assert s["median_interval_coverage"] == coverage >= 0.9
    assert f"{coverage:.0%} interval of the median step" in report


def test_a_receive_its_wait_found_complete_ends_at_its_estimated_arrival(runs):
    """gloo completes a receive when the runtime waits for it, so a message already there when the multi-stage
    runtime waited shows the wait's start as its completion: its transfer row ends instead at the later of its
    two posts plus the step's median exact link time (validate/ingest/flow.py, _estimate_arrivals), and the idle
    time before the wait is no longer counted as waiting for it. Messages the receiver waited for keep their
    completion."""
    from sim.core.ir import Action, ActionKind
    from sim.results.timeline import transfer_rows
    from validate.ingest.messages import BLOCKED_SLACK

    v = runs["interleaved-1f1b"]
    ing = ingest([str(v.paths[k]) for k in sorted(v.paths) if k.startswith("trace_rank")],
                 v.comparison.ingested.schedule)
    tx = transfer_rows(ing.measured.timeline)
    rows = {ing.schedule.key(Action(int(s), ActionKind.F if op == "SEND_F" else ActionKind.B, int(mb))): end
            for op, s, mb, end in zip(tx["op"].astype(str), tx["stage"], tx["microbatch"], tx["end"])}
    exact = sorted(ing.link_seconds.values())
    link = exact[len(exact) // 2] if exact else 0.0
    found = waited = 0
    for k, m in ing.messages[ing.step].items():
        end = rows[k]
        if m.wait_start is not None and m.complete <= m.wait_start + BLOCKED_SLACK:
            began = max(m.send_call[0], m.recv_call[0])  # the later call's start, as the trace's link times count
            assert end == pytest.approx(max(began, min(m.complete, began + link)), abs=1e-9)
            found += end < m.complete - 1e-6
        else:
            assert end == pytest.approx(max(m.complete, m.send_call[0]), abs=1e-9)
            waited += 1
    assert found > 0 and waited > 0


@pytest.mark.parametrize("seconds,steps", [([0.02, 0.03, 0.025], 40), ([0.05, 0.04, 0.06], 20), ([1.3, 1.1, 1.2], 5),
                                           ([0.11], 9), ([], 5), ([0.0], 5)])
def test_the_profiled_steps_fill_about_a_second(seconds, steps):
    """No number given: as many steps as fill PROFILED_SECONDS at the timed steps' median, 5 to 40 (1-ms actions:
    the cap; probe-sized: the floor)."""
    from validate.pytorch.runtime import profiled_steps_for
    assert profiled_steps_for(seconds) == steps
