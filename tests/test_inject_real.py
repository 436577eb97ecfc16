"""Injection into real workloads (issue 22): real stages padded to drawn durations, the baselines, the spec carried by
the request, and the runtime terms the prediction fits on a measured run (validate.rank.inject, validate.injected)."""

from __future__ import annotations

import math
import pickle
from statistics import NormalDist
from types import SimpleNamespace

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.core.ir import OP_B, OP_F, OP_U, OP_W
from validate.rank import inject as inject_module
from validate.rank.inject import InjectedStage, Injector, low_factor, padded_costs, parse_inject, PAD_HEADROOM
from validate.request import InjectSpec, Job, RunRequest, WorkloadSpec


@settings(max_examples=40, deadline=None)
@given(cv=st.floats(0.01, 2.0))
def test_low_factor_is_the_lognormal_factors_one_in_a_thousand_quantile(cv):
    spec = parse_inject(f"lognormal:{cv}")
    cv = spec.variability().compute.cv  # as parsed (6 significant digits)
    sigma = math.sqrt(math.log1p(cv * cv))
    # the sampler's factor is exp(N(-sigma^2/2, sigma)) (sim.engines.sampling._factor)
    assert NormalDist(-sigma * sigma / 2, sigma).cdf(math.log(low_factor(spec))) == pytest.approx(0.001, rel=1e-6)


def test_low_factor_covers_the_drawn_factors():
    """Of 20,000 draws of the injector, about 1 in 1,000 falls below the margin (binomial: 20 expected, 5 sigma
    bounds 0..43)."""
    spec = parse_inject("lognormal:0.1", seed=1)
    low = low_factor(spec)
    injector = Injector(spec, device=0, devices=1, stages=1)
    below = 0
    for run in range(200):
        below += sum(injector.seconds(1.0, 0, OP_F, mb) < low for mb in range(100))
        injector.next_run()
    assert 0 < below <= 43
    assert low_factor(parse_inject("straggler=device=0,factor=2")) == 1.0  # stragglers only lengthen
    assert low_factor(parse_inject("normal:0.1")) == pytest.approx(1 - 0.1 * 3.090232306, rel=1e-9)
    assert low_factor(parse_inject("normal:2")) == 0.05


def test_padded_costs_are_the_measured_times_with_headroom_over_the_low_factor():
    spec = parse_inject("lognormal:0.1")
    padded = padded_costs({1: {"forward": 0.01, "backward": 0.02, "weight": 0.005, "send_bytes": 9.0}}, spec)
    scale = PAD_HEADROOM / low_factor(spec)
    assert padded == {1: {"forward": pytest.approx(0.01 * scale), "backward": pytest.approx(0.02 * scale),
                          "weight": pytest.approx(0.005 * scale), "recompute": 0.0, "update": 0.0}}


class _Clock:
    """A fake perf_counter: every real computation takes *step* seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Inner:
    """A real stage's stand-in: each call 'computes' by advancing the fake clock."""

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds, self.resets, self.calls = clock, seconds, 0, []

    def _work(self, what):
        self.calls.append(what)
        self.clock.now += self.seconds
        return what

    def forward(self, mb, x, *, keep_graph=True):
        return self._work(("F", mb))

    def backward(self, mb, grad_out, *, split):
        return self._work(("B", mb, split))

    def weight(self, mb):
        self._work(("W", mb))

    def recompute(self, mb):
        self._work(("R", mb))

    def update(self, u):
        self._work(("U", u))

    def reset(self):
        self.resets += 1


class _Sleeper:
    def __init__(self, clock: _Clock) -> None:
        self.clock, self.deadlines = clock, []

    def until(self, deadline: float) -> None:
        self.deadlines.append(deadline)
        self.clock.now = max(self.clock.now, deadline)


def _stage(monkeypatch, spec, *, compute=0.001, device=1):
    clock = _Clock()
    monkeypatch.setattr(inject_module.time, "perf_counter", clock)
    padded = {"forward": 0.01, "backward": 0.02, "weight": 0.005, "recompute": 0.01, "update": 0.002}
    inner = _Inner(clock, compute)
    stage = InjectedStage(inner, 1, padded, Injector(spec, device, 2, 2), _Sleeper(clock))
    return stage, inner, clock


