"""Monte Carlo with the runtime model's costs (issue 27 in sim.engines.sampling): the dispatch overhead holds the
device, is not busy time and is not scaled by any variability source; DualPipeV's overlapped pairs keep their
backward half at the pair's end in every sample's timeline (the p50/p99 Gantt rows); the command line's costs
columns reach the samples. The exactness property (nothing varies -> the fast engine's floats) over these costs is
in ``tests/test_montecarlo.py``.

Bug injection: :func:`_mutant` runs a copy of the sampling kernel with one line of its source changed (interpreted,
on small plans), so each check below is seen failing on the bug it guards.
"""

from __future__ import annotations

import inspect
import json
import textwrap

import numpy as np
import pytest

import sim
from sim.cli import main
from sim.engines import sampling
from sim.engines.plan import make_plan
from sim.engines.sampling import run_samples
from sim.engines.variability import Variability
from sim.search.montecarlo import monte_carlo


def _mutant(old: str, new: str):
    """The sampling kernel (interpreted) with the source line fragment *old* replaced by *new* (exactly once)."""
    source = textwrap.dedent(inspect.getsource(sampling._sample_kernel))
    assert source.count(old) == 1, f"the kernel no longer has {old!r}: update the injected bug"
    names = dict(vars(sampling))
    exec(compile(source.replace(old, new), sampling.__file__, "exec"), names)  # noqa: S102 - a test's own mutant
    return names["_sample_kernel"]


@pytest.fixture
def kernel(monkeypatch):
    """``kernel(None)``: the interpreted kernel as it is; ``kernel(f)``: the sampling calls run *f* instead."""
    def use(function):
        monkeypatch.setattr(sampling, "_compiled_kernel", lambda: function)
    return use


def _dualpipev(*, dispatch=0.0, latency=0.5, overlap=False, K=2, M=4):
    """The issue-27 case: dualpipev K=2 M=4 --latency 0.5 --no-overlap, the command line's costs per chunk."""
    schedule = sim.schedules.generate("dualpipev", K, M, chunks=2)
    costs = sim.uniform(K, forward=1.0, backward=2.0).split_into_chunks(2)
    if dispatch:
        costs = costs.with_dispatch(dispatch)
    return schedule, costs, sim.Hardware(devices=K, latency=latency, overlap=overlap)


# ---------------------------------------------------------------------------------------------- dispatch overhead
def _overhead_problems(arrays, plan) -> list[str]:
    """On one device with no links the device never waits: each sample's makespan is its busy seconds plus every
    action's dispatch overhead, unscaled; the critical path is all of it."""
    total = float(plan.overhead.sum())
    problems = []
    if not np.allclose(arrays.makespan - arrays.busy[:, 0], total, rtol=0, atol=1e-9):
        problems.append(f"makespan - busy = {(arrays.makespan - arrays.busy[:, 0])[:3]}, want {total}")
    if not np.allclose(arrays.critical_seconds[:, 0], arrays.makespan, rtol=1e-12):
        problems.append("the critical path does not hold the whole run")
    return problems


def _one_device_plan():
    schedule = sim.schedules.generate("1f1b", 1, 6)
    costs = sim.uniform(1, forward=1.0, backward=2.0, weight=0.5).with_dispatch({0: {"F": 0.25, "B": 0.5}})
    return make_plan(schedule, costs, sim.Hardware(devices=1))


VARIED = Variability.parse("lognormal:0.3", stragglers=["device=0,factor=2,prob=0.5"])


def test_the_overhead_is_neither_scaled_nor_busy():
    plan = _one_device_plan()
    arrays = run_samples(plan, VARIED, samples=200, seed=3)
    assert arrays.makespan.std() > 0 and (arrays.busy[:, 0] > 0).all()
    assert _overhead_problems(arrays, plan) == []
    # a certain straggler doubles the computations, not the overhead
    slow = run_samples(plan, Variability.parse(None, stragglers=["device=0,factor=2"]), samples=2, seed=0)
    durations = float(plan.durations.sum())
    assert slow.busy[0, 0] == pytest.approx(2 * durations) and slow.makespan[0] == pytest.approx(
        2 * durations + float(plan.overhead.sum()))


@pytest.mark.parametrize("old, new, why", [
    ("work = oh + dur", "work = oh * dev_factor[d] + dur", "a straggler slows the dispatch"),
    ("busy_out[j, d] += dur", "busy_out[j, d] += dur + overhead[i]", "the overhead counted as busy"),
    ("start_of[i] = start  #", "start_of[i] = begin  #", "the critical path without the overhead"),
], ids=["scaled", "busy", "path"])
def test_the_overhead_check_sees_each_bug(kernel, old, new, why):
    plan = _one_device_plan()
    kernel(None)  # the interpreted kernel as it is passes: the failure below is the mutant's
    assert _overhead_problems(run_samples(plan, VARIED, samples=20, seed=3), plan) == []
    kernel(_mutant(old, new))
    assert _overhead_problems(run_samples(plan, VARIED, samples=20, seed=3), plan) != [], why


