"""The streaming trace reader: one pass, bounded memory, the same spans as reading the whole file, and hostile
files refused in one line before anything large is built (issue 26, items 4, 6 and 10).

The reference is the plain reading (``json.loads`` of the whole text, every timed event kept): on random
event lists written every way a trace is written (object or bare list, metadata before or after the events,
pretty or compact, gzip, byte-order mark) the streamed spans must equal it.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.simulate import simulate
from validate.ingest import reader
from validate.ingest.actions import ActionPatternError, compile_patterns
from validate.ingest.flow import ClockError, IngestError, ingest
from validate.ingest.reader import Keep, TraceReadError, read_header, read_trace

HTA = Path(__file__).parent / "fixtures" / "hta"


def reference(data) -> list[tuple]:
    """Every well-formed timed event of *data* as (name, start, end), reading it whole."""
    events = data if isinstance(data, list) else data["traceEvents"]
    out, open_ = [], {}
    for e in events:
        if e.get("ph") == "X" and e.get("dur", -1) >= 0:
            out.append((e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        elif e.get("ph") == "B":
            open_.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e.get("ph") == "E" and open_.get((e["pid"], e["tid"])):
            b = open_[(e["pid"], e["tid"])].pop()
            if e["ts"] >= b["ts"]:
                out.append((b["name"], float(b["ts"]), float(e["ts"])))
    return sorted(out, key=lambda t: (t[1], -t[2]))


_names = st.sampled_from(["PP:0F0", "aten::mm", "gloo:recv", "c10d::send", 'a "quoted" ]}, name', "ProfilerStep#3",
                          "\u00e9\u00e8 \u2603", "kernel"])
_event = st.one_of(
    st.builds(lambda n, ts, dur, t: {"ph": "X", "cat": "cpu_op", "name": n, "ts": ts, "dur": dur, "pid": 1, "tid": t,
                                     "args": {"External id": 1, "grid": [1, 2, 3], "s": "]"}},
              _names, st.floats(0, 1e6, allow_nan=False), st.floats(0, 1e3, allow_nan=False), st.integers(1, 2)),
    st.builds(lambda n, ts: [{"ph": "B", "name": n, "ts": ts, "pid": 1, "tid": 3},
                             {"ph": "E", "ts": ts + 5, "pid": 1, "tid": 3}], _names, st.floats(0, 1e6, allow_nan=False)),
    st.builds(lambda i: {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": i, "ts": 1.0, "pid": 1, "tid": 1},
              st.integers(0, 9)),
    st.just({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.lists(_event, min_size=1, max_size=30), form=st.sampled_from(["head", "tail", "list"]),
       indent=st.sampled_from([None, 2]), gz=st.booleans(), bom=st.booleans())
def test_streamed_spans_equal_the_whole_file_reading(tmp_path_factory, raw, form, indent, gz, bom):
    events = [x for e in raw for x in (e if isinstance(e, list) else [e])]
    if not reference(events):
        events.append({"ph": "X", "name": "x", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 1})
    meta = {"distributedInfo": {"rank": 3, "world_size": 4}, "baseTimeNanoseconds": 1_790_000_000_000_000_000,
            "host_name": "h"}
    if form == "list":
        data = events
    elif form == "head":
        data = {**meta, "traceEvents": events, "traceName": "t ] }"}
    else:  # newer Kineto writes some metadata after the events
        data = {"schemaVersion": 1, "traceEvents": events, "INFO": [1, [2]], **meta}
    text = json.dumps(data, indent=indent).encode()
    text = (b"\xef\xbb\xbf" if bom else b"") + text
    path = tmp_path_factory.mktemp("t") / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    t = read_trace(path)
    assert [(s.name, s.start, s.end) for s in t.spans] == reference(events)
    if form != "list":
        assert (t.rank, t.world_size, t.base_ns, t.host) == (3, 4, 1_790_000_000_000_000_000, "h")


def test_metadata_after_the_events_of_a_real_kineto_file():
    """HolisticTraceAnalysis' cpu_only trace (MIT, see fixtures/hta/README.md) writes baseTimeNanoseconds last."""
    path = HTA / "rank-34.cpu_only.json.gz"
    with gzip.open(path) as f:
        whole = json.load(f)
    t = read_trace(path)
    assert t.base_ns == whole["baseTimeNanoseconds"] and t.rank == whole["distributedInfo"]["rank"]
    assert [(s.name, s.start, s.end) for s in t.spans] == reference(whole)


