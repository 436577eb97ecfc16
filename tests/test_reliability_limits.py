"""Sizes checked before anything large is built (issue 26.4) and sweep's cost refusal (issue 26.9).

``sweep -K 100000 -M 4`` built the 10^10 link pairs of K devices (while ``simulate`` of the same ran);
``gantt -K 512 -M 4096`` simulated, then spent 112 s and 4.3 GB drawing before a MemoryError;
``simulate --jitter 0.1`` at K=512, M=4096 passed the fast engine's size check and ran simpy out of
memory; ``sweep --forward 1e308 --backward 1e308`` wrote rows of errors where simulate refuses the flags.
Available memory is also what a container's cgroup or ``ulimit -v`` leaves, not only the machine's.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.cli
from sim import limits
from sim.model.hardware import Hardware
from sim.search.sweep import _slowest

ROOT = Path(__file__).resolve().parent.parent


def _cli(argv, capsys):
    code = sim.cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_sweep_of_100000_devices_runs_like_simulate(tmp_path, capsys):
    code, out, err = _cli(["sweep", "-K", "100000", "-M", "4", "--no-plots", "--no-progress",
                           "-o", str(tmp_path / "s")], capsys)
    assert code == 0, err
    assert "4 configurations (0 rejected" in out


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6).flatmap(lambda k: st.lists(st.lists(st.floats(0, 1e6), min_size=k, max_size=k),
                                                    min_size=k, max_size=k)))
def test_slowest_link_matches_every_pair(matrix):
    k = len(matrix)
    pairs = [matrix[a][b] for a in range(k) for b in range(k) if a != b]
    assert _slowest(matrix, max, 0.0) == max(pairs) and _slowest(matrix, min, math.inf) == min(pairs)


def test_one_number_for_every_link_is_read_once_per_row_object():
    hw = Hardware(devices=100_000, latency=2e-5, bandwidth=1e10)  # one shared row: 10^10 pairs never listed
    assert _slowest(hw.latency, max, 0.0) == 2e-5 and _slowest(hw.bandwidth, min, math.inf) == 1e10
    assert _slowest(Hardware(devices=1).latency, max, 0.0) == 0.0  # no links at all


def test_a_sweep_whose_largest_row_cannot_fit_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(limits, "available_memory", lambda: 1 << 30)
    code, _, err = _cli(["sweep", "-K", "2,64", "-M", "1,65536", "--no-progress", "-o", str(tmp_path / "s")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "the sweep's largest configuration" in err and "K=64, M=65536" in err and "fit here" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("flags", [["--forward", "1e308", "--backward", "1e308"], ["--activation-bytes", "1e308"]])
def test_sweep_refuses_costs_that_overflow_as_simulate_does(tmp_path, capsys, flags):
    code, _, simulate_err = _cli(["simulate", "-K", "2", "-M", "4", *flags], capsys)
    assert code == 2
    code, _, err = _cli(["sweep", "-K", "2,4", "-M", "1-4", "--no-progress", "-o", str(tmp_path / "s"), *flags],
                        capsys)
    assert code == 2 and err == simulate_err  # the same words
    assert not (tmp_path / "s").exists()


def test_gantt_too_large_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    import sim.cli.gantt as command

    def never(*args, **kwargs):
        raise AssertionError("simulated although the figure was refused")

    monkeypatch.setattr(command, "simulate_from_args", never)
    code, _, err = _cli(["gantt", "-K", "512", "-M", "4096", "-o", str(tmp_path / "g.png")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "4,194,304 actions" in err and "up to 250,000" in err and "--trace" in err
    code, _, err = _cli(["gantt", "-K", "2000", "-M", "1", "-o", str(tmp_path / "g.png")], capsys)
    assert code == 2 and "2,000 device rows" in err and "1,024" in err
    assert not list(tmp_path.iterdir())


def test_gantt_counts_an_imported_schedule_exactly_before_drawing(tmp_path, capsys, monkeypatch):
    import sim.io.plots

    monkeypatch.setattr(sim.io.plots, "MAX_GANTT_BOXES", 10)  # the file's 16 actions are now too many
    schedule = tmp_path / "s.csv"
    assert _cli(["export", "-s", "gpipe", "-K", "2", "-M", "4", "-o", str(schedule)], capsys)[0] == 0
    code, _, err = _cli(["gantt", "--schedule-file", str(schedule), "-o", str(tmp_path / "g.png")], capsys)
    assert code == 2 and "Gantt chart of 18 actions" in err
    assert not (tmp_path / "g.png").exists()


def test_a_png_past_what_agg_draws_is_one_line(tmp_path):
    from matplotlib.figure import Figure

    from sim.io.figures import FigureSizeError, save_figure

    with pytest.raises(FigureSizeError, match="65,535 a side"):
        save_figure(Figure(figsize=(4, 600)), tmp_path / "tall.png")
    assert not list(tmp_path.iterdir())


def test_the_simpy_engine_checks_its_own_size(capsys, monkeypatch):
    # 1F1B K=16, M=4096: 131 k actions, 52 MB for the fast engine (which runs), ~340 MB for simpy (refused)
    monkeypatch.setattr(limits, "available_memory", lambda: 200 << 20)
    code, _, err = _cli(["simulate", "-K", "16", "-M", "4096", "--jitter", "0.1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "simpy engine" in err and "actions fit here" in err
    assert _cli(["simulate", "-K", "16", "-M", "4096", "--json"], capsys)[0] == 0


def test_without_the_simpy_check_the_same_run_is_accepted(capsys, monkeypatch):
    """The bug, injected: simpy judged by the fast engine's budget lets the run through."""
    import sim.engines.simpy_engine as engine

    monkeypatch.setattr(limits, "available_memory", lambda: 200 << 20)
    monkeypatch.setattr(engine, "SIMPY_BYTES_PER_ACTION", limits.BYTES_PER_ACTION)
    monkeypatch.setattr(engine, "run_simpy", _stops_after_check(engine.run_simpy))
    with pytest.raises(_Accepted):
        sim.cli.main(["simulate", "-K", "16", "-M", "4096", "--jitter", "0.1"])


