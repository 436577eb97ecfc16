"""The timed steps are profiled without ``record_shapes`` and get their messages' sizes and peers from one step
profiled with it (validate.ingest.message_shapes has why and the figures)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from validate.ingest.actions import extract_rank
from validate.ingest.flow import ingest
from validate.ingest.reader import read_trace
from validate.ingest.message_shapes import SHAPE_ARGS, MessageShapesError, copy_message_shapes
from validate.pytorch.runtime import merge_traces

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def _event(name: str, ts: float, dur: float = 1.0, **args) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "args": dict(args)}


def _step(number: int, ts: float, calls: list[str]) -> list[dict]:
    return [_event(f"ProfilerStep#{number}", ts, 100.0),
            *[_event(name, ts + 1 + i) for i, name in enumerate(calls)], _event("aten::mm", ts + 50)]


SHAPED = [_event("c10d::send", 1, **{"Input Dims": [[[4, 8]]], "Concrete Inputs": ["", "", "1", "0"]}),
          _event("gloo:send", 2, **{"Input Dims": [[4, 8]], "Input type": ["float"]}),
          _event("c10d::recv_", 3, **{"Input Dims": [[[4, 8]]], "Concrete Inputs": ["", "", "1", "0"]}),
          _event("c10d::send", 4, **{"Input Dims": [[[2, 8]]], "Concrete Inputs": ["", "", "0", "0"]}),
          _event("gloo:send", 5, **{"Input Dims": [[2, 8]], "Input type": ["float"]}),
          _event("aten::mm", 6, **{"Input Dims": [[4, 8], [8, 8]]})]


def _device_copy(name: str, ts: float, dur: float = 1.0) -> dict:
    """Kineto's GPU-side copy of a host range, on the device's clock."""
    return {**_event(name, ts, dur), "cat": "gpu_user_annotation"}


def test_every_step_gets_the_shaped_steps_arguments_call_by_call():
    events = _step(1, 1000, ["c10d::send", "gloo:send", "c10d::recv_", "c10d::send", "gloo:send"]) + \
        _step(2, 2000, ["c10d::recv_", "c10d::send", "gloo:send", "c10d::send", "gloo:send"])  # another interleaving
    # a GPU's copies of a step and of a message, late on the device's clock: neither a step nor a call of step 2
    events += [_device_copy("ProfilerStep#1", 1090, 1000), _device_copy("c10d::send", 2005)]
    assert copy_message_shapes(SHAPED + [_device_copy("gloo:send", 7)], events) == 10
    for step in (1, 2):
        in_step = [e for e in events if step * 1000 < e["ts"] < step * 1000 + 100 and "cat" not in e]
        sends = [e for e in in_step if e["name"] == "c10d::send"]
        assert [e["args"]["Input Dims"] for e in sends] == [[[[4, 8]]], [[[2, 8]]]]  # the k-th gets the k-th
        assert [e["args"]["Concrete Inputs"][2] for e in sends] == ["1", "0"]
        assert [e["args"]["Input type"] for e in in_step if e["name"] == "gloo:send"] == [["float"], ["float"]]
        assert not any(k in e["args"] for e in in_step if e["name"] == "aten::mm" for k in SHAPE_ARGS)


@pytest.mark.parametrize("calls, named", [
    (["c10d::send", "gloo:send", "c10d::recv_", "c10d::send"], "gloo:send"),  # one call fewer
    (["c10d::send", "gloo:send", "c10d::recv_", "c10d::send", "gloo:send", "nccl:send 0->1"], "nccl:send"),
])
def test_a_step_with_other_calls_is_refused_by_number(calls, named):
    events = _step(1, 1000, ["c10d::send", "gloo:send", "c10d::recv_", "c10d::send", "gloo:send"]) + \
        _step(7, 2000, calls)
    with pytest.raises(MessageShapesError, match=f"profiled step 7 .*{named}"):
        copy_message_shapes(SHAPED, events)


def _without_shapes(trace: dict) -> dict:
    events = [dict(e, args={k: v for k, v in e["args"].items() if k not in SHAPE_ARGS}) if "args" in e else e
              for e in trace["traceEvents"]]
    return {**trace, "traceEvents": events}


def _first_step(trace: dict) -> dict:
    steps = sorted((e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    start, end = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
    return {**trace, "traceEvents": [e for e in trace["traceEvents"] if start <= e.get("ts", -1) <= end]}


ARGS = ["--from-pytorch", "Interleaved1F1B", "-M", "8", "--chunks", "2", "--microbatch-size", "64"]


@pytest.fixture()
def profiled_twice(tmp_path):
    """A user's two profiles of each rank, made from the committed interleaved-1f1b traces: the timed steps without
    shapes, and one step with them (its first step); the originals too."""
    originals = [FIXTURES / f"torch213_interleaved_K2_M8_gloo_rank{r}.json.gz" for r in (0, 1)]
    timed, shapes = [], []
    for r, path in enumerate(originals):
        trace = json.loads(gzip.open(path).read())
        timed.append(tmp_path / f"timed_rank{r}.json")
        timed[-1].write_text(json.dumps(_without_shapes(trace)))
        shapes.append(tmp_path / f"shapes_rank{r}.json")
        shapes[-1].write_text(json.dumps(_first_step(trace)))
    return [str(p) for p in originals], [str(p) for p in timed], [str(p) for p in shapes]


def test_a_real_trace_stripped_of_shapes_reads_the_same_once_they_are_copied(profiled_twice, tmp_path):
    """PyTorch's ScheduleInterleaved1F1B on two gloo ranks (ten steps profiled with shapes): without them ingest has
    no sizes or peers; from the first step copied onto every step (as the validator does), the messages read exactly
    as recorded, and so does the whole ingest."""
    pytest.importorskip("torch")
    from validate.pytorch.validation import pytorch_schedule, torch_class_for

    schedule, _ = pytorch_schedule(torch_class_for("interleaved-1f1b"), 2, 8)
    originals, stripped, shaped = profiled_twice
    copied = []
    for r in (0, 1):
        # merge_traces removes what it merged: copies of the fixture's files
        part, shapes = tmp_path / f"rank{r}_cycle0.json", tmp_path / f"rank{r}_shapes.json"
        part.write_text(Path(stripped[r]).read_text())
        shapes.write_text(Path(shaped[r]).read_text())
        copied.append(tmp_path / f"copied_rank{r}.json")
        merge_traces([part], copied[-1], shapes_from=shapes)
        assert not part.exists() and not shapes.exists()

    def messages(paths):
        return [[(m.step, m.direction, m.nbytes, m.peer) for m in extract_rank(read_trace(p), r, [0, 1, 0, 1]).messages]
                for r, p in enumerate(paths)]

    recorded = messages(originals)
    assert all(ms for ms in recorded) and all(size and peer in (0, 1) for ms in recorded for _, _, size, peer in ms)
    assert messages(copied) == recorded
    assert messages(stripped) != recorded  # the check can fail: without the copy no message has a size
    whole = ingest([str(p) for p in originals], schedule, microbatch_size=64)
    read = ingest([str(p) for p in copied], schedule, microbatch_size=64)
    assert read.calibration == whole.calibration and read.link_seconds == whole.link_seconds
    assert read.steps[read.step].metrics == whole.steps[whole.step].metrics and read.notes == whole.notes
    # ingest's own copy (--shapes-from), onto the spans it streams: the same calibration
    streamed = ingest(stripped, schedule, microbatch_size=64, shapes_from=shaped[::-1])
    assert streamed.calibration == whole.calibration and streamed.link_seconds == whole.link_seconds


def test_ingest_shapes_from_reads_traces_profiled_without_shapes_as_recorded(profiled_twice, tmp_path):
    """``pipesim ingest --shapes-from``: the traces profiled without shapes calibrate as the originals do (the
    messages' sizes: send_bytes), and without the option they do not (the check can fail). The shaped traces are
    given in the other order: their ranks come from the traces, as the timed traces' do."""
    pytest.importorskip("torch")  # --from-pytorch reads the class's order
    from sim.cli import main

    originals, timed, shapes = profiled_twice
    costs = {}
    for name, argv in (("whole", originals), ("without", timed), ("with", [*timed, "--shapes-from", *shapes[::-1]])):
        assert main(["ingest", *argv, *ARGS, "-o", str(tmp_path / name), "--json"]) == 0
        costs[name] = next((tmp_path / name).glob("*_costs.csv")).read_text()
    assert costs["with"] == costs["whole"] != costs["without"]
    assert ",65536.0," in costs["with"] and ",65536.0," not in costs["without"]
    report = json.loads(next((tmp_path / "with").glob("*_ingest.json")).read_text())
    assert any("--shapes-from" in note for note in report["notes"])  # the report says where the sizes came from


def test_ingest_shapes_from_refusals_are_one_line(profiled_twice, tmp_path, capsys):
    from sim.cli import main

    originals, timed, shapes = profiled_twice
    other = [str(FIXTURES / f"torch213_gpipe_K2_M4_rank{r}.json.gz") for r in (0, 1)]
    for extra, says in (([shapes[0]], "--shapes-from gives 1 trace(s) for 2 rank(s)"),
                        ([shapes[0], timed[0]], "--shapes-from: "),  # two of rank 0
                        (other, "rank 0 (" + timed[0] + ", shapes from " + other[0] + "): profiled step 1 made other "
                                "point-to-point calls")):
        assert main(["ingest", *timed, "-s", "interleaved-1f1b", "-M", "8", "--chunks", "2", "-o",
                     str(tmp_path / "o"), "--shapes-from", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pipesim: error: ") and says in err[0], err
        assert not (tmp_path / "o").exists()
    assert main(["ingest", *timed, "--overlap-pairs", "--shapes-from", *shapes]) == 2
    assert "--overlap-pairs reads no messages" in capsys.readouterr().err
