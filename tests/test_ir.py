"""The schedule IR: action text, derived dependencies, and ``Schedule.validate()``'s refusals."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.core.ir import Action, ActionKind, Schedule, ScheduleError

F, B, W, R, U = (ActionKind(k) for k in "FBWRU")


# ------------------------------------------------------------------ action text
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(list(ActionKind)), st.integers(0, 10**6))
def test_action_text_round_trip(stage, kind, mb):
    a = Action(stage, kind, mb)
    text = str(a)
    assert text == f"{stage}{kind.value}{mb}"
    assert Action.parse(text) == a


def test_action_text_examples():
    assert str(Action(2, F, 0)) == "2F0"
    assert Action.parse("2F0") == Action(2, F, 0)
    assert Action.parse(" 13U7 ") == Action(13, U, 7)
    assert repr(Action(1, B, 3)) == "Action(1B3)"


@pytest.mark.parametrize("text", ["", "F0", "2F", "2X0", "2f0", "-1F0", "2F-1", "2 F 0 1", "1I0", "2SEND_F0", "2F0,",
                                  "abc", "2.0F0"])
def test_bad_action_text_raises(text):
    with pytest.raises(ValueError, match="cannot parse action"):
        Action.parse(text)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=8))
def test_parse_raises_only_value_error(text):
    try:
        a = Action.parse(text)
    except ValueError:
        return
    assert Action.parse(str(a)) == a  # whatever parses prints back canonically
    assert a.kind.value in text and a.stage >= 0 and a.mb >= 0


# ----------------------------------------------------------------- dependencies
def test_dependencies_follow_the_ir_rules():
    s = schedules.one_f_one_b(3, 4, recompute=True)
    assert s.dependencies(Action(0, F, 1)) == []
    assert s.dependencies(Action(2, F, 1)) == [Action(1, F, 1)]
    assert s.dependencies(Action(2, B, 1)) == [Action(2, F, 1), Action(2, R, 1)]  # last stage: its own F
    assert s.dependencies(Action(0, B, 1)) == [Action(1, B, 1), Action(0, R, 1)]
    assert s.dependencies(Action(1, R, 3)) == [Action(1, F, 3)]
    assert s.dependencies(Action(1, U, 0)) == [Action(1, B, m) for m in range(4)]


def test_dependencies_with_split_backward_and_updates_per_group():
    # a hand-written 2-stage schedule with B/W split and two updates per stage (g = 2 micro-batches each)
    acts = {0: [Action(0, F, m) for m in range(4)], 1: []}
    for m in range(4):
        acts[1] += [Action(1, F, m), Action(1, B, m), Action(1, W, m)]
    acts[0] += [a for m in range(4) for a in (Action(0, B, m), Action(0, W, m))]
    acts[0] += [Action(0, U, 0), Action(0, U, 1)]
    acts[1] += [Action(1, U, 0), Action(1, U, 1)]
    s = Schedule.build(name="split", devices=2, microbatches=4, actions=acts).validate()
    assert s.split_backward == {(st_, m) for st_ in range(2) for m in range(4)}
    assert s.microbatches_per_update == 2
    assert s.dependencies(Action(0, W, 2)) == [Action(0, B, 2)]
    assert s.dependencies(Action(1, U, 1)) == [Action(1, W, 2), Action(1, W, 3)]


def test_iteration_of_actions():
    s = schedules.gpipe(2, 3, iterations=3)
    assert s.iteration_of(Action(0, F, 5)) == 1
    assert s.iteration_of(Action(1, B, 6)) == 2
    assert [s.iteration_of(Action(0, U, u)) for u in range(3)] == [0, 1, 2]
    p = schedules.pipedream(2, 3, iterations=2)  # one update per micro-batch
    assert p.microbatches_per_update == 1
    assert [p.iteration_of(Action(0, U, u)) for u in range(6)] == [0, 0, 0, 1, 1, 1]


def test_expected_actions_and_text():
    s = schedules.gpipe(2, 2)
    assert s.expected_actions() == set(s)
    assert s.to_text() == "0: 0F0 0F1 0B1 0B0 0U0\n1: 1F0 1F1 1B1 1B0 1U0"
    assert len(s) == 10


# ------------------------------------------------------------------- validation
def _with(schedule: Schedule, device: int, actions) -> Schedule:
    acts = dict(schedule.actions)
    acts[device] = tuple(actions)
    return schedule.replace_actions(acts)


def test_missing_action_is_named():
    s = schedules.gpipe(3, 2)
    broken = _with(s, 1, [a for a in s.actions[1] if a != Action(1, B, 0)])
    with pytest.raises(ScheduleError, match=r"missing.*1B0"):
        broken.validate()


def test_duplicate_action_is_named():
    s = schedules.gpipe(3, 2)
    broken = _with(s, 2, list(s.actions[2]) + [Action(2, F, 1)])
    with pytest.raises(ScheduleError, match=r"more than once.*2F1"):
        broken.validate()


def test_action_on_the_wrong_device_is_named():
    s = schedules.gpipe(3, 2)
    acts = dict(s.actions)
    acts[0] = tuple(a for a in acts[0] if a != Action(0, F, 1))
    acts[1] = (Action(0, F, 1),) + tuple(acts[1])
    with pytest.raises(ScheduleError, match=r"0F1 is on device 1 but stage 0 is placed on device 0"):
        s.replace_actions(acts).validate()


def test_action_outside_the_shape_is_refused():
    s = schedules.gpipe(2, 2)
    with pytest.raises(ScheduleError, match=r"outside the schedule's shape.*0R5"):
        _with(s, 0, list(s.actions[0]) + [Action(0, R, 5)]).validate()
    with pytest.raises(ScheduleError, match="stages 0..1"):
        _with(s, 0, list(s.actions[0]) + [Action(7, F, 0)]).validate()


def test_deadlock_when_a_backward_precedes_its_forward():
    # 1F1B on K=3, M=4: swap device 2's first F and first B, so 2B0 waits for its own 2F0 forever
    s = schedules.one_f_one_b(3, 4)
    acts = list(s.actions[2])
    assert acts[:2] == [Action(2, F, 0), Action(2, B, 0)]
    acts[0], acts[1] = acts[1], acts[0]
    broken = _with(s, 2, acts)
    with pytest.raises(ScheduleError) as info:
        broken.validate()
    message = str(info.value)
    assert "deadlocks" in message
    assert "device 2: 2B0 waits for 2F0" in message
    assert "[2B0]" in message and "<-- stuck" in message  # the device x step grid marks it


def test_deadlock_between_two_devices_names_both():
    # device 0 runs its backward before its second forward; device 1 waits for that forward first
    acts = {0: [Action(0, F, 0), Action(0, B, 1), Action(0, F, 1), Action(0, B, 0), Action(0, U, 0)],
            1: [Action(1, F, 1), Action(1, F, 0), Action(1, B, 0), Action(1, B, 1), Action(1, U, 0)]}
    s = Schedule.build(name="crossed", devices=2, microbatches=2, actions=acts)
    with pytest.raises(ScheduleError) as info:
        s.validate()
    message = str(info.value)
    assert "device 0: 0B1 waits for 1B1" in message
    assert "device 1: 1F1 waits for 0F1" in message
    assert s.find_deadlock() == {0: (Action(0, B, 1), [Action(1, B, 1)]), 1: (Action(1, F, 1), [Action(0, F, 1)])}


def test_validate_returns_the_schedule_and_good_schedules_pass():
    s = schedules.one_f_one_b(4, 8)
    assert s.validate() is s
    assert s.find_deadlock() == {}


def test_schedule_shape_errors():
    with pytest.raises(ScheduleError, match="devices must be a positive integer"):
        Schedule.build(name="x", devices=0, microbatches=1, actions={})
    with pytest.raises(ScheduleError, match="microbatches must be a positive integer"):
        Schedule.build(name="x", devices=1, microbatches=0, actions={})
    with pytest.raises(ScheduleError, match="outside 0..1"):
        Schedule.build(name="x", devices=2, microbatches=1, placement=[0, 2], actions={})
    assert issubclass(ScheduleError, ValueError)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["naive", "gpipe", "1f1b", "pipedream"]), st.integers(1, 6), st.integers(1, 8),
       st.integers(1, 2), st.booleans(), st.randoms(use_true_random=False), st.data())
def test_random_permutations_validate_or_raise_quickly(name, K, M, N, recompute, rng, data):
    s = schedules.generate(name, K, M, iterations=N, recompute=recompute)
    device = data.draw(st.integers(0, K - 1))
    acts = list(s.actions[device])
    rng.shuffle(acts)
    shuffled = _with(s, device, acts)
    try:
        shuffled.validate()
    except ScheduleError as exc:
        assert "deadlocks" in str(exc)
        stuck = shuffled.find_deadlock()
        assert stuck and all(str(a) in str(exc) for a, _ in stuck.values())
        # the stuck action really cannot run: one of its inputs never ran before it
        for dev, (a, unmet) in stuck.items():
            assert unmet and set(unmet) <= set(shuffled.dependencies(a))
    else:
        assert shuffled.find_deadlock() == {}


def test_large_deadlock_is_found_without_hanging():
    s = schedules.one_f_one_b(16, 64)
    acts = list(s.actions[15])
    random.Random(0).shuffle(acts)
    broken = _with(s, 15, acts)
    with pytest.raises(ScheduleError, match="deadlocks"):
        broken.validate()


# ------------------------------------------------------------------ integer arrays, kernel-run validation
def _reference_deadlock(s: Schedule) -> dict:
    """The walk the IR used before the list scheduler found deadlocks (pure Python over Action objects)."""
    done: set = set()
    position = [0] * s.devices
    progress = True
    while progress:
        progress = False
        for d in range(s.devices):
            acts = s.actions[d]
            while position[d] < len(acts) and all(p in done for p in s.dependencies(acts[position[d]])):
                done.add(acts[position[d]])
                position[d] += 1
                progress = True
    return {d: (s.actions[d][position[d]], [p for p in s.dependencies(s.actions[d][position[d]]) if p not in done])
            for d in range(s.devices) if position[d] < len(s.actions[d])}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "zb-h1", "zbv", "interleaved-1f1b"]), st.integers(2, 4),
       st.randoms(use_true_random=False), st.data())
def test_kernel_deadlock_detection_matches_a_plain_walk(name, K, rng, data):
    s = schedules.generate(name, K, 2 * K)
    device = data.draw(st.integers(0, K - 1))
    acts = list(s.actions[device])
    rng.shuffle(acts)
    shuffled = _with(s, device, acts)
    assert shuffled.find_deadlock() == _reference_deadlock(shuffled)


def test_fast_simulation_finds_a_deadlock_without_a_separate_check(monkeypatch):
    """The fast engine's list scheduler stalls on a deadlock and reports it; validate() is not what finds it."""
    from sim import simulate, uniform

    s = schedules.one_f_one_b(3, 4)
    acts = list(s.actions[2])
    acts[0], acts[1] = acts[1], acts[0]
    broken = _with(s, 2, acts)
    monkeypatch.setattr(Schedule, "validate", lambda self: pytest.fail("validate() was called"))
    with pytest.raises(ScheduleError, match=r"deadlocks: .*device 2: 2B0 waits for 2F0") as info:
        simulate(broken, uniform(3), engine="fast")
    assert "<-- stuck" in str(info.value)


