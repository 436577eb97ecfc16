"""`sim.simulate.simulate_runtime` takes the per-action and per-operation times a trace measures (issue 27: the
one path that plans, lowers and runs a runtime model; `validate.ingest.messages` used to repeat it).

Checked: both engines give the same floats with them (property test); they reach the engines aligned with the
program's batch items (a hand-built alignment gives the same floats; an injected misalignment, sends and receives
swapped, does not); NaN keeps the costs' and hardware's times; bad arrays are refused.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import ScheduleError
from sim.core.comm_lowering import lower
from sim.engines.plan import make_plan
from sim.engines.rendezvous import run_program
from sim.model.runtimes import get_runtime
from sim.simulate import simulate_runtime

from runtime_cases import SHAPES, random_case  # noqa: E402 (tests/runtime_cases.py)



def _case(name, chunks, K, M, seed):
    case = random_case(name, chunks, K, M, seed)
    if case is None:
        return None
    s, costs, hw, rng = case
    n = len(s.compiled.flat.keys)
    nan_some = lambda v: np.where(rng.random(n) < 0.3, np.nan, v)  # noqa: E731
    inputs = {"durations": nan_some(rng.uniform(0.2, 3, n)), "send_call": rng.uniform(0, 0.5, n),
              "recv_call": rng.uniform(0, 0.5, n), "link_seconds": nan_some(rng.uniform(0, 2, n)),
              "link_bound": np.where(rng.random(n) < 0.5, rng.uniform(0, 0.3, n), np.inf),
              "sender_seconds": nan_some(rng.uniform(0, 2, n))}
    return s, costs, hw, inputs


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SHAPES), st.integers(2, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_both_engines_give_the_same_floats_with_measured_inputs(shape, K, M, seed):
    case = _case(*shape, K, M, seed)
    if case is None:
        return
    s, costs, hw, inputs = case
    try:
        fast, fast_run = simulate_runtime(s, costs, hw, runtime="torch", engine="fast", **inputs)
    except ScheduleError:  # a posting order torch cannot run at this shape
        return
    slow, slow_run = simulate_runtime(s, costs, hw, runtime="torch", engine="simpy", **inputs)
    for field in ("start", "end", "transfer_start", "transfer_end"):
        np.testing.assert_array_equal(getattr(fast_run.run, field), getattr(slow_run.run, field), err_msg=field)
    assert fast_run.waits == slow_run.waits
    assert fast_run.pending == slow_run.pending  # the sends waited mid-step, from post to sender's completion
    np.testing.assert_array_equal(fast_run.send_post, slow_run.send_post)
    np.testing.assert_array_equal(fast_run.recv_post, slow_run.recv_post)
    assert fast.metrics.makespan == slow.metrics.makespan


def _by_hand(s, costs, hw, inputs, *, swap: bool = False):
    """What simulate_runtime should run: the plan with the given times put in, the calls aligned by hand."""
    plan = make_plan(s, costs, hw)
    durations = np.where(np.isnan(inputs["durations"]), plan.durations, inputs["durations"])
    seconds = np.minimum(plan.send_seconds, inputs["link_bound"])
    seconds = np.where(np.isnan(inputs["link_seconds"]), seconds, inputs["link_seconds"])
    plan = replace(plan, durations=durations, send_seconds=seconds, _views={})
    program = lower(s, get_runtime("torch").lowering(s))
    send, recv = (inputs["recv_call"], inputs["send_call"]) if swap else (inputs["send_call"], inputs["recv_call"])
    items = [send[i] if i >= 0 else recv[~i] for i in program.batch_item.tolist()]
    sender = np.where(np.isnan(inputs["sender_seconds"]), seconds, inputs["sender_seconds"])
    return run_program(plan, program, eager=False, item_seconds=items, sender_seconds=sender)


def test_the_inputs_reach_the_engine_aligned_with_the_program():
    s, costs, hw, inputs = _case("interleaved-1f1b", 2, 2, 8, 3)
    _, ran = simulate_runtime(s, costs, hw, runtime="torch", **inputs)
    np.testing.assert_array_equal(ran.run.end, _by_hand(s, costs, hw, inputs).run.end)
    # the injected bug: each send given its receive's call time and the other way round
    assert not np.array_equal(ran.run.end, _by_hand(s, costs, hw, inputs, swap=True).run.end)


def test_nan_everywhere_is_the_plain_model():
    s, costs, hw, _ = _case("zbv", 2, 2, 4, 1)
    n = len(s.compiled.flat.keys)
    nan = np.full(n, np.nan)
    plain, plain_run = simulate_runtime(s, costs, hw, runtime="torch")
    same, same_run = simulate_runtime(s, costs, hw, runtime="torch", durations=nan, link_seconds=nan,
                                      sender_seconds=nan, link_bound=np.full(n, np.inf), send_call=np.zeros(n))
    np.testing.assert_array_equal(plain_run.run.end, same_run.run.end)
    assert plain_run.waits == same_run.waits


@pytest.mark.parametrize("field,bad", [("durations", -1.0), ("send_call", np.nan), ("link_seconds", np.inf),
                                       ("recv_call", "short")])
def test_bad_arrays_are_refused(field, bad):
    s, costs, hw, _ = _case("1f1b", 1, 2, 4, 0)
    n = len(s.compiled.flat.keys)
    values = np.zeros(n - 1) if bad == "short" else np.full(n, bad)
    with pytest.raises(ValueError, match=field):
        simulate_runtime(s, costs, hw, runtime="torch", **{field: values})
