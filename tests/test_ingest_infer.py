"""Runtimes that name no action: torch 2.13's Schedule1F1B with the profiler's defaults, and Megatron-LM.

The committed traces under ``tests/fixtures/ingest/`` are real: torch 2.13 on CPU, gloo, 2 and 4 ranks,
``profile(activities=[CPU])`` with nothing of ours in the runtime (``make_torch_traces.py`` there makes
them; the slow test here makes fresh ones). Ingest must number every computation from the order the
runtime executes, say which actions were inferred, and refuse a schedule that does not fit, naming the
first computation that differs. Megatron-LM traces are made to the format Megatron writes (from its
source: ``forward_step`` / ``backward_step`` Python events, ``nccl:send a->b``), by the trace builder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.simulate import simulate
from validate.ingest import infer
from validate.ingest.flow import NoActionsError, ingest, without_updates
from validate.ingest.infer import OrderMismatchError
from validate.pytorch.schedules import executed_order

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def real(cls: str, K: int, M: int) -> list[str]:
    paths = sorted(FIXTURES.glob(f"torch213_{cls}_K{K}_M{M}_rank*.json.gz"))
    assert len(paths) == K
    return [str(p) for p in paths]


@pytest.mark.parametrize("K, M", [(2, 4), (4, 8)])
def test_unannotated_schedule1f1b_is_read_in_the_order_its_runtime_executes(K, M, check):
    ing = ingest(real("1f1b", K, M), executed_order("Schedule1F1B", K, M))
    assert ing.forms == ("inferred",)
    assert sorted(ing.steps) == [1, 2]  # both profiled steps complete
    assert ing.actions_inferred == 2 * K * M and ing.actions_measured == 0
    for result in ing.steps.values():
        check(result, modelled=False)
        assert (result.timeline["src"] >= 0).sum() == 2 * (K - 1) * M  # every activation and gradient paired
    ran = ing.measured.schedule
    assert all(ran.actions[d] == executed_order("Schedule1F1B", K, M).actions[d] for d in range(K))
    assert any("numbered from the schedule's order" in n for n in ing.notes)


def test_gpipe_with_the_profilers_defaults_is_named_and_measured():
    ing = ingest(real("gpipe", 2, 4), executed_order("ScheduleGPipe", 2, 4))
    assert ing.forms == ("single",) and ing.actions_inferred == 0 and ing.actions_measured == 16


def test_the_cli_says_which_actions_were_inferred(tmp_path, capsys):
    assert main(["ingest", *real("1f1b", 2, 4), "-s", "1f1b", "-M", "4", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "0 named by the trace, 16 inferred" in out
    report = next((tmp_path / "o").glob("*_ingest.md")).read_text()
    assert "16 numbered from the schedule's order" in report
    summary = json.loads(next((tmp_path / "o").glob("*_ingest.json")).read_text())
    assert summary["ingest"]["actions_inferred"] == 16


@pytest.mark.parametrize("flags, first", [
    (["-s", "gpipe", "-M", "4"], "computation 3 of the trace is a backward"),  # issue 26 item 6
    (["--from-pytorch", "GPipe", "-M", "4"], "computation 3 of the trace is a backward"),
    (["--from-pytorch", "1F1B", "-M", "3"], "computation 6 of the trace is a forward"),
])
def test_a_schedule_that_does_not_fit_is_refused_on_the_terminal(tmp_path, capsys, flags, first):
    out = tmp_path / "o"
    assert main(["ingest", *real("1f1b", 2, 4), *flags, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([ln for ln in err if ln.startswith("pipesim: error:")]) == 1 and first in err[-1]
    assert not out.exists()  # issue 26 item 10: a refused ingest leaves no empty -o folder


def test_the_bookkeeping_rule_is_what_makes_the_real_trace_fit(monkeypatch):
    """Injected bug: without the view / bookkeeping ops rule, torch's detach_ after each backward is a forward."""
    monkeypatch.setattr(infer, "BOOKKEEPING_OPS", frozenset())
    with pytest.raises(OrderMismatchError, match="is a forward"):
        ingest(real("1f1b", 2, 4), executed_order("Schedule1F1B", 2, 4))


