"""The ``deepspeed`` runtime profile (sim/model/runtimes.py, sim/core/comm_lowering.py ``lower_deepspeed``):
DeepSpeed's TrainSchedule, every exchange a blocking broadcast, timed by the rendezvous engine and checked against
the independent executor of the same instruction stream (sim/model/deepspeed_pipeline.py ``execute``)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST, STEP_WAIT, LoweringError, lower
from sim.core.keys import ScheduleError
from sim.model.cost import StageCosts
from sim.model.deepspeed_pipeline import execute
from sim.model.hardware import Hardware
from sim.model.runtimes import RUNTIMES, get_runtime
from sim.simulate import simulate_runtime


def _link_matrix(transfer: list[float]) -> list[list[float]]:
    """Latencies that make the link between stages s and s + 1 take transfer[s] both ways (execute's model: one
    time per neighbouring pair); other links are never used by a TrainSchedule."""
    K = len(transfer) + 1
    lat = [[0.0] * K for _ in range(K)]
    for s, c in enumerate(transfer):
        lat[s][s + 1] = lat[s + 1][s] = c
    return lat


def _run(forward, backward, transfer, M, *, overlap=False, iterations=1):
    K = len(forward)
    costs = StageCosts(forward=forward, backward=backward, send_bytes=[0.0] * K)
    hw = Hardware(devices=K, latency=_link_matrix(transfer), overlap=overlap)  # bytes 0: a transfer is its latency
    return simulate_runtime(schedules.generate("1f1b", K, M, iterations=iterations), costs, hw, runtime="deepspeed")


times = st.floats(0.05, 4.0, allow_nan=False)


# ------------------------------------------------------------------ (a) the independent executor
@settings(max_examples=80, deadline=None)
@given(K=st.integers(2, 5), M=st.integers(1, 8), uniform=st.booleans(), overlap=st.booleans(), data=st.data())
def test_the_runtime_times_trainschedule_as_the_deepspeed_executor_does(K, M, uniform, overlap, data):
    """Uniform and unequal stages and links: the lowered program under rendezvous links ends when execute's
    lock-stepped streams do, stage by stage; DeepSpeed's broadcasts block, so the hardware's overlap flag changes
    nothing."""
    if uniform:
        f, b, c = data.draw(times), data.draw(times), data.draw(st.floats(0.0, 2.0))
        forward, backward, transfer = [f] * K, [b] * K, [c] * (K - 1)
    else:
        forward = data.draw(st.lists(times, min_size=K, max_size=K))
        backward = data.draw(st.lists(times, min_size=K, max_size=K))
        transfer = data.draw(st.lists(st.floats(0.0, 2.0), min_size=K - 1, max_size=K - 1))
    expected = execute(forward, backward, transfer, M)
    result, ran = _run(forward, backward, transfer, M, overlap=overlap)
    assert result.metrics.makespan == pytest.approx(expected.makespan, rel=0, abs=1e-9)
    run = ran.run
    finish = [float(run.end[run.device_start[d]:run.device_start[d + 1]].max()) for d in range(K)]
    assert finish == pytest.approx(list(expected.finish), rel=0, abs=1e-9)
    assert int(np.sum(ran.run.send_to >= 0)) == expected.transfers == 2 * M * (K - 1)


def test_each_exchange_is_its_own_blocking_batch_in_trainschedule_order():
    """Stage 1 of 3, M = 2 (TrainSchedule's steps 1 to 7 by hand: F(m) at step 2m + 1, B(m) at step 2m + 4; a
    forward step receives its input first, a backward step sends the previous output first): every operation
    posted alone and waited at once; the update after the stream. (torch's notation: ``1RECV_F0`` is stage 1's
    receive of F0's result.)"""
    program = lower(schedules.generate("1f1b", 3, 2), "deepspeed")
    text = program.to_text().splitlines()[1]
    assert text == ("1: 1RECV_F0 WAIT(1RECV_F0) 1F0 "  # step 1
                    "1SEND_F0 WAIT(1SEND_F0) "  # step 2 (no backward yet)
                    "1RECV_F1 WAIT(1RECV_F1) 1F1 "  # step 3
                    "1SEND_F1 WAIT(1SEND_F1) 1RECV_B0 WAIT(1RECV_B0) 1B0 "  # step 4
                    "1SEND_B0 WAIT(1SEND_B0) "  # step 5 (no forward left)
                    "1RECV_B1 WAIT(1RECV_B1) 1B1 "  # step 6
                    "1SEND_B1 WAIT(1SEND_B1) "  # step 7
                    "1U0")
    for d in range(3):
        steps = program.steps(d)
        for (op, arg), nxt in zip(steps, steps[1:] + [(None, None)]):
            if op == STEP_POST:
                assert len(program.batch(arg)) == 1 and nxt == (STEP_WAIT, arg)
    assert [op for op, _ in program.steps(0)][-1] == STEP_COMPUTE  # the update after the stream



@pytest.mark.parametrize("K, M", [(2, 1), (3, 4), (4, 6)])
def test_the_simpy_twin_gives_the_same_floats(K, M):
    costs = StageCosts(forward=[1.0 + 0.25 * s for s in range(K)], backward=[2.0] * K, send_bytes=[1e6] * K)
    hw = Hardware(devices=K, latency=0.05, bandwidth=4e6)
    s = schedules.generate("1f1b", K, M)
    fast = simulate_runtime(s, costs, hw, runtime="deepspeed", engine="fast")[0]
    slow = simulate_runtime(s, costs, hw, runtime="deepspeed", engine="simpy")[0]
    assert fast.metrics == slow.metrics

# ------------------------------------------------------------------ (b) the closed form
@settings(max_examples=40, deadline=None)
@given(K=st.integers(2, 5), M=st.integers(1, 8), f=times, b=times)
def test_with_free_transfers_uniform_stages_take_the_1f1b_time(K, M, f, b):
    result, _ = _run([f] * K, [b] * K, [0.0] * (K - 1), M)
    assert result.metrics.makespan == pytest.approx((M + K - 1) * (f + b), rel=1e-12)


def test_blocking_broadcasts_cost_more_than_megatrons_pairs():
    """p = 2, M = 1, F = B = 1, c = 0.5 (execute's own hand case): 4 + 2 x 0.5 = 5; and with more micro-batches
    DeepSpeed's one-after-the-other exchanges are slower than Megatron's paired send/receive."""
    assert _run([1.0, 1.0], [1.0, 1.0], [0.5], 1)[0].metrics.makespan == pytest.approx(5.0)
    costs = StageCosts(forward=[1.0] * 4, backward=[2.0] * 4, send_bytes=[0.0] * 4)
    hw = Hardware(devices=4, latency=0.3)
    s = schedules.generate("1f1b", 4, 8)
    ds = simulate_runtime(s, costs, hw, runtime="deepspeed")[0].metrics.makespan
    mg = simulate_runtime(s, costs, hw, runtime="megatron")[0].metrics.makespan
    assert ds > mg


def test_iterations_run_one_trainschedule_each():
    """Two iterations: each stream ends with its update, so the second one starts after the first drains."""
    one = _run([1.0] * 3, [2.0] * 3, [0.1] * 2, 4)[0].metrics.makespan
    two = _run([1.0] * 3, [2.0] * 3, [0.1] * 2, 4, iterations=2)[0].metrics.makespan
    assert two == pytest.approx(2 * one)


# ------------------------------------------------------------------ (c) refusals
@pytest.mark.parametrize("name, chunks, why", [
    ("gpipe", None, "device 0 runs"),
    ("zbv", 2, "stages on"),
    ("interleaved-1f1b", 2, "stages on"),
    ("zb-h1", None, "W"),
    ("dualpipev", 2, "stages on"),
])
def test_other_orders_are_refused_naming_why(name, chunks, why):
    s = schedules.generate(name, 4, 8, chunks=chunks)
    with pytest.raises(LoweringError, match=r"deepspeed's engine runs its own TrainSchedule \(1F1B, one stage per "
                                            rf"device\); '{name}' is not it") as err:
        lower(s, "deepspeed")
    assert why in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ScheduleError)
    costs = StageCosts(forward=[1.0] * s.stages, backward=[1.0] * s.stages)
    with pytest.raises(LoweringError):
        simulate_runtime(s, costs, Hardware(devices=4), runtime="deepspeed")


