"""Trace ingestion without torch: simulated runs written as PyTorch-shaped traces must come back exactly.

Every naming form (the multi-stage runtime's ``PP:`` ranges, ScheduleGPipe's ``Forward i``,
marks without messages, ``--action-pattern``, GPU kernels) is written from a simulated timeline
by :mod:`ingest_trace_builder`; ingesting it must give the simulated computations back, transfers
that start with the send and end between the arrival and the consumer, the timeline invariants,
and a calibration that reproduces the run. Then the bad inputs: truncated files, missing ranks,
traces without pipeline actions, a schedule that does not match, random bytes and random JSON.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.model.cost import uniform
from sim.errors import PipesimError
from sim.model.hardware import Hardware
from sim.core.ir import Schedule
from sim.simulate import simulate
from validate.ingest.flow import (ClockError, IngestError, MissingRankError, NoActionsError, ScheduleMismatchError,
    ingest, without_updates)
from validate.ingest.actions import ActionPatternError
from validate.ingest.clocks import align_clocks
from validate.ingest.reader import TraceReadError, read_trace, rank_from_name

PATTERN = r"(?P<kind>fwd|bwd)_s(?P<stage>\d+)_mb(?P<mb>\d+)"
LATENCY = 2e-4


def simulated(name, K, M, **kw):
    sched = without_updates(schedules.generate(name, K, M, **kw))
    # one range per action, as a runtime that runs a pair's two actions one after the other records them: pipesim's
    # engines run an overlapped pair as one unit (its forward's row spans the pair), so DualPipeV runs here unpaired
    # (as it did while without_updates dropped the pairs)
    sched = sched.replace_actions(sched.actions)
    split = bool(sched.split_backward)
    costs = uniform(sched.stages, forward=1e-3, backward=2e-3, weight=5e-4 if split else 0.0, send_bytes=4096)
    return simulate(sched, costs, Hardware(devices=K, latency=LATENCY))


def write(tmp_path, traces, *, names=None, gz=False):
    paths = []
    for r, t in enumerate(traces):
        path = tmp_path / ((names or [f"rank{r}.json"] * len(traces))[r] + (".gz" if gz else ""))
        data = json.dumps(t).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        paths.append(str(path))
    return paths


def assert_same_run(sim_result, ingested, *, exact_transfers=False):
    key = ["device", "stage", "microbatch", "op", "src", "dst"]
    a = sim_result.timeline.sort_values(key).reset_index(drop=True)
    b = ingested.measured.timeline.sort_values(key).reset_index(drop=True)
    assert a[key].equals(b[key]), "the ingested rows are not the simulated rows"
    comp = a["src"] < 0
    np.testing.assert_allclose(b["start"], a["start"], atol=1e-8)
    np.testing.assert_allclose(b["end"][comp], a["end"][comp], atol=1e-8)
    # a receive completes when the receiver waits for it: at the arrival, or later when it was busy
    assert (b["end"][~comp] >= a["end"][~comp] - 1e-8).all()
    if exact_transfers:
        np.testing.assert_allclose(b["end"][~comp], a["end"][~comp], atol=1e-8)


# ------------------------------------------------------------------------------------- round trips
ROUND_TRIPS = [("gpipe", 2, 4, {}, "PP"), ("1f1b", 3, 5, {}, "PP"), ("interleaved-1f1b", 2, 4, {"chunks": 2}, "PP"),
               ("zbv", 2, 4, {}, "PP"), ("dualpipev", 2, 4, {}, "PP"), ("gpipe", 3, 4, {}, "single"),
               ("1f1b", 3, 5, {}, "loose"), ("1f1b", 2, 4, {}, "pattern"), ("1f1b", 2, 4, {}, "gpu"),
               ("zbv", 2, 4, {}, "gpu"), ("gpipe", 3, 4, {}, "gpu-single")]


@pytest.mark.parametrize("name,K,M,kw,form", ROUND_TRIPS, ids=[f"{r[0]}-{r[4]}" for r in ROUND_TRIPS])
def test_ingesting_a_simulated_run_gives_it_back(tmp_path, check, name, K, M, kw, form):
    res = simulated(name, K, M, **kw)
    ing = ingest(write(tmp_path, traces_from(res, form)), res.schedule,
                 action_patterns=[PATTERN] if form == "pattern" else ())
    assert_same_run(res, ing, exact_transfers=form.startswith("gpu"))
    check(ing.measured, modelled=False)
    assert ing.order_differences == ()
    assert ing.measured.source == "measured"
    # the calibration is the run's own costs and link, so simulating with it reproduces the run
    cal = ing.calibration
    np.testing.assert_allclose(cal.costs.forward, res.costs.forward, atol=1e-8)
    np.testing.assert_allclose(np.add(cal.costs.backward, cal.costs.weight),
                               np.add(res.costs.backward, res.costs.weight), atol=1e-8)
    if not form.startswith("gpu"):
        assert cal.costs.send_bytes[0] == 4096
    assert cal.hardware.latency[0][1] == pytest.approx(LATENCY, abs=1e-8)
    again = simulate(res.schedule, cal.costs, cal.hardware)
    assert again.metrics.makespan == pytest.approx(res.metrics.makespan, rel=1e-5)


def test_the_wait_inside_a_forward_range_is_not_compute(tmp_path):
    """ScheduleGPipe's 'Forward i' holds the wait for the activation: the compute starts when it arrived."""
    res = simulated("gpipe", 2, 3)
    traces = traces_from(res, "single")
    ranges = [e for e in traces[1]["traceEvents"] if e.get("name") == "Forward 0"]
    assert ranges[0]["dur"] > 1e3 + 100  # the range is longer than the forward: it waited
    ing = ingest(write(tmp_path, traces), res.schedule)
    tl = ing.measured.timeline
    f = tl[(tl.device == 1) & (tl.op == "F") & (tl.microbatch == 0)].iloc[0]
    assert f.end - f.start == pytest.approx(1e-3, abs=1e-8)


