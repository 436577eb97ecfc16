"""Megatron-LM's overlapped mode (``overlap_p2p_comm``) read from a real trace: when each receive was waited for,
and the runtime's own time charged once.

The fixture (``tests/fixtures/ingest/megatron213_overlap_interleaved_K2_M8_rank{0,1}.json.gz``, how it was made:
``fixtures/ingest/slim_gpu_trace.py``) is six profiled steps of ``pipesim validate --runtime megatron-overlap`` at
1-ms actions on 2 gloo ranks. In this mode a rank posts a receive, computes, and waits for it in
``pp_pre_forward`` / ``pp_pre_backward``; gloo closes the receive's ``gloo:recv`` range inside that wait. Read as
waited for right after its post, every receive looked like a transfer lasting the computation in between, and the
prediction drawn from those link times was 20% slow; charging the time before each call both as the call's overhead
and as a gap before the next action made it 3% slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim import schedules
from validate.ingest import actions
from validate.ingest.calibration import calibrate_runtime
from validate.ingest.flow import ingest
from validate.ingest.message_draws import message_distributions, predict_drawn
from validate.ingest.reader import Keep, Span

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
TRACES = [str(FIXTURES / f"megatron213_overlap_interleaved_K2_M8_rank{r}.json.gz") for r in (0, 1)]
WAIT = "<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1 object at 0x7f1ef7150c70>"


def _ingested():
    return ingest(TRACES, schedules.generate("interleaved-1f1b", 2, 8), source="megatron")


def _prediction_error(ing, *, once: bool = True) -> float:
    """Median measured step / the prediction ``validate --runtime megatron-overlap`` makes from *ing* - 1; *once*:
    False measures the dispatch overhead with the time before each call in it (charged twice)."""
    cal = ing.calibration
    spans = ing.dispatch_spans() if once else ing.comm_spans
    model = calibrate_runtime(ing.runs(), cal.costs, cal.hardware, "megatron-overlap",
                              dispatch_runs=ing.dispatch_runs() if once else None,
                              draws=message_distributions(ing.messages, results=ing.steps, schedule=ing.schedule,
                                                          spans=spans, overhead=ing.call_overhead))
    predicted = predict_drawn(ing.schedule, model.costs, model.hardware, model.runtime, model.draws)[0]
    measured = float(np.median([r.metrics.makespan for r in ing.steps.values()]))
    return measured / predicted.metrics.makespan - 1


def test_the_wait_that_returned_a_receive_is_the_one_running_at_its_completion():
    call = Span("c10d::recv_", "cpu_op", 10.0, 11.0, 1, 1)
    waits = actions._wait_calls([Span(WAIT, "python_function", 9.0, 60.0, 1, 1),  # began before the post: not it
                                 Span(WAIT, "python_function", 20.0, 21.0, 1, 1),  # returned before: not it
                                 Span(WAIT, "python_function", 48.0, 50.5, 1, 1),
                                 Span(WAIT, "python_function", 48.0, 50.5, 1, 2)])  # another thread
    assert actions._waited_in(waits, call, 50.0) == (48.0, 50.5)
    assert actions._waited_in(waits, call, 30.0) is None  # no wait of its thread was running then
    assert actions._waited_in({}, call, 50.0) is None
    keep = Keep(python_calls=(actions.WAIT_CALL,))
    assert keep(WAIT, "python_function") and not keep(WAIT, "cpu_op") and not Keep()(WAIT, "python_function")


def test_receives_are_waited_for_where_the_trace_shows_it():
    ing = _ingested()
    msgs = [m for step in ing.messages.values() for m in step.values()]
    assert len(msgs) == 6 * 48
    late = [m for m in msgs if m.wait_start is not None and m.wait_start > m.recv_call[1] + 1e-4]
    # most receives were posted, computed past and then waited for, and had arrived by then
    assert len(late) > len(msgs) / 2
    assert sum(m.blocked for m in msgs) < len(msgs) / 2
    assert all(m.wait_start >= m.recv_call[1] for m in msgs if m.wait_start is not None)


def test_without_the_waits_every_receive_reads_as_blocked(monkeypatch):
    monkeypatch.setattr(actions, "_waited_in", lambda *args: None)
    msgs = [m for step in _ingested().messages.values() for m in step.values()]
    assert all(m.blocked for m in msgs)


def test_the_time_before_each_call_is_charged_once():
    ing = _ingested()
    assert ing.call_overhead.form == "before the call" and ing.before_calls
    for step, spans in ing.dispatch_spans().items():
        for device, before in ing.before_calls[step].items():
            assert set(before) <= set(spans[device])
    from validate.predict.calibrate import dispatch_overhead
    once, twice = dispatch_overhead(ing.dispatch_runs()), dispatch_overhead(ing.runs())
    assert all(once[s][k] <= twice[s][k] + 1e-12 for s in twice for k in twice[s])
    total = lambda per_stage: sum(sum(v.values()) for v in per_stage.values())  # noqa: E731
    assert total(once) < 0.7 * total(twice)


def test_the_prediction_of_the_overlapped_mode_is_within_a_few_percent_and_each_fix_is_needed(monkeypatch):
    ing = _ingested()
    assert _prediction_error(ing) == pytest.approx(0.0, abs=0.025)  # +1.3% when written
    assert _prediction_error(ing, once=False) < -0.025  # the runtime's time charged twice: -3.0%
    monkeypatch.setattr(actions, "_waited_in", lambda *args: None)
    assert _prediction_error(_ingested()) < -0.15  # every receive read as waited for at its post: -19.9%
