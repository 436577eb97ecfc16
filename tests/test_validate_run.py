"""Real runs with torch.distributed (gloo, K=2 processes on this machine), faults, and bad input.

Each launch costs a few seconds (every rank imports torch), so there are three:
a 1F1B run checked end to end, a PipeDream run checked against weight stashing,
and a run where one rank raises at a chosen action.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sim.results.timeline import TIMELINE_COLUMNS  # noqa: E402
from sim import schedules  # noqa: E402
from validate import RankFailedError, ValidationError, run_validation, run_validations  # noqa: E402
from validate.run import check_request  # noqa: E402

SMALL = {"width": 16, "depth": 1, "batch": 4}


def _children() -> list[int]:
    """PIDs of this process's live children (from /proc)."""
    kids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            kids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in _state(k)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_gloo_runs_match_one_process_references_and_write_a_report(tmp_path, monkeypatch):
    # one launch (one torch import per rank), five schedules: naive, GPipe, GPipe + recompute, 1F1B, PipeDream
    monkeypatch.setenv("PIPESIM_CLOCK_PINGPONG", "1")  # also exercise the multi-host clock alignment
    reports = run_validations(["naive", "gpipe", schedules.gpipe(2, 4, recompute=True), "1f1b",
                               schedules.pipedream(2, 2, iterations=2)], 2, 4,
                              workload="mlp", output_dir=tmp_path, timeout=300, workload_options=SMALL, repeats=2)
    assert [r.predicted.schedule.name for r in reports] == ["naive", "gpipe", "gpipe+recompute", "1f1b", "pipedream"]
    for r in reports:
        assert r.gradients_match is True, r.predicted.schedule.name
        assert r.check.error < r.check.tolerance
        assert len(r.makespans) == 2
    # PipeDream: updates equal the weight-stashing replay, and the check could tell synchronous SGD apart
    power = reports[-1].check.power
    assert power["synchronous SGD"] >= 100 * reports[-1].check.tolerance and reports[-1].check.conclusive
    assert reports[0].check.power == {}  # a flush schedule: stashing and synchronous SGD coincide

    report = reports[3]
    d = report.to_dict()
    for key in ("predicted_makespan", "measured_makespan", "makespan_error", "predicted_bubble_fraction",
                "measured_bubble_fraction", "gradients_match", "makespan_error_range", "noise", "significant"):
        assert key in d
    lo, hi = d["makespan_error_range"]
    assert lo <= d["makespan_error"] <= hi and d["noise"] >= 0 and isinstance(d["significant"], bool)
    assert Path(report.paths["report"]).name == "1f1b_K2_M4_mlp_R2.md"  # repeats not the default: in the name
    assert d["replay"].startswith("pipesim simulate -s 1f1b -K 2 -M 4 --costs ") and "--hardware" in d["replay"]
    assert d["measured_makespan"] > 0 and d["predicted_makespan"] > 0
    # one host really has one clock: the ping-pong estimate is bounded by its uncertainty
    assert 0 < report.clock_uncertainty < 0.5
    assert any("clocks aligned by ping-pong" in n for n in report.measured.notes)
    tl = report.measured.timeline
    assert list(tl.columns) == TIMELINE_COLUMNS
    assert report.measured.source == "measured"
    comp = tl[tl["src"] < 0]
    assert len(comp) == len(report.predicted.schedule)
    assert (comp["end"] >= comp["start"]).all()
    sends = tl[tl["src"] >= 0]
    assert set(sends["op"]) == {"SEND_F", "SEND_B"} and len(sends) == 2 * 4
    assert (sends["bytes"] == 4 * 16 * 4).all()  # (batch, width) float32
    # a transfer ends after it starts, and its consumer starts after it ends (up to the clock uncertainty)
    f1 = comp[(comp["op"] == "F") & (comp["stage"] == 1)].set_index("microbatch")["start"]
    sf = sends[sends["op"] == "SEND_F"].set_index("microbatch")["end"]
    assert (f1 >= sf - 2 * report.clock_uncertainty - 1e-6).all()
    assert any("memory not measured" in n for n in report.measured.notes)
    for kind in ("report", "figure", "costs", "hardware"):
        assert Path(report.paths[kind]).exists()
    assert not list(tmp_path.glob("*.part"))
    text = Path(report.paths["report"]).read_text()
    assert "gradients_match: **True**" in text and "makespan" in text
    from sim.model.cost import load_costs
    assert load_costs(report.paths["costs"]).stages == 2


def test_rank_failure_stops_every_rank(tmp_path):
    before = set(_children())
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed at action 1B0"):
        run_validation("gpipe", 2, 2, workload="mlp", output_dir=tmp_path, timeout=120, fail_at="1:1B0",
                       workload_options=SMALL)
    assert time.monotonic() - t0 < 120
    assert set(_children()) - before == set()  # no rank left behind
    assert not list(tmp_path.iterdir())  # no report written as if complete


