"""Start K worker processes on this machine, watch them, and end them all on any failure.

Each rank is ``python -m validate.rank.worker --spec FILE`` with RANK, WORLD_SIZE and
LOCAL_RANK in its environment (the variables torchrun sets, so one worker serves both
launchers). Rendezvous goes through a file store in the launch's private temporary folder
(``PIPESIM_RENDEZVOUS_FILE``, mode 0700 from ``mkdtemp``), not a TCP store: torch's TCP
store listens on every interface, without authentication (issue 26 item 1), while a
one-machine run needs no network at all; gloo's own sockets are bound to the loopback
(``GLOO_SOCKET_IFNAME=lo``). The launcher
polls the processes every 50 ms. When one exits with an error or is killed, when one
has been stopped (SIGSTOP) for longer than ``timeout``, when the whole run passes
``max_time``, or on Ctrl-C or SIGTERM, every other rank is terminated (SIGTERM, then
SIGKILL after 3 s) and waited for, so no process is left behind; the ranks also die
with the launcher itself (``PR_SET_PDEATHSIG``, :func:`validate.rank.worker.die_with_parent`)
should it be killed outright. Two limits: ``timeout`` bounds each single wait of a
rank (a receive, a barrier; the rank names the action it waited in), ``max_time`` the
whole launch. The error names the rank and the action it was
on (from the rank's ``rank<r>.error.json``), preferring the cause over the echoes:
a rank's own error, then a rank that died, then peers that lost their connection.

A SIGKILL of the launcher leaves it no time to clean up: the ranks die with it, and a
watchdog process (:mod:`validate.rank.watchdog`, in its own session) removes the
temporary folder. The launch also measures where the machine's CPU time went while the
ranks ran (:class:`validate.request.CpuShare`), so that the report blames other work only
for what other work did.

Units: seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from validate import environment
from validate.request import RENDEZVOUS_FILE, LaunchResult, RunRequest

__all__ = ["RankFailedError", "launch", "stop_ranks", "start_watchdog", "end_watchdog"]

class RankFailedError(ChildProcessError):
    """A rank raised, died or timed out; the message names the rank and the action."""


def stop_ranks(procs: list[subprocess.Popen]) -> None:
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


def _stopped(pid: int) -> bool:
    """Whether *pid* is stopped (SIGSTOP, SIGTSTP, a debugger): state T or t in /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


