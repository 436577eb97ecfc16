"""The validator profiles PyTorch's and Megatron's runtimes in cycles of a few seconds, merged into one trace a rank.

With ``record_shapes=True`` the profiler held memory after every probe-sized step until it stopped, and from the
fifth step on the backwards ran far slower (``validate.pytorch.runtime.CYCLE_SECONDS`` has the figures); each cycle
releases it (the timed steps are now profiled without shapes: validate.ingest.message_shapes). The merged trace must
read exactly as one trace of the same steps would.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from validate.ingest.flow import ingest
from validate.pytorch.runtime import CYCLE_SECONDS, cycle_steps, merge_traces
from validate.pytorch.schedules import executed_order

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def test_a_cycle_holds_a_few_seconds_of_steps():
    assert cycle_steps(5, [1.5, 1.4, 1.6]) == 2  # probe-sized steps: two per cycle
    assert cycle_steps(40, [0.04, 0.05, 0.03]) == 40  # 1-ms actions: one cycle
    assert cycle_steps(5, [2 * CYCLE_SECONDS]) == 1  # never less than one step
    assert cycle_steps(7, []) == 7  # nothing timed: one cycle


def _split(trace: dict, shift_ns: int) -> tuple[dict, dict]:
    """*trace* as two cycles: the first profiled step's events, and the rest on a clock *shift_ns* later (their
    ``ts`` less the shift, ``baseTimeNanoseconds`` plus it), as a second export of the same process could read."""
    steps = sorted((e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    cut = steps[1]["ts"]
    first = {**trace, "traceEvents": [e for e in trace["traceEvents"] if e.get("ts", 0) < cut]}
    rest = [dict(e, ts=e["ts"] - shift_ns / 1e3) if "ts" in e else dict(e)
            for e in trace["traceEvents"] if e.get("ts", 0) >= cut]
    second = {**trace, "traceEvents": rest, "baseTimeNanoseconds": trace["baseTimeNanoseconds"] + shift_ns}
    return first, second


def _step_starts(trace: dict) -> list[float]:
    return sorted(e["ts"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))


@pytest.mark.parametrize("shift_ns", [0, 250_000_000_000])
def test_merged_cycles_read_as_the_one_trace(tmp_path, shift_ns):
    schedule = executed_order("Schedule1F1B", 2, 4)
    originals = sorted(FIXTURES.glob("torch213_1f1b_K2_M4_rank*.json.gz"))
    merged = []
    for r, path in enumerate(originals):
        trace = json.loads(gzip.open(path).read())
        trace.setdefault("baseTimeNanoseconds", 1_790_000_000_000_000_000)
        parts = []
        for c, part in enumerate(_split(trace, shift_ns)):
            parts.append(tmp_path / f"rank{r}_cycle{c}.json")
            parts[-1].write_text(json.dumps(part))
        out = tmp_path / f"run_rank{r}.json"
        merge_traces(parts, out)
        assert not any(p.exists() for p in parts) and not list(tmp_path.glob("*.part"))
        merged.append(str(out))
        # on the first cycle's clock again: every step where the one trace has it
        assert _step_starts(json.loads(out.read_text())) == pytest.approx(_step_starts(trace), abs=1e-3)
    whole, cycles = ingest([str(p) for p in originals], schedule), ingest(merged, schedule)
    assert sorted(cycles.steps) == sorted(whole.steps)
    for s in whole.steps:
        assert cycles.steps[s].metrics.makespan == pytest.approx(whole.steps[s].metrics.makespan, abs=1e-9)
    assert {s: len(m) for s, m in cycles.messages.items()} == {s: len(m) for s, m in whole.messages.items()}