def test_steps_are_told_apart_and_the_last_complete_one_is_compared(tmp_path):
    res = simulated("1f1b", 2, 3)
    first = traces_from(res, "PP", step_marker=3)
    second = traces_from(res, "PP", step_marker=4)
    shift = 1e5  # the second step 0.1 s later
    for t1, t2 in zip(first, second):
        for e in t2["traceEvents"]:
            if e.get("ph") == "X":
                e["ts"] += shift
        t1["traceEvents"] += [e for e in t2["traceEvents"] if e.get("ph") == "X"]
    # step 4 loses an action on rank 1: it is incomplete
    lost = next(e for e in first[1]["traceEvents"] if e.get("name") == "PP:1B2" and e["ts"] > shift)
    first[1]["traceEvents"].remove(lost)
    paths = write(tmp_path, first)
    ing = ingest(paths, res.schedule)
    assert ing.step == 3 and sorted(ing.steps) == [3]
    with pytest.raises(ScheduleMismatchError, match=r"1 action\(s\) of the schedule missing from the trace \(1B2\)"):
        ingest(paths, res.schedule, step=4)
    with pytest.raises(IngestError, match="step 9 is not in the traces"):
        ingest(paths, res.schedule, step=9)


def test_several_complete_steps_all_calibrate(tmp_path):
    res = simulated("gpipe", 2, 2)
    traces = traces_from(res, "PP")
    for t in traces:  # the same step again, 50 ms later (occurrence order tells the steps apart)
        t["traceEvents"] += [dict(e, ts=e["ts"] + 5e4) for e in t["traceEvents"] if e.get("ph") == "X"]
    ing = ingest(write(tmp_path, traces), res.schedule)
    assert sorted(ing.steps) == [0, 1] and ing.step == 1
    assert ing.calibration.stats[(0, "F")].n == 4  # 2 micro-batches x 2 steps
    assert ing.steps[0].metrics.makespan == pytest.approx(res.metrics.makespan, rel=1e-6)


def test_nested_marks_keep_the_tighter_range(tmp_path):
    """A mark inside the runtime's own range (a harness marking the computation) is the compute time."""
    res = simulated("gpipe", 2, 2)
    traces = traces_from(res, "PP")
    for t in traces:
        outer = [dict(e, ts=e["ts"] - 50.0, dur=e["dur"] + 80.0) for e in t["traceEvents"]
                 if e.get("name", "").startswith("PP:") and e["name"][4] in "FB" and "SEND" not in e["name"]
                 and "RECV" not in e["name"]]
        t["traceEvents"] += outer
    ing = ingest(write(tmp_path, traces), res.schedule)
    assert_same_run(res, ing)


