"""Runtime models in the engines: eager and rendezvous links over lowered programs, both engines, exact parity.

The list scheduler of lowered programs (:mod:`sim.engines.rendezvous`) must give, for the ``pipesim`` lowering under
eager links, the very floats of the trusted fast path; and the simpy twin the very floats of the list scheduler
under every profile.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import Hardware, ScheduleError, schedules, simulate
from sim.core.ir import B, F, Schedule
from sim.simulate import simulate_runtime
from sim.core.comm_lowering import ProgramBuilder, lower
from sim.engines.fastpath import run_fast
from sim.engines.plan import make_plan
from sim.engines.rendezvous import run_program
from sim.model.cost import StageCosts
from sim.model.runtimes import RUNTIMES, get_runtime

SHAPES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("dualpipev", 2), ("zb-h1", 1),
          ("pipedream", 1), ("naive", 1)]


def _costs(S, rng):
    return StageCosts(forward=rng.uniform(0.5, 2, S).tolist(), backward=rng.uniform(0.5, 3, S).tolist(),
                      weight=rng.uniform(0, 1, S).tolist(), update=rng.uniform(0, 0.3, S).tolist(),
                      send_bytes=rng.uniform(0, 2e6, S).tolist(),
                      dispatch_forward=rng.uniform(0, 0.2, S).tolist(),
                      dispatch_backward=rng.uniform(0, 0.2, S).tolist())


def _schedule(name, K, M, chunks):
    try:
        return schedules.generate(name, K, M, chunks=chunks if chunks > 1 else None)
    except Exception:  # a shape this schedule refuses (e.g. M < K)
        return None


def _same_run(a, b):
    for field in ("start", "end", "transfer_start", "transfer_end"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


configs = st.tuples(st.sampled_from(SHAPES), st.integers(2, 4), st.integers(1, 6), st.integers(0, 2**31 - 1),
                    st.booleans(), st.sampled_from([0.0, 0.05, 0.7]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(configs)
def test_eager_pipesim_program_reproduces_the_fast_path(config):
    (name, chunks), K, M, seed, overlap, latency = config
    s = _schedule(name, K, M * K if name == "dualpipev" else M, chunks)
    if s is None:
        return
    rng = np.random.default_rng(seed)
    plan = make_plan(s, _costs(s.stages, rng), Hardware(devices=K, latency=latency, bandwidth=4e6, overlap=overlap))
    old = run_fast(plan)
    new = run_program(plan, lower(s, "pipesim", blocking_sends=not overlap), eager=True).run
    _same_run(old, new)


@settings(max_examples=40, deadline=None)
@given(configs, st.sampled_from(sorted(RUNTIMES)), st.sampled_from([0.0, 0.03]))
def test_list_scheduler_and_simpy_agree_under_every_profile(config, runtime, post):
    (name, chunks), K, M, seed, overlap, latency = config
    s = _schedule(name, K, M * K if name == "dualpipev" else M, chunks)
    if s is None:
        return
    rng = np.random.default_rng(seed)
    costs, hw = _costs(s.stages, rng), Hardware(devices=K, latency=latency, bandwidth=4e6, overlap=overlap)
    try:
        fast, fast_run = simulate_runtime(s, costs, hw, runtime=runtime, engine="fast", post_overhead=post)
    except ScheduleError:  # a posting order this runtime cannot run: refused before anything runs, by both
        with pytest.raises(ScheduleError):
            simulate_runtime(s, costs, hw, runtime=runtime, engine="simpy", post_overhead=post)
        return
    slow, slow_run = simulate_runtime(s, costs, hw, runtime=runtime, engine="simpy", post_overhead=post)
    _same_run(fast_run.run, slow_run.run)
    assert fast.metrics == slow.metrics
    assert fast_run.waits == slow_run.waits


@pytest.mark.parametrize("engine", ["fast", "simpy"])
@pytest.mark.parametrize("K,M", [(2, 4), (4, 8), (3, 7)])
def test_eager_profile_keeps_the_textbook_numbers(engine, K, M):
    """The default profile is today's model: 1F1B on free links with uniform stages takes (M + K - 1)(F + B)."""
    r = simulate(schedules.one_f_one_b(K, M), StageCosts(forward=[1.0] * K, backward=[2.0] * K), Hardware(devices=K),
                 runtime="pipesim", engine=engine)
    assert r.metrics.makespan == (M + K - 1) * 3.0


