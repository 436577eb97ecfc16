"""Multi-node validation on one machine (issue 27 item 4): the README's torchrun command, run twice.

Two torchrun agents on 127.0.0.1 meet through c10d rendezvous, as two nodes would. A test-only
override (``PIPESIM_HOST_ID``, :data:`validate.rank.worker.HOST_ID_OVERRIDE`) gives them different
host ids, so the validator does what it does across hosts: estimates each rank's clock offset by
ping-pong, checks it against the matched send/receive pairs of the runs, and aligns the timeline.
Both agents share one clock here, so the true offset is 0 and each estimate must hold it within its
uncertainty.
"""

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torchrun_agents import run_agents, torchrun_or_skip  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def readme_command() -> str:
    """The torchrun command of the README's "Multi-node" section (continuation lines joined)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Multi-node"):]
    block = section[section.index("```bash"):].split("```", 2)[1]
    lines = block.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("torchrun "))
    command = []
    for ln in lines[start:]:
        command.append(ln.rstrip("\\").strip())
        if not ln.rstrip().endswith("\\"):
            break
    return " ".join(command)


def test_the_readme_names_the_command_this_test_runs():
    command = readme_command()
    for part in ("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=$HEAD:$PORT", "-m validate.torchrun", "-o $OUT"):
        assert part in command, command


@pytest.mark.slow
def test_two_torchrun_agents_on_one_machine_validate_as_two_nodes(tmp_path):
    from validate.rank.comm import free_port

    torchrun = torchrun_or_skip()
    command = readme_command().replace("torchrun ", f"{torchrun} ", 1)
    env = dict(os.environ, HEAD="127.0.0.1", PORT=str(free_port()), OUT=str(tmp_path / "out"),
               GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    ran = run_agents(["bash", "-c", command], lambda n: dict(env, PIPESIM_HOST_ID=f"node{n}"), lambda n: tmp_path)
    for a, _, err in ran:
        assert a.returncode == 0, err[-3000:]
    summary = "".join(out for _, out, _ in ran)  # rank 0's agent prints the summary
    assert "2 hosts (boot ids): clocks aligned by ping-pong with rank 0" in summary, summary
    found = re.search(r"clock check by (\d+) matched send/receive pairs \(offset to rank 0\): rank 1 ([+-]\d+) us "
                      r"± (\d+) us \(ping-pong ([+-]\d+) us ± (\d+) us\); they agree", summary)
    assert found, summary
    pairs, by_pairs, pairs_unc, by_ping, ping_unc = (int(g) for g in found.groups())
    assert pairs >= 2 * 8  # every activation and gradient of the 8 micro-batches, in every timed run
    # one machine, one clock: the true offset is 0, and each estimate must hold it (1 us of rounding in the line)
    assert abs(by_pairs) <= pairs_unc + 1 and abs(by_ping) <= ping_unc + 1
    reports = list((tmp_path / "out").glob("1f1b_K2_M8_emulated*.md"))
    assert len(reports) == 1 and "matched send/receive pairs" in reports[0].read_text()
