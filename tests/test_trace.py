"""Chrome traces: Trace Event Format rules, every action once, flows paired and landing on receivers."""

from __future__ import annotations

import copy
import gzip
import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.cli import main
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.results.result import make_result
from sim.simulate import simulate
from sim.results.timeline import compute_rows, empty_timeline, transfer_rows
from sim.io.trace import TraceError, check_trace, chrome_trace, write_trace


def run(name="1f1b", K=4, M=8, *, recompute=False, iterations=1, weight=0.0, **hw):
    costs = uniform(K, forward=1.0, backward=2.0, weight=weight, update=0.25, send_bytes=1000.0,
                    activation_bytes=10.0, weight_bytes=100.0)
    return simulate(schedules.generate(name, K, M, recompute=recompute, iterations=iterations), costs,
                    Hardware(devices=K, **hw))


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def assert_every_row_once(trace, result, pid_base=1):
    """Each timeline row is exactly one X event with its times in microseconds (lanes folded onto their track)."""
    want = Counter()
    for _, r in compute_rows(result.timeline).iterrows():
        want[(pid_base + r["device"], 0, f"{r['stage']}{r['op']}{r['microbatch']}", round(r["start"] * 1e6, 3),
              round(r["end"] * 1e6, 3))] += 1
    for _, r in transfer_rows(result.timeline).iterrows():
        want[(pid_base + r["src"], 1 + r["dst"], f"{r['op']} {r['stage']}{r['op'][-1]}{r['microbatch']}",
              round(r["start"] * 1e6, 3), round(r["end"] * 1e6, 3))] += 1
    got = Counter((e["pid"], e["tid"] % 1000, e["name"], round(e["ts"], 3), round(e["ts"] + e["dur"], 3))
                  for e in x_events(trace) if pid_base <= e["pid"] < pid_base + 1000)
    assert got == want
    assert max(want.values(), default=1) == 1


@pytest.mark.parametrize("kwargs", [
    {},
    {"latency": 0.05, "bandwidth": 4000.0},
    {"name": "gpipe", "recompute": True, "latency": 0.01},
    {"name": "pipedream", "iterations": 2, "latency": 0.01},
    {"name": "zb-h1", "weight": 1.0, "latency": 0.02},
    {"name": "naive", "K": 1, "M": 3},
])
def test_trace_follows_the_rules_and_holds_every_action_once(kwargs):
    r = run(**kwargs)
    trace = chrome_trace(r)
    check_trace(trace)
    assert_every_row_once(trace, r)
    json.dumps(trace, allow_nan=False)
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    starts = Counter(e["id"] for e in flows if e["ph"] == "s")
    finishes = Counter(e["id"] for e in flows if e["ph"] == "f")
    assert starts == finishes and set(starts.values()) <= {1}
    assert len(starts) == len(transfer_rows(r.timeline))  # one arrow per transfer, to its receiver


def test_flow_lands_on_the_receiving_action():
    r = run(latency=0.05)
    trace = chrome_trace(r)
    by_id = {}
    for e in trace["traceEvents"]:
        if e["ph"] in "sf":
            by_id.setdefault(e["id"], {})[e["ph"]] = e
    slices = x_events(trace)
    for pair in by_id.values():
        s, f = pair["s"], pair["f"]
        sender = next(e for e in slices if e["pid"] == s["pid"] and e["tid"] == s["tid"]
                      and e["ts"] <= s["ts"] <= e["ts"] + e["dur"])
        receiver = next(e for e in slices if e["pid"] == f["pid"] and e["tid"] == 0
                        and e["ts"] <= f["ts"] <= e["ts"] + e["dur"])
        assert f["bp"] == "e" and receiver["ts"] >= sender["ts"] + sender["dur"] - 1e-6
        stage, mb = sender["args"]["stage"], sender["args"]["microbatch"]
        if sender["args"]["op"] == "SEND_F":
            assert receiver["name"] == f"{stage + 1}F{mb}"
        else:
            assert receiver["name"] == f"{stage - 1}B{mb}"


def test_names_tracks_and_memory_counters():
    r = run(latency=0.05)
    trace = chrome_trace(r)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {d + 1: f"1f1b: device {d} (stages {d})" for d in range(4)}  # pids from 1
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads[(2, 0)] == "compute" and threads[(2, 1)] == "send to device 0" and threads[(2, 3)] == "send to device 2"
    assert not any("lane" in name for name in threads.values())  # a simulated link never overlaps itself
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == set(range(1, 5))
    peak = {d: max(e["args"]["bytes"] for e in counters if e["pid"] == d + 1) for d in range(4)}
    assert peak == {d: r.metrics.peak_memory[d] for d in range(4)}


