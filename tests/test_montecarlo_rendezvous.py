"""Monte Carlo under the torch and megatron runtime profiles (rendezvous links, their posting points): exact against
the deterministic rendezvous engine when nothing varies, and the same draws as the eager kernel (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.core.comm_lowering import lower
from sim.engines.plan import make_plan
from sim.engines.rendezvous import run_program
from sim.engines.sampling import draw_samples
from sim.model.runtimes import get_runtime
from sim.search.montecarlo import MonteCarloError, make_variability
from sim.simulate import simulate_runtime

VARIED = dict(variability="lognormal:0.2", links="lognormal:0.1", stragglers=["device=any,factor=1.5,prob=0.3"],
              slow_links=["src=0,dst=1,factor=2,prob=0.5"])


def _case(name, K, M, f, b, w, latency):
    schedule = sim.schedules.generate(name, K, M)
    costs = sim.uniform(schedule.stages, forward=f, backward=b, weight=w if name.startswith("zb") else 0.0,
                        send_bytes=1e6)
    hardware = sim.Hardware(devices=K, latency=latency, bandwidth=1e9)
    return schedule, costs, hardware


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "gpipe", "zb-h1"]), K=st.integers(2, 4), M=st.integers(1, 6),
       f=st.floats(0.001, 0.05), b=st.floats(0.001, 0.05), w=st.floats(0.0, 0.02), latency=st.floats(0.0, 0.01),
       runtime=st.sampled_from(["torch", "megatron"]), post=st.sampled_from([0.0, 1e-4]))
def test_with_nothing_varied_every_sample_is_the_rendezvous_engines_run(name, K, M, f, b, w, latency, runtime, post):
    if name == "zb-h1" and M < K:
        M = K  # zb-h1 needs M >= K
    schedule, costs, hardware = _case(name, K, M, f, b, w, latency)
    try:
        expected, _ = simulate_runtime(schedule, costs, hardware, runtime=runtime, post_overhead=post)
    except sim.PipesimError:  # a posting order this runtime cannot match: Monte Carlo refuses it the same way
        with pytest.raises(sim.PipesimError):
            sim.monte_carlo(schedule, costs, hardware, samples=2, runtime=runtime, post_overhead=post)
        return
    mc = sim.monte_carlo(schedule, costs, hardware, samples=3, runtime=runtime, post_overhead=post, seed=1)
    assert (mc.makespan == expected.metrics.makespan).all()  # to the last bit
    assert mc.nominal.metrics.makespan == expected.metrics.makespan
    again = mc.sample_result(2).timeline
    assert np.array_equal(again["end"].to_numpy(), expected.timeline["end"].to_numpy())
    busy = mc.arrays.busy[0]
    assert busy.sum() == pytest.approx(sum(expected.metrics.busy), rel=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "gpipe", "zb-h1"]), K=st.integers(2, 4), M=st.integers(4, 8),
       latency=st.floats(0.0, 0.005), seed=st.integers(0, 1000))
def test_the_draws_are_the_eager_kernels_draws(name, K, M, latency, seed):
    """Walked by the rendezvous engine under pipesim's own (eager) lowering, the drawn samples give the eager
    kernel's makespans exactly: the two draw the same numbers (a different straggler, factor or link draw fails)."""
    schedule, costs, hardware = _case(name, K, M, 0.01, 0.02, 0.01, latency)
    mc = sim.monte_carlo(schedule, costs, hardware, samples=20, seed=seed, **VARIED)
    plan = make_plan(schedule, costs, hardware)
    program = lower(schedule, get_runtime("pipesim").lowering(schedule), blocking_sends=False)
    durations, sends = draw_samples(plan, mc.variability, first=0, count=20, seed=seed)
    from dataclasses import replace
    walked = [run_program(replace(plan, durations=durations[j], send_seconds=sends[j], _views={}), program,
                          eager=True).run.makespan for j in range(20)]
    assert np.array_equal(np.array(walked), mc.makespan)
    assert np.allclose(durations.sum(axis=1), mc.arrays.busy.sum(axis=1), rtol=1e-12)
    # and a part of the draws: samples 5..9 drawn alone are rows 5..9
    part, _ = draw_samples(plan, mc.variability, first=5, count=5, seed=seed)
    assert np.array_equal(part, durations[5:10])


def test_rendezvous_samples_vary_and_share_the_eager_draws():
    schedule, costs, hardware = _case("1f1b", 4, 8, 0.01, 0.02, 0.0, 1e-3)
    eager = sim.monte_carlo(schedule, costs, hardware, samples=200, seed=3, **VARIED)
    torch_ = sim.monte_carlo(schedule, costs, hardware, samples=200, seed=3, runtime="torch", **VARIED)
    assert np.std(torch_.makespan) > 0
    # the same draws: the runtimes' per-sample makespans move together (common random numbers)
    assert np.corrcoef(eager.makespan, torch_.makespan)[0, 1] > 0.9
    assert np.array_equal(eager.arrays.busy, torch_.arrays.busy) or np.allclose(eager.arrays.busy, torch_.arrays.busy,
                                                                                rtol=1e-12)
    d = torch_.summary()
    assert d["runtime"] == "torch" and d["critical_path"]["slowest_device"] is not None
    assert any("rendezvous engine" in n for n in d["notes"])
    from sim.cli.montecarlo_options import format_samples
    assert "on critical path" in format_samples(torch_).split("note")[0]


def test_pauses_are_refused_under_a_rendezvous_runtime():
    schedule, costs, hardware = _case("1f1b", 2, 4, 0.01, 0.02, 0.0, 0.0)
    with pytest.raises(MonteCarloError, match="pause"):
        sim.monte_carlo(schedule, costs, hardware, samples=5, runtime="torch", pause="every=0.5s,length=20ms")
    with pytest.raises(sim.PipesimError, match="pause"):
        draw_samples(make_plan(schedule, costs, hardware), make_variability(pause="every=0.5s,length=20ms"),
                     first=0, count=1, seed=0)