def test_a_real_action_lasts_its_padded_cost_times_the_simulators_draw(monkeypatch):
    spec = parse_inject("lognormal:0.2;straggler=device=1,factor=1.5,prob=0.5", seed=4)
    stage, inner, clock = _stage(monkeypatch, spec)
    mc = sim.monte_carlo(sim.schedules.one_f_one_b(2, 2), sim.uniform(2, forward=1, backward=1), samples=3,
                         variability=spec.variability(), seed=4)
    assert mc.samples == 3
    reference = Injector(spec, 1, 2, 2)
    for run in range(3):
        t0 = clock.now
        assert stage.forward(0, None) == ("F", 0)  # the real computation's result, passed on
        assert clock.now - t0 == pytest.approx(reference.seconds(0.01, 1, OP_F, 0), rel=1e-12)
        t0 = clock.now
        stage.backward(0, None, split=False)  # unsplit: the weight gradient's baseline too
        assert clock.now - t0 == pytest.approx(reference.seconds(0.025, 1, OP_B, 0), rel=1e-12)
        t0 = clock.now
        stage.backward(1, None, split=True)
        stage.weight(1)
        assert clock.now - t0 == pytest.approx(reference.seconds(0.02, 1, OP_B, 1) + reference.seconds(0.005, 1, OP_W, 1),
                                               rel=1e-12)
        t0 = clock.now
        stage.update(0)
        assert clock.now - t0 == pytest.approx(reference.seconds(0.002, 1, OP_U, 0), rel=1e-12)
        stage.reset()  # the next run draws the next sample
        reference.next_run()
    assert inner.resets == 3 and len(inner.calls) == 15
    # the straggler struck device 1 in some of these runs and not in others: the draws are the runs', not fixed
    factors = []
    probe = Injector(spec, 1, 2, 2)
    for _ in range(12):
        factors.append(probe._factor)
        probe.next_run()
    assert {1.0, 1.5} <= set(factors)


def test_a_computation_longer_than_its_draw_is_not_cut(monkeypatch):
    """Real compute cannot be shortened: an overrun lasts its real time (the sleeper's deadline is in the past)."""
    stage, inner, clock = _stage(monkeypatch, parse_inject("lognormal:0.1"), compute=0.5)
    t0 = clock.now
    stage.forward(0, None)
    assert clock.now - t0 == pytest.approx(0.5)


def test_settle_padding_covers_the_longest_real_computation_and_never_lowers(monkeypatch):
    spec = parse_inject("lognormal:0.1")
    stage, inner, clock = _stage(monkeypatch, spec, compute=0.002)
    scale = PAD_HEADROOM / low_factor(spec)
    assert 0.002 * scale < 0.01  # the baselines below start above what a 2 ms computation needs
    stage.forward(0, None)
    inner.seconds = 0.004
    stage.forward(1, None)  # the longest forward seen
    inner.seconds = 0.002
    stage.backward(0, None, split=False)  # unsplit B: 2 ms * scale < P(B) + P(W) = 25 ms, kept
    stage.update(0)
    settled = stage.settle_padding()
    assert settled["forward"] == pytest.approx(max(0.01, 0.004 * scale))
    assert settled["backward"] == 0.02 and settled["weight"] == 0.005
    assert settled["update"] == pytest.approx(max(0.002, 0.002 * scale))
    assert settled["recompute"] == 0.01  # never ran: unchanged
    assert stage.padded == settled and not stage.real  # the timed runs use it; the record starts afresh
    inner.seconds = 0.05
    stage.backward(1, None, split=False)  # 50 ms unsplit: B + W raised together, in proportion
    settled = stage.settle_padding()
    assert settled["backward"] + settled["weight"] == pytest.approx(0.05 * scale)
    assert settled["backward"] / settled["weight"] == pytest.approx(4.0)
    inner.seconds = 0.001
    stage.forward(2, None)
    assert stage.settle_padding()["forward"] == pytest.approx(max(0.01, 0.004 * scale))  # never lowered


def test_the_inject_spec_travels_in_the_request():
    spec = parse_inject("lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2", seed=5)
    request = RunRequest(jobs=(Job(schedule=sim.schedules.one_f_one_b(2, 2)),), workload=WorkloadSpec(),
                         inject=spec)
    back = pickle.loads(pickle.dumps(request))
    assert back.inject == spec and isinstance(back.inject, InjectSpec)
    assert not hasattr(inject_module, "ENVIRONMENT")  # no PIPESIM_INJECT: the request is the one way in


