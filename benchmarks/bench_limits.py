"""Peak memory of the largest inputs each command accepts for a memory budget (issue 26.4).

(``ingest``'s figure is ``benchmarks/bench_ingest.py --only streaming``: 8 traces of 250 MB, read in one pass.)

    python benchmarks/bench_limits.py                 # a 512 MiB budget: about a minute on an idle machine
    python benchmarks/bench_limits.py --budget 2048   # MiB

pipesim refuses, before any work, what would not fit in the memory available (sim/limits.py: ~400 B per
action for the fast engine, ~2.6 kB for simpy; sim/io/plots.py: 250,000 boxes a Gantt figure). This runs
each command at the largest size its check accepts when *budget* MiB are available and prints the peak
resident memory of the process (ru_maxrss of the child, interpreter and libraries included: the baseline
row is what a tiny run costs) beside what the check predicted, with the load average: a peak above the
baseline plus the prediction means a constant is wrong.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.io.plots import MAX_GANTT_BOXES  # noqa: E402
from sim.limits import BYTES_PER_ACTION, SIMPY_BYTES_PER_ACTION  # noqa: E402
from sim.model.models import LIMITS, get_model  # noqa: E402

RANK_BYTES = 310 * 2**20
"""What validate's memory check counts per rank (validate/environment.py): the row shows the largest rank's peak
(ru_maxrss covers the launcher's waited-for children); the check admits MemAvailable / this many ranks."""


def _deep_model(folder: str) -> str:
    """A model file at the layer limit (the small GPT's shape, 100,000 layers): the largest ``plan`` accepts."""
    import dataclasses
    import json

    path = Path(folder) / "deep.json"
    spec = dataclasses.asdict(get_model("small-gpt")) | {"name": "deep", "layers": LIMITS["layers"]}
    path.write_text(json.dumps(spec))
    return str(path)


def _run(argv: list[str]) -> tuple[int, float, float]:
    """(exit code, seconds, peak resident MiB) of ``python -m sim *argv*`` as a child process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "sim", *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.stderr.close()
    return os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss / 1024  # Linux: ru_maxrss in KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=512, help="MiB taken as available (default 512)")
    args = parser.parse_args()
    budget = args.budget * 2**20
    k = 64
    m_fast = int(budget // BYTES_PER_ACTION // (2 * k))      # 1F1B: F and B per stage and micro-batch
    m_simpy = int(budget // SIMPY_BYTES_PER_ACTION // (2 * k))
    m_gantt = (MAX_GANTT_BOXES - k) // (2 * k)                # the figure's own cap (F, B, and U per stage)
    sweep_m = int(budget // BYTES_PER_ACTION // (4 * 16))     # sweep checks 3 + recompute per stage x M
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("simulate (baseline)", "gpipe K=4 M=4: the interpreter and libraries", None,
             ["simulate", "-K", "4", "-M", "4", "--json"]),
            ("simulate", f"1f1b K={k} M={m_fast}", 2 * k * m_fast * BYTES_PER_ACTION,
             ["simulate", "-K", str(k), "-M", str(m_fast), "--json"]),
            ("simulate --jitter (simpy)", f"1f1b K={k} M={m_simpy}", 2 * k * m_simpy * SIMPY_BYTES_PER_ACTION,
             ["simulate", "-K", str(k), "-M", str(m_simpy), "--jitter", "0.1", "--json"]),
            ("gantt", f"1f1b K={k} M={m_gantt} ({2 * k * m_gantt:,} boxes)", None,
             ["gantt", "-K", str(k), "-M", str(m_gantt), "--labels", "none", "-o", f"{tmp}/gantt.png"]),
            ("gantt, one more micro-batch", f"1f1b K={k} M={m_gantt + 1}: refused", None,
             ["gantt", "-K", str(k), "-M", str(m_gantt + 1), "--labels", "none", "-o", f"{tmp}/refused.png"]),
            ("sweep", f"4 schedules, K=2,16, M=1,{sweep_m}", 3 * 16 * sweep_m * BYTES_PER_ACTION,
             ["sweep", "-K", "2,16", "-M", f"1,{sweep_m}", "--no-plots", "--no-progress", "-o", f"{tmp}/sweep"]),
            ("sweep (issue 26.4)", "4 schedules, K=100000, M=4", None,
             ["sweep", "-K", "100000", "-M", "4", "--no-plots", "--no-progress", "-o", f"{tmp}/wide"]),
            ("export", f"1f1b K={k} M={m_fast} as PyTorch CSV", 2 * k * m_fast * BYTES_PER_ACTION,
             ["export", "-K", str(k), "-M", str(m_fast), "-o", f"{tmp}/s.csv"]),
            ("plan", f"a model of {LIMITS['layers']:,} layers (the limit) on 8 GPUs", None,
             ["plan", "--model", _deep_model(tmp), "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "8",
              "--no-progress", "-o", f"{tmp}/plan"]),
            ("validate (one rank's peak)", "emulated gpipe K=2 M=4, 1 timed run", RANK_BYTES,
             ["validate", "-s", "gpipe", "-K", "2", "-M", "4", "--workload", "emulated", "--repeats", "1",
              "--quiet", "-o", f"{tmp}/validation"]),
        ]
        print(f"budget {args.budget:g} MiB; load before {os.getloadavg()[0]:.2f}")
        print(f"{'command':<28} {'input':<46} {'check (MiB)':>11} {'peak RSS (MiB)':>14} {'time (s)':>8} "
              f"{'exit':>4}  load")
        for command, what, predicted, argv in cases:
            code, seconds, peak = _run(argv)
            check = f"{predicted / 2**20:.0f}" if predicted else "-"
            print(f"{command:<28} {what:<46} {check:>11} {peak:>14.0f} {seconds:>8.1f} {code:>4}  "
                  f"{os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
