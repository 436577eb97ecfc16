"""Two torchrun agents on this machine, as two nodes: the launcher the multi-node tests share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def torchrun_or_skip() -> str:
    """The ``torchrun`` next to this Python (or on PATH); skips the test where there is none."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    return torchrun


def run_agents(command: Sequence[str], env: Callable[[int], dict], cwd: Callable[[int], Path], *, agents: int = 2,
               timeout: float = 240) -> list[tuple[subprocess.Popen, str, str]]:
    """Start *agents* copies of *command* (agent n with ``env(n)`` in ``cwd(n)``, each in its own session), wait for
    all of them, and return (process, stdout, stderr) per agent; an agent still running after *timeout* seconds
    (or when the test fails) is killed with its whole process group, so no rank outlives the test."""
    procs = [subprocess.Popen(list(command), env=env(n), cwd=cwd(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for n in range(agents)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return [(p, out, err) for p, (out, err) in zip(procs, outputs)]
