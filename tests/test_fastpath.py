"""The fast engine's kernel: compiled (numba) and interpreted runs agree exactly, its flat arrays, its fallbacks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import Hardware, schedules, simulate
from sim.core import listsched
from sim import jit
from sim.model.cost import StageCosts
from sim.schedules.registry import REGISTRY
from sim.results.memory import memory_profile
from sim.engines.plan import make_plan

numba = pytest.importorskip("numba")


def _costs(S):
    return StageCosts(forward=[1.0 + 0.1 * s for s in range(S)], backward=[2.0 - 0.1 * s for s in range(S)],
                      weight=[0.7] * S, recompute=[0.9] * S, update=[0.3] * S, send_bytes=[3e5] * S,
                      activation_bytes=[1e6] * S, checkpoint_bytes=[1e5] * S, weight_bytes=[5e6] * S)


def _hw(K, overlap=True):
    latency = [[0.01 * (1 + abs(a - b)) for b in range(K)] for a in range(K)]
    return Hardware(devices=K, latency=latency, bandwidth=1e6, overlap=overlap, memory_capacity=2e7)


def _run(schedule, costs, hw, *, compiled: bool, monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_MIN_ACTIONS", 0 if compiled else 10**12)
    return simulate(schedule, costs, hw, engine="fast")


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)), K=st.integers(1, 4), M=st.integers(1, 9),
       iterations=st.integers(1, 2), recompute=st.booleans(), overlap=st.booleans())
def test_compiled_and_interpreted_kernels_give_identical_timelines(name, K, M, iterations, recompute, overlap):
    try:
        s = schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
    except ValueError:  # not every schedule exists at every size
        return
    costs, hw = _costs(s.stages), _hw(K, overlap)
    with pytest.MonkeyPatch.context() as mp:
        fast = _run(s, costs, hw, compiled=True, monkeypatch=mp)
        slow = _run(s, costs, hw, compiled=False, monkeypatch=mp)
    pd.testing.assert_frame_equal(fast.timeline, slow.timeline, check_exact=True)
    assert fast.metrics == slow.metrics


@pytest.mark.parametrize("name,K,M,recompute,overlap", [
    ("1f1b", 4, 8, True, False), ("zb-h1", 3, 6, False, True), ("pipedream", 3, 5, False, True),
    ("interleaved-1f1b", 2, 4, False, False),
])
def test_compiled_kernel_matches_the_simpy_engine(check, name, K, M, recompute, overlap, monkeypatch):
    s = schedules.generate(name, K, M, iterations=2, recompute=recompute)
    costs, hw = _costs(s.stages), _hw(K, overlap)
    fast = _run(s, costs, hw, compiled=True, monkeypatch=monkeypatch)
    check(fast)
    slow = simulate(s, costs, hw, engine="simpy")
    pd.testing.assert_frame_equal(fast.timeline, slow.timeline, check_exact=True)
    assert fast.metrics == slow.metrics


def test_large_schedules_use_the_compiled_kernel(monkeypatch):
    monkeypatch.setattr(jit, "_kernels", {})
    small = schedules.one_f_one_b(2, 4)
    simulate(small, _costs(2), engine="fast")
    assert listsched._list_schedule not in jit._kernels  # below the threshold the kernel is not even compiled
    monkeypatch.setattr(jit, "COMPILE_MIN_ACTIONS", len(small))
    simulate(small, _costs(2), engine="fast")
    assert jit._kernels[listsched._list_schedule] is not None


def test_flat_arrays_describe_the_compiled_dependencies():
    s = schedules.generate("zb-h1", 3, 4, recompute=False)
    comp = s.compiled
    flat = comp.flat
    n = len(flat.keys)
    assert flat.keys.tolist() == [k for keys in comp.keys for k in keys]
    for i, key in enumerate(flat.keys.tolist()):
        assert flat.device[i] == next(d for d, keys in enumerate(comp.keys) if key in keys)
        slots = flat.dep_slot[flat.dep_start[i]:flat.dep_start[i + 1]].tolist()
        decoded = [int(flat.keys[p]) if p < n else ~int(flat.keys[p - n]) for p in slots]
        assert tuple(decoded) == comp.deps[key]
        assert flat.send_to[i] == comp.sends.get(key, -1)
    assert comp.flat is flat  # built once per schedule


def test_plan_keeps_the_per_key_views_for_the_simpy_engine():
    s = schedules.one_f_one_b(3, 2)
    costs, hw = _costs(3), _hw(3)
    plan = make_plan(s, costs, hw)
    assert set(plan.duration) == {s.key(a) for a in s}
    assert plan.duration[s.key(s.actions[2][0])] == 1.2  # 2F0: forward of stage 2
    f0 = s.key(s.actions[0][0])
    src, dst, seconds = plan.transfer[f0]
    assert (src, dst) == (0, 1) and seconds == hw.transfer_time(0, 1, 3e5)
    assert set(plan.transfer) == set(s.compiled.sends)


def test_kernel_compiles_without_a_disk_cache(monkeypatch):
    """numba raises RuntimeError at decoration when no cache directory is writable: compile per process instead."""
    real = numba.njit

    def njit(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function '_list_schedule': no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", njit)
    monkeypatch.setattr(jit, "_kernels", {})
    monkeypatch.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
    s = schedules.one_f_one_b(2, 3)
    assert listsched._compiled_kernel() is not None
    r = simulate(s, _costs(2), engine="fast")
    assert r.metrics.makespan > 0


def test_interpreted_kernel_when_compiling_does_not_pay():
    s = schedules.one_f_one_b(3, 4)
    with jit.compile_above(10**12):  # never compile: the same function, interpreted over lists
        r = simulate(s, _costs(3), _hw(3), engine="fast")
    expected = simulate(s, _costs(3), _hw(3), engine="simpy")
    pd.testing.assert_frame_equal(r.timeline, expected.timeline, check_exact=True)


def test_importing_the_cli_loads_neither_numba_nor_torch():
    code = "import sys, sim.cli; assert 'numba' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_reads_string_and_categorical_op_columns_alike():
    s = schedules.generate("pipedream", 3, 4, iterations=2, recompute=True)
    costs = _costs(3)
    tl = simulate(s, costs, _hw(3)).timeline
    as_category = memory_profile(s, costs, tl, 6e6)
    for other in (tl.astype({"op": str}), tl.astype({"op": pd.CategoricalDtype(["U", "SEND_B", "W", "B", "F", "R",
                                                                                "SEND_F"])})):
        again = memory_profile(s, costs, other, 6e6)
        pd.testing.assert_frame_equal(again.usage, as_category.usage, check_exact=True)
        assert (again.peak, again.peak_inflight, again.weight_versions, again.overflows) == (
            as_category.peak, as_category.peak_inflight, as_category.weight_versions, as_category.overflows)
    assert as_category.overflows and max(as_category.weight_versions) > 1  # stashed weight versions
    assert np.all(as_category.usage["bytes"].to_numpy() > 0)


# ------------------------------------------------------------------ the numpy wavefront (no compiler)
def _args(flat, plan):
    return (flat.device_start, flat.dep_start, flat.dep_slot, plan.durations, plan.link, plan.send_seconds, plan.links,
            bool(plan.hardware.overlap), plan.paired)  # paired: overlapped pairs hold a blocking send to their end


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(REGISTRY)), st.integers(2, 5), st.integers(1, 3), st.booleans(), st.booleans(),
       st.floats(0.0, 0.5), st.integers(1, 2))
def test_wavefront_gives_the_kernels_exact_floats(name, K, mult, recompute, overlap, latency, iterations):
    from sim.core.wavefront import wavefront_schedule

    chunks = 2 if name in ("zbv", "dualpipev", "interleaved-1f1b") else None
    try:
        s = schedules.generate(name, K, 2 * K * mult, iterations=iterations, recompute=recompute, chunks=chunks)
    except ValueError:
        return  # a documented refusal of this shape
    hw = Hardware(devices=K, latency=latency, bandwidth=1e6, overlap=overlap)
    plan = make_plan(s, _costs(s.stages), hw)
    args = _args(plan.flat, plan)
    expected = listsched._list_schedule(*(a.tolist() if isinstance(a, np.ndarray) else a for a in args))
    for mine, theirs in zip(wavefront_schedule(*args), expected):
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))


def test_wavefront_stops_where_the_kernel_stops_on_a_deadlock():
    import random

    from sim.core.wavefront import wavefront_schedule

    s = schedules.one_f_one_b(4, 8)
    for seed in range(20):
        acts = list(s.actions[2])
        random.Random(seed).shuffle(acts)
        broken = s.replace_actions({**s.actions, 2: acts})
        broken.check_structure()
        plan = make_plan(broken, _costs(4), _hw(4))
        args = _args(plan.flat, plan)
        position = listsched._list_schedule(*(a.tolist() if isinstance(a, np.ndarray) else a for a in args))[-1]
        assert wavefront_schedule(*args)[-1].tolist() == list(position)


def test_a_fresh_process_runs_a_wide_schedule_without_numba():
    """pipesim simulate of ~100 k actions in a new process: numpy waves instead of numba's ~1 s start-up."""
    code = ("import sys, sim\nr = sim.simulate(sim.schedules.one_f_one_b(32, 256), sim.uniform(32))\n"
            "assert r.metrics.makespan == (256 + 31) * 3.0\nprint('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_numba_is_loaded_once_the_waves_have_cost_its_start_up():
    """Ski rental: numpy waves until they have cost what loading numba costs, then the compiled kernel."""
    code = ("import sys, sim\nfrom sim.core import listsched\nlistsched.NUMBA_STARTUP_SECONDS = 1e-9\n"
            "s, c = sim.schedules.one_f_one_b(32, 64), sim.uniform(32)\n"  # validation: one run of waves
            "after_one = 'numba' in sys.modules\nfirst = sim.simulate(s, c).metrics\n"
            "print(after_one, 'numba' in sys.modules, first.makespan == (64 + 31) * 3.0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)), K=st.integers(1, 5), M=st.integers(1, 9),
       iterations=st.integers(1, 3), recompute=st.booleans())
def test_compiled_flat_arrays_are_numpys(name, K, M, iterations, recompute):
    """sim.core.compiled builds the dependency arrays with numpy or, once numba is loaded, one compiled loop: the same
    integers either way (overlapped pairs, recompute, split backwards, PipeDream's per-micro-batch updates)."""
    from sim.core import compiled

    try:
        s = schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
    except ValueError:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jit, "COMPILE_MIN_ACTIONS", 10**12)
        expected = compiled.build_flat(s)
        mp.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
        got = compiled.build_flat(s)
    for field in ("keys", "device", "device_start", "dep_start", "dep_slot", "send_to"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)
        assert getattr(got, field).dtype == np.int64, field