def test_schedule_is_its_key_arrays():
    s = schedules.one_f_one_b(3, 4)
    again = Schedule.from_keys(name=s.name, devices=3, microbatches=4, keys=s.keys_array, device_start=s.device_start)
    assert again == s and again.actions == s.actions
    assert [s.key(a) for a in s] == s.keys_array.tolist()
    assert s.device_start.tolist() == [0, 9, 18, 27]
    with pytest.raises(AttributeError, match="immutable"):
        s.name = "x"
    with pytest.raises(ValueError):
        s.keys_array[0] = 1  # read-only arrays
    with pytest.raises(ScheduleError, match="device_start"):
        Schedule.from_keys(name="x", devices=2, microbatches=1, keys=[0, 1], device_start=[0, 3, 2])


def test_schedule_pickles_as_arrays():
    import pickle

    s = schedules.zbv(2, 4)
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.placement == s.placement
    hand = Schedule.build(name="bad", devices=1, microbatches=1, actions={0: ["not an action"]})
    assert len(pickle.loads(pickle.dumps(hand))) == 1


def test_numpy_integers_are_accepted_in_the_placement():
    import numpy as np

    s = Schedule.build(name="x", devices=2, microbatches=1, placement=np.array([0, 1]),
                       actions={0: [Action(0, F, 0), Action(0, B, 0), Action(0, U, 0)],
                                1: [Action(1, F, 0), Action(1, B, 0), Action(1, U, 0)]})
    assert s.validate().placement == (0, 1) and all(type(d) is int for d in s.placement)