def _pause_problems() -> list[str]:
    schedule = sim.schedules.gpipe(1, 10)  # 10 x (F 1 s + B 2 s + two dispatches of 0.5 s) = 40 s of work
    costs = sim.uniform(1, forward=1.0, backward=2.0).with_dispatch({0: {"F": 0.5, "B": 0.5}})  # U: none
    mc = monte_carlo(schedule, costs, samples=2, pause="every=4s,length=1s,aligned")
    problems = []
    # pauses at [0,1), [4,5), ...: 3 s of work per 4 s; 39 s done at 52 s, the pause [52,53), the last 1 s: 54 s
    if mc.makespan[0] != pytest.approx(54.0):
        problems.append(f"makespan {mc.makespan[0]}, want 54")
    if mc.arrays.busy[0, 0] != pytest.approx(30.0):  # neither pauses nor the overhead
        problems.append(f"busy {mc.arrays.busy[0, 0]}, want 30")
    boxes = mc.sample_result(0).timeline
    first, third = boxes.iloc[0], boxes.iloc[2]  # F0: the pause [0,1), its dispatch, then it computes; F2 likewise
    if (first.op, first.start, first.end, third.start, third.end) != ("F", 1.5, 2.5, 5.5, 6.5):
        problems.append(f"F0 {first.start}..{first.end}, F2 {third.start}..{third.end}; want 1.5..2.5, 5.5..6.5")
    return problems


@pytest.mark.parametrize("old, new", [
    (None, None),
    ("begin = _paused_end(start, oh, p_every, p_length, phase[d]) if oh > 0.0 else start", "begin = start + oh"),
    ("end = _paused_end(start, work,", "end = oh + _paused_end(start, dur,"),
], ids=["kernel", "box-before-the-pause", "dispatch-not-paused"])
def test_a_pause_stops_the_dispatch_too(kernel, old, new):
    """A pause (GC, a checkpoint write) stops the process, so it stops the runtime's dispatch as well as the
    computation: overhead + duration is the work that pauses interrupt. The mutants pause the computation alone."""
    if old is None:
        assert _pause_problems() == []
    else:
        kernel(_mutant(old, new))
        assert _pause_problems() != []


def test_the_critical_path_accounts_for_every_second_with_overhead_pairs_and_blocking_sends():
    """Followed back from the last end, the path's device seconds (dispatch included) and transfer seconds add up
    to the makespan: every start is the end of what bound it, also a pair's held send."""
    schedule, costs, hw = _dualpipev(dispatch=0.1)
    mc = monte_carlo(schedule, costs, hw, samples=300, variability="lognormal:0.2", links="lognormal:0.5", seed=2)
    a = mc.arrays
    np.testing.assert_allclose(a.critical_seconds.sum(axis=1) + a.critical_link_seconds, a.makespan, rtol=1e-12)


# ---------------------------------------------------------------------------------------------- overlapped pairs
def _pair_rows_problems(result) -> list[str]:
    """Each overlapped pair's backward half starts and ends where the pair (its forward's row) ends."""
    tl = result.timeline
    rows = {(int(r.stage), r.op, int(r.microbatch)): (r.start, r.end) for r in tl.itertuples() if r.op in ("F", "B")}
    schedule = result.schedule
    problems = []
    for i in schedule.fused.tolist():
        f, b = schedule.action_of(int(schedule.keys_array[i])), schedule.action_of(int(schedule.keys_array[i + 1]))
        f_end = rows[(f.stage, "F", f.mb)][1]
        b_start, b_end = rows[(b.stage, "B", b.mb)]
        if not b_start == b_end == f_end:
            problems.append(f"pair ({f};{b}) ends at {f_end}, its backward row spans {b_start}..{b_end}")
    return problems


def test_the_p50_and_p99_gantt_rows_of_pairs_end_with_the_pair():
    """The rows ``--mc-plots`` draws (sim.io.distribution_plots.tail_gantt: the p50 and p99 samples)."""
    schedule, costs, hw = _dualpipev(dispatch=0.05)
    mc = monte_carlo(schedule, costs, hw, samples=200, variability="lognormal:0.2", links="lognormal:0.3", seed=1)
    for q in (0.5, 0.99):
        sample = mc.quantile_sample(q)
        result = mc.sample_result(sample)
        assert result.metrics.makespan == mc.makespan[sample]
        assert _pair_rows_problems(result) == []