def test_asynchronous_backend_spans_do_not_hide_a_forward(monkeypatch):
    """Injected bug: gloo's send / recv spans last until completion and overlap the next forward; taken as
    parents, they hide it (rank 0's F1 sits inside F0's gloo:send in the real trace)."""
    monkeypatch.setattr(infer, "_OP_CATS", ("cpu_op", "", "user_annotation"))
    with pytest.raises(OrderMismatchError):
        ingest(real("1f1b", 2, 4), executed_order("Schedule1F1B", 2, 4))


def _simulated(name: str, K: int, M: int, f: float, b: float, chunks: int | None = None):
    sched = without_updates(schedules.generate(name, K, M, **({"chunks": chunks} if chunks else {})))
    costs = uniform(sched.stages, forward=f, backward=b, activation_bytes=1e6, send_bytes=1e6)
    return simulate(sched, costs, Hardware(devices=K, latency=1e-4, bandwidth=1e10))


def _write(tmp_path: Path, traces: list[dict]) -> list[str]:
    paths = []
    for r, t in enumerate(traces):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    return paths


def _same_computations(a, b) -> None:
    ca = a.timeline[a.timeline["src"] < 0].sort_values(["device", "start"])
    cb = b.timeline[b.timeline["src"] < 0].sort_values(["device", "start"])
    assert list(ca["op"].astype(str)) == list(cb["op"].astype(str))
    assert list(ca["microbatch"]) == list(cb["microbatch"]) and list(ca["stage"]) == list(cb["stage"])
    assert abs(ca["start"].values - cb["start"].values).max() < 1e-6
    assert abs(ca["end"].values - cb["end"].values).max() < 1e-6


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(K=st.integers(2, 4), extra=st.integers(0, 4), f=st.floats(1e-4, 5e-3), ratio=st.floats(0.5, 3.0))
def test_op_structure_traces_of_any_1f1b_give_the_simulated_run_back(tmp_path_factory, K, extra, f, ratio):
    res = _simulated("1f1b", K, K + extra, f, f * ratio)
    paths = _write(tmp_path_factory.mktemp("ops"), traces_from(res, "ops", step_marker=3))
    ing = ingest(paths, res.schedule)
    assert ing.forms == ("inferred",)
    _same_computations(res, ing.measured)


@pytest.mark.parametrize("name, chunks", [("1f1b", None), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)])
def test_megatron_traces_are_numbered_by_its_order(tmp_path, capsys, check, name, chunks):
    K, M = 3, 6
    res = _simulated(name, K, M, 1e-3, 2e-3, chunks)
    paths = _write(tmp_path, traces_from(res, "megatron", step_marker=7))
    ing = ingest(paths, res.schedule, source="megatron")
    assert ing.forms == ("megatron",) and ing.actions_inferred == len(list(res.schedule))
    check(ing.measured, modelled=False)
    _same_computations(res, ing.measured)
    flags = ["--from-megatron", "1f1b"] if chunks is None else ["--from-megatron", "interleaved", "--chunks", str(chunks)]
    assert main(["ingest", *paths, *flags, "-M", str(M), "-o", str(tmp_path / "o")]) == 0
    assert "inferred" in capsys.readouterr().out


def test_megatron_interleaved_read_as_plain_1f1b_is_refused(tmp_path, capsys):
    res = _simulated("interleaved-1f1b", 2, 4, 1e-3, 2e-3, 2)
    paths = _write(tmp_path, traces_from(res, "megatron", step_marker=7))
    assert main(["ingest", *paths, "--from-megatron", "1f1b", "-M", "4", "-o", str(tmp_path / "o")]) == 2
    assert "Megatron-LM's forward_step / backward_step" in capsys.readouterr().err


def test_a_trace_without_megatron_functions_says_how_to_profile(tmp_path):
    res = _simulated("1f1b", 2, 2, 1e-3, 2e-3)
    paths = _write(tmp_path, traces_from(res, "PP"))
    with pytest.raises(NoActionsError, match="with_stack=True"):
        ingest(paths, res.schedule, source="megatron")


