"""``pipesim simulate`` and ``pipesim schedules``: output, JSON keys, and one-line errors with exit code 2.

Most runs call ``sim.cli.main([...])`` in-process; one runs the installed ``pipesim``
script in a subprocess for the real exit code and stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.schedules import registry as generators
from sim import schedules, simulate, uniform
from sim.cli import main

JSON_LISTS = ("busy", "peak_memory", "peak_inflight", "weight_versions")
JSON_NUMBERS = ("makespan", "utilization", "bubble_fraction", "throughput")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_prints_a_table(capsys):
    code, out, err = run_cli(capsys, "simulate", "--schedule", "gpipe", "-K", "4", "-M", "4")
    assert code == 0 and err == ""
    assert "schedule gpipe: K=4 devices" in out
    assert "utilization       57.1%" in out
    assert "bubble fraction   42.9%" in out
    assert "makespan          21 s" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]  # one row per device


def test_simulate_json_has_the_figures_per_device(capsys):
    code, out, err = run_cli(capsys, "simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--activation-bytes", "100",
                             "--latency", "0.1", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    for key in JSON_NUMBERS:
        assert isinstance(data[key], float)
    for key in JSON_LISTS:
        assert isinstance(data[key], list) and len(data[key]) == 4
    assert data["peak_inflight"] == [4, 3, 2, 1]
    assert data["peak_memory"] == [400.0, 300.0, 200.0, 100.0]
    assert data["weight_versions"] == [1, 1, 1, 1]
    # the same numbers as the API
    from sim import Hardware
    r = simulate(schedules.one_f_one_b(4, 8), uniform(4, send_bytes=100, activation_bytes=100),
                 Hardware(devices=4, latency=0.1))
    assert data["makespan"] == r.metrics.makespan
    assert data["busy"] == r.metrics.busy
    assert data["throughput"] == pytest.approx(8 / r.metrics.makespan)


def test_simulate_with_costs_and_hardware_files(capsys, tmp_path):
    from sim import Hardware, save_costs, save_hardware
    costs = tmp_path / "costs.csv"
    save_costs(uniform(3, forward=2, backward=4), costs)
    hw = tmp_path / "hw.json"
    save_hardware(Hardware(devices=3, latency=0.5), hw)
    code, out, err = run_cli(capsys, "simulate", "-s", "gpipe", "-K", "3", "-M", "2", "--costs", str(costs),
                             "--hardware", str(hw), "--json")
    assert code == 0, err
    assert json.loads(out)["makespan"] == (2 + 3 - 1) * 6 + 2 * 2 * 0.5


def test_simulate_writes_the_timeline(capsys, tmp_path):
    from sim.io.timeline_io import read_timeline
    path = tmp_path / "t.csv"
    code, _, _ = run_cli(capsys, "simulate", "-K", "2", "-M", "2", "--timeline", str(path))
    assert code == 0
    tl = read_timeline(path)
    assert set(tl["op"]) >= {"F", "B", "U"} and len(tl[tl["src"] < 0]) == 2 * 2 * 2 + 2


def test_memory_overflow_is_reported(capsys):
    code, out, _ = run_cli(capsys, "simulate", "-s", "gpipe", "-K", "2", "-M", "4", "--activation-bytes", "10",
                           "--memory-capacity", "25")
    assert code == 0
    assert "MEMORY OVERFLOW: device 0 exceeds its memory capacity by 15 bytes" in out


def _write(tmp_path, text):
    path = tmp_path / "costs.csv"
    path.write_text(text)
    return str(path)


BAD_INPUTS = {
    "K<1": lambda tmp: ["simulate", "-K", "0"],
    "M<1": lambda tmp: ["simulate", "-M", "0"],
    "K not an int": lambda tmp: ["simulate", "-K", "four"],
    "negative cost": lambda tmp: ["simulate", "--forward", "-1"],
    "non-numeric cost": lambda tmp: ["simulate", "--backward", "abc"],
    "nan cost": lambda tmp: ["simulate", "--forward", "nan"],
    "zero bandwidth": lambda tmp: ["simulate", "--bandwidth", "0"],
    "unknown schedule": lambda tmp: ["simulate", "--schedule", "nope"],
    "missing costs file": lambda tmp: ["simulate", "--costs", str(tmp / "absent.csv")],
    "costs length": lambda tmp: ["simulate", "-K", "4", "--costs",
                                 _write(tmp, "stage,forward,backward\n0,1,2\n1,1,2\n2,1,2\n")],
    "costs header": lambda tmp: ["simulate", "--costs", _write(tmp, "0,1,2\n1,1,2\n")],
    "costs non-numeric": lambda tmp: ["simulate", "-K", "2", "--costs", _write(tmp, "stage,forward\n0,1\n1,x\n")],
    "costs negative": lambda tmp: ["simulate", "-K", "2", "--costs", _write(tmp, "stage,forward\n0,1\n1,-2\n")],
    "costs empty": lambda tmp: ["simulate", "--costs", _write(tmp, "# nothing\n")],
    "bad hardware": lambda tmp: ["simulate", "--hardware", _write(tmp, "{not json")],
    "unknown flag": lambda tmp: ["simulate", "--frobnicate"],
    "no command": lambda tmp: [],
    "bad timeline suffix": lambda tmp: ["simulate", "--timeline", str(tmp / "t.txt")],
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case):
    code, out, err = run_cli(capsys, *BAD_INPUTS[case](tmp_path))
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pipesim: error: ") and len(lines[0]) > len("pipesim: error: ")
    assert "Traceback" not in err


def test_error_messages_say_what_is_wrong(capsys, tmp_path):
    _, _, err = run_cli(capsys, *BAD_INPUTS["costs length"](tmp_path))
    assert "3 stages" in err and "4" in err
    _, _, err = run_cli(capsys, *BAD_INPUTS["unknown schedule"](tmp_path))
    assert "unknown schedule 'nope'" in err and "gpipe" in err
    _, _, err = run_cli(capsys, *BAD_INPUTS["costs non-numeric"](tmp_path))
    assert "'x' is not a number" in err


def test_schedules_lists_every_registered_schedule(capsys):
    code, out, err = run_cli(capsys, "schedules")
    assert code == 0 and err == ""
    listed = [ln.split()[0] for ln in out.splitlines() if ln and not ln[0].isspace()]
    assert listed == generators.names()
    for name in generators.names():
        assert generators.get_generator(name).SOURCE in out
    code, out, _ = run_cli(capsys, "schedules", "--json")
    assert [row["name"] for row in json.loads(out)] == generators.names()


def _pipesim() -> list[str]:
    script = Path(sys.executable).with_name("pipesim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sim"]


def test_pipesim_subprocess_exit_codes(tmp_path):
    bad = subprocess.run(_pipesim() + ["simulate", "-K", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1 and bad.stderr.startswith("pipesim: error: ")


def test_importing_sim_does_not_import_torch():
    code = ("import importlib, pkgutil, sys, sim, sim.cli\n"
            "assert 'torch' not in sys.modules, 'import sim imported torch'\n"
            "for m in pkgutil.walk_packages(sim.__path__, 'sim.'):\n"
            "    if m.name != 'sim.__main__':  # runs the CLI\n"
            "        importlib.import_module(m.name)\n"
            "    assert 'torch' not in sys.modules, m.name + ' imported torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
