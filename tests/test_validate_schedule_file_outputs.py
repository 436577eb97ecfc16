"""``pipesim validate --schedule-file``: whose report is whose, and the same files under torchrun.

- ``--runtime torch``: two different files with the same K, M and workload, written to one ``-o`` folder, keep
  two reports (they shared ``schedule-file_K2_M4_mlp_torch.*`` before: the second run overwrote the first), named
  from the file and its digest (:func:`validate.pytorch.schedules.schedule_file_key`), the same name again for
  the same file.
- torchrun (:mod:`validate.torchrun`, README "Multi-node"): ``--schedule-file`` runs pipesim's executor with the
  order of rank 0's file on every rank (sent through torchrun's store), the report written once; ``--runtime
  torch`` there is one line and exit 2 on every rank (it was silently ignored: pipesim's executor ran instead).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_agents import run_agents, torchrun_or_skip

from sim import schedules
from sim.io.schedule_io import write_schedule_file

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--workload", "mlp", "--width", "16", "--depth", "1", "--batch", "4")


def _env(**extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **extra)


def test_a_files_key_is_its_sanitised_name_and_digest_stable_and_distinct(tmp_path):
    from validate.pytorch.schedules import schedule_file_key

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = write_schedule_file(schedules.generate("1f1b", 2, 4), tmp_path / "one" / "my plan (v2).csv",
                                "pytorch-csv")
    other = write_schedule_file(schedules.generate("gpipe", 2, 4), tmp_path / "two" / "my plan (v2).csv",
                                "pytorch-csv")
    key, digest = schedule_file_key(str(first))
    assert key.startswith("my-plan-v2-csv-") and key == f"my-plan-v2-csv-{digest[:8]}" and len(digest) == 64
    assert schedule_file_key(str(first)) == (key, digest)  # the same file, the same name
    assert schedule_file_key(str(other))[0] != key  # same name, other folder, other order: another report
    copy = shutil.copy(first, tmp_path / "my plan (v2).json")
    assert schedule_file_key(str(copy))[0] != key  # another file name
    assert schedule_file_key(str(tmp_path / "one" / "my plan (v2).csv"))[0] == key
    odd = tmp_path / "..csv"
    odd.write_bytes(first.read_bytes())
    assert schedule_file_key(str(odd))[0] == f"csv-{digest[:8]}"
    for bad in ("\u00e9t\u00e9.csv", "---.csv", "x" * 200 + ".csv"):
        name = schedule_file_key(str(shutil.copy(first, tmp_path / bad)))[0]
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"), name
        assert len(name) <= 48 + 9 and not name.startswith("-")


def _torch_run(path: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "sim", "validate", "--runtime", "torch", "--schedule-file", str(path),
                           *SMALL, "--repeats", "2", "-o", str(out), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_schedule_files_in_one_folder_keep_two_reports(tmp_path):
    pytest.importorskip("torch.distributed.pipelining")
    a = write_schedule_file(schedules.generate("1f1b", 2, 4), tmp_path / "a.csv", "pytorch-csv")
    b = write_schedule_file(schedules.generate("gpipe", 2, 4), tmp_path / "b.csv", "pytorch-csv")
    out = tmp_path / "out"
    first = _torch_run(a, out)
    second = _torch_run(b, out)
    reports = sorted(p.name for p in out.glob("*_torch.json"))
    assert len(reports) == 2, reports  # was one: schedule-file_K2_M4_mlp_torch.json, b's over a's
    for run, path in ((first, a), (second, b)):
        assert run["schedule_file"] == str(path)
        assert all(Path(p).exists() for p in run["paths"].values())
        kept = json.loads(Path(run["paths"]["json"]).read_text())
        assert kept["schedule_file"] == str(path) and kept["schedule"] == path.stem
        assert Path(run["paths"]["report"]).name.startswith(f"{path.stem}-csv-")
        assert f"schedule file: `{path}`" in Path(run["paths"]["report"]).read_text()
    assert first["paths"]["report"] != second["paths"]["report"]
    again = _torch_run(a, out)  # the same file again: its own report replaced, nothing added
    assert again["paths"]["report"] == first["paths"]["report"]
    assert sorted(p.name for p in out.glob("*_torch.json")) == reports


def test_pipesims_executor_names_a_file_s_schedule_for_the_file(tmp_path):
    """The executor names its reports after the schedule: a file's is renamed for the file, so a ``1f1b.csv``
    holding another order neither takes a generated 1f1b's report nor replays as ``-s 1f1b``."""
    from sim.cli.validate import named_for_file
    from sim.io.schedule_io import read_schedule_file
    from validate.pytorch.schedules import schedule_file_key
    from validate.run import replay_command

    path = write_schedule_file(schedules.generate("gpipe", 2, 4), tmp_path / "1f1b.csv", "pytorch-csv")
    saved = read_schedule_file(path)
    assert saved.name == "1f1b" and "-s 1f1b" in replay_command(saved, None, None)
    named = named_for_file(saved, str(path))
    assert named.name == schedule_file_key(str(path))[0] and named.name.startswith("1f1b-csv-")
    assert named.actions == saved.actions and named.placement == saved.placement
    assert "-s 1f1b" not in replay_command(named, None, None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_synthesized_files_keep_two_reports_with_pipesims_executor(tmp_path):
    """Both files' schedules are called 'synthesized' (sim.search.synthesis.schedule_of): the reports were both
    synthesized_K2_M4_mlp_R1.*, the second over the first."""
    from sim.model.cost import uniform
    from sim.model.hardware import Hardware
    from sim.search.synthesis import synthesize

    files = []
    for name, limit in (("p", 2), ("q", 4)):
        found = synthesize(uniform(2, forward=1.0, backward=1.0, weight=1.0), Hardware(devices=2), microbatches=4,
                           memory_limit=limit, method="local", seconds=1)
        assert found.schedule.name == "synthesized"
        files.append(write_schedule_file(found.schedule, tmp_path / f"{name}.json", "json"))
    out = tmp_path / "out"
    for path in files:
        done = subprocess.run([sys.executable, "-m", "sim", "validate", "--schedule-file", str(path), *SMALL,
                               "--repeats", "1", "-o", str(out), "--json"],
                              capture_output=True, text=True, env=_env(), timeout=280, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["schedule"].startswith(f"{path.stem}-json-")
    reports = sorted(p.name for p in out.glob("*.md"))
    assert len(reports) == 2 and reports[0].startswith("p-json-") and reports[1].startswith("q-json-"), reports


def _rank(tmp_path: Path, *argv: str, world: int = 1, **env: str) -> subprocess.CompletedProcess:
    """``python -m validate.torchrun`` as torchrun starts rank 0 (RANK, WORLD_SIZE, ... in the environment)."""
    from validate.rank.comm import free_port

    return subprocess.run([sys.executable, "-m", "validate.torchrun", *argv], capture_output=True, text=True,
                          timeout=280, cwd=tmp_path,
                          env=_env(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                   MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo", **env))


@pytest.mark.parametrize("argv, world, message", [
    (["--runtime", "torch", "-s", "1f1b", "-M", "4"], 1, "--runtime torch runs on one machine"),
    (["--runtime", "torch", "--schedule-file", "plan.csv"], 2, "--runtime torch runs on one machine"),
    (["--schedule-file", "missing.csv"], 1, "'missing.csv'"),
    (["--schedule-file", "plan.csv"], 1, "a schedule of 2 ranks; torchrun started 1"),
    (["--schedule-file", "one.csv", "-M", "8"], 1, "-M/--microbatches 8 conflicts with --schedule-file one.csv"),
    (["--schedule-file", "plan.csv"], 2, "needs torchrun's shared store"),
    (["--schedule-file", "plan.csv", "--recompute"], 2, "runs as it is written"),
])
def test_refused_under_torchrun_in_one_line_and_exit_2(tmp_path, argv, world, message):
    """Checked before anything starts, on every rank; one line, no traceback (bad input used to show one)."""
    pytest.importorskip("torch")
    write_schedule_file(schedules.generate("1f1b", 2, 4), tmp_path / "plan.csv", "pytorch-csv")
    write_schedule_file(schedules.generate("gpipe", 1, 4), tmp_path / "one.csv", "pytorch-csv")
    done = _rank(tmp_path, *argv, *SMALL, "-o", str(tmp_path / "out"), world=world)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("pipesim validate (torchrun): error:") and message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_schedule_file_under_two_torchrun_agents_runs_rank_0s_order_everywhere(tmp_path):
    """The README's two-node line with --schedule-file, on 127.0.0.1 (as tests/test_multinode.py): each agent's
    folder holds another order under the same relative name; every rank runs rank 0's (the report names its
    digest), the gradients match, and one report is written."""
    pytest.importorskip("torch")
    import hashlib

    from validate.rank.comm import free_port

    torchrun = torchrun_or_skip()
    digests = []
    for n, name in enumerate(("1f1b", "gpipe")):
        (tmp_path / f"node{n}").mkdir()
        plan = write_schedule_file(schedules.generate(name, 2, 4), tmp_path / f"node{n}" / "plan.csv", "pytorch-csv")
        digests.append(hashlib.sha256(plan.read_bytes()).hexdigest())
    port, out = str(free_port()), tmp_path / "out"
    command = [torchrun, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=pipesim", "-m", "validate.torchrun",
               "--schedule-file", "plan.csv", *SMALL, "--repeats", "2", "-o", str(out)]
    ran = run_agents(command, lambda n: _env(GLOO_SOCKET_IFNAME="lo", PIPESIM_HOST_ID=f"node{n}"),
                     lambda n: tmp_path / f"node{n}")
    for a, _, err in ran:
        assert a.returncode == 0, err[-3000:]
    [(head, summary)] = [(n, o) for n, (_, o, _) in enumerate(ran) if "gradients_match" in o]  # rank 0's agent
    assert "gradients_match True" in summary, summary
    assert f"schedule file plan.csv (SHA-256 {digests[head]}), read by rank 0 and sent to every rank" in summary
    reports = list(out.glob("*.md"))
    assert [r.name for r in reports] == [f"plan-csv-{digests[head][:8]}_K2_M4_mlp_R2.md"]
    assert digests[head] in reports[0].read_text()


def test_every_rank_gets_rank_0s_file_or_rank_0s_refusal_through_the_store(tmp_path, monkeypatch):
    """:func:`validate.torchrun.shared_schedule_file` against a store hosted here as torchrun's agent hosts it:
    rank 1 runs rank 0's bytes although its own folder has no such file, and stops with rank 0's line, without
    waiting out the timeout, when rank 0 refuses the file."""
    pytest.importorskip("torch")
    import hashlib
    from datetime import timedelta

    from torch.distributed import TCPStore

    from validate.errors import ValidationError
    from validate.rank.comm import free_port
    from validate.torchrun import shared_schedule_file

    port = free_port()
    agent = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))  # noqa: F841 - kept alive
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "first")
    plan = write_schedule_file(schedules.generate("zbv", 2, 4), tmp_path / "plan.json", "json")
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    on_0, d0 = shared_schedule_file(str(plan), 0, 2, timeout=5)
    on_1, d1 = shared_schedule_file(str(tmp_path / "elsewhere" / "plan.json"), 1, 2, timeout=5)
    assert d0 == d1 == digest and on_0.actions == on_1.actions == schedules.generate("zbv", 2, 4).actions
    assert on_1.placement == on_0.placement and on_1.name == on_0.name

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "second")  # a new launch: another key
    wrong = write_schedule_file(schedules.generate("1f1b", 4, 4), tmp_path / "four.csv", "pytorch-csv")
    with pytest.raises(ValidationError, match="a schedule of 4 ranks; torchrun started 2"):
        shared_schedule_file(str(wrong), 0, 2, timeout=5)
    with pytest.raises(ValidationError, match="rank 0 refused --schedule-file: --schedule-file .*four.csv is a "
                                              "schedule of 4 ranks"):
        shared_schedule_file(str(wrong), 1, 2, timeout=5)

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "third")  # rank 0 never answers: named, after the timeout
    with pytest.raises(ValidationError, match="no answer from rank 0 on --schedule-file within 1 s"):
        shared_schedule_file(str(plan), 1, 2, timeout=1)