def _fake_report(schedule, costs, overhead, latency, spec, run):
    """A 'measured' run that is the simulator's own sample *run* with dispatch *overhead* and link *latency*, and
    that overhead per stage: runtime_terms must recover both."""
    letters = {"forward": "F", "backward": "B", "weight": "W", "recompute": "R", "update": "U"}
    per_stage = {s: {c: overhead for c in letters} for s in range(schedule.stages)}
    truth = costs.with_dispatch({s: {letters[c]: v for c, v in per.items()} for s, per in per_stage.items()})
    hardware = sim.Hardware(devices=schedule.devices, latency=latency, bandwidth=1e9)
    mc = sim.monte_carlo(schedule, truth, hardware, samples=run + 1, variability=spec.variability(), seed=spec.seed)
    measured = mc.sample_result(run)
    return measured, per_stage


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_runtime_terms_recover_the_dispatch_overhead_and_hop_latency_of_a_known_run(name):
    pytest.importorskip("torch")
    from validate.injected import run_of_timeline, runtime_terms

    schedule = sim.schedules.generate(name, 4, 8)
    costs = sim.uniform(4, forward=0.02, backward=0.02, weight=0.02 if name == "zb-h1" else 0.0,
                        send_bytes=65536.0)
    spec = parse_inject("lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2", seed=2)
    measured, overhead = _fake_report(schedule, costs, 3e-4, 4e-4, spec, run=3)
    timeline = measured.timeline
    assert (timeline[timeline.op == "F"].end > 0).any()
    fitted = sim.Hardware(devices=4, latency=1e-6, bandwidth=1e9)  # the ping-pong's: only its bandwidth is kept

    def terms(measured, overhead, sample, runs=1):
        run = run_of_timeline(schedule, measured.timeline, sample)
        return runtime_terms(schedule, [run] * runs, costs, spec, fitted, overhead)

    dispatch, latency, notes = terms(measured, overhead, 3)
    assert latency == pytest.approx(4e-4, abs=1e-9)
    for per in dispatch.values():
        for op, value in per.items():
            assert value == pytest.approx(3e-4, abs=1e-9), op  # the overhead; the draws realised exactly
    assert "hop latency 0.400 ms" in notes[1]
    assert terms(measured, overhead, 3, runs=3)[1] == pytest.approx(4e-4, abs=1e-9)  # pooled over runs
    # the bug the fit guards: gaps taken whole, the consumer's overhead kept in them, say 0.7 ms: such gaps are
    # those of a run without overhead and a latency of 0.7 ms, which the fit must tell apart
    alike, none = _fake_report(schedule, costs, 0.0, 7e-4, spec, run=3)
    assert terms(alike, none, 3)[1] == pytest.approx(7e-4, abs=1e-9)
    # other draws than the run's: the realised-minus-drawn part no longer vanishes
    assert max(v for per in terms(measured, overhead, 4)[0].values() for v in per.values()) > 4e-4


def test_runs_of_traces_put_every_rank_on_rank_0s_clock():
    pytest.importorskip("torch")
    from validate.injected import runs_of_traces

    trace = lambda rank, at: SimpleNamespace(rank=rank, compute=[(rank, at, at + 1.0)], overhead=[(rank, 1e-4)])
    ranks = [SimpleNamespace(rank=0, traces=[trace(0, 5.0), trace(0, 7.0)]),
             SimpleNamespace(rank=1, traces=[trace(1, 6.0), trace(1, 8.0)])]
    runs = runs_of_traces(ranks, [0.0, 0.5], first=2)
    assert [r.sample for r in runs] == [2, 3]
    assert runs[1].actions == {0: (0, 7.0, 8.0), 1: (1, 7.5, 8.5)}
    assert runs[0].overhead == ((0, 1e-4), (1, 1e-4))


@pytest.mark.slow
def test_an_injected_mlp_run_pads_real_stages_and_predicts_its_distribution(tmp_path):
    pytest.importorskip("torch")
    from validate.run import run_validation

    report = run_validation("1f1b", 2, 2, workload="mlp", workload_options={"width": 64, "batch": 8},
                            output_dir=tmp_path, inject="lognormal:0.2;straggler=device=any,factor=2,prob=0.3",
                            iterations_timed=30, warmup=2)
    assert report.gradients_match  # padding waits; the gradients are the real ones
    c = report.distribution
    assert c.measured_samples == 30 and np.std(report.makespans) > 0
    # every run drew the simulator's sample (warm-up + run index): paired errors are the model's alone; the coarse
    # bound a loaded 2-core machine allows (the benchmark measures the figures)
    assert abs(c.paired_error) < 0.15
    assert any("hop latency" in n for n in c.notes)
    stem = str(report.paths["report"]).removesuffix(".md")  # the report's stem names its distribution files
    assert Path(stem + "_distribution.md").exists() and Path(stem + "_distribution_cdf.png").exists()