def test_rendezvous_waits_for_the_receive_post():
    """GPipe K=2 M=2 under torch's ScheduleGPipe loop: stage 1 posts the receive of F1 only after computing F0, so
    F1's activation (sent at t=1) moves at t=2 (F0 on stage 1 ends), eager would have moved it at t=1."""
    s = schedules.gpipe(2, 2)
    costs = StageCosts(forward=[1.0, 1.0], backward=[1.0, 1.0], send_bytes=[1.0, 1.0])
    hw = Hardware(devices=2, latency=0.5, bandwidth=float("inf"))
    eager = simulate(s, costs, hw, runtime="pipesim").timeline
    torch = simulate(s, costs, hw, runtime="torch").timeline

    def send(tl, mb):
        row = tl[(tl.op == "SEND_F") & (tl.microbatch == mb)]
        return row.start.item(), row.end.item()

    assert send(eager, 1) == (2.0, 2.5)  # F1 on stage 0 ends at 2.0
    # stage 1: receive F0 posted at 0, F0 arrives 1.5, computes to 2.5, then posts the receive of F1
    assert send(torch, 0) == (1.0, 1.5)
    assert send(torch, 1) == (2.5, 3.0)


def _cross_blocking_program(s):
    """Blocking send before the receive on both devices: device 0 sends F1 and waits before posting the receive of
    B0; device 1 sends B0 and waits before posting the receive of F1. Eager links never block; rendezvous ones
    never match."""
    b = ProgramBuilder(s)
    flat = s.compiled.flat
    index = {s.action_of(int(k)).__str__(): i for i, k in enumerate(flat.keys.tolist())}
    f00, f01, b00, b01 = (index[a] for a in ("0F0", "0F1", "0B0", "0B1"))
    f10, f11, b10, b11 = (index[a] for a in ("1F0", "1F1", "1B0", "1B1"))
    b.compute(0, f00); b.post(0, [f00], wait=True)
    b.compute(0, f01); b.post(0, [f01], wait=True)
    b.post(0, [~b10], wait=True); b.compute(0, b00)
    b.post(0, [~b11], wait=True); b.compute(0, b01)
    b.post(1, [~f00], wait=True); b.compute(1, f10); b.compute(1, b10); b.post(1, [b10], wait=True)
    b.post(1, [~f01], wait=True); b.compute(1, f11); b.compute(1, b11); b.post(1, [b11], wait=True)
    return b.build("hand-made")


def test_rendezvous_only_deadlock_is_named_before_running():
    s = Schedule.build(name="cross", devices=2, microbatches=2, actions={
        0: [F(0, 0), F(0, 1), B(0, 0), B(0, 1)], 1: [F(1, 0), B(1, 0), F(1, 1), B(1, 1)]})
    program = _cross_blocking_program(s)
    plan = make_plan(s, StageCosts(forward=[1.0, 1.0], backward=[1.0, 1.0], send_bytes=[1.0, 1.0]),
                     Hardware(devices=2, latency=0.1))
    run_program(plan, program, eager=True)  # eager links: the sends never wait for a receive
    with pytest.raises(ScheduleError) as err:
        run_program(plan, program, eager=False)
    text = str(err.value)
    assert "deadlocks" in text and "device 0 stuck at WAIT(0SEND_F1)" in text and "1RECV_F1 (never posted)" in text
    assert "device 1 stuck at WAIT(1SEND_B0)" in text and "0RECV_B0 (never posted)" in text


