"""DeepSpeed's TrainSchedule stream (sim/model/deepspeed_pipeline.py): the port against the source's own rules, and
its execution with blocking, paired broadcasts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model import deepspeed_pipeline as dp
from sim.model.deepspeed_pipeline import (BACKWARD, FORWARD, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD,
                                          DeepSpeedScheduleError, execute, train_schedule)

sizes = st.tuples(st.integers(1, 9), st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(sizes)
def test_stream_follows_the_sources_step_rule(pm):
    """TrainSchedule: 2 (M + p - 1) steps, at most one pass a step; stage s runs F(m) at step 2m + s and B(m) at
    step 2m + 2p - 1 - s (schedule.py _step_to_micro_batch); every micro-batch once each way; the end-of-batch
    instructions on the last step only."""
    p, M = pm
    for s in range(p):
        steps = train_schedule(p, M, s)
        assert len(steps) == 2 * (M + p - 1)
        for k, cmds in enumerate(steps):
            passes = [i for i in cmds if i.name in (FORWARD, BACKWARD)]
            assert len(passes) <= 1
            for i in passes:
                expected = 2 * i.micro_batch + s if i.name == FORWARD else 2 * i.micro_batch + 2 * p - 1 - s
                assert k == expected, (s, k, i)
            assert ("OptimizerStep" in [i.name for i in cmds]) == (k == len(steps) - 1)
        names = [(i.name, i.micro_batch) for c in steps for i in c if i.name in (FORWARD, BACKWARD)]
        assert sorted(names) == sorted([(FORWARD, m) for m in range(M)] + [(BACKWARD, m) for m in range(M)])


@settings(max_examples=60, deadline=None)
@given(sizes)
def test_each_step_talks_to_one_neighbour_and_every_transfer_has_its_pair(pm):
    """A forward step exchanges only with the previous stage, a backward step only with the next; each send has
    the matching receive on the neighbour in the same step (the source's "must be paired" rule)."""
    p, M = pm
    streams = [train_schedule(p, M, s) for s in range(p)]
    peer_of = {RECV_ACT: -1, SEND_GRAD: -1, SEND_ACT: +1, RECV_GRAD: +1}
    pair = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}
    for s in range(p):
        for k, cmds in enumerate(streams[s]):
            comms = [i for i in cmds if i.name in peer_of]
            assert len({peer_of[i.name] for i in comms}) <= 1
            for i in comms:
                other = streams[s + peer_of[i.name]][k]
                assert [(o.name, o.micro_batch) for o in other if o.name == pair[i.name]] == [(pair[i.name],
                                                                                             i.micro_batch)]


@settings(max_examples=40, deadline=None)
@given(sizes, st.floats(0.1, 5.0), st.floats(0.1, 5.0))
def test_without_transfers_the_stream_takes_one_f1b_time(pm, f, b):
    """With free transfers and equal stages the lock-stepped stream takes (M + p - 1)(F + B), the 1F1B time
    (Narayanan et al. 2021 section 2.2.1): the step structure itself costs nothing."""
    p, M = pm
    t = execute([f] * p, [b] * p, [0.0] * (p - 1), M)
    assert t.makespan == pytest.approx((M + p - 1) * (f + b))
    assert t.busy == pytest.approx([M * (f + b)] * p)
    assert t.transfers == 2 * M * (p - 1)


def test_transfers_run_one_after_the_other():
    """Each blocking broadcast holds both stages: p = 2, M = 1, F = B = 1, c = 0.5: stage 0 F, send (0.5),
    stage 1 F + B, send back (0.5), stage 0 B: 4 + 2 x 0.5."""
    assert execute([1.0, 1.0], [1.0, 1.0], [0.5], 1).makespan == pytest.approx(5.0)
    # and a slower link can only slow it
    slow = execute([1.0] * 4, [3.0] * 4, [0.4] * 3, 8).makespan
    fast = execute([1.0] * 4, [3.0] * 4, [0.1] * 3, 8).makespan
    assert slow > fast > (8 + 3) * 4.0


def test_a_mispaired_stream_is_a_deadlock_not_a_hang(monkeypatch):
    """Injected bug: the backward step's exchanges in the opposite order (receive the gradient before sending the
    activation) while the neighbour keeps the source's order: both wait; execute must say so and stop."""
    original = dp.train_schedule

    def swapped(stages, micro_batches, stage):
        steps = original(stages, micro_batches, stage)
        out = []
        for cmds in steps:
            names = [i.name for i in cmds]
            if SEND_ACT in names and RECV_GRAD in names:
                a, g = names.index(SEND_ACT), names.index(RECV_GRAD)
                cmds = list(cmds)
                cmds[a], cmds[g] = cmds[g], cmds[a]
            out.append(cmds)
        return out

    monkeypatch.setattr(dp, "train_schedule", swapped)
    with pytest.raises(DeepSpeedScheduleError, match="deadlock"):
        execute([1.0] * 3, [2.0] * 3, [0.1] * 2, 4)


def test_bad_sizes_are_refused():
    with pytest.raises(DeepSpeedScheduleError):
        train_schedule(0, 4, 0)
    with pytest.raises(DeepSpeedScheduleError):
        train_schedule(4, 4, 4)
    with pytest.raises(DeepSpeedScheduleError):
        execute([1.0, 1.0], [1.0], [0.1], 2)


@settings(max_examples=40, deadline=None)
@given(sizes, st.data())
def test_with_free_transfers_the_stream_is_the_simulators_1f1b(pm, data):
    """Cross-check against the simulator: with unequal stages and free transfers, TrainSchedule's stream has the
    1F1B order on every stage (p - s forwards first, then one backward, one forward) and adds no dependency
    beyond it, so its makespan equals the exact engine's 1F1B with blocking sends."""
    from sim import schedules
    from sim.model.hardware import Hardware
    from sim.model.cost import StageCosts
    from sim.simulate import simulate

    p, M = pm
    times = st.floats(0.1, 4.0, allow_nan=False)
    f = [data.draw(times) for _ in range(p)]
    b = [data.draw(times) for _ in range(p)]
    costs = StageCosts(forward=f, backward=b, weight=[0.0] * p, recompute=[0.0] * p, send_bytes=[0.0] * p)
    expected = simulate(schedules.generate("1f1b", p, M), costs, Hardware(devices=p, latency=0.0, overlap=False))
    assert execute(f, b, [0.0] * (p - 1), M).makespan == pytest.approx(expected.metrics.makespan)
