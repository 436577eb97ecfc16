"""The two engines (simpy and the exact fast path), jitter, multiple iterations and the invariant checker itself."""

from __future__ import annotations

import pandas as pd
import pytest

from sim import Hardware, ScheduleError, schedules, simulate, uniform
from sim.model.cost import StageCosts
from sim.results.timeline import TIMELINE_COLUMNS, compute_rows, transfer_rows

CASES = [
    ("gpipe", 4, 4, 1, False),
    ("1f1b", 4, 8, 2, True),
    ("pipedream", 3, 5, 2, False),
    ("naive", 3, 2, 2, True),
]


def _costs(K):
    return StageCosts(forward=[1.0 + 0.1 * s for s in range(K)], backward=[2.0 - 0.1 * s for s in range(K)],
                      update=[0.3] * K, send_bytes=[3e5] * K, activation_bytes=[1e6] * K)


def _hw(K, overlap=True):
    latency = [[0.01 * (1 + abs(a - b)) for b in range(K)] for a in range(K)]
    return Hardware(devices=K, latency=latency, bandwidth=1e6, overlap=overlap)


@pytest.mark.parametrize("name,K,M,N,recompute", CASES)
@pytest.mark.parametrize("overlap", [True, False])
def test_fast_and_simpy_timelines_are_identical(check, name, K, M, N, recompute, overlap):
    s = schedules.generate(name, K, M, iterations=N, recompute=recompute)
    fast = simulate(s, _costs(K), _hw(K, overlap), engine="fast")
    slow = simulate(s, _costs(K), _hw(K, overlap), engine="simpy")
    check(fast)
    pd.testing.assert_frame_equal(fast.timeline, slow.timeline, check_exact=True)
    assert fast.metrics == slow.metrics
    assert list(fast.timeline.columns) == TIMELINE_COLUMNS
    assert len(transfer_rows(fast.timeline)) > 0 or K == 1


def test_auto_engine_is_the_fast_one():
    s = schedules.one_f_one_b(4, 4)
    auto = simulate(s, _costs(4), _hw(4))
    fast = simulate(s, _costs(4), _hw(4), engine="fast")
    pd.testing.assert_frame_equal(auto.timeline, fast.timeline, check_exact=True)


def test_no_overlap_delays_the_sender():
    s = schedules.gpipe(4, 4)
    costs = uniform(4, forward=1, backward=2, send_bytes=1e6)
    hw = dict(devices=4, bandwidth=2e6)  # 0.5 s per transfer
    overlapped = simulate(s, costs, Hardware(**hw))
    blocking = simulate(s, costs, Hardware(**hw, overlap=False))
    assert blocking.metrics.makespan > overlapped.metrics.makespan
    comp = compute_rows(blocking.timeline)
    f1 = comp[(comp.device == 0) & (comp.op == "F") & (comp.microbatch == 1)]
    assert f1["start"].item() == 1.5  # after F0 (1 s) and its send (0.5 s)


def test_jitter_changes_times_keeps_invariants_and_is_reproducible(check):
    s = schedules.one_f_one_b(4, 8, iterations=2)
    costs, hw = _costs(4), _hw(4)
    plain = simulate(s, costs, hw, engine="simpy")
    a = simulate(s, costs, hw, jitter=0.2, seed=7)
    b = simulate(s, costs, hw, jitter=0.2, seed=7)
    c = simulate(s, costs, hw, jitter=0.2, seed=8)
    for r in (a, c):
        check(r, exact_durations=False)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    assert not a.timeline["end"].equals(c.timeline["end"])
    assert not a.timeline["end"].equals(plain.timeline["end"])
    durations = compute_rows(a.timeline).eval("end - start")
    nominal = compute_rows(plain.timeline).eval("end - start")
    assert durations.mean() == pytest.approx(nominal.mean(), rel=0.2)  # lognormal with mean 1
    with pytest.raises(AssertionError):  # and durations really moved, so the exact check catches them
        check(a)