def test_receives_out_of_send_order_are_refused():
    from sim.core.comm_lowering import LoweringError

    s = Schedule.build(name="two", devices=2, microbatches=2, actions={
        0: [F(0, 0), F(0, 1), B(0, 0), B(0, 1)], 1: [F(1, 0), F(1, 1), B(1, 0), B(1, 1)]})
    b = ProgramBuilder(s)
    flat = s.compiled.flat
    index = {str(s.action_of(int(k))): i for i, k in enumerate(flat.keys.tolist())}
    for d in range(2):
        for i in b.actions(d):
            b.compute(d, i)
    b.post(0, [index["0F0"]]); b.post(0, [index["0F1"]])
    b.post(1, [~index["0F1"]]); b.post(1, [~index["0F0"]])  # the receiver posts mb 1 first: the bug
    b.post(1, [index["1B0"]]); b.post(1, [index["1B1"]]); b.post(0, [~index["1B0"]]); b.post(0, [~index["1B1"]])
    with pytest.raises(LoweringError, match="another order"):
        b.build("hand-made")


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_dispatch_overhead_is_device_time_not_compute(engine):
    s = schedules.gpipe(2, 2)
    plain = StageCosts(forward=[1.0, 1.0], backward=[2.0, 2.0])
    charged = StageCosts(forward=[1.0, 1.0], backward=[2.0, 2.0], dispatch_forward=[0.25, 0.25],
                         dispatch_backward=[0.5, 0.5])
    folded = StageCosts(forward=[1.25, 1.25], backward=[2.5, 2.5])
    hw = Hardware(devices=2)
    a, b, c = (simulate(s, x, hw, engine=engine) for x in (plain, charged, folded))
    assert b.metrics.makespan == c.metrics.makespan  # the device is held as if the action took that much longer
    assert b.metrics.busy == a.metrics.busy  # but only the computation counts as busy
    tl = b.timeline
    f0 = tl[(tl.op == "F") & (tl.device == 0) & (tl.microbatch == 0)]
    assert (f0.start.item(), f0.end.item()) == (0.25, 1.25)


def test_the_json_says_which_runtime(tmp_path):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sim", "simulate", "-s", "1f1b", "-K", "2", "-M", "4", "--latency",
                          "0.1", "--runtime", "torch", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["runtime"] == "torch" and data["lowering"] == "torch-1f1b"
    bad = subprocess.run([sys.executable, "-m", "sim", "simulate", "--runtime", "colossalai"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("pipesim: error:") and "megatron" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    sampled = subprocess.run([sys.executable, "-m", "sim", "simulate", "-s", "1f1b", "-K", "2", "-M", "4", "--samples",
                              "10", "--runtime", "torch"], capture_output=True, text=True)
    assert sampled.returncode == 0 and "runtime torch" in sampled.stdout  # sampled under the runtime, and says so


def test_get_runtime_names_the_choices():
    with pytest.raises(Exception, match="pipesim, torch, megatron"):
        get_runtime("nope")
    assert get_runtime("Torch").links == "rendezvous" and get_runtime("pipesim").eager


@pytest.mark.parametrize("name", ["1f1b", "zbv", "dualpipev"])
@pytest.mark.parametrize("overlap", [True, False])
def test_replication_charges_dispatch_as_simulate_does(name, overlap):
    """One copy, no replicated stage: the replication engine's run is simulate()'s, dispatch overhead included."""
    import pandas as pd

    from sim.engines.replication import Replication, simulate_replicated
    from sim.model.cost import uniform

    K, M = 2, 8
    s = schedules.generate(name, K, M, chunks=2 if name in ("zbv", "dualpipev") else None)
    chunks = s.stages // K
    costs = uniform(K, forward=1.0, backward=2.0, weight=0.5, send_bytes=3e5, dispatch_forward=0.1,
                    dispatch_backward=0.2, dispatch_weight=0.05)
    costs = costs.split_into_chunks(chunks) if chunks > 1 else costs
    hw = Hardware(devices=K, latency=0.05, bandwidth=1e7, overlap=overlap)
    base, run = simulate(s, costs, hw), simulate_replicated(s, costs, Replication(), hw)
    cols = ["device", "stage", "microbatch", "op", "start", "end"]
    a = base.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    b = run.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert run.metrics.makespan == base.metrics.makespan and run.metrics.busy == base.metrics.busy


def test_the_compiled_walk_gives_the_interpreted_floats():
    from sim import jit

    if jit.compiled(__import__("sim.engines.rendezvous", fromlist=["_walk"])._walk) is None:
        pytest.skip("numba is not installed")
    s = schedules.generate("interleaved-1f1b", 4, 16, chunks=2)
    costs = _costs(s.stages, np.random.default_rng(3))
    hw = Hardware(devices=4, latency=0.05, bandwidth=4e6)
    runs = []
    for threshold in (0, 10**12):  # compiled, then interpreted
        with jit.compile_above(threshold):
            runs.append(simulate_runtime(s, costs, hw, runtime="torch", post_overhead=0.02)[1])
    _same_run(runs[0].run, runs[1].run)
    assert runs[0].waits == runs[1].waits