def test_the_pair_check_sees_the_old_kernel(kernel):
    """The kernel before this fix ignored the pairs: a blocking pair's forward send held the device before the
    backward half (issue 27's row 3B1 at 7.5 while the pair ends at 7.0)."""
    schedule, costs, hw = _dualpipev()
    kernel(_mutant("if paired[i]:  #", "if False:  #"))
    mc = monte_carlo(schedule, costs, hw, samples=20, seed=1)  # nothing varies: the deterministic rows
    problems = _pair_rows_problems(mc.sample_result(0))
    assert "pair (0F3;3B1) ends at 7.0, its backward row spans 7.5..7.5" in problems


def test_a_sample_with_nothing_varying_has_the_simulated_timeline():
    """Row by row, dispatch overhead (computation boxes start after it) and pairs included."""
    schedule, costs, hw = _dualpipev(dispatch={0: {"F": 0.1}, 3: {"B": 0.2, "W": 0.05}})
    mc = monte_carlo(schedule, costs, hw, samples=5, seed=0)
    sampled = mc.sample_result(3)
    assert sampled.timeline.equals(mc.nominal.timeline)
    assert sampled.metrics.busy == mc.nominal.metrics.busy
    assert (mc.makespan == mc.nominal.metrics.makespan).all()


def test_the_interpreted_kernel_gives_the_compiled_floats(kernel):
    """Everything at once (lognormal compute, link jitter, a straggler, pauses, dispatch, pairs, blocking sends):
    numba's kernel and the plain Python one (no numba) agree to the last bit."""
    if sampling._compiled_kernel() is None:
        pytest.skip("numba is not installed")
    schedule, costs, hw = _dualpipev(dispatch=0.1, K=3, M=6)
    plan = make_plan(schedule, costs, hw)
    var = Variability.parse("lognormal:0.2", links="normal:0.3", stragglers=["device=any,factor=1.5,prob=0.5"],
                            pause="every=3s,length=0.4s")
    compiled = run_samples(plan, var, samples=30, seed=5)
    kernel(None)
    interpreted = run_samples(plan, var, samples=30, seed=5)
    for name in ("makespan", "busy", "on_critical_path", "critical_seconds", "critical_link_seconds"):
        assert np.array_equal(getattr(compiled, name), getattr(interpreted, name)), name


# ---------------------------------------------------------------------------------------------- command line
def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_dispatch_columns_of_a_costs_file_reach_the_samples(tmp_path, capsys):
    costs = tmp_path / "costs.csv"
    costs.write_text("stage,forward,backward,dispatch_forward,dispatch_backward\n"
                     "0,0.5,1.0,0.1,0.2\n1,0.5,1.0,0.1,0.2\n2,0.5,1.0,0.1,0.2\n3,0.5,1.0,0.1,0.2\n")
    shape = ["simulate", "-s", "dualpipev", "-K", "2", "-M", "4", "--latency", "0.5", "--no-overlap", "--costs",
             str(costs), "--json"]
    simulated = _json(capsys, shape)["makespan"]
    sampled = _json(capsys, shape + ["--samples", "20"])
    assert sampled["nominal_makespan"] == simulated
    assert set(sampled["makespan_quantiles"].values()) == {simulated}
    assert sampled["makespan_mean"] == simulated and sampled["makespan_std"] == 0.0
    assert any(n.startswith("dispatch overhead") for n in sampled["notes"])


def test_the_dispatch_flag_reaches_the_samples(capsys):
    shape = ["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--dispatch", "0.1", "--json"]
    simulated = _json(capsys, shape)["makespan"]
    assert _json(capsys, shape + ["--samples", "10"])["makespan_quantiles"]["p50"] == simulated


def test_samples_under_a_rendezvous_runtime_from_the_command_line(capsys):
    """`simulate --runtime torch --samples N` samples the runtime's model: with nothing varied every quantile is the
    one run's makespan under that runtime (not the eager model's); varied, it follows the critical path."""
    shape = ["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--runtime", "torch", "--post-overhead", "0.05",
             "--json"]
    one = _json(capsys, shape)["makespan"]
    eager = _json(capsys, ["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--json"])["makespan"]
    sampled = _json(capsys, shape + ["--samples", "10"])
    assert set(sampled["makespan_quantiles"].values()) == {one} != {eager}
    varied = _json(capsys, shape + ["--samples", "50", "--variability", "lognormal:0.1"])
    assert varied["critical_path"]["slowest_device"] in range(4) and varied["makespan_quantiles"]["p99"] > one
    assert main(["simulate", "-s", "1f1b", "-K", "2", "-M", "4", "--runtime", "torch", "--samples", "10",
                 "--show-comm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipesim: error: ") and "\n" not in err and "--show-comm" in err
