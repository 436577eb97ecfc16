"""The rolling one-step-ahead prediction (validate.predict.prediction): each timed run is predicted from the run before
it, never from itself. Synthetic runs made from the simulator's own timeline, every action scaled by a known
factor per run, on free links: every prediction and error has a closed form."""

import math

import numpy as np
import pytest

pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.model.cost import COLUMNS, load_costs, uniform  # noqa: E402
from sim.model.hardware import Hardware, load_hardware  # noqa: E402
from sim.core.ir import Action, ActionKind  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.results.timeline import compute_rows  # noqa: E402
from validate.predict import prediction  # noqa: E402
from validate.predict.calibrate import in_schedule_costs, in_schedule_overhead  # noqa: E402
from validate.run import build_report  # noqa: E402
from validate.compare.report import format_markdown, format_summary  # noqa: E402
from validate.request import RankResult, StageCalibration, WorkloadSpec  # noqa: E402
from validate.rank.tracing import RankTrace  # noqa: E402

COSTS = uniform(2, forward=1.0, backward=2.0, send_bytes=8.0)
FREE = Hardware(devices=2)  # zero latency, infinite bandwidth: a makespan scales with the action times
SPEC = WorkloadSpec(name="mlp", width=8, depth=1, batch=2)


def _rows(sched, scale, overhead=0.0):
    """Per device: (compute rows, overhead rows) of a run whose every action took *scale* x its cost in COSTS."""
    base = simulate(sched, COSTS, FREE)
    rows = {d: ([], []) for d in range(sched.devices)}
    for r in compute_rows(base.timeline).itertuples():
        key = sched.key(Action(r.stage, ActionKind(r.op), r.microbatch))
        rows[r.device][0].append((key, r.start * scale, r.end * scale))
        rows[r.device][1].append((key, overhead))
    return rows


def _launch(sched, warm_scale, scales, *, overheads=None, edit=None):
    """Rank results of a launch: a warm-up run at *warm_scale*, then one timed run per entry of *scales*
    (*overheads*: executor overhead per action of each timed run; *edit*: (run, scale) to replace that
    run's trace with one at another scale, after the fact)."""
    overheads = overheads or [0.0] * len(scales)
    warm = _rows(sched, warm_scale)
    timed = [_rows(sched, s, o) for s, o in zip(scales, overheads)]
    if edit is not None:
        timed[edit[0]] = _rows(sched, edit[1], overheads[edit[0]])
    iso = {c: getattr(COSTS, c)[0] for c in COLUMNS}
    ranks = []
    for d in range(sched.devices):
        cal = StageCalibration(before={d: dict(iso)}, after={d: dict(iso)}, ping=None, overhead=0.0,
                               in_schedule=in_schedule_costs(sched, warm[d][0]),
                               action_overhead=in_schedule_overhead(sched, warm[d][1]))
        traces = [RankTrace(rank=d, compute=list(t[d][0]), overhead=list(t[d][1])) for t in timed]
        ranks.append(RankResult(rank=d, traces=traces, calibration=cal))
    return ranks


def _report(sched, launch, **options):
    options = {"given_costs": None, "hardware": None, "output_dir": None, "calibration": "schedule"} | options
    return build_report(sched, SPEC, "gloo", launch, **options)


SCHED = schedules.one_f_one_b(2, 4)
P = simulate(SCHED, COSTS, FREE).metrics.makespan


def test_a_step_is_missed_by_the_run_it_happens_in_only():
    # runs 0-2 at the costs, runs 3-4 twice as slow: only run 3 is predicted from a run of the other speed
    report = _report(SCHED, _launch(SCHED, 1.0, [1, 1, 1, 2, 2]))
    assert report.predictions == pytest.approx([P, P, P, P, 2 * P])
    assert list(report.errors) == pytest.approx([0, 0, 0, 1.0, 0])
    assert report.makespan_error == pytest.approx(0.0)
    assert report.makespan_error_from_warmup == pytest.approx(0.0)  # median of 0 0 0 1 1
    assert report.warmup_prediction == pytest.approx(P)
    d = report.to_dict()
    assert d["predicted_makespans"] == pytest.approx([P, P, P, P, 2 * P])
    assert d["calibration_source"] == prediction.ROLLING_SOURCE
    # each run against the costs that predicted it: the step shows in one run of five, the median is 0
    assert report.noise_parts["in_runs"] == pytest.approx(0.0, abs=1e-12)
    assert report.noise_parts["model_miss"] == pytest.approx(0.0, abs=1e-12)
    assert report.noise_parts["replay"] == pytest.approx(0.0, abs=1e-12)  # median of 0 0 0 1 0