def test_a_run_too_large_for_memory_is_refused_before_any_work(monkeypatch):
    import sim.limits
    from sim import TooLargeError
    from sim.errors import PipesimError

    monkeypatch.setattr(sim.limits, "available_memory", lambda: 10**6)  # 1 MB: a few thousand actions
    monkeypatch.setattr(sim.limits, "SMALL_ACTIONS", 0)
    with pytest.raises(TooLargeError, match=r"1f1b with K=64, M=1024.*actions and needs .* GiB, more than") as info:
        schedules.one_f_one_b(64, 1024)
    assert issubclass(TooLargeError, PipesimError) and "\n" not in str(info.value)
    assert schedules.one_f_one_b(2, 2)  # small runs still fit
    with pytest.raises(TooLargeError, match="more than"):
        sim.limits.check_fits(10**12, "x", available=2**30)
    sim.limits.check_fits(10**3, "x", available=2**30)


def test_a_schedule_whose_actions_were_read_keeps_its_overlapped_pairs_through_pickle():
    """Reading ``actions`` caches them, and a pickled schedule with cached actions was rebuilt from them without its
    overlapped pairs: DualPipeV reached the validator's ranks as separate actions."""
    import pickle

    s = schedules.generate("dualpipev", 2, 4)
    assert len(s.fused) == 6
    s.actions
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.fused.tolist() == s.fused.tolist() and back.overlapped == s.overlapped
