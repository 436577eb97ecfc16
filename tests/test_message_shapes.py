"""The timed steps are profiled without ``record_shapes`` and get their messages' sizes and peers from one step
profiled with it (validate.pytorch.message_shapes has why and the figures)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from validate.ingest.actions import extract_rank
from validate.ingest.flow import ingest
from validate.ingest.reader import read_trace
from validate.pytorch.message_shapes import SHAPE_ARGS, MessageShapesError, copy_message_shapes
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


def test_a_real_trace_stripped_of_shapes_reads_the_same_once_they_are_copied(tmp_path):
    """PyTorch's ScheduleInterleaved1F1B on two gloo ranks (ten steps profiled with shapes): without them ingest has
    no sizes or peers; from the first step copied onto every step (as the validator does), the messages read exactly
    as recorded, and so does the whole ingest."""
    pytest.importorskip("torch")
    from validate.pytorch.validation import pytorch_schedule, torch_class_for

    schedule, _ = pytorch_schedule(torch_class_for("interleaved-1f1b"), 2, 8)
    originals = [FIXTURES / f"torch213_interleaved_K2_M8_gloo_rank{r}.json.gz" for r in (0, 1)]
    stripped, copied = [], []
    for r, path in enumerate(originals):
        trace = json.loads(gzip.open(path).read())
        stripped.append(tmp_path / f"stripped_rank{r}.json")
        stripped[-1].write_text(json.dumps(_without_shapes(trace)))
        part, shapes = tmp_path / f"rank{r}_cycle0.json", tmp_path / f"rank{r}_shapes.json"
        part.write_text(stripped[-1].read_text())
        shapes.write_text(json.dumps(_first_step(trace)))
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
