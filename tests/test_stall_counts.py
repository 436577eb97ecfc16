"""Counting a step's stalls (validate/ingest/message_draws.py: ``step_stalls`` for a profiled step, ``drawn_stalls``
for a draw of the prediction): the two must count the same thing, or the table that compares them
(``benchmarks/bench_runtime_replay.py --stalls``) compares nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sim import schedules
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from validate.ingest.message_draws import drawn_stalls, step_stalls
from validate.ingest.messages import MessageModel, MessageTimes, predict_with_messages

sys.path.insert(0, str(Path(__file__).parent))
from test_call_overhead import _ingested_interleaved  # noqa: E402  (the 1-ms interleaved 1F1B fixture)


def _one_step(schedule, costs, hardware, **changed):
    keys = schedule.compiled.flat.keys[np.flatnonzero(schedule.compiled.flat.send_to >= 0)].tolist()
    fields = dict(send_call={}, recv_call={}, link={k: 1e-4 for k in keys}, bound={}, sender={}, typical_send=0.0,
                  typical_recv=0.0, steps=1)
    for name, values in changed.items():
        fields[name] = {**fields[name], **values}
    model = MessageModel(**fields)
    return model, predict_with_messages(schedule, costs, hardware, "torch", model)


def test_a_slow_call_and_a_waited_for_transfer_are_stalls():
    """GPipe on two devices under PyTorch's posting points: a 2-ms link of the first activation, which device 1
    waits for, is one stall, 0.9 ms none; a send call of 1.5 ms is one, whatever it delays; nothing slow, none."""
    s = schedules.generate("gpipe", 2, 3)
    costs = StageCosts(forward=[1e-3, 1e-3], backward=[2e-3, 2e-3])
    hw = Hardware(devices=2)
    first = int(s.compiled.flat.keys[np.flatnonzero(np.asarray(s.compiled.flat.send_to) == 1)][0])
    for changed, stalls in (({}, 0), ({"link": {first: 2e-3}}, 1), ({"link": {first: 0.9e-3}}, 0),
                            ({"send_call": {first: 1.5e-3}}, 1), ({"recv_call": {first: 1.5e-3}}, 1)):
        model, (result, ran) = _one_step(s, costs, hw, **changed)
        assert drawn_stalls(s, model, result, ran) == stalls, changed


def test_a_step_replayed_with_its_own_times_has_the_steps_stalls():
    """Ten steps of PyTorch's interleaved 1F1B at 1-ms actions, each replayed with its own computations, dispatch and
    message times (tests/test_call_overhead.py): the run's stalls are the step's in 8 of 10 steps and never more
    than one apart (5-11 per step). Counting every message the trace has instead of those the runtime waited for
    (whose completion is the arrival; the others' is an upper bound) gives up to four more per step: that is the bug
    this guards against."""
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.message_draws import message_distributions

    ing = _ingested_interleaved()
    schedule = ing.schedule
    dist = message_distributions(ing.messages, results=ing.steps, schedule=schedule, spans=ing.comm_spans,
                                 overhead=ing.call_overhead)
    rt = calibrate_runtime(ing.runs(), ing.calibration.costs, ing.calibration.hardware, "torch", draws=dist)
    ids = [(a.stage, a.kind.value, a.mb) for a in map(schedule.action_of, schedule.compiled.flat.keys.tolist())]
    measured, replayed, unfiltered = [], [], []
    for k, step in sorted(ing.steps.items()):
        rows = step.timeline[step.timeline["src"] < 0]
        took = {(int(st), str(op), int(mb)): b - a for st, op, mb, a, b in
                zip(rows["stage"], rows["op"].astype(str), rows["microbatch"], rows["start"], rows["end"])}
        costs = rt.costs.with_dispatch(dist.by_step[k].dispatch) if dist.by_step[k].dispatch else rt.costs
        model = ing.message_model([k])
        result, ran = predict_with_messages(schedule, costs, rt.hardware, "torch", model,
                                            durations=np.array([took.get(i, np.nan) for i in ids]),
                                            microbatch_size=64)
        measured.append(step_stalls(ing.messages[k], step))
        replayed.append(drawn_stalls(schedule, model, result, ran))
        # the bug put back: every message as if the runtime had waited for it
        every = {key: MessageTimes(m.send_call, m.recv_call, m.complete, wait_start=-1.0)
                 for key, m in ing.messages[k].items()}
        unfiltered.append(step_stalls(every, step))
    measured, replayed, unfiltered = map(np.array, (measured, replayed, unfiltered))
    assert measured.min() >= 3 and np.sum(measured == replayed) >= 8
    assert np.abs(measured - replayed).max() <= 1
    assert np.abs(unfiltered - replayed).max() >= 3
