"""``--runtime`` on sweep, plan and ingest (issue 27): the runtime reaches every simulation, the default changes
nothing (bit for bit), the outputs say which runtime ran, and a bad name is one line with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.cli import main
from sim.errors import PipesimError, PipesimTypeError
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.model.runtimes import UnknownRuntimeError
from sim.search import batch
from sim.search.batch import BatchError, Candidate, evaluate, resolve_chunks
from sim.search.sweep import read_sweep, run_sweep
from sim.simulate import simulate, simulate_runtime

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
RUNTIMES = ("pipesim", "torch", "megatron")


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipesim: error: "), err
    return err[0]


def _figures(e):
    """An Evaluation as comparable values (NaN, the figures of a rejected row, as None: NaN != NaN)."""
    return tuple(None if isinstance(v, float) and v != v else v for v in (
        e.makespan, e.utilization, e.bubble_fraction, e.bubble_ratio, e.throughput, e.peak_memory, e.peak_inflight,
        e.weight_versions, e.memory_overflows, e.error))


def _direct(c: Candidate):
    """What simulate() gives for *c*, called as before issue 27 for the default runtime (no runtime argument)."""
    chunks = resolve_chunks(c.schedule, c.chunks)
    schedule = schedules.generate(c.schedule, c.devices, c.microbatches, chunks=chunks)
    hw = c.hardware or Hardware(devices=c.devices)
    if c.runtime == "pipesim" and c.post_overhead == 0.0:
        return simulate(schedule, c.costs, hw)
    return simulate_runtime(schedule, c.costs, hw, runtime=c.runtime, post_overhead=c.post_overhead)[0]


def _grid(runtime: str, post: float = 0.0) -> list[Candidate]:
    """Shapes where the runtimes differ: links with latency, blocking sends on some, dispatch overhead."""
    out = []
    # Megatron runs an unsplit backward (no zb-h1), and its interleaved schedule on more than 2 ranks
    names = ("gpipe", "1f1b", "interleaved-1f1b") if runtime.startswith("megatron") else \
        ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
    for name in names:
        for k, m, overlap in ((2, 4, True), (4, 8, False)):
            if runtime == "megatron" and name == "interleaved-1f1b" and k == 2:
                continue
            chunks = resolve_chunks(name, None)
            costs = uniform(k, forward=1.0, backward=2.0, weight=0.5 if name == "zb-h1" else 0.0,
                            dispatch_forward=0.05).split_into_chunks(chunks) if chunks > 1 else \
                uniform(k, forward=1.0, backward=2.0, weight=0.5 if name == "zb-h1" else 0.0, dispatch_forward=0.05)
            out.append(Candidate(schedule=name, devices=k, microbatches=m, costs=costs,
                                 hardware=Hardware(devices=k, latency=0.3, overlap=overlap), runtime=runtime,
                                 post_overhead=post))
    return out


def _rows_match_runtime(rows, candidates) -> bool:
    return all(e.ok and e.makespan == _direct(c).metrics.makespan for e, c in zip(rows, candidates))


# ----------------------------------------------------------------------------------------------- the batch engine
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"]),
       k=st.integers(1, 4), m=st.integers(1, 8), latency=st.sampled_from([0.0, 0.25, 1e-3]),
       overlap=st.booleans())
def test_the_default_runtime_gives_the_floats_of_a_simulation_without_one(name, k, m, latency, overlap):
    """Bit for bit: a Candidate without a runtime, and one naming 'pipesim', are simulate() as before issue 27."""
    hw = Hardware(devices=k, latency=latency, overlap=overlap)
    plain, named = evaluate([Candidate(schedule=name, devices=k, microbatches=m, hardware=hw),
                             Candidate(schedule=name, devices=k, microbatches=m, hardware=hw, runtime="pipesim")])
    assert _figures(plain) == _figures(named)
    if plain.ok:
        chunks = resolve_chunks(name, None)
        schedule = schedules.generate(name, k, m, chunks=chunks)
        share = uniform(k)
        r = simulate(schedule, share.split_into_chunks(chunks) if chunks > 1 else share, hw)
        assert (plain.makespan, plain.utilization, plain.throughput) == \
            (r.metrics.makespan, r.metrics.utilization, r.metrics.throughput)
        assert plain.peak_memory == tuple(float(v) for v in r.metrics.peak_memory)


@pytest.mark.parametrize("runtime", ["torch", "megatron", "megatron-overlap"])
def test_every_process_executor_honours_the_runtime(runtime):
    candidates = _grid(runtime, post=0.02)
    here, pool = evaluate(candidates, jobs=1), evaluate(candidates, jobs=2)
    assert [_figures(e) for e in here] == [_figures(e) for e in pool]
    assert _rows_match_runtime(here, candidates)
    eager = evaluate(_grid("pipesim"))
    assert sum(a.makespan != b.makespan for a, b in zip(here, eager)) >= len(eager) // 2  # the runtime mattered


def test_the_dask_executor_honours_the_runtime():
    pytest.importorskip("distributed")
    candidates = _grid("torch")
    assert [_figures(e) for e in evaluate(candidates, jobs=1, executor="dask")] == \
        [_figures(e) for e in evaluate(candidates, jobs=1)]


def test_the_runtime_check_sees_an_evaluator_that_drops_the_runtime(monkeypatch):
    """The bug injected: the worker's simulate() ignores the runtime. The check above then fails."""
    candidates = _grid("torch", post=0.02)
    assert _rows_match_runtime(evaluate(candidates), candidates)
    simulate_module = sys.modules["sim.simulate"]  # the module (the package's `sim.simulate` is the function)
    real = simulate_module.simulate
    monkeypatch.setattr(simulate_module, "simulate",
                        lambda *a, runtime="pipesim", post_overhead=0.0, **kw: real(*a, **kw))
    batch._schedule_cache.clear()
    assert not _rows_match_runtime(evaluate(candidates), candidates)


