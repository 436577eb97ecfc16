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