def test_a_smooth_drift_is_followed_and_the_warm_up_figure_shows_what_it_would_have_been():
    g = 0.05  # every run 5% slower than the one before, the warm-up run included
    scales = [(1 + g) ** (r + 1) for r in range(5)]
    report = _report(SCHED, _launch(SCHED, 1.0, scales))
    assert list(report.errors) == pytest.approx([g] * 5)  # closed form: each run is (1 + g) x its predictor
    from_warmup = [s - 1 for s in scales]  # (1 + g)^(r + 1) - 1
    assert report.makespan_error_from_warmup == pytest.approx(float(np.median(from_warmup)))
    assert abs(report.makespan_error) < abs(report.makespan_error_from_warmup)
    assert report.noise_parts["in_runs"] == pytest.approx(g)  # each run moved g from the run that predicted it


def test_the_prediction_of_a_run_never_uses_that_runs_own_trace():
    honest = _report(SCHED, _launch(SCHED, 1.0, [1, 1, 1, 1]))
    for run in range(4):
        edited = _report(SCHED, _launch(SCHED, 1.0, [1, 1, 1, 1], edit=(run, 3.0)))
        assert edited.predictions[:run + 1] == pytest.approx(honest.predictions[:run + 1])  # itself and before
        assert edited.errors[run] == pytest.approx(2.0)  # a run 3x as slow as the one that predicted it
        if run + 1 < 4:
            assert edited.predictions[run + 1] == pytest.approx(3 * P)  # the next run is predicted from it


def test_the_out_of_sample_check_catches_a_prediction_from_the_runs_own_trace(monkeypatch):
    # plant the bug: run r predicted from its own trace; the check above must see it
    def leaky(schedule, ranks, *, rolling):
        return [prediction.traced_times(schedule, ranks, r) for r in range(len(ranks[0].traces))]
    monkeypatch.setattr("validate.run.per_run_sources", leaky)
    honest = _report(SCHED, _launch(SCHED, 1.0, [1, 1, 1, 1]))
    edited = _report(SCHED, _launch(SCHED, 1.0, [1, 1, 1, 1], edit=(2, 3.0)))
    assert edited.predictions[2] != pytest.approx(honest.predictions[2])  # what the real check forbids
    assert edited.errors[2] == pytest.approx(0.0)  # and it would have hidden a run 3x as slow


def test_each_run_takes_the_executor_overhead_of_the_run_before_it():
    sched = schedules.gpipe(2, 2)
    report = _report(sched, _launch(sched, 1.0, [1, 1, 1], overheads=[0.0, 0.25, 0.0]))
    with_overhead = uniform(2, forward=1.25, backward=2.25, update=0.25, send_bytes=8.0)
    base = simulate(sched, COSTS, FREE).metrics.makespan
    assert report.predictions == pytest.approx([base, base, simulate(sched, with_overhead, FREE).metrics.makespan])


def test_the_shown_prediction_is_the_median_runs_and_its_files_replay_it(tmp_path):
    scales = [1.0, 1.3, 0.9, 1.1, 1.2]  # measured: median run is run 3 (1.1 P), predicted from run 2 (0.9 P)
    report = _report(SCHED, _launch(SCHED, 1.0, scales), output_dir=tmp_path)
    assert report.median_run == 3 and report.predicted_from == "timed run 3"
    assert report.measured.metrics.makespan == pytest.approx(1.1 * P)
    assert report.predicted.metrics.makespan == pytest.approx(0.9 * P) == report.predictions[3]
    assert report.calibration.costs.forward == pytest.approx((0.9, 0.9))
    # the written costs and hardware reproduce exactly the prediction shown
    replayed = simulate(SCHED, load_costs(report.paths["costs"]), load_hardware(report.paths["hardware"]))
    assert replayed.metrics.makespan == report.predicted.metrics.makespan
    assert report.paths["costs"] in report.replay and report.paths["hardware"] in report.replay
    assert report.to_dict()["predicted_makespan"] == report.predictions[report.median_run]
    text = open(report.paths["report"]).read()
    assert prediction.ROLLING_SOURCE in text and "timed run 4 (shown)" not in text and "| 4 (shown) |" in text
    assert "every run predicted from the last warm-up run instead: error" in format_summary(report)
    assert "the run shown (timed run 4) from timed run 3" in format_markdown(report, None)


