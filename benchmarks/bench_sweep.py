"""How long the default sweep takes: ``pipesim sweep`` with its defaults must finish in under 10 s.

    .venv/bin/python benchmarks/bench_sweep.py            # measures, prints the figures
    .venv/bin/python benchmarks/bench_sweep.py --repeat 3

The default grid is schedules naive,gpipe,1f1b,pipedream x K in 2,4,8,16 x M in 1..128
(128 configurations). Printed: the simulations alone (run_sweep, 1 and 2 processes),
and the whole command end to end in a fresh process (imports, simulations, CSV and three
PNG plots), best of --repeat runs: wall-clock seconds, and the CPU seconds the command used
(user + system), which other load on the machine does not inflate much.
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

from sim.commands.sweep import DEFAULT_DEVICES, DEFAULT_MICROBATCHES, DEFAULT_SCHEDULES
from sim.commands.options import int_list
from sim.sweep import run_sweep

LIMIT_S = 10.0


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    names = DEFAULT_SCHEDULES.split(",")
    ks, ms = int_list(DEFAULT_DEVICES), int_list(DEFAULT_MICROBATCHES)
    n = len(names) * len(ks) * len(ms)
    print(f"default sweep: {len(names)} schedules x K {ks} x M {ms} = {n} configurations "
          f"({os.cpu_count()} CPU cores)")
    for jobs in (1, 2):
        t = best_of(args.repeat, lambda: run_sweep(names, ks, ms, jobs=jobs, progress=False))
        print(f"  run_sweep, jobs={jobs}:                 {t:6.2f} s  ({n / t:.0f} configurations/s)")
    pipesim = [sys.executable, "-m", "sim.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 2):
            cmd = pipesim + ["sweep", "-o", str(Path(tmp) / f"j{jobs}"), "--no-progress", "--jobs", str(jobs)]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = best_of(args.repeat, lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / args.repeat
            verdict = "under" if t < LIMIT_S else "OVER"
            print(f"  `pipesim sweep -o DIR --jobs {jobs}` end to end: {t:6.2f} s wall ({verdict} the {LIMIT_S:g} s "
                  f"limit), {cpu:.2f} CPU s per run; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
