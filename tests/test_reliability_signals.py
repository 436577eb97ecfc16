"""Ctrl-C and SIGTERM end every command the same way (issue 26.7 and the exit codes of issue 26).

A signal that arrives while a numba-compiled kernel runs used to surface as ``SystemError:
CPUDispatcher(...) returned a result with an exception set`` (exit 1, "a bug in pipesim") or be lost
(exit 0): compiled code calls back into Python when it boxes its results (``_numba_unpickle``), and a
handler that raises there leaves an exception set under a call that returns a value. sim.jit holds
SIGINT and SIGTERM back while a kernel runs; these tests deliver SIGINT in the middle of a long kernel at
several delays, and show the SystemError again with the deferral switched off.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sim.cli
from sim.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
DELAYS = (0.3, 0.6, 0.9, 1.2)  # seconds between the SIGINTs: each lands inside a ~0.5 s kernel call

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from sim import jit

    if sys.argv[1] == "no-deferral":  # the bug, injected: the numba dispatcher called bare
        jit._uninterrupted = lambda dispatcher: dispatcher

    def spin(n):  # long in compiled code, then returns arrays: boxing them calls back into Python
        acc = 0.0
        for i in range(n):
            acc += (i % 7) * 0.5
        out = np.empty(2)
        out[0] = acc
        return out, np.zeros(3)

    kernel = jit.compiled(spin)
    kernel(10)  # compiled (and cached) before the parent starts signalling
    print("ready", flush=True)
    for _ in range(int(sys.argv[2])):
        try:
            while True:
                kernel(300_000_000)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        except SystemError:
            print("SystemError", flush=True)
""")


def _interrupt_kernel(tmp_path: Path, mode: str, delays=DELAYS) -> list[str]:
    """What each SIGINT, sent at *delays* into a running compiled kernel, raised in the child."""
    script = tmp_path / "kernel_child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), mode, str(len(delays))], stdout=subprocess.PIPE,
                             text=True, env=ENV, cwd=tmp_path)
    try:
        assert child.stdout.readline() == "ready\n"
        seen = []
        for delay in delays:
            time.sleep(delay)
            child.send_signal(signal.SIGINT)
            seen.append(child.stdout.readline().strip())
        assert child.wait(timeout=120) == 0
        return seen
    finally:
        child.kill()


def test_sigint_inside_a_compiled_kernel_is_a_keyboard_interrupt_every_time(tmp_path):
    assert _interrupt_kernel(tmp_path, "deferred") == ["KeyboardInterrupt"] * len(DELAYS)


def test_without_the_deferral_the_same_sigint_is_a_system_error(tmp_path):
    assert "SystemError" in _interrupt_kernel(tmp_path, "no-deferral", DELAYS[:2])  # what issue 26.7 saw


def test_the_handlers_in_place_before_a_kernel_are_back_after_it():
    from sim import jit

    before = {s: signal.getsignal(s) for s in jit.DEFERRED_SIGNALS}
    with jit.signals_deferred():
        for s in jit.DEFERRED_SIGNALS:  # a Python handler is held back; SIG_DFL (ends the process at once) stays
            assert (signal.getsignal(s) is not before[s]) == callable(before[s])
    assert {s: signal.getsignal(s) for s in jit.DEFERRED_SIGNALS} == before


def test_a_signal_held_back_is_delivered_once_on_leaving():
    from sim import jit

    with pytest.raises(KeyboardInterrupt):
        with jit.signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now, and only noted it
    # nothing left pending: a second delivery would raise here


# ------------------------------------------------------------------ exit codes: 130 for SIGINT, 143 for SIGTERM
def _command_that_receives(signum: int):
    def run(args):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler interrupts this sleep
        return 0
    return run


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
                                                 (signal.SIGTERM, EXIT_TERMINATED, "terminated")])
def test_every_command_exits_130_on_sigint_and_143_on_sigterm(monkeypatch, capsys, signum, code, word):
    import sim.cli.simulate as command

    monkeypatch.setattr(command, "run", _command_that_receives(signum))
    assert sim.cli.main(["simulate"]) == code
    assert capsys.readouterr().err == f"pipesim: {word}\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # main() put the default back


def test_sweep_exits_143_on_sigterm_like_every_command(monkeypatch, capsys, tmp_path):
    """sweep's worker pool turns SIGTERM into an interrupt of its own (issue 26.10: it gave 130)."""
    import sim.cli.sweep as command
    from sim.search import batch

    def sweep_receiving_sigterm(*args, **kwargs):
        with batch._sigterm_as_interrupt():  # what the pool runs under
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)

    monkeypatch.setattr(command, "run_sweep", sweep_receiving_sigterm)
    assert sim.cli.main(["sweep", "-K", "2", "-M", "2", "-o", str(tmp_path / "out")]) == EXIT_TERMINATED
    assert capsys.readouterr().err == "pipesim: terminated\n"
    assert not (tmp_path / "out").exists()


def test_terminated_cleans_up_like_ctrl_c():
    assert issubclass(Terminated, KeyboardInterrupt)


@pytest.mark.slow  # two real runs of a 4.2 M-action simulation and two plans, each stopped by SIGINT
@pytest.mark.parametrize("argv", [["simulate", "-K", "256", "-M", "8192"],
                                  ["plan", "--model", "small-gpt", "--gpu", "cpu", "--gpus", "8", "--global-batch",
                                   "512", "--no-progress", "-o", "{tmp}/plan"]])
def test_sigint_stops_simulate_and_plan_with_130(tmp_path, argv):
    interrupted = 0
    for delay in (0.8, 1.6):
        argv_here = [a.replace("{tmp}", str(tmp_path)) for a in argv]
        child = subprocess.Popen([sys.executable, "-m", "sim", *argv_here], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        err = child.communicate(timeout=300)[1]
        if child.returncode == 0:  # finished before the signal came: nothing to check at this delay
            continue
        assert child.returncode == EXIT_INTERRUPTED, err
        assert err.strip().splitlines()[-1] == "pipesim: interrupted" and "Error" not in err
        interrupted += 1
    assert interrupted  # at least one signal landed while the command ran


def test_a_finished_command_ignores_ctrl_c_while_the_interpreter_shuts_down():
    """Python restores SIGINT's default action during its shutdown (numba's and the pools' clean-up: a few hundred
    ms after a plan), so a Ctrl-C then killed a command whose files were written (exit -2, seen with `plan` at a
    1.8 s delay). `pipesim` / `python -m sim` ignore Ctrl-C once the command is done: atexit sees it ignored, and
    a Ctrl-C sent from there ends nothing (exit 0, the command's code)."""
    code = textwrap.dedent("""
        import atexit, os, signal, sys
        import sim.cli
        def check():
            print("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "not ignored")
            os.kill(os.getpid(), signal.SIGINT)
        atexit.register(check)
        sys.argv = ["pipesim", "schedules"]
        sim.cli.entry()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ignored") and "not ignored" not in done.stdout