def test_recompute_is_refused_with_deepspeeds_own_way():
    with pytest.raises(LoweringError, match="inside BackwardPass"):
        lower(schedules.generate("1f1b", 3, 4, recompute=True), "deepspeed")


def test_gpipe_with_one_micro_batch_is_trainschedules_order():
    """GPipe's order equals TrainSchedule's at M = 1 (F then B on every stage): the order decides, not the name."""
    program = lower(schedules.generate("gpipe", 3, 1), "deepspeed")
    assert program.lowering == "deepspeed"


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "sim", *argv], capture_output=True, text=True)


@pytest.mark.parametrize("argv", [
    ["simulate", "-s", "zbv", "-K", "4", "-M", "8", "--runtime", "deepspeed"],
    ["simulate", "-s", "interleaved-1f1b", "--chunks", "2", "-K", "2", "-M", "4", "--runtime", "deepspeed"],
    ["simulate", "-s", "gpipe", "-K", "2", "-M", "4", "--runtime", "deepspeed"],
])
def test_the_cli_refuses_in_one_line(argv):
    out = _cli(*argv)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesim: error: deepspeed's engine runs its own TrainSchedule")


def test_validate_cannot_run_deepspeed():
    """validate runs a real runtime; DeepSpeed is not one pipesim can launch: one line, exit 2."""
    out = _cli("validate", "-s", "1f1b", "-K", "2", "-M", "2", "--runtime", "deepspeed")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert "--runtime" in lines[-1] and "deepspeed" in lines[-1] and "Traceback" not in out.stderr