_PEAK = """
import sys
from validate.ingest.reader import Keep, read_trace
seen = []
t = read_trace(sys.argv[1], keep=Keep(), progress=seen.append)
# VmHWM: this image's peak (ru_maxrss would carry the parent's peak across fork + exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(hwm * 1024, sum(seen), len(t.spans))
"""


def _padded(path: Path, events: int) -> int:
    """A Kineto-shaped trace: a few pipeline ranges, then *events* CPU ops (pretty-printed); returns its size."""
    res = simulate(schedules.generate("1f1b", 2, 4), uniform(2, forward=1e-3, backward=2e-3), Hardware(devices=2))
    trace = traces_from(res, "PP")[0]
    text = json.dumps(trace, indent=2)
    op = ('  {\n    "ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 100, "tid": 100,\n    "ts": 11.5, '
          '"dur": 0.25,\n    "args": {\n      "External id": 7, "Record function id": 0, "Ev Idx": 7\n    }\n  },\n')
    head, sep, tail = text.partition('"traceEvents": [')
    path.write_text(head + sep + "\n" + op * events + tail.lstrip())
    return path.stat().st_size


def test_reading_keeps_memory_bounded(tmp_path):
    """Peak resident memory does not grow with the file: 4x the events, a few MB more at most (reading the
    whole file, json.loads, would add ~10x its size)."""
    import subprocess
    import sys

    peaks = []
    for n, events in (("small", 40_000), ("large", 160_000)):
        path = tmp_path / f"{n}.json"
        size = _padded(path, events)
        out = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        rss, progressed, kept = map(int, out.stdout.split())
        assert progressed == size  # the progress bar reaches the end
        assert kept < 100  # the CPU ops are not kept
        peaks.append((size, rss))
    (small, rss_small), (large, rss_large) = peaks
    assert large > 3 * small and large > 30e6
    assert rss_large - rss_small < 0.1 * (large - small), peaks


def test_the_header_pass_reads_the_rank_without_the_events(tmp_path):
    res = simulate(schedules.generate("gpipe", 2, 2), uniform(2, forward=1.0), Hardware(devices=2))
    path = tmp_path / "x.json"
    path.write_text(json.dumps(traces_from(res, "PP")[1]))
    h = read_header(path)
    assert h.rank == 1 and h.world_size == 2 and h.spans == ()


# ----------------------------------------------------------------------------------------- issue 26, hostile files
def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipesim: error: "), err
    return err[0]


def test_special_files_are_refused_before_reading(tmp_path, capsys):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, what in (("/dev/zero", "device or pipe"), (str(fifo), "device or pipe"), (str(tmp_path), "folder")):
        assert what in _cli_error(capsys, ["ingest", path, "-s", "gpipe", "-M", "1", "-K", "1",
                                           "-o", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_a_gzip_bomb_is_refused_while_inflating(tmp_path, monkeypatch):
    """The ratio check, with its floor lowered so that the test inflates 40 MB instead of gigabytes."""
    monkeypatch.setattr(reader, "_INFLATION_FLOOR", 1 << 20)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 40_000_000 + b"]}", compresslevel=9))
    assert path.stat().st_size < 100_000
    with pytest.raises(TraceReadError, match="inflates more than 200x"):
        read_trace(path)
    monkeypatch.setattr(reader, "MAX_INFLATION", 10**6)  # the bug injected: no ratio check
    with pytest.raises(TraceReadError, match="no timed events"):
        read_trace(path)


def test_too_many_events_are_refused_while_streaming(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "MAX_KEPT_EVENTS", 1000)
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": i, "dur": 1, "pid": 0, "tid": 7,
               "args": {"correlation": i}} for i in range(5000)]
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceReadError, match="more than 1,000 events ingest needs"):
        read_trace(path, keep=Keep())


