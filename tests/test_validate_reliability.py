"""The validator's process side under hostile conditions (issue 26 items 1, 4, 9 and 10).

- The rendezvous store never listens on a network interface: the listening sockets of a running
  validation (launcher and ranks) are read from ``/proc/net/tcp{,6}`` and must all be loopback.
- A SIGKILL of the launcher leaves neither ranks nor its temporary folder behind.
- Sizes that would not fit in memory (``-K 17`` emulated ranks on a small machine, ``--depth 1000000``),
  a hardware file for other K, an unwritable ``--timeline`` and a file as ``-o`` are refused before
  any rank starts (the launcher is replaced by one that fails the test).
- The load the run's own ranks make is not blamed on other work.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sim.cli import main  # noqa: E402
from validate import environment  # noqa: E402
from validate.request import CpuShare, WorkloadSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _start(tmp_path, *extra):
    """``pipesim validate`` that cannot finish by itself (30 s per emulated action), with its own TMPDIR."""
    costs = tmp_path / "slow.csv"
    costs.write_text("stage,forward,backward\n0,30,30\n1,30,30\n")
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "sim", "validate", "-s", "gpipe", "-K", "2", "-M", "2",
                             "--workload", "emulated", "--costs", str(costs), "-o", str(tmp_path / "out"), *extra],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env, cwd=ROOT)


def _ranks(proc, within=120.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ranks = [p for p in _descendants(proc.pid) if "validate.rank.worker" in _cmdline(p)]
        if len(ranks) == 2:
            return ranks
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


def _end(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _listening(pids: list[int]) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets *pids* listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state 0A: LISTEN
                out.append(fields[1])
    return out


_LOOPBACK = ("0100007F:", "00000000000000000000000001000000:", "0000000000000000FFFF00000100007F:")
"""127.0.0.1, ::1 and ::ffff:127.0.0.1 in /proc/net/tcp{,6}'s byte order."""


def test_a_running_validation_listens_on_the_loopback_only(tmp_path):
    # issue 26 item 1: torch's TCP store of rank 0 listened on every interface (* in ss -ltn)
    proc = _start(tmp_path)
    try:
        ranks = _ranks(proc)
        deadline = time.monotonic() + 120  # until both ranks have joined (gloo's sockets are up)
        while time.monotonic() < deadline and any(not _listening([r]) for r in ranks):
            time.sleep(0.2)
        addresses = _listening([proc.pid, *ranks])
        assert addresses, "the ranks never listened: they did not get as far as the process group"
        assert all(a.startswith(_LOOPBACK) for a in addresses), addresses
    finally:
        _end(proc)


def test_loopback_check_sees_a_socket_on_every_interface(tmp_path):
    # the check's own test: a socket bound to 0.0.0.0 is seen and is not loopback
    import socket
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        addresses = _listening([os.getpid()])
    assert addresses and not any(a.startswith(_LOOPBACK) for a in addresses)


def test_sigkill_of_the_launcher_leaves_no_rank_and_no_temporary_folder(tmp_path):
    proc = _start(tmp_path)
    try:
        ranks = _ranks(proc)
        assert list((tmp_path / "tmp").iterdir())  # the launcher's folder exists while it runs
        os.kill(proc.pid, signal.SIGKILL)  # no handler runs: the watchdog must remove the folder
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (list((tmp_path / "tmp").iterdir())
                                               or not all(_state(r) == "Z" for r in ranks)):
            time.sleep(0.1)
        assert all(_state(r) == "Z" for r in ranks)
        assert not list((tmp_path / "tmp").iterdir())
    finally:
        _end(proc)