def test_merged_trace_of_predicted_and_measured():
    predicted = run(latency=0.05)
    measured = make_result(predicted.schedule, predicted.costs, predicted.hardware, predicted.timeline.assign(
        start=predicted.timeline["start"] * 1.1, end=predicted.timeline["end"] * 1.1), source="measured")
    trace = chrome_trace([predicted, measured])
    check_trace(trace)
    assert_every_row_once(trace, predicted, 1)
    assert_every_row_once(trace, measured, 1001)
    procs = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert len(set(procs)) == 8 and sum(p.startswith("predicted:") for p in procs) == 4
    assert sum(p.startswith("measured:") for p in procs) == 4
    named = chrome_trace([predicted, measured], names=["sim", "gloo"])
    assert {p.split(":")[0] for p in (e["args"]["name"] for e in named["traceEvents"] if e["name"] == "process_name")} \
        == {"sim", "gloo"}
    with pytest.raises(TraceError, match="one name per result"):
        chrome_trace([predicted, measured], names=["x"])
    with pytest.raises(TraceError):
        chrome_trace([])


def test_empty_timeline_trace():
    s = schedules.generate("1f1b", 2, 2)
    empty = make_result(s, uniform(2), Hardware(devices=2), empty_timeline(), source="measured")
    trace = chrome_trace(empty)
    check_trace(trace)
    assert x_events(trace) == []


def _broken(mutate):
    trace = chrome_trace(run(latency=0.05))
    mutate(trace["traceEvents"])
    return trace


@pytest.mark.parametrize("mutate, message", [
    (lambda ev: ev.append({"ph": "X", "name": "a", "pid": 1, "tid": 9, "ts": 1.0}), "lacks"),
    (lambda ev: ev.append({"ph": "X", "name": "a", "pid": 1, "tid": 9, "ts": "1", "dur": 1}), "finite number"),
    (lambda ev: ev.append({"ph": "X", "name": "a", "pid": 1, "tid": 9, "ts": float("nan"), "dur": 1}), "strict JSON"),
    (lambda ev: ev.append({"ph": "X", "name": "a", "pid": 1, "tid": 9, "ts": 1, "dur": -1}), "negative"),
    (lambda ev: ev.append({"ph": "X", "name": "a", "pid": 0, "tid": 9, "ts": 1, "dur": 1}), "pid 0"),
    (lambda ev: ev.extend([{"ph": "X", "name": "a", "pid": 1, "tid": 9, "ts": 0, "dur": 2},
                           {"ph": "X", "name": "b", "pid": 1, "tid": 9, "ts": 1, "dur": 2}]), "overlaps"),
    (lambda ev: ev.remove(next(e for e in ev if e["ph"] == "f")), "only"),
    (lambda ev: ev.append(copy.deepcopy(next(e for e in ev if e["ph"] == "s"))), "two"),
    (lambda ev: next(e for e in ev if e["ph"] == "f").update(ts=-5.0), "before it starts"),
    (lambda ev: next(e for e in ev if e["ph"] == "f").update(tid=7), "lies in no slice"),
    (lambda ev: ev.append({"ph": "M", "name": "process_name", "pid": 1, "args": {}}), "metadata"),
    (lambda ev: ev.append({"ph": "C", "name": "memory", "pid": 1, "ts": 0, "args": {"bytes": "x"}}), "numeric"),
    (lambda ev: ev.append({"ph": "Q", "name": "?"}), "phase"),
])
def test_checker_rejects_broken_traces(mutate, message):
    with pytest.raises(TraceError, match=message):
        check_trace(_broken(mutate))
    with pytest.raises(TraceError):
        check_trace({"events": []})


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(["naive", "gpipe", "1f1b", "pipedream", "zb-h1"]), K=st.integers(1, 5),
       M=st.integers(1, 6), latency=st.sampled_from([0.0, 0.03]), recompute=st.booleans())
def test_any_schedule_gives_a_valid_trace(name, K, M, latency, recompute):
    r = run(name, K, M, recompute=recompute, weight=0.5, latency=latency)
    trace = chrome_trace(r)
    check_trace(trace)
    assert_every_row_once(trace, r)


