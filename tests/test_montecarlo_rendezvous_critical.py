"""Monte Carlo under a rendezvous runtime follows each sample's critical path ("who made it slow"): the rule in
:mod:`sim.engines.rendezvous` (each start set by its latest constraint, ties to the device, then the send's post,
the receive's post, the link), with the eager kernel's output fields."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.cli import main
from sim.core.comm_lowering import STEP_POST, lower
from sim.engines.plan import make_plan
from sim.engines.rendezvous import run_program
from sim.engines.sampling import draw_samples
from sim.model.runtimes import get_runtime
from sim.simulate import simulate_runtime

VARIED = dict(variability="lognormal:0.2", links="lognormal:0.2", stragglers=["device=any,factor=1.5,prob=0.3"],
              slow_links=["src=0,dst=1,factor=2,prob=0.5"])


def _gpipe2(M, post_overhead):
    """GPipe on 2 devices: F 1 s, B 2 s, transfers of 0.5 s (latency only), under torch's rendezvous runtime."""
    schedule = sim.schedules.generate("gpipe", 2, M)
    costs = sim.uniform(2, forward=1.0, backward=2.0, send_bytes=0)
    hardware = sim.Hardware(devices=2, latency=0.5, bandwidth=1e9)
    result, walked = simulate_runtime(schedule, costs, hardware, runtime="torch", post_overhead=post_overhead)
    mc = sim.monte_carlo(schedule, costs, hardware, samples=3, runtime="torch", post_overhead=post_overhead)
    return result, walked.critical_path, mc


def _assert_path(path, mc, device_seconds, link_seconds):
    assert path.on_path.tolist() == [True, True]
    np.testing.assert_allclose(path.device_seconds, device_seconds, rtol=1e-12)
    assert path.link_seconds == pytest.approx(link_seconds, rel=1e-12)
    # every sample of a run with nothing varied is that run, its path included
    assert mc.arrays.on_critical_path.all()
    np.testing.assert_allclose(mc.arrays.critical_seconds, [device_seconds] * 3, rtol=1e-12)
    np.testing.assert_allclose(mc.arrays.critical_link_seconds, [link_seconds] * 3, rtol=1e-12)


def test_the_path_of_gpipe_on_two_devices_crosses_to_the_late_receiver():
    """Derived by hand (makespan 11 s). Device 1 posts each receive when it gets to it, so two transfers wait for
    the receiver, and the path follows them there:
    dev0 B0 [9, 11] <- its input, transfer B0 [8.5, 9], whose start is device 0's receive post at 8.5 (device 1
    posted the send at 8, and the receive's post is the later) <- dev0's post at 8.5 (0 s) <- dev0 B1 [6.5, 8.5]
    <- wait for transfer B1 [6, 6.5] <- its send's post at 6 on device 1 (the receive was posted at 6 too: a tie
    goes to the send) <- dev1 B1 [4, 6] <- dev1 F1 [3, 4] <- wait for transfer F1 [2.5, 3], set by device 1's
    receive post at 2.5 (device 0 posted the send at 2) <- dev1 F0 [1.5, 2.5] <- transfer F0 [1, 1.5], set by the
    send's post at 1 <- dev0 F0 [0, 1].
    Device 0 holds 2 + 2 + 1 = 5 s, device 1 holds 2 + 1 + 1 = 4 s, the links 4 x 0.5 = 2 s."""
    result, path, mc = _gpipe2(2, 0.0)
    assert result.metrics.makespan == 11.0
    _assert_path(path, mc, [5.0, 4.0], 2.0)


def test_a_post_holds_the_path_up_to_the_operation_it_posts():
    """Derived by hand (makespan 7.2 s), each post call 0.1 s: dev0 B0 [5.2, 7.2] <- (a tie of its wait's end and
    its input: the device) the wait, ended by transfer B0 [4.7, 5.2] <- its send posted at 4.7 by device 1's post
    call [4.6, 4.7] (0.1 s) <- dev1 B0 [2.6, 4.6] <- dev1 F0 [1.6, 2.6] <- transfer F0 [1.1, 1.6] <- device 0's post
    call [1.0, 1.1] <- dev0 F0 [0, 1]. Device 0: 2 + 0.1 + 1 s; device 1: 0.1 + 2 + 1 s; links 1 s."""
    result, path, mc = _gpipe2(1, 0.1)
    assert result.metrics.makespan == pytest.approx(7.2, rel=1e-12)
    _assert_path(path, mc, [3.1, 3.1], 1.0)