def test_sigkill_of_the_torch_runtimes_launcher_leaves_no_temporary_folder(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "sim", "validate", "--runtime", "torch", "-s", "gpipe", "-K", "2",
                             "-M", "2", "--width", "8", "--depth", "1", "--batch", "2", "--repeats", "100000",
                             "-o", str(tmp_path / "out")], stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        ranks: list[int] = []
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [p for p in _descendants(proc.pid) if "validate.pytorch.runtime" in _cmdline(p)]
            time.sleep(0.2)
        assert len(ranks) == 2 and list((tmp_path / "tmp").glob("pipesim-torch-*"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        ours = lambda: list((tmp_path / "tmp").glob("pipesim-*"))  # noqa: E731 - torch keeps its own cache there
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (ours() or not all(_state(r) == "Z" for r in ranks)):
            time.sleep(0.1)
        assert all(_state(r) == "Z" for r in ranks)
        assert not ours()
    finally:
        _end(proc)


@pytest.fixture
def no_launch(monkeypatch):
    import validate.launch
    import validate.rank.workloads

    def fail(*args, **kwargs):
        raise AssertionError("a rank was launched")

    monkeypatch.setattr(validate.launch, "launch", fail)
    monkeypatch.setattr(validate.rank.workloads, "build_stage_module", fail)  # nothing built before the checks


def _refused(capsys, *argv) -> str:
    code = main(["validate", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("pipesim: error: "), err
    return err


def test_more_emulated_ranks_than_memory_holds_are_refused(no_launch, monkeypatch, capsys):
    # issue 26 item 10: -K 17 --workload emulated used 5.1 GB (300 MB per rank) with no limit
    monkeypatch.setattr(environment, "available_memory", lambda: 4 * 2**30)
    err = _refused(capsys, "-s", "gpipe", "-K", "17", "-M", "4", "--workload", "emulated", "-o", "unused")
    assert "17 ranks x 310 MiB" in err and "4.0 GiB of memory available" in err and "at most about 13 ranks" in err


def test_depth_and_widths_that_do_not_fit_are_refused_before_building(no_launch, capsys):
    # issue 26 item 4: validate --depth 1000000 ran 36 s and took 5 GB before failing
    assert "more than 4096 layers per stage" in _refused(capsys, "-K", "2", "-M", "4", "--depth", "1000000")
    assert "more than 4096 layers per stage" in _refused(capsys, "--runtime", "torch", "-K", "2", "-M", "4",
                                                         "--depth", "1000000")
    err = _refused(capsys, "-K", "2", "-M", "4", "--depth", "4096", "--width", "4096")
    assert "GiB of memory available" in err and "lower --depth, --width or --d-model" in err


def test_memory_estimate_counts_the_weights():
    mlp = WorkloadSpec(name="mlp", width=1024, depth=3)
    assert environment.workload_bytes(mlp) == 4 * 3 * (1024 * 1024 + 1024)
    assert environment.workload_bytes(WorkloadSpec(name="emulated")) == 0


def test_hardware_timeline_and_output_are_checked_before_the_run(no_launch, tmp_path, capsys):
    # issue 26 item 9: these were checked only after a 24-30 s run
    hw = tmp_path / "hw.json"
    hw.write_text('{"devices": 3, "latency": 1e-5, "bandwidth": 1e9}')
    base = ["-s", "gpipe", "-K", "2", "-M", "4", "--workload", "emulated"]
    assert "the hardware describes 3 devices; the run has 2" in _refused(capsys, *base, "--hardware", str(hw),
                                                                         "-o", str(tmp_path / "o"))
    assert "use a .csv or .parquet file name" in _refused(capsys, *base, "--timeline", str(tmp_path / "t.txt"))
    (tmp_path / "adir.csv").mkdir()
    assert "it is an existing folder" in _refused(capsys, *base, "--timeline", str(tmp_path / "adir.csv"))
    assert "cannot write /proc/t.csv" in _refused(capsys, *base, "--timeline", "/proc/t.csv")
    (tmp_path / "afile").write_text("")
    assert "it is a file, not a folder" in _refused(capsys, *base, "-o", str(tmp_path / "afile"))
    assert not (tmp_path / "o").exists()


def test_the_runs_own_load_is_not_blamed_on_other_work(monkeypatch):
    # issue 26 item 10: 17 emulated ranks on 2 cores raise the load above the cores by themselves
    monkeypatch.setattr(environment, "usable_cores", lambda: [0, 1])
    own = CpuShare(wall=10.0, machine=19.0, own=18.0)  # the ranks kept both cores busy; others took 1 CPU-s
    line = environment.load_warning(6.0, 17.0, cpu=own)
    assert "WARNING" not in line and "not blamed on other work" in line and "only 1.0 of the 20.0 CPU-s" in line
    busy = CpuShare(wall=10.0, machine=19.0, own=6.0)  # other work took 13 of the 20 CPU-s
    assert "WARNING: other work used 13.0 CPU-s" in environment.load_warning(1.0, 3.0, cpu=busy)
    assert environment.load_warning(0.5, 0.7, cpu=CpuShare(wall=10.0, machine=5.0, own=4.5)) is None
    assert "other work competed" in environment.load_warning(1.0, 3.0)  # not measured: the load is all there is


def test_cpu_snapshot_counts_waited_children_as_own():
    before = environment.cpu_snapshot()
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    share = environment.cpu_share(before, environment.cpu_snapshot())
    assert share is not None and share.own >= 0.45 and share.machine >= 0.4 and share.wall >= 0.45
