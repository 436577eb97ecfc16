"""A hang guard for tests that signal a pipesim process and wait for it to end (the Ctrl-C / SIGTERM tests)."""

from __future__ import annotations

import signal
import subprocess

import pytest


def communicate_or_dump(proc: subprocess.Popen, what: str, timeout: float = 60.0) -> tuple[str, str]:
    """``proc.communicate(timeout)``; where *proc* is still running then, SIGABRT makes faulthandler (the process
    runs with ``PYTHONFAULTHANDLER=1``) print every thread's stack, and the test fails with it: where it hung.
    The teardown is bounded (sim/search/worker_pool.py ``terminate_pool``), so this guards, it does not wait."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=timeout)
        pytest.fail(f"{what} was still running {timeout:g} s after the signal; its threads:\n"
                    + ((out or "") + (err or ""))[-8000:])
