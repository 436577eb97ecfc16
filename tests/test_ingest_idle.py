"""The idle split (validate/compare/idle.py) on hand-built timelines whose answer is known, and on simulations."""

from __future__ import annotations

import pytest

from sim.schedules import registry as generators
from sim import schedules
from sim.core.config import ConfigError
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.core.ir import Action, ActionKind, OP_B, OP_F, OP_SEND_B, OP_SEND_F
from sim.results.result import make_result
from sim.simulate import simulate
from sim.results.timeline import timeline_frame
from validate.compare.idle import CATEGORIES, split_idle
from validate.ingest.flow import without_updates


def hand_built(extra_rows=()):
    """GPipe, K=2, M=1, by hand (seconds):

        device 0: F0 [0, 1]                                   B0 [7, 9]
        device 1:            F1 [3, 4]  B1 [4, 6]
        transfers: F0's activation [1, 2.5] to device 1; B1's gradient [6, 6.5] to device 0.

    Device 1 waits [0, 3] for F1: F0 computing until 1 (dependency 1), its activation in flight until 2.5
    (communication 1.5), then 0.5 with everything there (gap). Device 0 waits [1, 7] for B0: B1 is computed
    at 6 (dependency 5), arrives 6.5 (communication 0.5), gap 0.5. Device 1 after its B1: [6, 9] is the
    drain (dependency 3).
    """
    sched = without_updates(schedules.gpipe(2, 1))
    S = sched.stages
    key = lambda stage, kind, mb: sched.key(Action(stage, kind, mb))  # noqa: E731
    rows = [(0, key(0, ActionKind.F, 0), OP_F, 0.0, 1.0, -1, -1), (1, key(1, ActionKind.F, 0), OP_F, 3.0, 4.0, -1, -1),
            (1, key(1, ActionKind.B, 0), OP_B, 4.0, 6.0, -1, -1), (0, key(0, ActionKind.B, 0), OP_B, 7.0, 9.0, -1, -1),
            (0, key(0, ActionKind.F, 0), OP_SEND_F, 1.0, 2.5, 0, 1), (1, key(1, ActionKind.B, 0), OP_SEND_B, 6.0, 6.5, 1, 0),
            *extra_rows]
    cols = list(zip(*rows))
    tl = timeline_frame(sched, device=cols[0], key=cols[1], op=cols[2], start=cols[3], end=cols[4], src=cols[5],
                        dst=cols[6], nbytes=[0.0] * len(rows))
    assert S == 2
    return make_result(sched, uniform(2), Hardware(devices=2), tl, source="measured")


def test_the_hand_built_run_splits_as_worked_out():
    split = split_idle(hand_built())
    assert split.makespan == 9.0
    assert split.busy == (3.0, 3.0)
    assert split.dependency == pytest.approx((5.0, 1.0 + 3.0))
    assert split.communication == pytest.approx((0.5, 1.5))
    assert split.gap == pytest.approx((0.5, 0.5))


def test_time_inside_a_communication_call_is_communication_not_a_gap():
    split = split_idle(hand_built(), {0: [(6.6, 6.8), (0.2, 0.4)], 1: [(2.6, 2.7)]})
    assert split.communication == pytest.approx((0.7, 1.6))  # (0.2, 0.4) is inside F0: not idle, not counted
    assert split.gap == pytest.approx((0.3, 0.4))
    assert split.dependency == pytest.approx((5.0, 4.0))  # a call while waiting for a dependency stays dependency


def test_without_transfer_rows_the_flight_time_is_a_gap():
    res = hand_built()
    tl = res.timeline[res.timeline["src"] < 0]
    split = split_idle(make_result(res.schedule, res.costs, res.hardware, tl, source="measured"))
    assert split.communication == (0.0, 0.0)
    assert split.gap == pytest.approx((1.0, 2.0))


def _each_schedule():
    for name in generators.names():
        try:
            yield name, schedules.generate(name, 3, 6, chunks=2 if name == "interleaved-1f1b" else None)
        except ConfigError:
            continue


@pytest.mark.parametrize("name,sched", list(_each_schedule()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_simulation_has_no_gaps_and_its_split_adds_up(name, sched):
    costs = uniform(sched.stages, forward=1.0, backward=2.0, weight=0.5 if sched.split_backward else 0.0,
                    update=0.25, send_bytes=1e3)
    free = simulate(sched, costs)
    split = split_idle(free)
    assert split.gap == pytest.approx((0.0,) * sched.devices, abs=1e-12)
    assert split.communication == pytest.approx((0.0,) * sched.devices, abs=1e-12)
    assert split.fraction("dependency") == pytest.approx(free.metrics.bubble_fraction)
    slow = simulate(sched, costs, Hardware(devices=sched.devices, latency=0.3, bandwidth=1e4))
    s = split_idle(slow)
    assert s.total("communication") > 0 and s.gap == pytest.approx((0.0,) * sched.devices, abs=1e-9)
    for d in range(sched.devices):
        assert s.busy[d] + sum(getattr(s, c)[d] for c in CATEGORIES) == pytest.approx(slow.metrics.makespan)


def test_without_overlap_a_simulated_sender_is_busy_communicating():
    sched = schedules.gpipe(2, 2)
    costs = uniform(2, forward=1.0, backward=2.0, send_bytes=1e3)
    res = simulate(sched, costs, Hardware(devices=2, latency=0.5, overlap=False))
    s = split_idle(res)
    assert s.communication[0] > 0 and sum(s.gap) == pytest.approx(0.0, abs=1e-12)
