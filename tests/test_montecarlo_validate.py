"""Distributions checked against measured runs: the KS distance and quantile errors, the injection of the emulated
workload (the same draws as the simulator's samples), and a validator launch with --inject."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.engines.variability import VariabilityError
from validate.compare.distributions import compare_distributions, ks_distance, median_interval
from validate.rank.inject import InjectSpec, Injector, parse_inject


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.integers(0, 20), min_size=1, max_size=30), b=st.lists(st.integers(0, 20), min_size=1, max_size=30))
def test_ks_distance_is_the_largest_gap_between_the_two_cdfs(a, b):
    a, b = np.array(a, float), np.array(b, float)
    grid = np.arange(-1, 22)  # every value, and one below: the sup over a step function is at its jumps
    gaps = [abs(np.mean(a <= x) - np.mean(b <= x)) for x in grid]
    assert ks_distance(a, b) == pytest.approx(max(gaps))


@pytest.mark.parametrize("n,r,coverage", [(4, 1, 0.875), (5, 1, 0.9375), (10, 2, 1 - 2 * 11 / 1024),
                                          (11, 3, 1 - 2 * 67 / 2048), (40, 15, None)])
def test_median_interval_is_the_sign_tests(n, r, coverage):
    """The order statistics x_(r) and x_(n+1-r) with the largest r that covers 90%: 1 - 2 P(Bin(n, 1/2) <= r - 1)
    (Conover 3.2), computed here from the binomial directly."""
    import math
    values = np.random.default_rng(n).permutation(np.arange(1.0, n + 1))  # order statistic k is k
    lo, hi, got = median_interval(values)
    tail = sum(math.comb(n, k) for k in range(r)) / 2 ** n
    assert (lo, hi) == (r, n + 1 - r) and got == pytest.approx(1 - 2 * tail)
    if coverage is not None:
        assert got == pytest.approx(coverage)
    assert got >= 0.9 or n < 5  # one more value dropped at each end would fall below 90%
    assert 1 - 2 * (tail + math.comb(n, r) / 2 ** n) < 0.9 or r == (n + 1) // 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=60), st.sampled_from([0.5, 0.8, 0.9, 0.95]))
def test_median_interval_holds_the_median_and_its_coverage(values, confidence):
    lo, hi, coverage = median_interval(values, confidence)
    assert lo <= float(np.median(values)) <= hi and min(values) <= lo and hi <= max(values)
    assert coverage >= confidence or (lo, hi) == (min(values), max(values))  # too few values: the whole range


def test_median_interval_covers_the_true_median_as_often_as_it_says():
    """Drawn samples of 20 from a skewed distribution (lognormal: median 1): the interval holds the true median in
    the share of trials its coverage gives (95.9%), not fewer (an interval one value narrower at each end: 88.5%)."""
    rng = np.random.default_rng(7)
    trials = [median_interval(rng.lognormal(0.0, 0.3, 20)) for _ in range(4000)]
    held = np.mean([lo <= 1.0 <= hi for lo, hi, _ in trials])
    assert trials[0][2] == pytest.approx(0.9586, abs=1e-4) and held == pytest.approx(0.9586, abs=0.012)
    with pytest.raises(sim.PipesimError, match="at least one value"):
        median_interval([])
    with pytest.raises(sim.PipesimError, match="confidence"):
        median_interval([1.0], 1.5)


def test_comparison_figures():
    rng = np.random.default_rng(0)
    predicted = rng.lognormal(0, 0.1, 4000)
    same = compare_distributions(predicted, rng.lognormal(0, 0.1, 400))
    assert same.consistent and same.ks < 0.08 and abs(same.p50_error) < 0.02
    slower = compare_distributions(predicted, 1.1 * rng.lognormal(0, 0.1, 400))
    assert not slower.consistent and slower.p50_error == pytest.approx(0.1, abs=0.02)
    assert compare_distributions(predicted, predicted).ks == 0
    paired = compare_distributions(predicted, 1.03 * predicted[:50], paired=predicted[:50])
    assert paired.paired_error == pytest.approx(0.03) and paired.paired_range == pytest.approx((0.03, 0.03))
    assert "Paired" in "\n".join(paired.lines())
    with pytest.raises(sim.PipesimError, match="one per run"):
        compare_distributions(predicted, predicted[:50], paired=predicted[:40])
    with pytest.raises(sim.PipesimError):
        compare_distributions(predicted, [1.0])


def test_inject_specifications():
    spec = parse_inject("lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2", seed=3)
    assert spec.compute == "lognormal:0.1" and spec.stragglers == ("device=any,factor=1.5,prob=0.2",)
    assert InjectSpec.from_json(spec.to_json()) == spec
    for bad in ("gamma:1", "lognormal:0.1;normal:0.2", "straggler=device=1", "pause=every=1s,length=1ms"):
        with pytest.raises(VariabilityError):
            parse_inject(bad)


def test_an_injected_run_waits_what_the_simulators_sample_draws():
    """One device, no links: a run's makespan is the sum of its waits, which must equal the Monte Carlo sample of the
    same number (same seed): the emulated workload and the prediction share their random numbers."""
    schedule = sim.schedules.one_f_one_b(1, 6)
    costs = sim.uniform(1, forward=1.0, backward=2.0, update=0.5)
    spec = parse_inject("lognormal:0.2;straggler=device=0,factor=3,prob=0.5", seed=7)
    mc = sim.monte_carlo(schedule, costs, samples=12, variability=spec.variability(), seed=7)
    injector = Injector(spec, device=0, devices=1, stages=1)
    for run in range(12):
        total = 0.0
        for a in schedule.actions[0]:
            base = costs.cost(a.stage, a.kind, split=False)
            total += injector.seconds(base, a.stage, "FBWRU".index(a.kind.value), a.mb)
        assert total == pytest.approx(mc.makespan[run], rel=1e-12)
        injector.next_run()
    assert len(set(np.round(mc.makespan, 9))) > 1  # the runs do differ


def test_the_emulated_stage_waits_for_the_injected_draws():
    pytest.importorskip("torch")
    import torch

    from validate.rank.workloads import EmulatedStage, rank_setup
    from validate.request import WorkloadSpec

    schedule = sim.schedules.one_f_one_b(2, 2)
    costs = sim.uniform(2, forward=0.001, backward=0.002)
    spec = parse_inject("straggler=device=1,factor=2", seed=0)
    setup = rank_setup(WorkloadSpec(name="emulated"), schedule, 1, torch.device("cpu"), costs, inject=spec)
    stage = setup.runtimes[1]
    assert isinstance(stage, EmulatedStage) and stage.inject is not None
    assert stage._cost(0.001, 0, 0) == pytest.approx(0.002)  # device 1 is the straggler: twice as long
    run = stage.inject.run
    stage.reset()
    assert stage.inject.run == run + 1
    plain = rank_setup(WorkloadSpec(name="emulated"), schedule, 1, torch.device("cpu"), costs).runtimes[1]
    assert plain.inject is None and plain._cost(0.001, 0, 0) == 0.001


def test_the_validator_refuses_what_it_cannot_inject():
    pytest.importorskip("torch")
    from validate.run import run_validation

    with pytest.raises(sim.PipesimError, match="links and pauses are not injected"):
        run_validation("1f1b", 2, 2, workload="mlp", inject="pause=every=1s,length=1ms", output_dir=None)
    with pytest.raises(sim.PipesimError, match=">= 30"):
        run_validation("1f1b", 2, 2, workload="emulated", inject="lognormal:0.1", iterations_timed=5,
                       output_dir=None)


@pytest.mark.slow
def test_a_launch_with_injection_reports_the_distributions(tmp_path):
    pytest.importorskip("torch")
    from validate.run import run_validation

    costs = sim.uniform(2, forward=0.004, backward=0.008)
    report = run_validation("1f1b", 2, 2, workload="emulated", costs=costs, output_dir=tmp_path,
                            inject="lognormal:0.3;straggler=device=any,factor=2,prob=0.3", iterations_timed=30,
                            warmup=1)
    c = report.distribution
    assert c.measured_samples == 30 and c.predicted_samples >= 1000
    assert len(report.makespans) == 30
    assert np.std(report.makespans) > 0  # the waits were drawn, not fixed
    # the coarse agreement a loaded 2-core machine allows (the benchmark measures the real figures)
    assert abs(c.p50_error) < 0.25
    # each run drew the simulator's sample (warm-up + run index): paired, the errors are the model's alone
    assert abs(c.paired_error) < 0.15 and c.paired_range[1] - c.paired_range[0] < 0.3
    stem = str(report.paths["report"]).removesuffix(".md")  # the report's stem names its distribution files
    assert Path(stem + "_distribution.md").exists() and Path(stem + "_distribution_cdf.png").exists()
    assert report.to_dict()["distribution"]["ks"] == c.ks
