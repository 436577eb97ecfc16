"""The memory model: activations in flight, recompute checkpoints, weight state, capacity overflows.

GPipe keeps the activations of all M micro-batches on every stage; 1F1B keeps
min(K-s, M) on stage s (Narayanan et al. 2021; Fan et al., DAPPLE); with recompute a
stage keeps only its M inputs plus one micro-batch's activations, brought back by R
just before its B (GPipe paper, section 2.3).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import Hardware, make_result, schedules, simulate, uniform
from sim.model.cost import StageCosts

ACT, CKPT = 1000.0, 10.0
SHAPES = [(1, 1), (2, 1), (2, 5), (3, 3), (4, 4), (4, 8), (6, 2), (8, 12)]


@pytest.mark.parametrize("K,M", SHAPES)
def test_gpipe_holds_m_microbatches_on_every_stage(K, M):
    r = simulate(schedules.gpipe(K, M), uniform(K, activation_bytes=ACT))
    assert r.metrics.peak_inflight == [M] * K
    assert r.metrics.peak_memory == [M * ACT] * K


@pytest.mark.parametrize("K,M", SHAPES)
def test_1f1b_holds_min_k_minus_s_and_m(K, M):
    r = simulate(schedules.one_f_one_b(K, M), uniform(K, activation_bytes=ACT))
    assert r.metrics.peak_inflight == [min(K - s, M) for s in range(K)]
    assert r.metrics.peak_memory == [min(K - s, M) * ACT for s in range(K)]


@pytest.mark.parametrize("K,M", SHAPES)
def test_naive_holds_one_microbatch(K, M):
    r = simulate(schedules.naive(K, M), uniform(K, activation_bytes=ACT))
    assert r.metrics.peak_inflight == [1] * K
    assert r.metrics.peak_memory == [ACT] * K


@pytest.mark.parametrize("K,M", SHAPES)
def test_gpipe_recompute_keeps_checkpoints_plus_one_activation(K, M):
    costs = uniform(K, activation_bytes=ACT, checkpoint_bytes=CKPT)
    r = simulate(schedules.gpipe(K, M, recompute=True), costs)
    assert r.metrics.peak_memory == [M * CKPT + ACT] * K
    assert r.metrics.peak_inflight == [M] * K  # still M micro-batches in flight, only smaller
    plain = simulate(schedules.gpipe(K, M), costs)
    saved = [p - q for p, q in zip(plain.metrics.peak_memory, r.metrics.peak_memory)]
    assert saved == [M * ACT - (M * CKPT + ACT)] * K


def test_checkpoint_defaults_to_the_bytes_a_stage_receives():
    costs = uniform(3, send_bytes=7.0, activation_bytes=ACT)
    assert costs.checkpoint_bytes == (7.0, 7.0, 7.0)
    r = simulate(schedules.gpipe(3, 4, recompute=True), costs)
    assert r.metrics.peak_memory == [4 * 7.0 + ACT] * 3


def test_static_state_is_held_from_the_start():
    costs = StageCosts(forward=[1, 1], backward=[2, 2], weight_bytes=[100, 200], grad_bytes=[10, 20],
                       optimizer_bytes=[1000, 2000], activation_bytes=[5, 5])
    r = simulate(schedules.gpipe(2, 3), costs)
    usage = r.memory.usage.groupby("device")["bytes"]
    assert list(usage.min()) == [1110, 2220]  # never below the weights, gradients and optimizer state
    assert r.metrics.peak_memory == [1110 + 15, 2220 + 15]
    assert list(usage.last()) == [1110, 2220]  # every activation freed at the end


def test_usage_is_a_step_function_that_matches_the_peak():
    r = simulate(schedules.one_f_one_b(4, 8), uniform(4, activation_bytes=ACT))
    for d, rows in r.memory.usage.groupby("device"):
        times = rows["time"].to_numpy()
        assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
        assert rows["bytes"].max() == r.memory.peak[d]
        assert rows["bytes"].min() >= 0


def test_capacity_overflow_names_device_time_and_excess():
    K, M = 4, 4
    r = simulate(schedules.gpipe(K, M), uniform(K, activation_bytes=10), Hardware(devices=K, memory_capacity=25))
    overflows = r.memory.overflows
    assert [o.device for o in overflows] == list(range(K))
    for o in overflows:
        s = o.device
        # stage s starts F(s,m) at (s+m)*F: over 25 bytes at its third forward, peak at its fourth
        assert o.first_time == s + 2.0
        assert o.peak_time == s + 3.0
        assert o.excess_bytes == 15.0
    assert r.metrics.memory_overflow[1] == "device 1 exceeds its memory capacity by 15 bytes at t=4 (first over at t=3)"


def test_1f1b_overflows_only_on_the_stages_that_hold_more():
    K, M = 4, 4
    r = simulate(schedules.one_f_one_b(K, M), uniform(K, activation_bytes=10), Hardware(devices=K, memory_capacity=25))
    # 1F1B holds min(K-s, M) = 4, 3, 2, 1 micro-batches: only stages 0 and 1 go over 25 bytes
    assert [o.device for o in r.memory.overflows] == [0, 1]
    assert [o.excess_bytes for o in r.memory.overflows] == [15.0, 5.0]
    assert simulate(schedules.one_f_one_b(K, M), uniform(K, activation_bytes=10),
                    Hardware(devices=K, memory_capacity=40)).memory.overflows == []


def test_split_backward_frees_at_w():
    """When B is split, activations stay until W ends."""
    from sim.core.ir import Action, ActionKind, Schedule
    F, B, W, U = (ActionKind(k) for k in "FBWU")
    acts = {0: [Action(0, F, 0), Action(0, B, 0), Action(0, W, 0), Action(0, U, 0)]}
    s = Schedule.build(name="one", devices=1, microbatches=1, actions=acts)
    costs = StageCosts(forward=[1], backward=[2], weight=[3], activation_bytes=[8])
    r = simulate(s, costs)
    usage = r.memory.usage
    assert usage[usage["bytes"] == 8]["time"].min() == 0.0
    assert usage[(usage["time"] > 0) & (usage["bytes"] == 0)]["time"].min() == 6.0  # end of W: 1 + 2 + 3


def test_memory_from_a_measured_timeline():
    """make_result derives the same memory from any timeline, e.g. one that was measured."""
    sim_result = simulate(schedules.one_f_one_b(3, 4), uniform(3, activation_bytes=ACT))
    measured = sim_result.timeline.copy()
    measured[["start", "end"]] = measured[["start", "end"]] * 1.5 + 0.25  # slower and later, same order
    r = make_result(sim_result.schedule, sim_result.costs, sim_result.hardware, measured, source="measured")
    assert r.source == "measured"
    assert r.metrics.peak_inflight == sim_result.metrics.peak_inflight
    assert r.metrics.peak_memory == sim_result.metrics.peak_memory
    assert r.metrics.makespan == pytest.approx(sim_result.metrics.makespan * 1.5 + 0.25)
    # the same step function, on the stretched clock
    for t in np.linspace(0.0, sim_result.metrics.makespan, 97):
        for d in range(3):
            assert _level_at(r.memory.usage, d, 1.5 * t + 0.25) == _level_at(sim_result.memory.usage, d, t)


def _level_at(usage: pd.DataFrame, device: int, t: float) -> float:
    """Bytes held by *device* at time *t* (the last step at or before t)."""
    rows = usage[usage["device"] == device]
    i = np.searchsorted(rows["time"].to_numpy(), t, side="right") - 1
    return float(rows["bytes"].iloc[max(i, 0)])


@pytest.mark.parametrize("split_mbs", [{1}, {0, 2}, {0, 1, 2, 3, 4, 5}])
def test_weight_versions_with_a_partly_split_backward(split_mbs):
    """A micro-batch's backward ends with its W when it has one, else with its B (regression: the version
    count used only W ends as soon as any W existed, reading uninitialized memory for the others)."""
    from sim.core.ir import Action, ActionKind
    K, M = 3, 6
    plain = schedules.pipedream(K, M)
    acts = {}
    for d, order in plain.actions.items():
        acts[d] = []
        for a in order:
            acts[d].append(a)
            if a.kind is ActionKind.B and a.mb in split_mbs:
                acts[d].append(Action(a.stage, ActionKind.W, a.mb))
    split = plain.replace_actions(acts).validate()
    costs = uniform(K, forward=1, backward=1, weight=1, weight_bytes=1)
    expected = simulate(plain, costs).metrics.weight_versions
    assert expected == [3, 2, 1]
    for _ in range(3):  # deterministic
        assert simulate(split, costs).metrics.weight_versions == expected