def test_engine_arguments_are_checked():
    s = schedules.gpipe(2, 2)
    with pytest.raises(ValueError, match="unknown engine"):
        simulate(s, uniform(2), engine="warp")
    with pytest.raises(ValueError, match="deterministic"):
        simulate(s, uniform(2), engine="fast", jitter=0.1)
    with pytest.raises(ValueError, match="jitter must be >= 0"):
        simulate(s, uniform(2), jitter=-1)
    with pytest.raises(ValueError, match="microbatch_size"):
        simulate(s, uniform(2), microbatch_size=0)
    with pytest.raises(ScheduleError, match="costs describe 3 stages"):
        simulate(s, uniform(3))
    with pytest.raises(ScheduleError, match="hardware has 3 devices"):
        simulate(s, uniform(2), Hardware(devices=3))


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b", "pipedream"])
def test_multiple_iterations(check, name):
    K, M, N = 3, 4, 3
    s = schedules.generate(name, K, M, iterations=N)
    r = simulate(s, _costs(K), _hw(K))
    check(r)  # every action exactly once, iteration column right
    comp = compute_rows(r.timeline)
    fb = comp[comp.op.isin(["F", "B"])]
    assert (fb["iteration"] == fb["microbatch"] // M).all()
    assert sorted(fb.groupby("iteration").size()) == [2 * K * M] * N
    u = comp[comp.op == "U"]
    per_iteration = u.groupby("iteration").size()
    if name == "pipedream":  # an update after every backward
        assert list(per_iteration) == [K * M] * N
    else:  # one update per stage and iteration, after every backward of that iteration
        assert list(per_iteration) == [K] * N
        for (stage, it), rows in u.groupby(["stage", "iteration"]):
            last_b = fb[(fb.stage == stage) & (fb.iteration == it) & (fb.op == "B")]["end"].max()
            assert rows["start"].item() >= last_b
            nxt = fb[(fb.stage == stage) & (fb.iteration == it + 1) & (fb.op == "F")]["start"]
            assert nxt.empty or nxt.min() >= rows["end"].item()


@pytest.mark.parametrize("tamper", ["early", "overlap", "drop", "link", "iteration"])
def test_the_checker_catches_broken_timelines(check, tamper):
    """The invariant checker (tests/conftest.py) must fail on a timeline that breaks a rule."""
    r = simulate(schedules.one_f_one_b(3, 4), uniform(3, send_bytes=1e6), Hardware(devices=3, bandwidth=4e6))
    check(r)
    tl = r.timeline.copy()
    comp = compute_rows(tl)
    if tamper == "early":  # a consumer that starts before its input arrives
        i = comp[(comp.stage == 2) & (comp.op == "F") & (comp.microbatch == 0)].index[0]
        tl.loc[i, ["start", "end"]] -= 0.5
    elif tamper == "overlap":  # two computations of a device at once
        i = comp[(comp.stage == 0) & (comp.op == "F") & (comp.microbatch == 1)].index[0]
        tl.loc[i, ["start", "end"]] = [0.5, 1.5]
    elif tamper == "drop":
        tl = tl.drop(comp.index[3])
    elif tamper == "link":  # two transfers on one link at once
        sends = transfer_rows(tl)
        link = sends[(sends.src == 0) & (sends.dst == 1)].sort_values("start")
        i, j = link.index[:2]
        tl.loc[j, ["start", "end"]] = [tl.loc[i, "start"], tl.loc[i, "end"]]
    else:
        tl.loc[comp.index[0], "iteration"] = 5
    broken = type(r)(r.schedule, r.costs, r.hardware, tl, r.memory, r.metrics)
    with pytest.raises(AssertionError):
        check(broken)


@pytest.mark.parametrize("kwargs", [dict(engine="warp"), dict(jitter=-1.0), dict(jitter=float("nan")),
                                    dict(microbatch_size=0.0), dict(engine="fast", jitter=0.1)])
def test_bad_simulate_options_raise_a_typed_error(kwargs):
    from sim.errors import PipesimError
    from sim.simulate import SimulateError

    with pytest.raises(SimulateError) as info:
        simulate(schedules.gpipe(2, 2), uniform(2), **kwargs)
    assert isinstance(info.value, PipesimError)
