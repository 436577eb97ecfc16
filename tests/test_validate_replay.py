"""Replay: the prediction with each timed run's own action times separates a machine that moved from a model
that missed. Synthetic runs made from the simulator's own timeline, so every figure is exact."""

import pytest

pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.model.cost import COLUMNS, uniform  # noqa: E402
from sim.model.hardware import Hardware  # noqa: E402
from sim.core.ir import Action, ActionKind  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.results.timeline import compute_rows  # noqa: E402
from validate.run import build_report  # noqa: E402
from validate.predict.replay import replayed_makespans  # noqa: E402
from validate.compare.report import format_markdown  # noqa: E402
from validate.request import RankResult, StageCalibration, WorkloadSpec  # noqa: E402
from validate.rank.tracing import RankTrace  # noqa: E402

COSTS = uniform(3, forward=1.0, backward=2.0, send_bytes=8.0)
FREE = Hardware(devices=3)  # zero latency, infinite bandwidth: makespans are sums of action times


def _rows(sched, timeline, *, scale=1.0, stall_after=None, stall=0.0):
    """Per device, (key, start, end) of every action of *timeline*, times scaled; from *stall_after* on,
    every action on every device starts *stall* later (an unmodeled pause: durations unchanged)."""
    rows = {d: [] for d in range(sched.devices)}
    for r in compute_rows(timeline).itertuples():
        key = sched.key(Action(r.stage, ActionKind(r.op), r.microbatch))
        shift = stall if stall_after is not None and r.start >= stall_after else 0.0
        rows[r.device].append((key, r.start * scale + shift, r.end * scale + shift))
    return rows


def test_a_run_that_took_the_predicted_times_replays_the_prediction():
    sched = schedules.one_f_one_b(3, 4)
    predicted = simulate(sched, COSTS, FREE)
    rows = _rows(sched, predicted.timeline)
    flat = [row for d in rows.values() for row in d]
    assert replayed_makespans(sched, COSTS, FREE, [(flat, [])]) == [pytest.approx(predicted.metrics.makespan)]
    twice = [row for d in _rows(sched, predicted.timeline, scale=2.0).values() for row in d]
    assert replayed_makespans(sched, COSTS, FREE, [(twice, [])]) == [pytest.approx(2 * predicted.metrics.makespan)]


def test_measured_overhead_is_replayed_only_when_the_prediction_has_it():
    sched = schedules.gpipe(3, 2)
    predicted = simulate(sched, COSTS, FREE)
    flat = [row for d in _rows(sched, predicted.timeline).values() for row in d]
    extra = [(k, 0.5) for k, _, _ in flat]
    base = predicted.metrics.makespan
    assert replayed_makespans(sched, COSTS, FREE, [(flat, extra)], add_overhead=False) == [pytest.approx(base)]
    assert replayed_makespans(sched, COSTS, FREE, [(flat, extra)])[0] > base + 1.0  # several on the critical path


def _report(sched, rows, repeats=3):
    costs = uniform(sched.stages, forward=1.0, backward=2.0, send_bytes=8.0)
    per_stage = {c: getattr(costs, c)[0] for c in COLUMNS}
    ranks = []
    for d in range(sched.devices):
        cal = StageCalibration(before={d: dict(per_stage)}, after={d: dict(per_stage)}, in_schedule={}, ping=None,
                               overhead=0.0)
        ranks.append(RankResult(rank=d, traces=[RankTrace(rank=d, compute=list(rows[d])) for _ in range(repeats)],
                                calibration=cal))
    return build_report(sched, WorkloadSpec(name="emulated"), "gloo", ranks, given_costs=costs, hardware=None,
                        output_dir=None)


def test_a_slower_machine_is_noise_and_an_unmodeled_stall_is_not():
    sched = schedules.one_f_one_b(3, 4)
    predicted = simulate(sched, COSTS, FREE)
    slow = _report(sched, _rows(sched, predicted.timeline, scale=1.3))
    assert slow.makespan_error == pytest.approx(0.3)
    assert slow.noise_parts["replay"] == pytest.approx(0.3) and slow.noise_parts["model_miss"] == pytest.approx(0.0)
    assert not slow.significant  # every action took 30% longer: the runs' own times explain all of it
    half = predicted.metrics.makespan / 2
    stalled = _report(sched, _rows(sched, predicted.timeline, stall_after=half, stall=0.2 * predicted.metrics.makespan))
    assert stalled.makespan_error == pytest.approx(0.2)
    assert stalled.noise_parts["replay"] == pytest.approx(0.0, abs=1e-12)  # the same action times
    assert stalled.noise_parts["model_miss"] == pytest.approx(0.2)
    assert stalled.significant  # 20% the model does not have: a real error
    assert "model itself misses +20.0%" in format_markdown(stalled, None)
