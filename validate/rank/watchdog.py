"""Removes a launch's temporary folder when the launcher dies without removing it (SIGKILL, OOM killer).

    python -m validate.rank.watchdog FOLDER LAUNCHER_PID      # started by validate.launch, one per launch

The launcher removes its folder itself on every exit it lives through (done, a failed rank, Ctrl-C,
SIGTERM). A SIGKILL gives it no chance: its ranks die with it (``PR_SET_PDEATHSIG``) but nobody
removed the folder (spec, logs, rank results: issue 26 item 10). This process, started in a session
of its own (so a signal to the launcher's process group does not reach it), checks every
:data:`POLL` seconds whether its parent is still the launcher; once it is not, it waits until no
process still holds the folder as its working state (the ranks, being killed) for at most
:data:`GRACE` seconds, removes the folder and exits. The launcher ends it after its own clean-up.

Only the standard library: it starts in a few tens of milliseconds and holds no torch.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

__all__ = ["watch", "main", "POLL", "GRACE"]

POLL = 0.25
"""Seconds between two checks of the parent."""
GRACE = 5.0
"""Seconds to wait, once the launcher is gone, for ranks still running (they get SIGKILL with it)."""


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def watch(folder: Path, launcher: int) -> None:
    """Return once *launcher* is gone, after removing *folder* (the ranks listed in ``ranks.pid`` waited for)."""
    while os.getppid() == launcher:
        time.sleep(POLL)
    deadline = time.monotonic() + GRACE
    pid_file = folder / "ranks.pid"
    try:
        pids = [int(p) for p in pid_file.read_text().split()]
    except (OSError, ValueError):
        pids = []
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m validate.rank.watchdog FOLDER LAUNCHER_PID", file=sys.stderr)
        return 2
    watch(Path(args[0]), int(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
