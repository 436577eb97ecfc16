"""A fast-engine run read as arrays gives the figures its rows give: the compiled memory kernel to the last bit
(numpy's fallback where it cannot), and the metrics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import Hardware, jit, schedules, simulate
from sim.results import memory
from sim.model.cost import StageCosts
from sim.schedules.registry import REGISTRY
from sim.results.memory_kernel import memory_peaks
from sim.results.metrics import compute_metrics
from sim.results.timeline import EngineRun

pytest.importorskip("numba")


def _costs(S, *, zero_times=False, kept=None):
    """*kept*: the share of the activations a split B leaves for its W (None: pipesim's default, all of them)."""
    times = 0.0 if zero_times else 1.0
    acts = [1e6 + 0.1 * s for s in range(S)]
    return StageCosts(weight_activation_bytes=None if kept is None else [a * kept for a in acts],
                      forward=[times * (1.0 + 0.1 * s) for s in range(S)], backward=[times * 2.0] * S,
                      weight=[times * 0.5] * S, recompute=[times * 0.9] * S, update=[times * 0.3] * S,
                      send_bytes=[3e5] * S, activation_bytes=acts,
                      checkpoint_bytes=[1e5 / 3] * S, weight_bytes=[5e6 / 7] * S, grad_bytes=[1e6] * S,
                      optimizer_bytes=[2e6] * S)


def _run(schedule, costs, hardware) -> EngineRun:
    run = simulate(schedule, costs, hardware, engine="fast")._timeline
    assert isinstance(run, EngineRun)  # no rows built for the metrics
    return run


def _profiles(schedule, costs, run, capacity, monkeypatch):
    """(numpy's profile of the run's rows, the profile of the run itself through the kernel)."""
    monkeypatch.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
    return memory.memory_profile(schedule, costs, run.rows(), capacity), memory.memory_profile(
        schedule, costs, run, capacity)


def _same(a, b):
    assert a.peak == b.peak  # exact floats: the same sums in the same order
    assert a.peak_inflight == b.peak_inflight
    assert a.weight_versions == b.weight_versions
    assert [str(o) for o in a.overflows] == [str(o) for o in b.overflows]
    assert a.overflows == b.overflows


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)), K=st.integers(1, 4), M=st.integers(1, 9),
       iterations=st.integers(1, 3), recompute=st.booleans(), zero_times=st.booleans(),
       capacity=st.sampled_from([None, 1e6, 4e6, 1e12]), kept=st.sampled_from([None, 0.0, 0.37]))
def test_the_kernel_gives_numpys_profile_and_the_run_its_rows_metrics(name, K, M, iterations, recompute,
                                                                       zero_times, capacity, kept):
    """Every schedule, with recompute, split backwards (W keeping all, none or part of the activations), many
    weight versions (PipeDream), zero-length actions (ties at one instant), overflows, overlapped pairs."""
    try:
        s = schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
    except ValueError:  # not every schedule exists at every size
        return
    costs = _costs(s.stages, zero_times=zero_times, kept=kept)
    run = _run(s, costs, Hardware(devices=K, latency=0.0 if zero_times else 0.1))
    samples = s.total_microbatches
    with pytest.MonkeyPatch.context() as mp:
        expected, got = _profiles(s, costs, run, capacity, mp)
        _same(expected, got)
        # the run's metrics (compiled busy seconds, as the profile's kernel is) are its rows' (numpy's)
        assert compute_metrics(run, got, devices=K, samples=samples) == compute_metrics(
            run.rows(), expected, devices=K, samples=samples)


def test_the_kernel_is_used_for_large_runs_once_numba_is_loaded(monkeypatch):
    s = schedules.pipedream(4, 300)  # thousands of actions, hundreds of weight versions
    costs = _costs(4)
    run = _run(s, costs, Hardware(devices=4, memory_capacity=8e6))
    calls = []
    real = jit.compiled

    def spy(kernel):
        calls.append(kernel)
        return real(kernel)

    monkeypatch.setattr(jit, "compiled", spy)
    expected, got = _profiles(s, costs, run, 8e6, monkeypatch)
    assert memory_peaks in calls
    assert jit.compiled(memory_peaks)(*_kernel_args(s, costs, run), 4 * len(run.keys))[0]  # no fallback taken
    _same(expected, got)
    assert got.overflows  # a real overflow, found the same way
    assert got.usage.equals(expected.usage)  # the step function is numpy's, built on demand


def _kernel_args(s, costs, run):
    return (run.keys, run.device_start, run.start, run.end, s.stages, np.asarray(costs.activation_bytes),
            np.asarray(costs.checkpoint_bytes), np.asarray(costs.kept_after_b() or np.zeros(s.stages)),
            np.asarray(costs.weight_bytes),
            np.asarray(s.placement, dtype=np.int64), np.zeros(s.devices), np.inf)


def test_actions_out_of_run_order_exceed_the_budget_and_numpy_answers(monkeypatch):
    """The kernel sorts by insertion, linear on a run's order; on any other order it gives up past its budget
    (never quadratic), and memory_profile answers with numpy."""
    s = schedules.one_f_one_b(4, 64)
    costs = _costs(4)
    run = _run(s, costs, Hardware(devices=4))
    kernel = jit.compiled(memory_peaks)
    budget = 4 * len(run.keys)
    assert kernel(*_kernel_args(s, costs, run), budget)[0]  # run order: a few moves
    flipped = np.concatenate([np.arange(a, b)[::-1] for a, b in zip(run.device_start[:-1], run.device_start[1:])])
    shuffled = EngineRun(s, run.keys[flipped], run.device[flipped], run.device_start, run.start[flipped],
                         run.end[flipped], run.link[flipped], run.transfer_start[flipped], run.transfer_end[flipped],
                         run.send_to[flipped], run.send_bytes[flipped])
    assert not kernel(*_kernel_args(s, costs, shuffled), budget)[0]  # each device backwards: over budget
    monkeypatch.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
    _same(memory.memory_profile(s, costs, run.rows()), memory.memory_profile(s, costs, shuffled))


def test_zero_length_actions_exercise_the_tie_break(monkeypatch):
    """The comparison above can fail on ties: with every action at t=0 (GPipe, zero costs), frees first keeps a
    device at its static bytes, while allocations first would count all M activations at once. Numpy and the
    kernel both give the former; a kernel with the wrong tie-break would fail the property test."""
    s = schedules.gpipe(2, 4)
    costs = _costs(2, zero_times=True)
    run = _run(s, costs, Hardware(devices=2, latency=0.0))
    static = costs.weight_bytes[0] + costs.grad_bytes[0] + costs.optimizer_bytes[0]
    assert (run.end == 0).all()
    expected, got = _profiles(s, costs, run, None, monkeypatch)
    _same(expected, got)
    assert got.peak[0] == static < static + 4 * costs.activation_bytes[0]