# ------------------------------------------------------------------ (d) the commands that take --runtime
def test_the_profile_is_listed():
    profile = get_runtime("DeepSpeed")
    assert "deepspeed" in RUNTIMES and profile.links == "rendezvous" and not profile.eager
    assert profile.lowering(schedules.generate("1f1b", 2, 2)) == "deepspeed"
    assert "deepspeed/runtime/pipe/schedule.py" in profile.source
    assert "deepspeed" in _cli("simulate", "--help").stdout


def test_simulate_json_names_the_runtime_and_lowering():
    out = _cli("simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--latency", "0.1", "--runtime", "deepspeed", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["runtime"] == "deepspeed" and data["links"] == "rendezvous" and data["lowering"] == "deepspeed"
    # the CLI's default costs (F = 1 s, B = 2 s per stage) and 0.1 s links: execute's time for that stream
    assert data["makespan"] == pytest.approx(execute([1.0] * 4, [2.0] * 4, [0.1] * 3, 8).makespan, abs=1e-9)


def test_sweep_and_plan_accept_it(tmp_path):
    from sim.cli import main
    from sim.search.sweep import read_sweep

    out = tmp_path / "s"
    assert main(["sweep", "--schedules", "1f1b,gpipe", "-K", "2", "-M", "4", "--latency", "0.1", "--runtime",
                 "deepspeed", "-o", str(out), "--no-plots", "--no-progress"]) == 0
    df = read_sweep(out / "sweep.csv").set_index("schedule")
    assert set(df["runtime"]) == {"deepspeed"}
    assert df.loc["1f1b", "makespan"] == pytest.approx(execute([1.0] * 2, [2.0] * 2, [0.1], 4).makespan)
    assert "TrainSchedule" in df.loc["gpipe", "error"]  # a row the runtime cannot run says why
    plan_out = tmp_path / "p"
    assert main(["plan", "--model", "small-gpt", "--gpu", "cpu", "--gpus", "2", "--global-batch", "16",
                 "--tensor-parallel", "1", "--microbatch-size", "4", "--recompute", "none", "--schedules", "1f1b",
                 "--no-progress", "--runtime", "deepspeed", "-o", str(plan_out)]) == 0
    assert json.loads((plan_out / "plan.json").read_text())["runtime"]["name"] == "deepspeed"


def test_monte_carlo_samples_the_deepspeed_program():
    """Nothing varied: every sample is the rendezvous engine's run of DeepSpeed's program, to the last bit."""
    import sim

    schedule = schedules.generate("1f1b", 3, 4)
    costs = StageCosts(forward=[1.0, 1.5, 0.5], backward=[2.0, 2.5, 1.0], send_bytes=[0.0] * 3)
    hardware = Hardware(devices=3, latency=0.2)
    expected, _ = simulate_runtime(schedule, costs, hardware, runtime="deepspeed")
    mc = sim.monte_carlo(schedule, costs, hardware, samples=3, runtime="deepspeed", seed=1)
    assert mc.runtime == "deepspeed" and (mc.makespan == expected.metrics.makespan).all()
    assert expected.metrics.makespan == pytest.approx(execute([1.0, 1.5, 0.5], [2.0, 2.5, 1.0], [0.2] * 2, 4).makespan)
