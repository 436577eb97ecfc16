"""What-if questions on an ingested step and the attribution of its excess (validate/ingest/whatif.py).

A run with one straggler is simulated, written as traces, ingested and analysed: the ideal must be the run
without the straggler, the actual replay the run with it, ``median`` must answer the ideal, and the excess
must land on the straggler's stage, device and kind, by all three measures.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.core.ir import Action, ActionKind
from sim.engines.fastpath import run_fast
from sim.engines.plan import make_plan
from sim.io.trace import check_trace
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.results.result import make_result
from validate.ingest.flow import ingest, without_updates
from validate.ingest.whatif import WhatIfError, analyse, parse_what_if

F, B = 1e-3, 2e-3


def _run(K: int, M: int, slow: dict | None = None, latency: float = 0.0):
    """1F1B on K devices, uniform costs, *slow*: {Action: extra seconds}; the Result the engine gives."""
    sched = without_updates(schedules.generate("1f1b", K, M))
    costs = uniform(K, forward=F, backward=B)
    hw = Hardware(devices=K, latency=latency)
    plan = make_plan(sched, costs, hw)
    durations = plan.durations.copy()
    for action, extra in (slow or {}).items():
        durations[int(np.flatnonzero(plan.flat.keys == sched.key(action))[0])] += extra
    return make_result(sched, costs, hw, run_fast(replace(plan, durations=durations, _views={})))


def _ingested(tmp_path, result):
    paths = []
    for r, t in enumerate(traces_from(result, "PP", step_marker=2)):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    return ingest(paths, result.schedule), paths


@pytest.mark.parametrize("text, n", [("median", 1), ("stage 2 x0.9", 1), ("stage 1 B x0.8", 1), ("device 0 x1.5", 1),
                                     ("kind W x0.5", 1), ("link 0-1 x2", 1), ("link 1->0 x4", 1),
                                     ("stage 1 x0.8, link 0-1 x2", 2), ("  MEDIAN ", 1)])
def test_questions_are_read(text, n):
    assert len(parse_what_if(text)) == n


@pytest.mark.parametrize("text", ["stage x0.9", "stage 2 0.9", "link 0 x2", "stage 2 x0", "stage 2 x-1", "stage 2 xnan",
                                  "faster please", "stage 2 x1e9", ""])
def test_unreadable_questions_are_refused(text):
    with pytest.raises(WhatIfError):
        parse_what_if(text)


def test_the_cli_refuses_a_bad_question_before_reading_the_traces(tmp_path, capsys):
    missing = tmp_path / "not_there.json"
    assert main(["ingest", str(missing), "-s", "1f1b", "-K", "1", "-M", "1", "-o", str(tmp_path / "o"),
                 "--what-if", "stage two x2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--what-if 'stage two x2'" in err


def test_questions_that_do_not_fit_the_run_are_refused(tmp_path):
    ing, _ = _ingested(tmp_path, _run(3, 6))
    for q, what in (("stage 7 x2", "stages 0..2"), ("device 3 x2", "devices 0..2"), ("link 0-2 x2", "no transfer"),
                    ("link 1-1 x2", "two different devices")):
        with pytest.raises(WhatIfError, match=what):
            analyse(ing, [q])


def test_a_straggler_is_found_and_median_removes_it(tmp_path):
    K, M, extra = 4, 8, 5e-3
    clean = _run(K, M)
    straggler = Action(2, ActionKind.F, 3)
    slowed = _run(K, M, {straggler: extra})
    assert slowed.metrics.makespan > clean.metrics.makespan + 1e-3
    ing, _ = _ingested(tmp_path, slowed)
    a = analyse(ing, ["median", "stage 2 x1", "stage 0 x0.5"])
    assert a.ideal.metrics.makespan == pytest.approx(clean.metrics.makespan, rel=1e-6)
    assert a.actual.metrics.makespan == pytest.approx(slowed.metrics.makespan, rel=1e-6)
    median, same, faster = a.answers
    assert median.step_time == pytest.approx(clean.metrics.makespan, rel=1e-6)
    assert same.step_time == pytest.approx(a.actual.metrics.makespan, rel=1e-9)
    assert faster.step_time < a.actual.metrics.makespan
    excess = slowed.metrics.makespan - clean.metrics.makespan
    stage = {r["group"]: r for r in a.attribution["stage"]}
    assert a.attribution["stage"][0]["group"] == "stage 2"
    assert stage["stage 2"]["critical_path_s"] == pytest.approx(extra, abs=1e-7)  # the builder separates events by 1 ns
    assert stage["stage 2"]["fixing_saves_s"] == pytest.approx(excess, rel=1e-6)
    assert stage["stage 2"]["alone_costs_s"] == pytest.approx(excess, rel=1e-6)
    for other in ("stage 0", "stage 1", "stage 3"):
        assert abs(stage[other]["fixing_saves_s"]) < 1e-7 and abs(stage[other]["alone_costs_s"]) < 1e-7
    assert a.attribution["device"][0]["group"] == "device 2" and a.attribution["kind"][0]["group"] == "F"
    assert str(straggler) in a.critical_path


@settings(max_examples=15, deadline=None)
@given(K=st.integers(2, 4), extra_m=st.integers(0, 4), seed=st.integers(0, 10**6), latency=st.sampled_from([0.0, 2e-4]))
def test_the_critical_path_has_no_slack(tmp_path_factory, K, extra_m, seed, latency):
    """Along the path each action starts when the one before it ends: its durations add up to the makespan."""
    rng = np.random.default_rng(seed)
    M = K + extra_m
    sched = without_updates(schedules.generate("1f1b", K, M))
    slow = {a: float(rng.uniform(0, 3e-3)) for a in sched if rng.random() < 0.2}
    ing, _ = _ingested(tmp_path_factory.mktemp("cp"), _run(K, M, slow, latency))
    a = analyse(ing, [])
    tl = a.actual.timeline
    total = 0.0
    for item in a.critical_path:
        if "->" in item:
            producer, dst = item.split("->")
            act = Action.parse(producer)
            row = tl[(tl["src"] >= 0) & (tl["stage"] == act.stage) & (tl["microbatch"] == act.mb)
                     & (tl["op"].astype(str) == f"SEND_{act.kind.value}")]
        else:
            act = Action.parse(item)
            row = tl[(tl["src"] < 0) & (tl["stage"] == act.stage) & (tl["microbatch"] == act.mb)
                     & (tl["op"].astype(str) == act.kind.value)]
        total += float((row["end"] - row["start"]).iloc[0])
    assert total == pytest.approx(a.actual.metrics.makespan, rel=1e-9, abs=1e-12)


def test_the_cli_writes_ideal_and_actual_into_one_perfetto_trace(tmp_path, capsys):
    _, paths = _ingested(tmp_path, _run(2, 4, {Action(1, ActionKind.B, 1): 3e-3}))
    out = tmp_path / "o"
    assert main(["ingest", *paths, "-s", "1f1b", "-M", "4", "-o", str(out), "--what-if", "median",
                 "--what-if", "stage 1 x0.5"]) == 0
    text = capsys.readouterr().out
    assert "what if median:" in text and "what if stage 1 x0.5:" in text
    trace = json.loads(next(out.glob("*_whatif_trace.json")).read_text())
    check_trace(trace)
    names = [r["name"] for r in trace["otherData"]["results"]]
    assert names[:3] == ["measured", "actual (replayed)", "ideal (medians)"]
    report = next(out.glob("*_ingest.md")).read_text()
    assert "StragglerAnalysis" in report and "| stage 1 |" in report
    summary = json.loads(next(out.glob("*_ingest.json")).read_text())
    assert summary["what_if"]["answers"][0]["question"] == "median"
