"""The modules the command line and the ingest side load before torch stay torch-free.

(The import graph itself, cycles and direction, is checked for every package by tests/test_layout.py.)"""

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "validate"


def test_torch_free_modules_stay_torch_free():
    code = ("import sys, sim.cli.validate, validate.request, validate.errors, validate.compare.results, validate.compare.report; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], timeout=120, cwd=PACKAGE.parent).returncode == 0