# ------------------------------------------------------------------------------------- clocks
def test_clocks_of_two_hosts_are_aligned_by_the_messages(tmp_path, check):
    res = simulated("1f1b", 2, 4)
    traces = traces_from(res, "PP", offsets_us=[0.0, 5e6], hosts=["a", "b"])  # rank 1's clock 5 s ahead
    ing = ingest(write(tmp_path, traces), res.schedule)
    assert not ing.clock.shared
    assert ing.clock.uncertainty[1] <= LATENCY * 1e6  # microseconds
    err = ing.clock.offsets[1] + 5e6  # the recovered offset cancels the 5 s
    assert abs(err) <= ing.clock.uncertainty[1] + 1e-3
    tl, ref = ing.measured.timeline, res.timeline
    comp = lambda t: t[t.src < 0].sort_values(["device", "stage", "microbatch", "op"])  # noqa: E731
    assert np.abs(comp(tl)["start"].to_numpy() - comp(ref)["start"].to_numpy()).max() <= 2 * LATENCY
    # on a shared clock the same traces say that messages completed before they were sent
    shared = ingest(write(tmp_path, traces), res.schedule, clock="shared")
    assert shared.clock.violations > 0 and any("do not share a clock" in n for n in shared.notes)


def test_clock_bounds_need_messages_both_ways():
    with pytest.raises(ClockError, match=r"rank\(s\) \[1\]"):
        align_clocks([(0, 1, 0.0, 10.0)], 2, shared=False)
    a = align_clocks([(0, 1, 0.0, 110.0), (1, 0, 200.0, 110.0)], 2, shared=False)  # offset -100 +- 10
    assert a.offsets[1] == pytest.approx(-100.0) and a.uncertainty[1] == pytest.approx(10.0)


# ------------------------------------------------------------------------------------- ranks
def test_ranks_from_names_from_option_and_through_the_pipeline_group(tmp_path):
    res = simulated("gpipe", 2, 2)
    traces = traces_from(res, "PP")
    for t in traces:
        del t["distributedInfo"]
    paths = write(tmp_path, traces[::-1], names=["trace_rank1.json", "trace_rank_0.json"])
    assert ingest(paths, res.schedule).traces == tuple(paths[::-1])
    unnamed = write(tmp_path, traces, names=["a.json", "b.json"])
    with pytest.raises(MissingRankError, match="give --ranks"):
        ingest(unnamed, res.schedule)
    assert ingest(unnamed, res.schedule, ranks=[0, 1]).traces == tuple(unnamed)
    # torchtitan-style: global ranks 4 and 6 of world 8, pipeline group [4, 6]
    for r, t in zip((4, 6), traces):
        t["distributedInfo"] = {"rank": r, "world_size": 8, "pg_config": [
            {"pg_name": "1", "ranks": [4, 6]}, {"pg_name": "0", "ranks": list(range(8))}]}
    assert len(ingest(write(tmp_path, traces), res.schedule).steps) == 1
    assert rank_from_name("pp-rank12.pt.trace.json.gz") == 12 and rank_from_name("worker3.json") is None


def test_a_missing_or_doubled_rank_is_named(tmp_path):
    res = simulated("gpipe", 3, 2)
    paths = write(tmp_path, traces_from(res, "PP"))
    with pytest.raises(MissingRankError, match=r"no trace for rank\(s\) \[2\]"):
        ingest(paths[:2], res.schedule)
    with pytest.raises(MissingRankError, match="are both rank 0"):
        ingest([paths[0], paths[0], paths[2]], res.schedule)


# ------------------------------------------------------------------------------------- bad traces
def test_truncated_and_broken_files_are_refused_with_the_reason(tmp_path):
    res = simulated("gpipe", 2, 2)
    text = json.dumps(traces_from(res, "PP")[0])
    cut = tmp_path / "rank0.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(TraceReadError, match="truncated"):
        read_trace(cut)
    gz = tmp_path / "rank1.json.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-20])
    with pytest.raises(TraceReadError, match="not a complete gzip file"):
        read_trace(gz)
    for content, message in ((b"\xff\xfe\x00", "not UTF-8"), (b'{"a": 1}', "not a Chrome trace"),
                             (b'{"traceEvents": []}', "no timed events")):
        bad = tmp_path / "bad.json"
        bad.write_bytes(content)
        with pytest.raises(TraceReadError, match=message):
            read_trace(bad)
    with pytest.raises(TraceReadError, match="cannot read"):
        read_trace(tmp_path / "absent.json")


