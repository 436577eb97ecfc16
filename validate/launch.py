"""Start K worker processes on this machine, watch them, and end them all on any failure.

Each rank is ``python -m validate.worker --spec FILE`` with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT in its environment (the
same variables torchrun sets, so one worker serves both launchers). The launcher
polls the processes every 50 ms. When one exits with an error or is killed, when
the run passes its timeout (each rank's own waits time out after ``timeout`` seconds
and name their action; the launcher stops everything ``_GRACE`` seconds later), or on
Ctrl-C, every other rank is terminated (SIGTERM, then SIGKILL after 3 s) and waited
for, so no process is left behind. The error names the rank and the action it was
on (from the rank's ``rank<r>.error.json``), preferring the cause over the echoes:
a rank's own error, then a rank that died, then peers that lost their connection.

Units: seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["RankFailedError", "launch"]

_GRACE = 30.0
"""Seconds past the timeout before the launcher stops ranks itself (their own waits time out first)."""


class RankFailedError(ChildProcessError):
    """A rank raised, died or timed out; the message names the rank and the action."""


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


_PEER_LOST = ("Connection reset", "Connection closed", "closed by peer", "Broken pipe", "Timed out", "timed out")


def _describe_failure(workdir: Path, codes: list[int | None], failed: int) -> str:
    """The cause, not its echoes: a rank's own error first, then a rank that died, then peers that lost it."""
    errors = {}
    for path in sorted(workdir.glob("rank*.error.json")):
        try:
            e = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        errors[e["rank"]] = e
    own = [e for e in errors.values() if not any(p in e["message"] for p in _PEER_LOST)]
    died = [r for r, c in enumerate(codes) if c is not None and c < 0 and r not in errors]  # before we stopped any
    if own or not died:
        pick = own or list(errors.values())
        if pick:
            e = min(pick, key=lambda e: e["rank"])
            where = f"at action {e['action']}" if e.get("action") else "before running its actions"
            return f"rank {e['rank']} failed {where}: {e['message']}"
    rank = died[0] if died else failed
    log = workdir / f"rank{rank}.log"
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
    rc = codes[rank]
    how = f"was killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with code {rc}"
    return f"rank {rank} {how}" + (f": {tail[0]}" if tail else "") + "; the other ranks were stopped"


def launch(spec: dict, *, timeout: float) -> dict:
    """Run *spec* on K local processes (K of its schedules); return rank 0's gathered result.

    Raises :class:`RankFailedError` if a rank fails, dies or the run exceeds *timeout* seconds.
    """
    import torch

    from .comm import free_port

    world = spec["jobs"][0]["schedule"].devices
    workdir = Path(tempfile.mkdtemp(prefix="pipesim-validate-"))
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        spec = dict(spec, result_dir=str(workdir), result_path=str(workdir / "result.pt"))
        torch.save(spec, workdir / "spec.pt")
        port = str(free_port())
        root = str(Path(__file__).resolve().parent.parent)
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                       OMP_NUM_THREADS=str(spec.get("threads", 1)),
                       PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
            log = open(workdir / f"rank{rank}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "validate.worker", "--spec", str(workdir / "spec.pt")],
                                          env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=root))
        # each rank's own waits time out after *timeout* and name their action; this is the backstop
        deadline = time.monotonic() + timeout + _GRACE
        while True:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                time.sleep(0.2)  # let the first failing rank's peers write their own errors
                codes = [p.poll() for p in procs]  # exit codes before the launcher stops anyone
                _stop(procs)
                raise RankFailedError(_describe_failure(workdir, codes, failed))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                _stop(procs)
                running = [r for r, c in enumerate(codes) if c is None]
                raise RankFailedError(f"the run passed its timeout of {timeout:g} s (+{_GRACE:g} s); ranks {running} were still "
                                      f"running and have been stopped (raise --timeout if the model is large)")
            time.sleep(0.05)
        result_path = workdir / "result.pt"
        if not result_path.exists():
            raise RankFailedError("rank 0 exited without writing its result")
        return torch.load(result_path, weights_only=False)
    finally:
        _stop(procs)  # also on Ctrl-C: no rank is left behind
        for log in logs:
            log.close()
        shutil.rmtree(workdir, ignore_errors=True)
