"""Start-up stays light: `import sim`, the CLI's `simulate --json` and a metrics-only simulation load
no pandas, matplotlib, numba, pyarrow or torch (each check runs in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "matplotlib", "numba", "pyarrow", "torch")


def _loaded_after(code: str) -> set[str]:
    """Top-level packages among HEAVY that a fresh interpreter holds after running *code*."""
    probe = code + f"\nimport sys; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_sim_loads_no_heavy_package():
    assert _loaded_after("import sim") == set()


def test_import_sim_does_not_import_torch():
    assert "torch" not in _loaded_after("import sim, sim.schedules, sim.simulate")


def test_cli_simulate_json_loads_no_heavy_package():
    code = "import sim.cli, contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()):\n" \
           "    assert sim.cli.main(['simulate', '-s', 'gpipe', '-K', '4', '-M', '4', '--json']) == 0"
    assert _loaded_after(code) == set()


def test_metrics_only_simulation_builds_no_dataframe():
    """A sweep or planner reads result.metrics thousands of times: no pandas on that path."""
    code = ("import sim\ns = sim.schedules.one_f_one_b(4, 8)\n"
            "r = sim.simulate(s, sim.uniform(4, forward=1, backward=2, activation_bytes=1e6), "
            "sim.Hardware(devices=4, latency=1e-3, bandwidth=1e9))\n"
            "assert r.metrics.makespan > 0 and max(r.metrics.peak_memory) > 0")
    assert _loaded_after(code) == set()


@pytest.mark.parametrize("heavy", ["pandas"])
def test_the_probe_can_see_a_heavy_import(heavy):
    """The check above would fail if the path loaded the package (here: the timeline is asked for)."""
    code = ("import sim\nr = sim.simulate(sim.schedules.gpipe(2, 2), sim.uniform(2))\nr.timeline")
    assert heavy in _loaded_after(code)