class _Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C (every rank stopped, the folder removed), then exit 143."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def launch(request: RunRequest, *, timeout: float, max_time: float | None = None,
           progress: Callable[[str], None] | None = None) -> LaunchResult:
    """Run *request* on K local processes (K of its schedules); return what rank 0 gathered.

    *timeout*: seconds any one wait may take (each rank's own waits give up after it and name
    their action; a rank stopped for that long is named as stopped). *max_time*: seconds for the
    whole launch (None: no cap). *progress*: called with each progress line of rank 0.
    Raises :class:`RankFailedError` if a rank fails, dies, is stopped or the run exceeds a limit.
    SIGTERM, like Ctrl-C, stops every rank and removes the temporary folder (then exits 143).
    """
    import torch

    world = request.world
    workdir = Path(tempfile.mkdtemp(prefix="pipesim-validate-"))  # mode 0700: the rendezvous file is private
    root = str(Path(__file__).resolve().parent.parent)
    procs: list[subprocess.Popen] = []
    logs = []
    old_handler = None
    if threading.current_thread() is threading.main_thread():
        old_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    watchdog = start_watchdog(workdir)
    try:
        request = replace(request, result_dir=str(workdir))
        result_path = workdir / "result.pt"
        torch.save({"request": request, "result_path": str(result_path)}, workdir / "spec.pt")
        cpu_before = environment.cpu_snapshot()
        for rank in range(world):
            env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                       GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                       OMP_NUM_THREADS=str(request.threads), PIPESIM_PARENT_PID=str(os.getpid()),
                       PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
            env[RENDEZVOUS_FILE] = str(workdir / "rendezvous")
            log = open(workdir / f"rank{rank}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "validate.rank.worker", "--spec", str(workdir / "spec.pt")],
                                          env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=root))
        (workdir / "ranks.pid").write_text(" ".join(str(p.pid) for p in procs))  # for the watchdog
        started = time.monotonic()
        stopped_since: dict[int, float] = {}
        shown = 0
        while True:
            shown = _show_progress(workdir / "progress.log", shown, progress)
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for r, p in enumerate(procs):
                if codes[r] is None and _stopped(p.pid):
                    stopped_since.setdefault(r, now)
                else:
                    stopped_since.pop(r, None)
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                time.sleep(0.2)  # let the first failing rank's peers write their own errors
                codes = [p.poll() for p in procs]  # exit codes before the launcher stops anyone
                stopped = [r for r, p in enumerate(procs) if codes[r] is None and _stopped(p.pid)]
                stop_ranks(procs)
                if stopped:  # the peers timed out waiting for it: name the cause, not the echo
                    raise RankFailedError(_stopped_message(stopped, timeout))
                raise RankFailedError(_describe_failure(workdir, codes, failed))
            if all(c == 0 for c in codes):
                break
            long_stopped = [r for r, t in stopped_since.items() if now - t > timeout]
            if long_stopped:
                stop_ranks(procs)
                raise RankFailedError(_stopped_message(sorted(long_stopped), timeout))
            if max_time is not None and now - started > max_time:
                stop_ranks(procs)
                running = [r for r, c in enumerate(codes) if c is None]
                raise RankFailedError(f"the run passed its overall cap --max-time {max_time:g} s; ranks {running} were "
                                      f"still running and have been stopped (raise --max-time for long runs)")
            time.sleep(0.05)
        cpu = environment.cpu_share(cpu_before, environment.cpu_snapshot())  # every rank waited for: counted
        _show_progress(workdir / "progress.log", shown, progress)
        if not result_path.exists():
            raise RankFailedError("rank 0 exited without writing its result")
        return replace(torch.load(result_path, weights_only=False), cpu=cpu)
    except _Terminated:
        stop_ranks(procs)
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        stop_ranks(procs)  # also on Ctrl-C and SIGTERM: no rank is left behind
        for log in logs:
            log.close()
        shutil.rmtree(workdir, ignore_errors=True)
        end_watchdog(watchdog)
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)


def start_watchdog(workdir: Path) -> subprocess.Popen | None:
    """The process that removes *workdir* should this launcher be killed outright (:mod:`validate.rank.watchdog`);
    :func:`end_watchdog` ends it once the launcher has removed the folder itself.

    In a session of its own, so that a signal to the launcher's process group (Ctrl-C in a terminal, ``kill
    -KILL -PGID``) does not end it too; None if it cannot start (the launch still runs and cleans up itself).
    """
    root = str(Path(__file__).resolve().parent.parent)
    try:
        return subprocess.Popen([sys.executable, "-m", "validate.rank.watchdog", str(workdir), str(os.getpid())],
                                cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                    filter(None, [root, os.environ.get("PYTHONPATH")]))))
    except OSError:
        return None


def end_watchdog(watchdog: subprocess.Popen | None) -> None:
    if watchdog is None:
        return
    watchdog.kill()  # the folder is gone already; nothing for it to do
    watchdog.wait()


def _stopped_message(ranks: list[int], timeout: float) -> str:
    which = ", ".join(str(r) for r in ranks)
    return (f"rank {which} was stopped (SIGSTOP or a debugger: process state T) and its peers could not go on; "
            f"every rank has been stopped (--timeout {timeout:g} s bounds each wait)")


def _show_progress(path: Path, shown: int, progress) -> int:
    """Pass the progress lines rank 0 appended since the last call to *progress*; returns the lines seen."""
    if progress is None or not path.exists():
        return shown
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return shown
    for line in lines[shown:]:
        progress(line)
    return len(lines)