def test_the_compiled_builder_flags_a_result_needed_on_two_devices():
    """Only a malformed hand-made array can ask for it (check_structure refuses duplicates first): B(0,0) on
    device 0 read by U(0,0) on device 1 and again on device 2."""
    from sim.core import compiled

    kernel = jit.compiled(compiled._flat_kernel)
    one_stage = np.array([0], dtype=np.int64)  # placement (not checked when g is given)
    *_, conflict = kernel(np.array([1, 4], dtype=np.int64), np.array([0, 1, 2]), one_stage, 1, 1)
    assert not conflict
    *_, conflict = kernel(np.array([1, 4, 4], dtype=np.int64), np.array([0, 1, 2, 3]), one_stage, 1, 1)
    assert conflict


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "pipedream", "zb-h1", "interleaved-1f1b"]), K=st.integers(1, 4),
       M=st.integers(1, 6), mutation=st.sampled_from(["none", "drop", "repeat", "move", "replace", "negative"]),
       where=st.integers(0, 10**6), value=st.integers(0, 400))
def test_the_compiled_structure_check_agrees_with_numpys(name, K, M, mutation, where, value):
    """One compiled loop decides whether the structure checks pass (numpy words the error when one fails): on
    schedules broken one way at a time, it passes exactly those numpy passes."""
    from sim.core import compiled
    from sim.core.ir import ScheduleError

    try:
        s = schedules.generate(name, K, M)
    except ValueError:
        return
    keys, starts = s.keys_array.copy(), s.device_start.copy()
    i = where % len(keys)
    if mutation == "drop":
        keys = np.delete(keys, i)
        starts[starts > i] -= 1
    elif mutation == "repeat":
        keys = np.insert(keys, i, keys[i])
        starts[starts > i] += 1
    elif mutation == "move" and K > 1:  # the last action of device 0 becomes the first of device 1
        starts[1] -= 1
    elif mutation == "replace":
        keys[i] = value
    elif mutation == "negative":
        keys[i] = -1 - value
    broken = s.replace_keys(keys, starts)
    try:
        compiled.check_structure(broken)  # below the threshold: numpy
        numpy_passes = True
    except ScheduleError:
        numpy_passes = False
    kernel = jit.compiled(compiled._flat_kernel)
    updates, *arrays = kernel(broken.keys_array, broken.device_start, np.asarray(broken.placement, dtype=np.int64),
                              broken.total_microbatches, 0)  # g = 0: check the structure first
    assert (updates >= 0) == numpy_passes
    if numpy_passes:
        assert updates == compiled.check_structure(broken) == broken.updates_per_stage
        checked = compiled._flat_schedule(broken, *arrays)  # and the arrays built on the way are numpy's
        expected = compiled.build_flat(broken)
        for field in ("device", "dep_start", "dep_slot", "send_to"):
            np.testing.assert_array_equal(getattr(checked, field), getattr(expected, field), err_msg=field)
    with pytest.MonkeyPatch.context() as mp:  # through the public entry point: the same verdict
        mp.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
        try:
            compiled.check_structure(broken)
            assert numpy_passes
        except ScheduleError:
            assert not numpy_passes


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)), K=st.integers(1, 5), M=st.integers(1, 8),
       recompute=st.booleans(), overlap=st.booleans())
def test_compiled_plan_arrays_are_numpys(name, K, M, recompute, overlap):
    """Durations (split and full backwards, recompute, overlapped pairs), transfer bytes and seconds (per-link
    latencies) and the link numbering: the compiled plan gives numpy's arrays exactly."""
    try:
        s = schedules.generate(name, K, M, recompute=recompute)
    except ValueError:
        return
    costs, hw = _costs(s.stages), _hw(K, overlap)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jit, "COMPILE_MIN_ACTIONS", 10**12)
        expected = make_plan(s, costs, hw)
        mp.setattr(jit, "COMPILE_MIN_ACTIONS", 0)
        got = make_plan(s, costs, hw)
    for field in ("durations", "send_seconds", "send_bytes", "link"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)
        assert getattr(got, field).dtype == getattr(expected, field).dtype, field
    assert got.links == expected.links