def _async_sends(result, stretch: float = 4.0):
    """The run as a measured one whose sends overlap on each link, as asynchronous sends do (isend)."""
    tl = result.timeline.copy()
    sends = tl["op"].isin(["SEND_F", "SEND_B"])
    tl.loc[sends, "end"] = tl.loc[sends, "start"] + stretch * (tl.loc[sends, "end"] - tl.loc[sends, "start"])
    return make_result(result.schedule, result.costs, result.hardware, tl, source="measured")


def test_overlapping_sends_get_their_own_lanes_and_no_slice_overlaps():
    measured = _async_sends(run("gpipe", 4, 6, latency=0.2, bandwidth=4000.0))
    tr = transfer_rows(measured.timeline)
    overlapping = any((g["start"].to_numpy()[1:] < g["end"].to_numpy()[:-1]).any()
                      for _, g in tr.sort_values("start").groupby(["src", "dst"]))
    assert overlapping  # the test input really has partially overlapping sends on one link
    trace = chrome_trace(measured)
    check_trace(trace)
    assert_every_row_once(trace, measured)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "send to device 1, lane 2" in names
    # every flow still starts on its transfer's lane and lands on the receiving computation
    sends = {(e["pid"], e["tid"]) for e in x_events(trace) if e["cat"] == "transfer"}
    assert {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "s"} <= sends


def test_checker_catches_the_overlap_that_one_track_per_link_makes():
    trace = chrome_trace(_async_sends(run("gpipe", 4, 6, latency=0.2, bandwidth=4000.0)))
    for e in trace["traceEvents"]:  # the old layout: every send of a link on one thread
        if e.get("cat") in ("transfer", "flow") and e["ph"] != "f":
            e["tid"] %= 1000
    with pytest.raises(TraceError, match="overlaps"):
        check_trace(trace)


def _two_slices(first: tuple[float, float], second_ts: float, second_dur: float = 10.0) -> dict:
    meta = {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "device 0"}}
    return {"traceEvents": [meta] + [
        {"ph": "X", "name": name, "cat": "compute", "pid": 1, "tid": 0, "ts": ts, "dur": dur, "args": {}}
        for name, ts, dur in (("0F0", *first), ("0F1", second_ts, second_dur))]}


def test_checker_reads_ends_at_the_written_resolution():
    # A measured run's back-to-back actions: the float sum 1640.252441 + 369.498536 is 2009.7509770000001,
    # one ulp past the next start; the file says they touch, and a viewer sees them touch.
    check_trace(_two_slices((1640.252441, 369.498536), 2009.750977))
    with pytest.raises(TraceError, match="overlaps"):  # a real overlap of one written unit (1e-6 us) still fails
        check_trace(_two_slices((1640.252441, 369.498537), 2009.750977))


def test_overlapping_measured_computations_get_a_second_lane():
    r = run("1f1b", 2, 3)
    tl = r.timeline.copy()
    first = tl.index[(tl["device"] == 0) & (tl["op"] == "F")][0]
    tl.loc[first, "end"] += 0.5  # a timer glitch: F0 ends after F1 starts
    trace = chrome_trace(make_result(r.schedule, r.costs, r.hardware, tl, source="measured"))
    check_trace(trace)
    assert any(e["args"]["name"].startswith("compute, overlapping") for e in trace["traceEvents"]
               if e["name"] == "thread_name")


def test_write_trace_json_and_gz(tmp_path):
    trace = chrome_trace(run())
    assert json.loads(write_trace(trace, tmp_path / "t.json").read_text()) == trace
    with gzip.open(write_trace(trace, tmp_path / "t.json.gz"), "rt") as fh:
        assert json.load(fh) == trace
    with pytest.raises(TraceError, match=".json"):
        write_trace(trace, tmp_path / "t.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz"]


def test_cli_simulate_trace(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--latency", "0.01", "--activation-bytes", "1e6",
                 "--bandwidth", "1e8", "--trace", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    trace = json.loads(out.read_text())
    check_trace(trace)
    same = simulate(schedules.generate("1f1b", 4, 8), uniform(4, send_bytes=1e6, activation_bytes=1e6),
                    Hardware(devices=4, latency=0.01, bandwidth=1e8))
    assert_every_row_once(trace, same)
    assert max(e["ts"] + e["dur"] for e in x_events(trace)) == pytest.approx(summary["makespan"] * 1e6)
    assert main(["simulate", "--trace", str(tmp_path / "run.csv")]) == 2
    assert capsys.readouterr().err.startswith("pipesim: error: cannot write a trace")

