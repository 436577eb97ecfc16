"""How long the 2,048-configuration sweep takes as a user runs it: the whole command, as a process.

    .venv/bin/python benchmarks/bench_sweep.py                        # this checkout, jobs 1 and 2
    .venv/bin/python benchmarks/bench_sweep.py --code /work/main      # the same command on another checkout (before)
    .venv/bin/python benchmarks/bench_sweep.py --repeat 3 --jobs 1,2,4

The command (issue 13, target <= 3 s wall with the CSV written; plots timed separately):

    pipesim sweep --schedules naive,gpipe,1f1b,pipedream --devices 2,4,8,16 --microbatches 1-128 -o DIR --no-plots

4 schedules x 4 K x 128 M = 2,048 configurations, about 2 M actions. Printed for each --jobs:
the best wall-clock seconds of --repeat runs of the command in a fresh process (imports,
simulations, CSV), the CPU seconds it used (user + system, all its processes; other load on
the machine inflates it little), and the 1-minute load average before and after, since on a
shared machine a busy neighbour inflates wall time. Then the three plots of that CSV, drawn
in this process (matplotlib imported before the clock starts). A checkout whose sweep has no
--no-plots (the code before the batch engine) is timed with its plots, and the line says so.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRID = ["--schedules", "naive,gpipe,1f1b,pipedream", "--devices", "2,4,8,16", "--microbatches", "1-128"]
CONFIGURATIONS = 4 * 4 * 128
TARGET_S = 3.0


def load() -> float:
    return os.getloadavg()[0]


def time_command(code: Path, argv: list[str], repeat: int) -> tuple[float, float, float, float]:
    """Best wall seconds, CPU seconds per run, load average before and after, of `python -m sim *argv` run in *code*."""
    walls = []
    before_load = load()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim", *argv], cwd=code, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime + cpu_after.ru_stime - cpu_before.ru_stime) / repeat
    return min(walls), cpu, before_load, load()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose `python -m sim` runs (default: this)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure; the best is printed (default 2)")
    parser.add_argument("--jobs", default="1,2", help="comma-separated --jobs values (default 1,2)")
    args = parser.parse_args()
    code = args.code.resolve()
    help_text = subprocess.run([sys.executable, "-m", "sim", "sweep", "--help"], cwd=code, capture_output=True,
                               text=True, check=True).stdout
    can_skip_plots = "--no-plots" in help_text
    print(f"`pipesim sweep {' '.join(GRID)}`: {CONFIGURATIONS} configurations, code in {code}, "
          f"{os.cpu_count()} CPU cores, best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        csv = None
        for jobs in [int(j) for j in args.jobs.split(",")]:
            out = Path(tmp) / f"j{jobs}"
            argv = ["sweep", *GRID, "-o", str(out), "--no-progress", "--jobs", str(jobs)]
            argv += ["--no-plots"] if can_skip_plots else []
            wall, cpu, load0, load1 = time_command(code, argv, args.repeat)
            what = "CSV" if can_skip_plots else "CSV and plots (this code cannot skip them)"
            verdict = "meets" if wall <= TARGET_S else "misses"
            print(f"  --jobs {jobs}: {wall:6.2f} s wall, {cpu:6.2f} CPU s ({what}; {verdict} the {TARGET_S:g} s "
                  f"target); {CONFIGURATIONS / wall:,.0f} configurations/s; load average {load0:.2f} -> {load1:.2f}")
            csv = out / "sweep.csv"
        if csv is not None and code == REPO:
            sys.path.insert(0, str(REPO))
            import matplotlib  # noqa: F401  (imported before the clock: the command imports it once too)

            from sim.cli.sweep import write_sweep_plots
            from sim.search.sweep import read_sweep

            df = read_sweep(csv)
            load0 = load()
            t0 = time.perf_counter()
            write_sweep_plots(df, Path(tmp) / "plots")
            print(f"  plots of that CSV (three PNGs, in process): {time.perf_counter() - t0:6.2f} s; "
                  f"load average {load0:.2f} -> {load():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