@pytest.mark.parametrize("runtime", ["torch", "megatron"])
@pytest.mark.parametrize("slow", [0, 1, 2, 3])
def test_a_device_three_times_slower_is_the_critical_device(slow, runtime):
    schedule = sim.schedules.generate("1f1b", 4, 8)
    costs = sim.uniform(4, forward=1.0, backward=2.0, send_bytes=1e6)
    hardware = sim.Hardware(devices=4, latency=1e-3, bandwidth=1e9)
    mc = sim.monte_carlo(schedule, costs, hardware, samples=20, runtime=runtime, variability="lognormal:0.05",
                         stragglers=[f"device={slow},factor=3"])
    cp = mc.summary()["critical_path"]
    assert cp["slowest_device"] == slow
    share = np.array(cp["time_share"])
    assert share[slow] > 0.8 and share[slow] > np.delete(share, slow).max()
    assert cp["on_path_share"][slow] == 1.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "gpipe", "zb-h1", "interleaved-1f1b"]), K=st.integers(2, 4),
       M=st.integers(1, 6), latency=st.floats(0.0, 0.01), runtime=st.sampled_from(["torch", "megatron"]),
       post=st.sampled_from([0.0, 1e-3]), varied=st.booleans(), seed=st.integers(0, 1000))
def test_the_paths_seconds_are_the_makespan(name, K, M, latency, runtime, post, varied, seed):
    """Device seconds + link seconds (waits hold none) add up to each sample's makespan: the path is a chain
    from time 0 to the last end without a gap or an overlap."""
    chunks = 2 if name == "interleaved-1f1b" else 1
    if name == "zb-h1":
        M = max(M, K)
    if chunks > 1:
        M = K * max(1, M // K)  # Megatron's interleaving needs M a multiple of K
    schedule = sim.schedules.generate(name, K, M, chunks=chunks)
    costs = sim.uniform(schedule.stages, forward=0.01, backward=0.02, weight=0.01 if name == "zb-h1" else 0.0,
                        send_bytes=1e6)
    hardware = sim.Hardware(devices=K, latency=latency, bandwidth=1e9)
    try:
        mc = sim.monte_carlo(schedule, costs, hardware, samples=8, seed=seed, runtime=runtime, post_overhead=post,
                             **(VARIED if varied else {}))
    except sim.PipesimError:  # a posting order this runtime cannot match (tests/test_montecarlo_rendezvous.py)
        return
    a = mc.arrays
    np.testing.assert_allclose(a.critical_seconds.sum(axis=1) + a.critical_link_seconds, a.makespan, rtol=1e-9)
    assert (a.critical_seconds >= 0).all() and (a.critical_link_seconds >= 0).all()
    assert not (a.critical_seconds > 0)[~a.on_critical_path].any()  # seconds only where the device is on it
    # and a device holds no more of the path than its own work: its computations and its post calls
    program = mc.program
    posts = np.bincount(np.repeat(np.arange(K), np.diff(program.step_start)), minlength=K,
                        weights=(program.step_op == STEP_POST).astype(float))
    assert (a.critical_seconds <= (a.busy + posts * post) * (1 + 1e-9)).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "gpipe", "zb-h1"]), K=st.integers(2, 4), M=st.integers(4, 8),
       latency=st.floats(0.0, 0.005), seed=st.integers(0, 1000))
def test_under_eager_links_the_path_is_the_eager_kernels(name, K, M, latency, seed):
    """An independent check of the walk back: the rendezvous engine walking pipesim's own (eager) lowering gives
    the eager kernel's makespans exactly (tests/test_montecarlo_rendezvous.py), and so the same critical path,
    which the kernel follows by its own code (sim.engines.sampling._sample_kernel)."""
    schedule = sim.schedules.generate(name, K, M)
    costs = sim.uniform(schedule.stages, forward=0.01, backward=0.02, weight=0.01 if name == "zb-h1" else 0.0,
                        send_bytes=1e6)
    hardware = sim.Hardware(devices=K, latency=latency, bandwidth=1e9)
    mc = sim.monte_carlo(schedule, costs, hardware, samples=10, seed=seed, **VARIED)
    plan = make_plan(schedule, costs, hardware)
    program = lower(schedule, get_runtime("pipesim").lowering(schedule), blocking_sends=False)
    durations, sends = draw_samples(plan, mc.variability, first=0, count=10, seed=seed)
    for j in range(10):
        path = run_program(replace(plan, durations=durations[j], send_seconds=sends[j], _views={}), program,
                           eager=True).critical_path
        assert path.on_path.tolist() == mc.arrays.on_critical_path[j].tolist()
        np.testing.assert_allclose(path.device_seconds, mc.arrays.critical_seconds[j], rtol=1e-9, atol=1e-15)
        assert path.link_seconds == pytest.approx(mc.arrays.critical_link_seconds[j], rel=1e-9, abs=1e-15)