def test_a_bad_runtime_is_refused_before_any_work():
    ok = Candidate(schedule="gpipe", devices=2, microbatches=2)
    with pytest.raises(UnknownRuntimeError, match=r"candidates\[1\]|unknown runtime 'colossalai'.*pipesim, torch"):
        evaluate([ok, Candidate(schedule="gpipe", devices=2, microbatches=2, runtime="colossalai")])
    with pytest.raises(PipesimTypeError, match=r"candidates\[0\]\.runtime"):
        evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2, runtime=None)])
    for bad in (-1.0, float("inf"), float("nan"), "0.1", True):
        with pytest.raises(BatchError, match="post_overhead"):
            evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2, runtime="torch", post_overhead=bad)])
    e, = evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2, runtime="TORCH")])  # any case
    assert e.ok


# ----------------------------------------------------------------------------------------------- sweep
def test_sweep_with_the_default_runtime_is_unchanged_and_names_it():
    kwargs = dict(costs={"forward": 1.0, "backward": 2.0}, hardware={"latency": 0.2}, progress=False)
    before = run_sweep(["gpipe", "1f1b", "zbv"], [2, 4], [1, 4, 8], **kwargs)
    named = run_sweep(["gpipe", "1f1b", "zbv"], [2, 4], [1, 4, 8], runtime="pipesim", **kwargs)
    pd.testing.assert_frame_equal(before, named, check_exact=True)
    assert set(before["runtime"]) == {"pipesim"} and set(before["post_overhead_s"]) == {0.0}
    assert set(before["dispatch_s"]) == {0.0}


def test_sweep_cli_runtime_rows_and_columns(tmp_path):
    out = tmp_path / "s"
    assert main(["sweep", "--schedules", "1f1b,interleaved-1f1b", "-K", "2,4", "-M", "4,8", "--latency", "0.1",
                 "--runtime", "torch", "--dispatch", "0.01", "--post-overhead", "0.002", "-o", str(out),
                 "--no-plots", "--no-progress"]) == 0
    df = read_sweep(out / "sweep.csv")
    described = json.loads((out / "sweep.columns.json").read_text())
    for column in ("runtime", "dispatch_s", "post_overhead_s"):
        assert column in df.columns and described[column]["meaning"]
    assert set(df["runtime"]) == {"torch"} and set(df["post_overhead_s"]) == {0.002}
    assert df["dispatch_s"].tolist() == pytest.approx([0.01] * len(df))  # per action, also for 2 chunks per device
    for row in df.itertuples():
        chunks = int(row.chunks)
        schedule = schedules.generate(row.schedule, int(row.devices), int(row.microbatches), chunks=chunks)
        share = uniform(int(row.devices), dispatch_forward=0.01, dispatch_backward=0.01, dispatch_weight=0.01,
                        dispatch_recompute=0.01, dispatch_update=0.01)
        costs = share.split_into_chunks(chunks) if chunks > 1 else share
        r, _ = simulate_runtime(schedule, costs, Hardware(devices=int(row.devices), latency=0.1), runtime="torch",
                                post_overhead=0.002)
        assert row.makespan == r.metrics.makespan