class _Accepted(BaseException):
    """The simpy run got past its size check (raised instead of running it)."""


def _stops_after_check(run_simpy):
    def run(plan, **kwargs):
        import sim.engines.simpy_engine as engine

        engine.check_fits(len(plan.schedule), "simpy", bytes_per_action=engine.SIMPY_BYTES_PER_ACTION)
        raise _Accepted
    return run


def test_available_memory_counts_the_address_space_limit():
    """``ulimit -v`` (RLIMIT_AS) of 3 GiB: what is left of it, not the machine's free memory."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from sim import limits; print(limits.available_memory())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) < 3 << 30


def test_a_cgroup_limit_is_read_from_its_files(tmp_path, monkeypatch):
    """cgroup v2 (``0::/job``) with memory.max 2 GiB and 0.5 GiB in use: 1.5 GiB of room."""
    files = {"/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/memory.max": f"{2 << 30}\n",
             "/sys/fs/cgroup/job/memory.current": f"{1 << 29}\n"}
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path in files:
            target = tmp_path / path.strip("/").replace("/", "_")
            target.write_text(files[path])
            return real_open(target, *args, **kwargs)
        if str(path).startswith("/sys/fs/cgroup"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert limits._cgroup_room() == (2 << 30) - (1 << 29)
    files["/sys/fs/cgroup/job/memory.max"] = "max\n"  # no limit
    assert limits._cgroup_room() is None


def test_sweep_plots_of_too_many_device_counts_are_refused_before_the_sweep(tmp_path, capsys):
    code, _, err = _cli(["sweep", "--schedules", "gpipe", "-K", "2-66", "-M", "1", "--no-progress",
                         "-o", str(tmp_path / "s")], capsys)
    assert code == 2 and "at most 64, and -K gives 65" in err and "--no-plots" in err
    assert not (tmp_path / "s").exists()
    code, _, err = _cli(["sweep", "--schedules", "gpipe", "-K", "2-66", "-M", "1", "--no-progress", "--no-plots",
                         "-o", str(tmp_path / "s")], capsys)
    assert code == 0, err


def test_a_legend_of_many_device_counts_keeps_its_ends():
    from sim.io.sweep_plots import _thin_legend

    labels = [f"K={k}" for k in range(2, 66)] + ["closed form"]
    handles, shown = _thin_legend(list(range(len(labels))), labels)
    assert shown == ["K=2", "K=3", "K=4", "K=5", "... (56 more K)", "K=62", "K=63", "K=64", "K=65", "closed form"]
    assert len(handles) == len(shown)
    assert _thin_legend([0, 1], ["K=2", "K=4"]) == ([0, 1], ["K=2", "K=4"])


def test_the_schedule_cache_of_a_batch_is_bounded_in_actions(monkeypatch):
    from sim.core.ir import Schedule
    from sim.search import batch

    monkeypatch.setattr(batch, "_schedule_cache", type(batch._schedule_cache)())
    monkeypatch.setattr(batch, "_cached_actions", [0])
    monkeypatch.setattr(batch, "_SCHEDULE_CACHE_ACTIONS", 3_000)
    rows = batch.evaluate([batch.Candidate(schedule="1f1b", devices=8, microbatches=m) for m in (64, 96, 128, 2)])
    assert all(r.ok for r in rows)
    held = [len(v) for v in batch._schedule_cache.values() if isinstance(v, Schedule)]
    assert sum(held) <= 3_000 or len(held) == 1  # the newest is always kept, however large
    assert batch._cached_actions[0] == sum(held)