def test_rank_that_dies_stops_every_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_FAULT", "kill")  # rank 0 SIGKILLs itself at 0F1: no error file, no message
    before = set(_children())
    with pytest.raises(RankFailedError, match=r"rank 0 was killed by signal 9"):
        run_validation("1f1b", 2, 2, workload="mlp", output_dir=tmp_path, timeout=120, fail_at="0:0F1",
                       workload_options=SMALL)
    assert set(_children()) - before == set()
    assert not list(tmp_path.iterdir())


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_nccl_without_gpu_is_one_line_error():
    out = _cli("validate", "--backend", "nccl", "-K", "2")
    assert out.returncode == 2
    assert out.stderr.startswith("pipesim: error: --backend nccl needs CUDA GPUs")
    assert len(out.stderr.strip().splitlines()) == 1


def test_unknown_workload_and_backend_are_refused_before_start():
    out = _cli("validate", "--workload", "resnet")
    assert out.returncode == 2 and "unknown workload 'resnet'" in out.stderr
    with pytest.raises(ValidationError, match="unknown backend"):
        check_request(workload="mlp", backend="mpi", devices=2)


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValidationError, match="2 devices asked, 1 GPU"):
        check_request(workload="mlp", backend="nccl", devices=2)


def test_bad_fail_at_and_costs_are_refused(tmp_path):
    with pytest.raises(ValidationError, match="has no action"):
        run_validation("gpipe", 2, 2, output_dir=None, fail_at="1:0F0")
    bad = tmp_path / "c.csv"
    bad.write_text("stage,forward\n0,1\n")
    with pytest.raises(ValidationError, match="1 stages but the schedule has 2"):
        run_validation("gpipe", 2, 2, workload="emulated", costs=bad, output_dir=None)


def test_validate_without_torch_says_how_to_install(monkeypatch):
    import argparse

    from sim.cli.validate import TorchMissingError, run
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TorchMissingError, match=r"pip install 'pipesim\[validate\]'"):
        run(argparse.Namespace())


def test_simulator_cli_does_not_import_torch():
    code = "import sim.cli, sys; sim.cli.build_parser(); assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_run_on_gpus(tmp_path):
    k = min(2, torch.cuda.device_count())
    report = run_validation("1f1b", k, 4, workload="mlp", backend="nccl", output_dir=tmp_path, timeout=300,
                            workload_options=SMALL)
    assert report.gradients_match is True
    assert all(m is not None and m > 0 for m in report.memory)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_calibrations_before_and_after_the_runs_time_the_same_gpu(tmp_path):
    """A GPU-bound stage (about 1.5 ms a forward on an H200): the calibration of each stage alone before the runs
    and the one after them agree (validate.rank.measure's spin-up: on an H200 the noise floor read +-359% without
    it while the runs spread +-0.1%)."""
    report = run_validation("1f1b", 1, 4, workload="mlp", backend="nccl", output_dir=tmp_path, timeout=300,
                            workload_options={"width": 4096, "depth": 4, "batch": 512})
    assert report.noise_floor.stage_costs < 0.5, report.noise_floor
    assert report.noise_floor.noise < 0.5, report.noise_floor
    json.dumps(report.to_dict(), default=str)


def _scripted_clock(times):
    """A clock for validate.rank.measure.spin_up whose every timing returns the next of *times*."""
    it = iter(times)
    return lambda: (lambda: next(it))


@pytest.mark.parametrize("times,runs", [
    ([0.0903 * 0.85 ** i for i in range(12)] + [0.0137] * 200, 20),  # slow at first, falling, then settled
    ([0.0024] * 1000, 209),  # settled from the start: the least spin-up (0.5 s) and no more
    ([0.05 * (1 + (i % 2)) * (1 + i / 10) for i in range(1000)], None),  # never settles: stops at the limit
])
def test_the_gpu_spin_up_runs_until_the_forward_time_settles(times, runs):
    from validate.rank.measure import GPU_SPIN_UP_LIMIT, GPU_SPIN_UP_SECONDS, spin_up

    done = spin_up(lambda i: None, _scripted_clock(times))
    assert done == times[:len(done)]
    if runs is not None:
        assert len(done) == runs
    else:
        assert sum(done[:-1]) < GPU_SPIN_UP_LIMIT <= sum(done)
    assert sum(done) >= GPU_SPIN_UP_SECONDS


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}").exists() else []:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def test_ctrl_c_stops_every_rank(tmp_path):
    import signal
    proc, ranks = _start_cli(tmp_path)  # 30 s per action: the run cannot finish first
    try:
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, proc.stderr.read()
    assert all(_state(p) == "Z" for p in ranks)  # every rank is gone
    assert not (tmp_path / "out").exists()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _start_cli(tmp_path, *extra, costs="30"):
    """A validate run that cannot finish by itself (30 s per emulated action), in its own session."""
    path = tmp_path / "slow.csv"
    path.write_text(f"stage,forward,backward\n0,{costs},{costs}\n1,{costs},{costs}\n")
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "validate", "-s", "gpipe", "-K", "2", "-M", "2",
                             "--workload", "emulated", "--costs", str(path), "-o", str(tmp_path / "out"), *extra],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    deadline = time.monotonic() + 120
    ranks = []
    while time.monotonic() < deadline and len(ranks) < 2:  # wait until both ranks run
        ranks = [p for p in _descendants(proc.pid) if "validate.rank.worker" in _cmdline(p)]
        time.sleep(0.2)
    assert len(ranks) == 2
    return proc, ranks