def test_the_command_line_names_the_critical_device_under_torch(capsys):
    shape = ["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--runtime", "torch", "--samples", "30",
             "--variability", "lognormal:0.1", "--straggler", "device=2,factor=3"]
    assert main(shape + ["--json"]) == 0
    cp = json.loads(capsys.readouterr().out)["critical_path"]
    assert cp["slowest_device"] == 2 and cp["time_share"][2] == max(cp["time_share"])
    assert main(shape) == 0
    text = capsys.readouterr().out
    assert "on critical path" in text and "not followed" not in text
    row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["2"])
    assert float(row[2].rstrip("%")) > 80  # device 2's share of the path's seconds


def test_the_compiled_walk_back_gives_the_interpreted_path():
    """Programs of jit.compile_min_actions() actions or more walk compiled (the walk and the walk back): the same
    floats as the interpreted functions the tests above run."""
    from sim import jit

    if jit.compiled(__import__("sim.engines.rendezvous", fromlist=["_critical_path"])._critical_path) is None:
        pytest.skip("numba is not installed")
    schedule = sim.schedules.generate("interleaved-1f1b", 4, 8, chunks=2)
    costs = sim.uniform(schedule.stages, forward=0.01, backward=0.02, send_bytes=1e6)
    hardware = sim.Hardware(devices=4, latency=1e-3, bandwidth=1e9)
    runs = []
    for threshold in (0, 10**12):  # compiled, then interpreted
        with jit.compile_above(threshold):
            runs.append(sim.monte_carlo(schedule, costs, hardware, samples=20, seed=5, runtime="torch",
                                        post_overhead=1e-3, **VARIED).arrays)
    for field in ("makespan", "on_critical_path", "critical_seconds", "critical_link_seconds"):
        assert np.array_equal(getattr(runs[0], field), getattr(runs[1], field)), field
    assert runs[0].on_critical_path.any() and (runs[0].critical_link_seconds > 0).any()


def test_a_transfer_that_ends_last_starts_the_path():
    """Where a transfer ends after every computation the path starts at it (action p's transfer is node p of the
    walk's full per-action arrays, not of the sent ones only). Pipelines end with a computation, so the first
    hand case's walk is taken with every computation's end clipped to 8.5 s: transfer B0 [8.5, 9] ends last, and
    the path is the hand-derived one less dev0 B0: device 0 holds 2 + 1 s, device 1 4 s, the links 2 s."""
    from sim.engines.rendezvous import critical_path, program_schedule

    schedule = sim.schedules.generate("gpipe", 2, 2)
    costs = sim.uniform(2, forward=1.0, backward=2.0, send_bytes=0)
    hardware = sim.Hardware(devices=2, latency=0.5, bandwidth=1e9)
    plan = make_plan(schedule, costs, hardware)
    program = lower(schedule, get_runtime("torch").lowering(schedule), blocking_sends=not hardware.overlap)
    out = program_schedule(program, plan.flat, plan.occupy, plan.overhead, plan.link, plan.send_seconds, plan.links,
                           False)
    _, end, sent_start, sent_end = (np.asarray(a) for a in out[:4])
    assert end.max() == 11.0 and sorted(sent_end[plan.link >= 0]) == [1.5, 3.0, 6.5, 9.0]
    path = critical_path(program, *out[9:], np.minimum(end, 8.5), sent_start, sent_end)
    assert path.on_path.tolist() == [True, True]
    np.testing.assert_allclose(path.device_seconds, [3.0, 4.0], rtol=1e-12)
    assert path.link_seconds == pytest.approx(2.0, rel=1e-12)
