"""Dispatch overhead: a cost in the costs file, and what calibration measures from a run's gaps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import Hardware, schedules, simulate
from sim.simulate import simulate_runtime
from sim.model.cost import DISPATCH_COLUMNS, CostsError, StageCosts, load_costs, save_costs
from validate.compare.idle import split_idle
from validate.predict.calibrate import dispatch_overhead


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"]), st.integers(2, 4), st.integers(0, 2**31 - 1),
       st.sampled_from(["pipesim", "torch"]))
def test_calibration_recovers_the_dispatch_a_run_was_simulated_with(name, K, seed, runtime):
    """The gap before an action is exactly its dispatch overhead in a simulation (the engines spend it once the
    inputs are there), so measuring a simulated run gives back the table it was simulated with."""
    s = schedules.generate(name, K, 2 * K, chunks=2 if name == "interleaved-1f1b" else None)
    rng = np.random.default_rng(seed)
    S = s.stages
    costs = StageCosts(forward=rng.uniform(1, 2, S).tolist(), backward=rng.uniform(1, 3, S).tolist(),
                       weight=rng.uniform(0.5, 1, S).tolist(), send_bytes=[1e5] * S,
                       **{c: rng.uniform(0.01, 0.2, S).tolist() for c in DISPATCH_COLUMNS})
    r, ran = simulate_runtime(s, costs, Hardware(devices=K, latency=0.05, bandwidth=1e7), runtime=runtime)
    measured = dispatch_overhead([(r, ran.waits)])  # a wait is a communication call, as in a trace
    table = costs.dispatch_table()
    kinds = "FBWRU"
    for stage, per in measured.items():
        for kind, seconds in per.items():
            assert math.isclose(seconds, table[stage][kinds.index(kind)], rel_tol=1e-9, abs_tol=1e-12)


def test_a_run_without_dispatch_measures_none():
    s = schedules.one_f_one_b(3, 6)
    r = simulate(s, StageCosts(forward=[1.0] * 3, backward=[2.0] * 3, send_bytes=[1e5] * 3),
                 Hardware(devices=3, latency=0.1, bandwidth=1e7))
    assert all(v == 0.0 for per in dispatch_overhead([(r, None)]).values() for v in per.values())
    assert split_idle(r).total("gap") == 0.0


def test_the_idle_split_shows_dispatch_as_gap():
    s = schedules.gpipe(2, 4)
    costs = StageCosts(forward=[1.0, 1.0], backward=[2.0, 2.0], dispatch_forward=[0.25, 0.25])
    split = split_idle(simulate(s, costs, Hardware(devices=2)))
    assert split.total("gap") == pytest.approx(8 * 0.25)  # 4 forwards on each of 2 devices


def test_the_costs_file_round_trips_the_dispatch_columns(tmp_path):
    costs = StageCosts(forward=[1.0, 2.0], backward=[2.0, 3.0], dispatch_forward=[1e-4, 2e-4],
                       dispatch_update=[5e-5, 0.0])
    path = save_costs(costs, tmp_path / "c.csv")
    assert "dispatch_forward" in path.read_text().splitlines()[0]
    assert load_costs(path) == costs
    plain = save_costs(StageCosts(forward=[1.0], backward=[2.0]), tmp_path / "p.csv")
    assert "dispatch" not in plain.read_text()  # files without overhead look as before


def test_the_dispatch_shorthand_column_and_its_refusals(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("stage,forward,dispatch,dispatch_backward\n0,1.0,0.5,0.25\n")
    c = load_costs(f)
    assert (c.dispatch_forward, c.dispatch_backward, c.dispatch_weight) == ((0.5,), (0.25,), (0.5,))
    f.write_text("stage,forward,dispatch_forward\n0,1.0,-1\n")
    with pytest.raises(CostsError, match="negative"):
        load_costs(f)


def test_dispatch_on_the_command_line(tmp_path):
    import json
    import subprocess
    import sys

    run = lambda *extra: json.loads(subprocess.run(  # noqa: E731
        [sys.executable, "-m", "sim", "simulate", "-s", "gpipe", "-K", "2", "-M", "2", "--json", *extra],
        capture_output=True, text=True, check=True).stdout)
    plain, charged = run(), run("--dispatch", "0.5")
    # the critical path runs 7 actions back to back: F0, F1 (stage 0), F1, B1 (stage 1), B1, B0, U (stage 0)
    assert charged["makespan"] == plain["makespan"] + 0.5 * 7
    assert charged["busy"] == plain["busy"]
    bad = subprocess.run([sys.executable, "-m", "sim", "simulate", "--dispatch", "-1"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("pipesim: error:") and len(bad.stderr.splitlines()) == 1


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(2, 4), st.floats(1e-4, 0.5))
def test_rendezvous_link_time_round_trips(name, K, latency):
    """A simulated torch run, read as a trace would be (transfer rows, waits as communication calls), gives back
    its link time for every message timed from its later post."""
    from validate.predict.calibrate import rendezvous_link_seconds

    s = schedules.generate(name, K, 2 * K)
    costs = StageCosts(forward=[1.0] * K, backward=[2.0] * K, send_bytes=[1e3] * K)
    r, ran = simulate_runtime(s, costs, Hardware(devices=K, latency=latency), runtime="torch")
    samples = rendezvous_link_seconds([(r, ran.waits)])
    assert samples and all(math.isclose(x, latency, rel_tol=1e-9) for x in samples)
    assert rendezvous_link_seconds([(r, None)]) == []  # no calls known: nothing timed


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), st.integers(2, 3), st.floats(1e-4, 0.2))
def test_post_overhead_round_trips(name, K, post):
    """Each post holds its device for the post overhead, and is a communication call: the calls of a simulated
    run that saw no arrival all last exactly that long."""
    from validate.predict.calibrate import post_call_seconds

    s = schedules.generate(name, K, 2 * K, chunks=2 if name == "interleaved-1f1b" else None)
    costs = StageCosts(forward=[1.0] * s.stages, backward=[2.0] * s.stages, send_bytes=[1e3] * s.stages)
    hw = Hardware(devices=K, latency=0.05)
    r, ran = simulate_runtime(s, costs, hw, runtime="torch", post_overhead=post)
    samples = post_call_seconds([(r, ran.waits)])
    assert samples and all(math.isclose(x, post, rel_tol=1e-9) for x in samples)
    assert r.metrics.makespan > simulate(s, costs, hw, runtime="torch").metrics.makespan  # posts cost time
    assert split_idle(r, ran.waits).total("communication") > split_idle(
        *(lambda x: (x[0], x[1].waits))(simulate_runtime(s, costs, hw, runtime="torch"))).total("communication")


@pytest.mark.parametrize("bad", [-1e-3, math.inf, math.nan])
def test_a_bad_post_overhead_is_refused(bad):
    from sim.simulate import SimulateError

    with pytest.raises(SimulateError, match="post_overhead"):
        simulate(schedules.gpipe(2, 2), StageCosts(forward=[1.0] * 2, backward=[1.0] * 2), runtime="torch",
                 post_overhead=bad)