def test_sweep_refuses_a_bad_runtime(tmp_path, capsys):
    base = ["sweep", "-K", "2", "-M", "4", "--no-plots", "--no-progress", "-o", str(tmp_path / "o")]
    assert "unknown runtime 'fast'" in _cli_error(capsys, base + ["--runtime", "fast"])
    assert "--post-overhead" in _cli_error(capsys, base + ["--post-overhead", "-1"])
    # (--samples with a runtime samples that runtime's model: tests/test_montecarlo_robustness.py)
    assert not (tmp_path / "o").exists()
    with pytest.raises(PipesimError, match="unknown runtime"):
        run_sweep(["gpipe"], [2], [4], runtime="nccl", progress=False)


# ----------------------------------------------------------------------------------------------- plan
PLAN = ["plan", "--model", "small-gpt", "--gpu", "cpu", "--gpus", "2", "--global-batch", "16", "--tensor-parallel",
        "1", "--microbatch-size", "2,4", "--recompute", "none", "--schedules", "gpipe,1f1b", "--no-progress"]


def test_plan_runtime_reaches_every_simulation_and_the_json(tmp_path):
    from sim.model.gpus import get_gpu
    from sim.model.models import get_model
    from sim.search.planner import PlanSpace, plan, simulate_candidate

    model, gpu = get_model("small-gpt"), get_gpu("cpu")
    space = dict(schedules=("gpipe", "1f1b"), tensor=(1,), microbatch_sizes=(2, 4), recompute=("none",))
    default = plan(model, gpu, gpus=2, global_batch=16, space=PlanSpace(**space))
    named = plan(model, gpu, gpus=2, global_batch=16, space=PlanSpace(**space, runtime="pipesim"))
    pd.testing.assert_frame_equal(default.ranked, named.ranked, check_exact=True)
    torch_plan = plan(model, gpu, gpus=2, global_batch=16,
                      space=PlanSpace(**space, runtime="torch", dispatch=1e-4, post_overhead=1e-5))
    assert torch_plan.inputs["runtime"] == "torch"
    piped = torch_plan.ranked[torch_plan.ranked["pipeline"] > 1]
    assert len(piped)
    for _, row in piped.iterrows():  # each ranked makespan is the torch runtime's simulation of that candidate
        assert row["makespan"] == simulate_candidate(model, gpu, row.to_dict(), torch_plan.inputs["space"]) \
            .metrics.makespan
    eager = default.ranked.set_index(["schedule", "pipeline", "microbatch_size"])["makespan"]
    modeled = torch_plan.ranked.set_index(["schedule", "pipeline", "microbatch_size"])["makespan"]
    both = eager.index.intersection(modeled.index)
    assert (modeled[both] > eager[both]).any()  # dispatch and posting cost time
    out = tmp_path / "p"
    assert main(PLAN + ["-o", str(out), "--runtime", "torch", "--dispatch", "1e-4"]) == 0
    summary = json.loads((out / "plan.json").read_text())
    assert summary["runtime"]["name"] == "torch" and summary["runtime"]["dispatch_s"] == 1e-4
    assert summary["runtime"]["links"] == "rendezvous"


def test_plan_refuses_a_bad_runtime(tmp_path, capsys):
    from sim.search.planner import PlanError, PlanSpace

    assert "unknown runtime 'tensorrt'" in _cli_error(capsys, PLAN + ["-o", str(tmp_path / "p"), "--runtime",
                                                                      "tensorrt"])
    with pytest.raises(UnknownRuntimeError):
        PlanSpace(runtime="tensorrt")
    with pytest.raises(PlanError, match="dispatch"):
        PlanSpace(dispatch=-1.0)
    assert PlanSpace(runtime="Megatron").runtime == "megatron"


# ----------------------------------------------------------------------------------------------- ingest
def _traces(name: str, k: int, m: int) -> list[str]:
    return [str(p) for p in sorted(FIXTURES.glob(f"torch213_{name}_K{k}_M{m}_rank*.json.gz"))]