def test_a_trace_cut_anywhere_is_called_truncated(tmp_path):
    """Wherever the cut lands (inside a string the decoder reports the string's start, not the end), the
    reader says the file ends early: the real-trace test cuts at 2/3 and once landed inside a name."""
    text = json.dumps(traces_from(simulated("gpipe", 2, 2), "PP")[0])
    cut = tmp_path / "rank0.json"
    for at in range(1, len(text) - 1, max(1, len(text) // 300)):
        cut.write_text(text[:at])
        with pytest.raises(TraceReadError, match="truncated"):
            read_trace(cut)


def test_the_reader_takes_gzip_event_lists_and_begin_end_pairs(tmp_path):
    events = [{"ph": "B", "name": "PP:0F0", "ts": 10, "pid": 1, "tid": 1},
              {"ph": "X", "name": "inner", "ts": 11, "dur": 2, "pid": 1, "tid": 1},
              {"ph": "E", "ts": 20, "pid": 1, "tid": 1},
              {"ph": "X", "name": "bad", "ts": "soon", "dur": 1, "pid": 1, "tid": 1},
              {"ph": "E", "ts": 30, "pid": 1, "tid": 2}, "not an event"]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(events).encode()))
    t = read_trace(path)
    assert [(s.name, s.start, s.end) for s in t.spans] == [("PP:0F0", 10.0, 20.0), ("inner", 11.0, 13.0)]
    assert t.skipped == 3 and t.rank is None


def test_a_trace_without_pipeline_actions_is_refused(tmp_path):
    res = simulated("gpipe", 2, 2)
    traces = traces_from(res, "PP")
    for t in traces:
        for e in t["traceEvents"]:
            if e.get("name", "").startswith("PP:"):
                e["name"] = "aten::mm"
    with pytest.raises(NoActionsError, match="has no pipeline actions"):
        ingest(write(tmp_path, traces), res.schedule)


def test_a_schedule_that_does_not_match_is_named(tmp_path):
    res = simulated("gpipe", 2, 4)
    paths = write(tmp_path, traces_from(res, "PP"))
    with pytest.raises(ScheduleMismatchError, match=r"8 action\(s\) in the trace that the schedule does not have \(0B2 0B3"):
        ingest(paths, without_updates(schedules.gpipe(2, 2)))
    gp = res.schedule
    swapped = Schedule.build(name="swapped", devices=2, microbatches=4, placement=[1, 0],
                             actions={1: gp.actions[0], 0: gp.actions[1]})
    with pytest.raises(ScheduleMismatchError, match="stage 0 ran on rank 0 but the schedule places it on rank 1"):
        ingest(paths, swapped)


def test_an_action_pattern_must_name_kind_and_micro_batch(tmp_path):
    res = simulated("gpipe", 2, 2)
    paths = write(tmp_path, traces_from(res, "PP"))
    with pytest.raises(ActionPatternError, match="lacks the named group"):
        ingest(paths, res.schedule, action_patterns=[r"fwd_(?P<mb>\d+)"])
    with pytest.raises(ActionPatternError, match="not a regular expression"):
        ingest(paths, res.schedule, action_patterns=["(unclosed"])


def test_an_overlapped_pair_is_split_at_its_first_autograd_event(tmp_path):
    """DualPipeV's (F;B) range: the backward starts at the first autograd engine event inside it."""
    res = simulated("1f1b", 2, 2)
    traces = traces_from(res, "PP")
    ev = traces[1]["traceEvents"]
    f = next(e for e in ev if e.get("name") == "PP:1F1")
    b = next(e for e in ev if e.get("name") == "PP:1B1")
    assert f["ts"] + f["dur"] <= b["ts"] + 1e-3  # F1 then B1 on the last rank: make them one pair
    ev.remove(f), ev.remove(b)
    ev.append(dict(f, name="PP:(1F1;1B1)OVERLAP_F_B", dur=b["ts"] + b["dur"] - f["ts"]))
    ev.append(dict(f, name="autograd::engine::evaluate_function: MseLossBackward0", cat="cpu_op", ts=b["ts"],
                   dur=10.0))
    ing = ingest(write(tmp_path, traces), res.schedule)
    assert_same_run(res, ing)
    ev[:] = [e for e in ev if not e.get("name", "").startswith("autograd")]  # nothing to split at
    with pytest.raises(ScheduleMismatchError, match="missing from the trace"):
        ingest(write(tmp_path, traces), res.schedule)