def test_a_trace_without_any_backward_is_no_pipeline_step(tmp_path):
    res = _simulated("1f1b", 2, 2, 1e-3, 2e-3)
    traces = traces_from(res, "ops")
    for t in traces:  # only the forwards' ops are left
        t["traceEvents"] = [e for e in t["traceEvents"] if "autograd" not in e.get("name", "")
                            and "Backward" not in e.get("name", "")]
    with pytest.raises(NoActionsError, match="no forward ops or autograd events"):
        ingest(_write(tmp_path, traces), res.schedule)


@pytest.mark.slow
def test_fresh_traces_of_torch_are_read_too(tmp_path):
    """Makes new traces with the installed torch (2 gloo ranks on CPU, a few seconds) and ingests them."""
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_torch_traces", FIXTURES / "make_torch_traces.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    paths = maker.make(tmp_path, "Schedule1F1B", 2, 4)
    ing = ingest([str(p) for p in paths], executed_order("Schedule1F1B", 2, 4))
    assert ing.actions_inferred == 16 and sorted(ing.steps) == [1, 2]


def test_a_blocking_exchanges_return_bounds_what_it_received():
    """Megatron's ``_communicate`` waits for its batch before it returns; gloo's thread may record the receive's end
    later (a real K=4 run: up to 0.8 ms after the consumer began). The completion is the earlier of the two; a
    receive posted through ``_p2p_ops`` (``overlap_p2p_comm``: not waited there) keeps its backend's end."""
    from validate.ingest.actions import _Gpu, _by_thread, _messages
    from validate.ingest.reader import Span

    args = {"Concrete Inputs": ["", "", "1", "0"]}
    spans = [Span("megatron/core/pipeline_parallel/p2p_communication.py(254): _communicate", "python_function",
                  10.0, 20.0, 1, 1),
             Span("megatron/core/pipeline_parallel/p2p_communication.py(16): _batched_p2p_ops", "python_function",
                  10.5, 12.5, 1, 1),
             # with overlap_p2p_comm it posts through _p2p_ops and returns at once: no bound
             Span("megatron/core/pipeline_parallel/p2p_communication.py(254): _communicate", "python_function",
                  39.0, 42.0, 1, 1),
             Span("megatron/core/pipeline_parallel/p2p_communication.py(60): _p2p_ops", "python_function",
                  39.5, 41.5, 1, 1),
             Span("c10d::recv_", "cpu_op", 11.0, 12.0, 1, 1, args),
             Span("gloo:recv", "user_annotation", 11.5, 30.0, 1, 1),
             Span("c10d::recv_", "cpu_op", 40.0, 41.0, 1, 1, args),
             Span("gloo:recv", "user_annotation", 40.5, 55.0, 1, 1)]
    inside, alone = _messages(_by_thread(spans), spans, _Gpu([]))
    assert (inside.complete, alone.complete) == (20.0, 55.0)


def test_sends_outside_ranges_are_paired_link_by_link():
    """Megatron's interleaved steady state (K=4, rank 2): a forward and a backward, then one batch that sends the
    backward's gradient (to rank 1) before the forward's output (to rank 3). Each send carries the result computed
    for its peer, not the one computed first (which would swap the two rows' times, and on a busy machine read a
    gradient as arriving after its consumer began)."""
    from validate.ingest.actions import ActionRange, Message, RankRecords
    from validate.ingest.flow import _pair_loose

    def act(stage, kind, start, end):
        return ActionRange(stage, kind, 0, start, end, start, end, "megatron", (1, 1), step=0)

    rec = RankRecords(actions=[act(6, "F", 0.0, 1.0), act(6, "B", 1.0, 3.0)],
                      loose=[Message("send", 3.1, 3.2, peer=1), Message("send", 3.3, 3.4, peer=3)])
    out, note = _pair_loose(rec, 2, [s % 4 for s in range(8)], 8)
    assert note is None
    assert {m.peer: m.producer for m in out} == {1: (6, "B", 0), 3: (6, "F", 0)}


def test_megatron_overlap_is_megatrons_own_runtime_for_a_megatron_trace():
    from sim.cli.ingest import runtime_mismatch
    assert runtime_mismatch({"megatron"}, "megatron-overlap") is None
    assert runtime_mismatch({"megatron"}, "megatron") is None
    assert "compares two different runtimes" in runtime_mismatch({"megatron"}, "torch")
