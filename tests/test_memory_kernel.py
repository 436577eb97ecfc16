"""The compiled memory kernel gives numpy's memory profile to the last bit, and falls back where it cannot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import Hardware, jit, schedules, simulate
from sim import fastpath, memory
from sim.cost import StageCosts
from sim.generators import REGISTRY
from sim.memory_kernel import memory_peaks
from sim.timeline import TimelineRows

pytest.importorskip("numba")


def _costs(S, *, zero_times=False):
    times = 0.0 if zero_times else 1.0
    return StageCosts(forward=[times * (1.0 + 0.1 * s) for s in range(S)], backward=[times * 2.0] * S,
                      weight=[times * 0.5] * S, recompute=[times * 0.9] * S, update=[times * 0.3] * S,
                      send_bytes=[3e5] * S, activation_bytes=[1e6 + 0.1 * s for s in range(S)],
                      checkpoint_bytes=[1e5 / 3] * S, weight_bytes=[5e6 / 7] * S, grad_bytes=[1e6] * S,
                      optimizer_bytes=[2e6] * S)


def _profiles(schedule, costs, rows, capacity, monkeypatch):
    """(numpy's profile, the kernel's profile) of the same rows."""
    monkeypatch.setattr(fastpath, "COMPILE_MIN_ACTIONS", 10**12)
    expected = memory.memory_profile(schedule, costs, rows, capacity)
    monkeypatch.setattr(fastpath, "COMPILE_MIN_ACTIONS", 0)
    return expected, memory.memory_profile(schedule, costs, rows, capacity)


def _same(a, b):
    assert a.peak == b.peak  # exact floats: the same sums in the same order
    assert a.peak_inflight == b.peak_inflight
    assert a.weight_versions == b.weight_versions
    assert [str(o) for o in a.overflows] == [str(o) for o in b.overflows]
    assert a.overflows == b.overflows


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)), K=st.integers(1, 4), M=st.integers(1, 9),
       iterations=st.integers(1, 3), recompute=st.booleans(), zero_times=st.booleans(),
       capacity=st.sampled_from([None, 1e6, 4e6, 1e12]))
def test_the_kernel_gives_numpys_profile(name, K, M, iterations, recompute, zero_times, capacity):
    """Every schedule, with recompute, split backwards, many weight versions (PipeDream), zero-length actions
    (ties at one instant) and overflows."""
    try:
        s = schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
    except ValueError:  # not every schedule exists at every size
        return
    costs = _costs(s.stages, zero_times=zero_times)
    rows = simulate(s, costs, Hardware(devices=K, latency=0.0 if zero_times else 0.1), engine="fast").rows
    with pytest.MonkeyPatch.context() as mp:
        expected, got = _profiles(s, costs, rows, capacity, mp)
    _same(expected, got)


def test_the_kernel_is_used_for_large_runs_once_numba_is_loaded(monkeypatch):
    s = schedules.pipedream(4, 300)  # thousands of actions, hundreds of weight versions
    costs = _costs(4)
    rows = simulate(s, costs, Hardware(devices=4, memory_capacity=8e6)).rows
    calls = []
    real = jit.compiled

    def spy(kernel):
        calls.append(kernel)
        return real(kernel)

    monkeypatch.setattr(jit, "compiled", spy)
    expected, got = _profiles(s, costs, rows, 8e6, monkeypatch)
    assert memory_peaks in calls
    _same(expected, got)
    assert got.overflows  # a real overflow, found the same way
    assert got.usage.equals(expected.usage)  # the step function is numpy's, built on demand


def test_rows_far_from_run_order_fall_back_to_numpy(monkeypatch):
    """A measured timeline may list its rows in any order: the kernel's sort gives up, numpy answers."""
    s = schedules.one_f_one_b(4, 64)
    costs = _costs(4)
    rows = simulate(s, costs, Hardware(devices=4)).rows
    reverse = np.arange(len(rows))[::-1].copy()
    backwards = TimelineRows(**{f: getattr(rows, f)[reverse] for f in rows.__dataclass_fields__})
    placement = np.asarray(s.placement, dtype=np.int64)
    args = (np.asarray(costs.activation_bytes), np.asarray(costs.checkpoint_bytes),
            np.asarray(costs.weight_bytes), placement, np.zeros(4), np.inf)
    columns = lambda r: (r.device, r.stage, r.microbatch, r.op, r.start, r.end, r.src)  # noqa: E731
    kernel = jit.compiled(memory_peaks)
    assert kernel(*columns(rows), *args, 4 * len(rows))[0]  # run order: a few moves
    assert not kernel(*columns(backwards), *args, 4 * len(rows))[0]  # reversed: over budget, says so
    expected, got = _profiles(s, costs, backwards, None, monkeypatch)
    _same(expected, got)
    _same(expected, memory.memory_profile(s, costs, rows))  # row order does not change the answer


def test_zero_length_actions_exercise_the_tie_break():
    """The comparison above can fail on ties: with every action at t=0 (GPipe, zero costs), frees first keeps a
    device at its static bytes, while allocations first would count all M activations at once. Numpy and the
    kernel both give the former; a kernel with the wrong tie-break would fail the property test."""
    s = schedules.gpipe(2, 4)
    costs = _costs(2, zero_times=True)
    rows = simulate(s, costs, Hardware(devices=2, latency=0.0)).rows
    static = costs.weight_bytes[0] + costs.grad_bytes[0] + costs.optimizer_bytes[0]
    assert (rows.end == 0).all()
    with pytest.MonkeyPatch.context() as mp:
        expected, got = _profiles(s, costs, rows, None, mp)
    _same(expected, got)
    assert got.peak[0] == static < static + 4 * costs.activation_bytes[0]