# ------------------------------------------------------------------------------------- fuzzing
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_give_a_typed_error_or_a_trace(tmp_path, data):
    path = tmp_path / "random.json"
    path.write_bytes(data)
    try:
        read_trace(path)
    except TraceReadError:
        pass


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=4), max_leaves=20)
names = st.sampled_from(["PP:0F0", "PP:1F0", "PP:0B0", "PP:1B0", "PP:1I0", "PP:1W0", "PP:0SEND_F0", "PP:1RECV_F0",
                         "PP:1SEND_B0", "PP:0RECV_B0", "Forward 0", "Backward 0", "c10d::send", "c10d::recv_",
                         "gloo:recv", "gloo:send", "PP:(0F0;1B0)OVERLAP_F_B", "ProfilerStep#1", "aten::mm",
                         "PP:5F0", "PP:2B7", "Forward 9", "PP:(1F0;7I0)OVERLAP_F_B", "PP:3RECV_B1", "PP:0UNSHARD",
                         "autograd::engine::evaluate_function: X", "cudaLaunchKernel", "ncclDevKernel_SendRecv"])
events = st.fixed_dictionaries({"ph": st.sampled_from(["X", "B", "E", "i"]), "name": names,
                                "ts": st.one_of(st.floats(-10, 1e4), st.just(float("nan"))), "dur": st.floats(-1, 1e3),
                                "pid": st.integers(0, 1), "tid": st.integers(0, 1)},
                               optional={"cat": st.sampled_from(["user_annotation", "cpu_op", "kernel", "cuda_runtime"]),
                                         "args": st.one_of(json_values, st.fixed_dictionaries(
                                             {"correlation": json_values, "Input Dims": json_values,
                                              "Concrete Inputs": json_values}))})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(json_values, st.fixed_dictionaries({"traceEvents": st.lists(events, max_size=25)},
                                                    optional={"distributedInfo": json_values,
                                                              "baseTimeNanoseconds": json_values})),
       st.lists(events, max_size=25), st.sampled_from(["gpipe", "interleaved-1f1b", "zbv"]))
def test_random_json_gives_a_typed_error_or_a_valid_result(tmp_path, first, second, name):
    paths = write(tmp_path, [first, {"traceEvents": second}])
    try:
        ing = ingest(paths, without_updates(schedules.generate(name, 2, 2 if name != "gpipe" else 1, chunks=2
                                                               if name == "interleaved-1f1b" else None)))
    except PipesimError:
        return
    assert set(ing.measured.timeline.columns) >= {"device", "stage", "microbatch", "op", "start", "end"}
    assert ing.measured.metrics.makespan >= 0


@st.composite
def damaged_traces(draw):
    """A valid two-rank trace with a few events dropped, renamed, duplicated or moved."""
    res = simulated(draw(st.sampled_from(["gpipe", "1f1b"])), 2, 2)
    traces = traces_from(res, draw(st.sampled_from(["PP", "single", "loose"])))
    for _ in range(draw(st.integers(1, 4))):
        ev = traces[draw(st.integers(0, 1))]["traceEvents"]
        i = draw(st.integers(1, len(ev) - 1))
        how = draw(st.sampled_from(["drop", "rename", "copy", "move"]))
        if how == "drop":
            ev.pop(i)
        elif how == "rename":
            ev[i] = dict(ev[i], name=draw(names))
        elif how == "copy":
            ev.append(dict(ev[i], ts=ev[i]["ts"] + draw(st.sampled_from([0.0, 500.0, 5000.0]))))
        else:
            ev[i] = dict(ev[i], ts=ev[i]["ts"] + draw(st.sampled_from([-3000.0, -200.0, 200.0, 3000.0])))
    return res, traces


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damaged_traces())
def test_a_damaged_trace_gives_a_typed_error_or_a_consistent_run(tmp_path, case):
    res, traces = case
    try:
        ing = ingest(write(tmp_path, traces), res.schedule)
    except PipesimError:
        return
    comp = ing.measured.timeline[ing.measured.timeline["src"] < 0]
    got = sorted(zip(comp["stage"], comp["op"].astype(str), comp["microbatch"]))
    assert got == sorted((a.stage, a.kind.value, a.mb) for a in res.schedule)  # every action once, never guessed
    assert (comp["device"].to_numpy() == [res.schedule.placement[s] for s in comp["stage"]]).all()
    for _, rows in comp.groupby("device"):
        rows = rows.sort_values("start")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-6).all()  # one at a time
    assert ing.measured.metrics.makespan == ing.measured.timeline["end"].max()