def _reap(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait()


def _gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(_state(p) == "Z" for p in pids):
        time.sleep(0.1)
    return all(_state(p) == "Z" for p in pids)


def test_sigterm_to_the_parent_alone_stops_every_rank_and_leaves_no_folder(tmp_path):
    import signal
    proc, ranks = _start_cli(tmp_path)
    try:
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGTERM)  # what timeout, Slurm, CI cancellation and docker stop send
        proc.wait(timeout=30)
    finally:
        _reap(proc)
    assert proc.returncode == 143, proc.stderr.read()
    assert _gone(ranks)
    assert not list((tmp_path / "tmp").iterdir())  # the launcher's temporary folder is gone too
    assert not (tmp_path / "out").exists()


def test_ranks_die_with_their_parent_even_on_sigkill(tmp_path):
    proc, ranks = _start_cli(tmp_path)
    try:
        time.sleep(1.0)
        os.kill(proc.pid, 9)  # no handler can run: PR_SET_PDEATHSIG must end the ranks
        proc.wait(timeout=30)
    finally:
        _reap(proc)
    assert _gone(ranks), [(_state(p), _cmdline(p)) for p in ranks]


@pytest.mark.slow
def test_a_stopped_rank_is_named(tmp_path):
    import signal
    proc, ranks = _start_cli(tmp_path, "--timeout", "10", costs="0.05")
    try:
        rank1 = next(p for p in ranks if _environ(p).get("RANK") == "1")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((tmp_path / "tmp").glob("*/progress.log")):
            time.sleep(0.1)  # rank 0 has joined the group and started
        time.sleep(1.0)
        os.kill(rank1, signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
    finally:
        _reap(proc)
    assert proc.returncode == 2, err
    assert "rank 1 was stopped" in err, err
    assert _gone(ranks)


def _environ(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
def test_cli_progress_timeline_replay_and_report_name(tmp_path):
    costs = tmp_path / "fast.csv"
    costs.write_text("stage,forward,backward\n0,0.01,0.02\n1,0.01,0.02\n")
    out = subprocess.run([sys.executable, "-m", "sim", "validate", "-s", "1f1b", "-K", "2", "-M", "2",
                          "--iterations", "2", "--repeats", "2", "--workload", "emulated", "--costs", str(costs),
                          "--timeline", str(tmp_path / "tl.csv"), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for line in ("launching 2 ranks", "warm-up 1/2", "timed run 2/2", "comparing"):
        assert line in out.stderr, out.stderr
    import pandas as pd
    tl = pd.read_csv(tmp_path / "tl.csv")
    assert list(tl.columns) == TIMELINE_COLUMNS and len(tl) > 0
    report = tmp_path / "out" / "1f1b_K2_M2_emulated_I2_R2.md"
    text = report.read_text()
    assert "pipesim simulate -s 1f1b -K 2 -M 2 --iterations 2 --costs" in text
    assert "not significant" in out.stdout or "outside the measurement noise" in out.stdout
    quiet = subprocess.run([sys.executable, "-m", "sim", "validate", "-s", "1f1b", "-K", "2", "-M", "2", "--repeats",
                            "1", "--workload", "emulated", "--costs", str(costs), "--json", "-o", str(tmp_path / "q")],
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    d = json.loads(quiet.stdout)
    assert d["repeats"] == 1 and d["significant"] in (True, False) and len(d["makespan_error_range"]) == 2


def test_torchrun_path_with_one_process(tmp_path):
    # what torchrun starts on every node, here with a world of one: the worker builds the request from its
    # flags, runs, and (rank 0) writes the report; progress goes to stderr there
    from validate.rank.comm import free_port
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    out = subprocess.run([sys.executable, "-m", "validate.torchrun", "-s", "gpipe", "-M", "2", "--workload", "mlp",
                          "--width", "8", "--depth", "1", "--batch", "2", "--repeats", "2", "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert "timed run 2/2" in out.stderr and "gradients_match True" in out.stdout
    assert (tmp_path / "gpipe_K1_M2_mlp_R2.md").exists()


def test_the_executor_keeps_five_timed_runs_unless_told():
    """``--repeats`` defaults to None so that ``--runtime torch`` can choose its profiled steps; pipesim's executor
    still times DEFAULT_REPEATS runs without it, and the number given with it."""
    from sim.cli import build_parser
    from sim.cli.validate import run_options
    from validate.request import DEFAULT_REPEATS

    parser = build_parser()
    assert run_options(parser.parse_args(["validate", "-s", "1f1b"])).repeats == DEFAULT_REPEATS == 5
    assert run_options(parser.parse_args(["validate", "-s", "1f1b", "--repeats", "3"])).repeats == 3