def test_given_costs_and_isolated_calibration_keep_one_prediction_for_every_run():
    launch = _launch(SCHED, 1.0, [1, 2, 1])
    for report in (_report(SCHED, launch, given_costs=COSTS), _report(SCHED, launch, calibration="isolated")):
        assert report.predictions == pytest.approx([P] * 3)
        assert list(report.errors) == pytest.approx([0, 1, 0])
        assert report.makespan_error_from_warmup is None and report.to_dict()["makespan_error_from_warmup"] is None
        assert report.calibration_source == prediction.FIXED_SOURCE and report.predicted_from == ""
        assert "from the last warm-up run instead" not in format_summary(report)


def test_one_timed_run_is_predicted_from_the_warm_up_run():
    report = _report(SCHED, _launch(SCHED, 2.0, [1.0]))
    assert report.predictions == pytest.approx([2 * P])
    assert report.makespan_error == pytest.approx(-0.5) == report.makespan_error_from_warmup
    assert report.predicted_from == "warm-up run"
    assert math.isfinite(report.noise)


def test_every_registered_schedule_is_predicted_run_by_run_on_real_ranks(monkeypatch):
    """mlp, K=2, M=4, 3 timed runs of every registered schedule in one launch: splits (zb, zbv, DualPipeV),
    interleaving, PipeDream windows, 2BW; plus GPipe with recompute and 1F1B over two iterations; about 9 s. Every op of every stage is traced in each timed run, so
    the run after it has a complete calibration."""
    import validate.run as comparison
    from sim.schedules import registry as generators
    from validate import run_validations
    seen = []
    real = comparison.build_report

    def keep(sched, spec, backend, ranks, **options):  # the raw rank results, to check what predicted each run
        seen.append((sched, ranks))
        return real(sched, spec, backend, ranks, **options)
    monkeypatch.setattr(comparison, "build_report", keep)
    names = list(generators.names())
    extra = [schedules.gpipe(2, 4, recompute=True), schedules.one_f_one_b(2, 4, iterations=2)]  # R; two flushes
    reports = run_validations(names + extra, 2, 4, workload="mlp", output_dir=None, timeout=300, repeats=3,
                              workload_options={"width": 16, "depth": 1, "batch": 4})
    assert [r.predicted.schedule.name for r in reports] == names + [s.name for s in extra]
    assert len(seen) == len(reports)
    for report, (sched, ranks) in zip(reports, seen):
        name = f"{sched.name} I={sched.iterations}"
        assert report.predicted.schedule is sched
        assert len(report.predictions) == 3 and all(0 < p < math.inf for p in report.predictions), name
        assert report.predictions[0] == report.warmup_prediction, name
        assert report.predicted.metrics.makespan == report.predictions[report.median_run], name
        assert np.isfinite(report.errors).all() and report.makespan_error_from_warmup is not None, name
        ops = {a.kind.value if a.kind.value != "B" or (a.stage, a.mb) in sched.split_backward else "B_full"
               for acts in sched.actions.values() for a in acts}
        for run in (1, 2):  # run r's prediction: every stage and op of the schedule, traced in run r - 1
            traced = prediction.traced_times(sched, ranks, run - 1)
            assert set(traced.stage_times) == set(range(sched.stages)), name
            assert set().union(*(set(v) for v in traced.stage_times.values())) == ops, name
        assert len(set(report.predictions)) == 3, name  # three different samples: rolling, not one calibration
        assert report.gradients_match is True, name


def test_drift_and_replay_take_one_set_of_costs_per_run():
    from validate.run import calibration_drift
    from validate.errors import ValidationError
    from validate.predict.replay import replayed_makespans
    runs = [[row for d in _rows(SCHED, s).values() for row in d[0]] for s in (1.0, 1.5)]
    slower = uniform(2, forward=1.5, backward=3.0, send_bytes=8.0)
    assert calibration_drift(SCHED, COSTS, runs) == pytest.approx(math.sqrt(1.5) - 1)  # median of log 1, log 1.5
    assert calibration_drift(SCHED, [COSTS, slower], runs) == pytest.approx(0.0)  # each run against its own costs
    with pytest.raises(ValidationError, match="one per run"):
        calibration_drift(SCHED, [COSTS], runs)
    pairs = [(r, []) for r in runs]
    assert replayed_makespans(SCHED, [COSTS, slower], FREE, pairs) == pytest.approx([P, 1.5 * P])
    with pytest.raises(ValidationError, match="one per run"):
        replayed_makespans(SCHED, [COSTS] * 3, FREE, pairs)
