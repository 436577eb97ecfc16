"""``plan --jobs N``: worker processes kept across the planner's evaluate() calls, each schedule shape generated once
(issue 25, bug a), with the same rows as one job; and numba really loaded before a large batch's first schedule."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from sim import schedules
from sim.model import gpus
from sim.model.models import ModelSpec
from sim.search import batch
from sim.search.batch import Candidate, evaluate, worker_session
from sim.search.planner import PlanSpace, plan
from hang_guard import communicate_or_dump  # noqa: E402 (tests/hang_guard.py)

pytestmark = pytest.mark.skipif(not batch.WorkerSession.available(), reason="worker sessions need fork")


def _candidates(m_scale: int) -> list[Candidate]:
    names = ("1f1b", "zb-h2", "zbv", "dualpipev", "pipedream-2bw")
    return [Candidate(schedule=name, devices=K, microbatches=m_scale * K * (2 if name in ("zbv", "dualpipev") else 1),
                      recompute=r, tag=(name, K, r))
            for name in names for K in (2, 3, 4) for r in (False, True)]


def _count_generations(monkeypatch, tmp_path):
    """schedules.generate, patched before the workers fork, appends one line per call to a file they share."""
    log = tmp_path / "generated.txt"
    real = schedules.generate

    def counted(name, devices, microbatches, **kw):
        with open(log, "a") as f:
            f.write(f"{name} {devices} {microbatches}\n")
        return real(name, devices, microbatches, **kw)

    monkeypatch.setattr(schedules, "generate", counted)
    monkeypatch.setattr(batch, "_schedule_cache", type(batch._schedule_cache)())  # the parent has nothing cached
    return lambda: log.read_text().splitlines() if log.exists() else []


def test_a_session_generates_each_shape_once_across_calls(monkeypatch, tmp_path):
    generated = _count_generations(monkeypatch, tmp_path)
    first, second = _candidates(1), _candidates(2)
    with worker_session(2) as session:
        rows = [evaluate(c, jobs=2) for c in (first, second, first, second)]
    shapes = {(c.schedule, c.devices, c.microbatches) for c in first + second}
    assert sorted(generated()) == sorted(f"{n} {k} {m}" for n, k, m in shapes)  # each once, recompute derived
    assert set(session.assign([((("1f1b",),), 1.0)])) <= {0, 1}
    assert rows[0] == rows[2] and rows[1] == rows[3]
    assert rows[0] == evaluate(first, jobs=1) and rows[1] == evaluate(second, jobs=1)  # the same floats


def test_without_a_session_each_call_generates_again(monkeypatch, tmp_path):
    """The bug the session fixes, seen by the same counter: per-call pools start with an empty cache."""
    generated = _count_generations(monkeypatch, tmp_path)
    first = _candidates(1)
    for _ in range(2):
        evaluate(first, jobs=2)
    assert len(generated()) >= 2 * len({(c.schedule, c.devices, c.microbatches) for c in first})


def test_homes_are_sticky_and_new_shapes_go_to_the_least_loaded_worker():
    session = batch.WorkerSession(3)
    assert session.assign([("a", 5.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)]) == [0, 1, 2, 1]
    assert session.assign([("d", 9.0), ("e", 1.0), ("a", 1.0)]) == [1, 0, 0]


def test_plan_with_two_jobs_is_the_plan_with_one():
    model = ModelSpec(name="small", layers=12, hidden=1024, heads=16, vocab=32000, seq_len=1024)
    space = PlanSpace(schedules=tuple(schedules.names()), pipeline=(1, 2, 4), tensor=(1, 2),
                      microbatch_sizes=(1, 2, 4), chunks=(2, 3))
    gpu = gpus.get_gpu("a100-80gb")
    one = plan(model, gpu, gpus=8, global_batch=32, space=space, memory_cap=6e9, jobs=1)
    two = plan(model, gpu, gpus=8, global_batch=32, space=space, memory_cap=6e9, jobs=2)
    assert len(one.ranked) > 5
    assert one.ranked.equals(two.ranked) and one.rejected.equals(two.rejected)
    assert one.explanation == two.explanation


def test_an_error_in_a_worker_stops_the_session_and_propagates(monkeypatch):
    def broken(candidates, compiled=False):  # called by name inside the forked workers
        raise RuntimeError("a bug in a worker")

    monkeypatch.setattr(batch, "_evaluate_batch", broken)
    with pytest.raises(RuntimeError, match="a bug in a worker"):
        with worker_session(2):
            evaluate(_candidates(1), jobs=2)


def test_loading_the_compiled_kernel_loads_it_in_a_fresh_process():
    """A fresh process (numba not imported yet) used to answer the loader's one-action run with numpy waves and
    load nothing, so a large batch spent a second of numpy waves before numba came anyway."""
    code = textwrap.dedent("""
        from sim import jit
        from sim.core import listsched
        from sim.search import batch
        batch._load_compiled_kernel()
        names = {k.__name__ for k in jit._kernels}
        print(json.dumps([jit.loaded(), sorted(names), listsched._wavefront_seconds]))
    """)
    out = subprocess.run([sys.executable, "-c", "import json" + code], capture_output=True, text=True, check=True)
    loaded, names, wavefront_seconds = json.loads(out.stdout)
    assert loaded and {"_list_schedule", "memory_peaks", "_plan_kernel"} <= set(names) and wavefront_seconds == 0


@pytest.mark.slow  # one 405B plan with two kept workers, stopped once they run (~3-8 s)
def test_ctrl_c_stops_the_kept_workers_with_130(tmp_path):
    import os
    import signal
    import time

    out_dir = tmp_path / "plan"
    argv = [sys.executable, "-m", "sim", "plan", "--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "768",
            "-G", "1536", "--schedules", ",".join(schedules.names()), "--pipeline-parallel",
            "1,2,3,4,6,8,12,16,24,32,48,64", "--tensor-parallel", "1,2,4,8", "--microbatch-size", "1,2,4,8,16,32",
            "--chunks", "2,3,4,6", "--jobs", "2", "--no-progress", "-o", str(out_dir)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONFAULTHANDLER": "1"})
    workers: list[str] = []
    deadline = time.monotonic() + 120
    while len(workers) < 2 and p.poll() is None and time.monotonic() < deadline:  # until both workers run
        workers = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        time.sleep(0.05)
    assert len(workers) == 2, "the plan ended before its workers were seen"
    p.send_signal(signal.SIGINT)
    out, _ = communicate_or_dump(p, "the plan")
    assert p.returncode == 130 and out.strip().splitlines()[-1] == "pipesim: interrupted"
    assert not out_dir.exists()
    for pid in workers:  # reaped: gone, not left running
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


# The two tests below run in a fresh interpreter: signals are held per thread (pthread_sigmask), and a process
# directed signal goes to any thread that does not block it, so in pytest's process (threads left by earlier tests)
# the kernel may hand SIGINT to another thread and Python raises it in the main thread at once. A pipesim command
# starts its pools before any other thread exists.
_HELD_CHECKS = textwrap.dedent("""
    import multiprocessing.context as mpc, signal, threading, time
    from sim.search.batch import _worker_ignores_sigint
    from sim.search.worker_pool import WorkerSession, interrupts_held

    # Ctrl-C is process-directed: the kernel gives it to this thread (which blocks it in the hold: it waits for
    # the mask) or to another (the next check). Sent to this thread itself, so the check cannot depend on which.
    reached = False
    try:
        with interrupts_held():
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            reached = True  # not interrupted inside the block
        print("not raised")
    except KeyboardInterrupt:
        print("held, then raised" if reached else "raised inside")

    # The kernel gives a process-directed signal to a thread that does not block it (numpy's OpenBLAS threads are
    # there in every pipesim process): sent to such a thread here, as the kernel may, so the check cannot pass by
    # luck. The main thread's held mask alone then raised it inside the block (CI, one run in many).
    parked = threading.Event()
    other = threading.Thread(target=parked.wait, daemon=True)
    other.start()
    reached = False
    try:
        with interrupts_held():
            signal.pthread_kill(other.ident, signal.SIGINT)
            time.sleep(0.2)  # the other thread runs CPython's C handler, which asks the main thread to act
            for _ in range(1000):  # each loop iteration is a point where CPython runs pending handlers
                pass
            reached = True
        print("not raised")
    except KeyboardInterrupt:
        print("held on another thread, then raised" if reached else "raised inside, taken by another thread")

    # Such a thread may run CPython's C handler late (when it gets a core): here while the hold puts the handlers
    # back, SIGINT's already in place. It must still be raised, and the mask left as it was: raised before the mask
    # was restored, it left Ctrl-C blocked for good, and every later one was lost (on a loaded machine).
    real_signal, once = signal.signal, []

    def late(number, handler):
        if number == signal.SIGTERM and handler == signal.SIG_DFL and not once:  # putting SIGTERM's back
            once.append(1)
            signal.pthread_kill(other.ident, signal.SIGINT)
            time.sleep(0.2)
        return real_signal(number, handler)

    signal.signal = late
    reached = False
    try:
        with interrupts_held():
            reached = True
        print("not raised")
    except KeyboardInterrupt:
        print("late, then raised" if reached else "raised inside")
    signal.signal = real_signal
    parked.set()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print("Ctrl-C left blocked" if signal.SIGINT in blocked else "mask as it was")

    def handlers(_):
        return (signal.getsignal(signal.SIGINT) is signal.default_int_handler and "Ctrl-C raises",
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and "SIGTERM ends it")

    session = WorkerSession(1)  # no initializer: the worker takes back the handlers the hold replaced
    print("a worker's handlers:", *next(session.run([(0, None)], handlers)))
    session.close()

    created = []
    real = mpc.ForkContext.Pool

    def pool(self, *args, **kwargs):
        made = real(self, *args, **kwargs)
        created.append(made)
        if len(created) == 2:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # Ctrl-C while the session starts its workers
        return made

    mpc.ForkContext.Pool = pool
    try:
        list(WorkerSession(2, initializer=_worker_ignores_sigint).run([(0, -1), (1, -2)], abs))
        print("no interrupt")
    except KeyboardInterrupt:
        workers = [w for p in created for w in p._pool]
        for w in workers:
            w.join(timeout=10)
        print(f"{len(created)} pools, {len(workers)} workers, {sum(w.is_alive() for w in workers)} alive")
""")


def test_ctrl_c_while_the_workers_start_terminates_them():
    """Held interrupts arrive when the block ends, also where another thread takes the signal, late or not; a worker
    forked in the block gets back the handlers the hold replaced; Ctrl-C as the second worker pool starts waits until
    both pools are the session's, which then terminates both (CPython's Pool() lets a KeyboardInterrupt escape with
    its workers forked; before interrupts_held both pools' workers were left running)."""
    done = subprocess.run([sys.executable, "-c", _HELD_CHECKS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "held, then raised", "held on another thread, then raised", "late, then raised", "mask as it was",
        "a worker's handlers: Ctrl-C raises SIGTERM ends it", "2 pools, 2 workers, 0 alive"], done.stdout + done.stderr