@pytest.mark.parametrize("name, cls, k, m", [("gpipe", "GPipe", 2, 4), ("1f1b", "1F1B", 2, 4)])
def test_ingest_runtime_predicts_with_the_trace_calibrated_runtime_model(tmp_path, capsys, name, cls, k, m):
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.flow import ingest
    from validate.pytorch.schedules import pytorch_schedule, torch_class_for

    argv = ["ingest", *_traces(name, k, m), "--from-pytorch", cls, "-K", str(k), "-M", str(m), "--json"]
    assert main(argv + ["-o", str(tmp_path / "plain")]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["-o", str(tmp_path / "torch"), "--runtime", "torch"]) == 0
    modeled = json.loads(capsys.readouterr().out)
    assert "runtime_model" not in plain and plain["runtime"] is None and modeled["runtime"] == "torch"
    model = modeled["runtime_model"]
    assert model["links"] == "rendezvous" and model["lowering"] == f"torch-{name}"
    assert model["without"]["makespan"] == plain["predicted_makespan"]  # the plain prediction, kept beside
    assert model["without"]["makespan_error"] == plain["makespan_error"]
    chosen = str(modeled["ingest"]["step"])
    assert set(model["makespan_error_steps"]) == {str(s) for s in modeled["ingest"]["complete_steps"]}
    assert model["makespan_error_steps"][chosen] == modeled["makespan_error"]
    assert model["without"]["makespan_error_steps"][chosen] == plain["makespan_error"]
    # the prediction is the torch profile on the trace's calibration plus what calibrate_runtime measured,
    # the compared step's messages included (validate/ingest/messages.py)
    schedule, _ = pytorch_schedule(torch_class_for(cls), k, m)
    ing = ingest(_traces(name, k, m), schedule)
    rc = calibrate_runtime(ing.runs(), ing.calibration.costs, ing.calibration.hardware, "torch",
                           messages=ing.message_model(), dispatch_runs=ing.dispatch_runs())
    r, _ = rc.predict(ing.schedule)
    assert modeled["predicted_makespan"] == r.metrics.makespan != plain["predicted_makespan"]
    bare = calibrate_runtime(ing.runs(), ing.calibration.costs, ing.calibration.hardware, "torch")
    r0, _ = simulate_runtime(ing.schedule, bare.costs, bare.hardware, runtime="torch", post_overhead=bare.post_overhead)
    assert bare.predict(ing.schedule)[0].metrics.makespan == r0.metrics.makespan  # without messages: the profile alone
    assert rc.dispatch and rc.post_samples > 0 and model["post_overhead_s"] == rc.post_overhead > 0
    assert rc.hardware.latency[0][1] >= ing.calibration.hardware.latency[0][1]  # the fit is a lower bound
    report = next((tmp_path / "torch").glob("*.md")).read_text()
    assert "## Runtime model" in report and "with the `torch` runtime model" in report
    assert "without (eager links" in report
    assert "## Runtime model" not in next((tmp_path / "plain").glob("*.md")).read_text()


def test_ingest_runtime_summary_line_and_bad_names(tmp_path, capsys):
    argv = ["ingest", *_traces("gpipe", 2, 4), "--from-pytorch", "GPipe", "-K", "2", "-M", "4"]
    assert main(argv + ["-o", str(tmp_path / "o"), "--runtime", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "runtime    megatron (rendezvous links" in out and "without it" in out
    assert "unknown runtime 'colossalai'" in _cli_error(capsys, argv + ["-o", str(tmp_path / "x"), "--runtime",
                                                                       "colossalai"])
    assert not (tmp_path / "x").exists()


def test_calibrate_runtime_keeps_what_was_given_and_what_eager_links_need():
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.flow import ingest
    from validate.pytorch.schedules import pytorch_schedule, torch_class_for

    schedule, _ = pytorch_schedule(torch_class_for("1F1B"), 2, 4)
    ing = ingest(_traces("1f1b", 2, 4), schedule)
    costs, hw = ing.calibration.costs, ing.calibration.hardware
    eager = calibrate_runtime(ing.runs(), costs, hw, "pipesim")
    assert eager.hardware is hw and eager.link_samples == 0 and eager.dispatch  # eager links: the fit times them
    given = calibrate_runtime(ing.runs(), costs, hw, "torch", costs_given=True, hardware_given=True)
    assert given.costs is costs and given.hardware is hw and not given.dispatch
    assert any("given costs" in n for n in given.notes) and any("given hardware" in n for n in given.notes)
    blind = calibrate_runtime([(r, None) for r, _ in ing.runs()], costs, hw, "torch")
    assert blind.post_samples == 0 and blind.post_overhead == 0.0 and blind.hardware is hw
    assert any("no communication calls" in n for n in blind.notes)


def test_ingest_refuses_a_runtime_that_cannot_run_the_schedule_before_reading(tmp_path, capsys, monkeypatch):
    import validate.ingest.flow as flow

    monkeypatch.setattr(flow, "read_ranks", lambda *a, **k: pytest.fail("the traces were read"))
    err = _cli_error(capsys, ["ingest", *_traces("gpipe", 2, 4), "-s", "interleaved-1f1b", "--chunks", "2", "-M", "4",
                              "-o", str(tmp_path / "o"), "--runtime", "megatron"])
    assert "megatron" in err and "interleaved-1f1b" in err
    assert not (tmp_path / "o").exists()