# ------------------------------------------------------------------------------------- command line
def test_pipesim_ingest_writes_the_report(tmp_path, capsys):
    res = simulated("interleaved-1f1b", 2, 4, chunks=2)
    paths = write(tmp_path, traces_from(res, "PP"), gz=True)
    out = tmp_path / "out"
    rc = main(["ingest", *paths, "-s", "interleaved-1f1b", "-M", "4", "--chunks", "2", "-o", str(out), "--json",
               "--timeline", str(tmp_path / "tl.csv")])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("predicted_makespan", "measured_makespan", "makespan_error", "predicted_bubble_fraction",
                "measured_bubble_fraction", "start_error_median", "end_error_worst", "idle", "calibration"):
        assert key in d
    assert abs(d["makespan_error"]) < 1e-5  # the trace was written from the simulation it is compared with
    idle = d["idle"]["measured"]
    assert idle["gap_total"] == pytest.approx(0.0, abs=1e-7)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"interleaved-1f1b_K2_M4_ingest{s}" for s in (".md", ".png", ".html", ".json", "_trace.json", "_costs.csv",
                                                      "_hardware.json"))  # .html: the interactive page (issue 24)
    assert "Idle time: where the bubble goes" in (out / "interleaved-1f1b_K2_M4_ingest.md").read_text()
    assert (tmp_path / "tl.csv").exists()


@pytest.mark.parametrize("case", ["truncated", "missing rank", "no actions", "mismatch", "no M", "bad pattern"])
def test_pipesim_ingest_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    res = simulated("gpipe", 2, 4)
    traces = traces_from(res, "PP")
    args = ["-s", "gpipe", "-M", "4"]
    if case == "no actions":
        for t in traces:
            t["traceEvents"] = [e for e in t["traceEvents"] if not e.get("name", "").startswith("PP:")]
    paths = write(tmp_path, traces)
    if case == "truncated":
        text = open(paths[1]).read()
        open(paths[1], "w").write(text[:-40])
    if case == "missing rank":
        paths = paths[:1]
        args += ["-K", "2"]
    if case == "mismatch":
        args = ["-s", "1f1b", "-M", "3"]
    if case == "no M":
        args = ["-s", "gpipe"]
    if case == "bad pattern":
        args += ["--action-pattern", "(?P<kind>x"]
    rc = main(["ingest", *paths, *args, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("pipesim: error: ")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_ingest_needs_no_torch(tmp_path):
    res = simulated("gpipe", 2, 2)
    paths = write(tmp_path, traces_from(res, "PP"))
    code = ("import sys\nfrom sim.cli import main\n"
            f"rc = main(['ingest', {paths[0]!r}, {paths[1]!r}, '-s', 'gpipe', '-M', '2', '-o', {str(tmp_path / 'o')!r}])\n"
            "assert rc == 0, rc\nassert 'torch' not in sys.modules, 'pipesim ingest imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_the_calibration_saves_in_the_simulators_formats_with_its_provenance(tmp_path):
    from sim.model.cost import load_costs
    from sim.model.hardware import load_hardware
    res = simulated("1f1b", 2, 4)
    cal = ingest(write(tmp_path, traces_from(res, "PP")), res.schedule).calibration
    cal.save(tmp_path / "c.csv", tmp_path / "h.json")
    assert load_costs(tmp_path / "c.csv") == cal.costs and load_hardware(tmp_path / "h.json") == cal.hardware
    text = (tmp_path / "c.csv").read_text()
    assert "# stage 0 F: median 0.001 s" in text and "p10" in text and "# links:" in text