@pytest.mark.parametrize("event, message", [
    ({"ph": "X", "name": {"x": 1}, "ts": 1, "dur": 2, "pid": 1, "tid": 1}, 'the name {"x": 1}, not a string'),
    ({"ph": "X", "name": "a", "ts": 1e300, "dur": 2, "pid": 1, "tid": 1}, "beyond any clock"),
])
def test_events_no_profiler_writes_are_refused(tmp_path, event, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [event]}))
    with pytest.raises(TraceReadError, match=message):
        read_trace(path)


@pytest.mark.parametrize("base", ["soon", -1e30, 1e30, 12345, True])
def test_absurd_base_times_are_refused(tmp_path, base):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}],
                                "baseTimeNanoseconds": base}))
    with pytest.raises(TraceReadError, match="baseTimeNanoseconds"):
        read_trace(path)


def _written(tmp_path, traces) -> list[str]:
    paths = []
    for r, t in enumerate(traces):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    return paths


def test_ranks_hours_apart_are_refused(tmp_path):
    res = simulate(schedules.generate("1f1b", 2, 4), uniform(2, forward=1e-3, backward=2e-3), Hardware(devices=2))
    sched = res.schedule
    hours = 5 * 3600e6
    paths = _written(tmp_path, traces_from(res, "PP", offsets_us=[0.0, hours]))
    with pytest.raises(ClockError, match="5 hours after rank 0"):
        ingest(paths, sched, clock="shared")
    paths = _written(tmp_path, traces_from(res, "PP", offsets_us=[0.0, 120.0]))  # microseconds apart: fine
    ingest(paths, sched, clock="shared")


def test_traces_of_different_profiled_steps_are_named_as_such(tmp_path):
    res = simulate(schedules.generate("1f1b", 2, 4), uniform(2, forward=1e-3, backward=2e-3), Hardware(devices=2))
    a = traces_from(res, "PP", step_marker=3)
    b = traces_from(res, "PP", step_marker=4)
    paths = _written(tmp_path, [a[0], b[1]])
    with pytest.raises(IngestError, match=r"different profiled steps.*rank 0 .*ProfilerStep#3.*rank 1 .*ProfilerStep#4"):
        ingest(paths, res.schedule)


def test_nested_quantifiers_are_refused_at_once():
    """Issue 26 item 10: '(?P<kind>(?:a+)+)(?P<mb>\\d+)' backtracked for minutes on a 41-character name."""
    for bad in (r"(?P<kind>(?:a+)+)(?P<mb>\d+)", r"(?P<kind>(\w*)*)(?P<mb>\d)", r"(?P<kind>(x{1,5})+)(?P<mb>\d)"):
        with pytest.raises(ActionPatternError, match="repeats a group that itself repeats"):
            compile_patterns([bad])
    compile_patterns([r"(?P<kind>fwd|bwd)_s(?P<stage>\d+)_mb(?P<mb>\d+)", r"(?:ab)+(?P<kind>F)(?P<mb>\d+)"])


def test_a_refused_ingest_leaves_no_output_folder(tmp_path, capsys):
    out = tmp_path / "deep" / "report"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    _cli_error(capsys, ["ingest", str(bad), "-s", "gpipe", "-K", "1", "-M", "1", "-o", str(out)])
    assert not (tmp_path / "deep").exists()


def test_named_actions_in_another_order_than_the_schedule_are_refused(tmp_path, capsys):
    """Issue 26 item 6: 1F1B traces ingested as GPipe gave exit 0 with the order difference a line deep in the
    report; now the first device and position that differ are named, exit 2."""
    res = simulate(schedules.generate("1f1b", 2, 4), uniform(2, forward=1e-3, backward=2e-3), Hardware(devices=2))
    paths = _written(tmp_path, traces_from(res, "PP"))
    err = _cli_error(capsys, ["ingest", *paths, "-s", "gpipe", "-M", "4", "-o", str(tmp_path / "o")])
    assert "ran its actions in another order: device 0 ran" in err
    assert main(["ingest", *paths, "-s", "1f1b", "-M", "4", "-o", str(tmp_path / "o")]) == 0
