"""The 0.2 module paths: each still imports, warns with the new path, and is the new module itself."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sim  # noqa: F401  (installs the aliases)
from sim.moved import SIM_MOVED
from validate.moved import VALIDATE_MOVED

ROOT = Path(__file__).resolve().parent.parent
TORCH_FREE = {old: new for old, new in {**SIM_MOVED, **VALIDATE_MOVED}.items()
              if not new.startswith(("validate.rank", "validate.pytorch.runtime", "validate.torchrun",
                                     "validate.predict.profile_layers", "validate.correctness.reference"))}


@pytest.mark.parametrize("old,new", sorted(TORCH_FREE.items()))
def test_an_old_path_warns_and_gives_the_new_module(old, new, monkeypatch):
    import validate  # noqa: F401  (its aliases)
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(new)):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # the alias does not rename the real module


def test_every_new_path_exists():
    for new in {**SIM_MOVED, **VALIDATE_MOVED}.values():
        assert importlib.util.find_spec(new) is not None, new


def test_the_old_torchrun_entry_point_still_runs():
    out = subprocess.run([sys.executable, "-W", "default", "-m", "validate.worker", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "validate.torchrun" in out.stdout + out.stderr and "--schedule" in out.stdout


def test_module_paths_the_readme_names_exist():
    text = (ROOT / "README.md").read_text()
    for path in set(re.findall(r"\b((?:sim|validate)/[\w/]+\.py)\b", text)):
        assert (ROOT / path).is_file(), path
    for dotted in set(re.findall(r"(?<![\w./-])((?:sim|validate)\.[a-z_]+(?:\.[a-z_]+)*)\b", text)):
        if dotted in SIM_MOVED or dotted in VALIDATE_MOVED:  # an old path the README names as such
            continue
        parts = dotted.split(".")
        for cut in range(1, len(parts) + 1):  # the longest prefix that is a module; the rest must be its attributes
            name = ".".join(parts[:cut])
            if (ROOT / (name.replace(".", "/") + ".py")).is_file() or (ROOT / name.replace(".", "/")).is_dir():
                continue
            module = importlib.import_module(".".join(parts[:cut - 1]))
            obj = module
            for attr in parts[cut - 1:]:
                assert hasattr(obj, attr), f"README names {dotted}: {obj.__name__ if hasattr(obj, '__name__') else obj} has no {attr}"
                obj = getattr(obj, attr)
            break
