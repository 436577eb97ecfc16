"""The report path without processes: an in-process run, fake calibration, then build_report writes every file."""

import json

import pytest

torch = pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.model.cost import COLUMNS, load_costs  # noqa: E402
from sim.model.hardware import load_hardware  # noqa: E402
from sim.io.trace import check_trace  # noqa: E402
from validate.predict.calibrate import fit_link  # noqa: E402
from validate.rank.measure import executor_overhead  # noqa: E402
from validate.run import action_errors, build_report  # noqa: E402
from validate.rank.inprocess import run_in_process  # noqa: E402
from validate.request import StageCalibration  # noqa: E402
from validate.rank.workloads import WorkloadSpec  # noqa: E402

SPEC = WorkloadSpec(name="mlp", width=8, depth=1, batch=2)


def _fake_launch(sched, *, after_scale=1.0):
    result = run_in_process(sched, SPEC)
    assert not result["errors"]
    for r in result["ranks"]:
        stage_costs = {c: 0.0 for c in COLUMNS}
        stage_costs.update(forward=1e-3, backward=2e-3, send_bytes=64.0)
        later = dict(stage_costs, forward=1e-3 * after_scale)
        r.calibration = StageCalibration(before={s: dict(stage_costs) for s in r.grads},
                                         after={s: dict(later) for s in r.grads}, in_schedule={},
                                         ping=[1e-5, 2e-5, 3e-5, 4e-5, 5e-5] if r.rank == 0 else None, overhead=1e-5)
    return result["ranks"]


def test_report_files_are_complete_and_readable(tmp_path):
    sched = schedules.one_f_one_b(2, 3)
    report = build_report(sched, SPEC, "gloo", _fake_launch(sched), given_costs=None, hardware=None,
                          output_dir=tmp_path, calibration="isolated")
    assert report.gradients_match is True
    assert set(report.paths) == {"report", "figure", "costs", "hardware", "trace", "html"}  # html: issue 24
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.split("/")[-1] for p in report.paths.values())  # nothing temporary left
    costs = load_costs(report.paths["costs"])
    assert costs.forward[0] == pytest.approx(1e-3 + 1e-5)  # measured + executor overhead
    hw = load_hardware(report.paths["hardware"])
    assert hw.latency[0][1] >= 0
    trace = json.loads(open(report.paths["trace"]).read())
    check_trace(trace)
    text = open(report.paths["report"]).read()
    assert "| makespan (ms) |" in text and "## Calibration used" in text
    page = open(report.paths["html"]).read()  # the interactive page beside the PNG (tests/test_pages*.py test it)
    assert page.startswith("<!DOCTYPE html>") and "<h1>validate 1f1b: K=2 M=3" in page
    d = report.to_dict()
    assert d["predicted_makespan"] > 0 and abs(d["makespan_error"]) < float("inf")
    json.dumps(d, default=str)


def test_action_errors_are_zero_for_identical_timelines_and_see_a_shift():
    sched = schedules.gpipe(2, 2)
    report = build_report(sched, SPEC, "gloo", _fake_launch(sched), given_costs=None, hardware=None, output_dir=None,
                          calibration="isolated")
    tl = report.predicted.timeline
    assert action_errors(tl, tl) == ((0.0, 0.0), (0.0, 0.0))
    shifted = tl.assign(start=tl["start"] + 0.5, end=tl["end"] + 0.5)
    (med, worst), _ = action_errors(tl, shifted)
    assert med == pytest.approx(0.5) and worst == pytest.approx(0.5)


def test_link_fit_recovers_latency_and_bandwidth():
    sizes = [4, 1 << 14, 1 << 18, 1 << 20, 1 << 22]
    latency, bandwidth = fit_link([(n, 2e-5 + n / 5e9) for n in sizes])
    assert latency == pytest.approx(2e-5, rel=1e-6) and bandwidth == pytest.approx(5e9, rel=1e-6)


def test_executor_overhead_is_measured_and_small():
    overhead = executor_overhead()
    assert 0 < overhead < 0.05


def test_in_schedule_calibration_takes_the_traced_means():
    from validate.predict.calibrate import assemble, in_schedule_costs
    sched = schedules.gpipe(2, 3)
    key = sched.key
    acts = [a for d in range(2) for a in sched.actions[d]]
    # F takes 1 ms (stage 0) / 3 ms (stage 1), unsplit B takes 4 ms, U 0.5 ms; one slow (preempted) F
    dur = {"F": lambda s: 1e-3 if s == 0 else 3e-3, "B": lambda s: 4e-3, "U": lambda s: 5e-4}
    compute = [(key(a), 10.0, 10.0 + dur[a.kind.value](a.stage)) for a in acts]
    compute.append((key(acts[0]), 0.0, 5e-3))  # a fourth F sample on stage 0: 1 1 1 5 ms
    ctx = in_schedule_costs(sched, compute)
    # the mean (2 ms), not the median (1 ms): the makespan is a sum, and the slow F was on its path
    assert ctx[0]["F"] == pytest.approx(2e-3) and ctx[1]["F"] == pytest.approx(3e-3)
    assert ctx[0]["B_full"] == pytest.approx(4e-3) and "B" not in ctx[0]
    many = [(key(acts[0]), 0.0, 1e-3)] * 18 + [(key(acts[0]), 0.0, 1.0)] * 2  # 20 samples: a tenth cut each end
    assert in_schedule_costs(sched, many)[0]["F"] == pytest.approx(1e-3)
    iso = {c: 0.0 for c in COLUMNS}
    iso.update(forward=9.0, backward=3.0, weight=1.0, send_bytes=8.0)
    cal = assemble({0: dict(iso), 1: dict(iso)}, devices=2, ping=None, overhead=0.5, emulated=False, in_schedule=ctx,
                   add_overhead=False)
    c = cal.costs
    assert c.forward == pytest.approx((2e-3, 3e-3))  # in-schedule means (no overhead: add_overhead=False)
    assert c.backward[0] + c.weight[0] == pytest.approx(4e-3)  # unsplit B = B + W, in the isolated 3:1 share
    assert c.backward[0] == pytest.approx(3e-3)
    assert c.send_bytes == (8.0, 8.0)  # sizes from the isolated measurement
    assert not cal.overhead_included
    alone = assemble({0: dict(iso), 1: dict(iso)}, devices=2, ping=None, overhead=0.5, emulated=False)
    assert alone.costs.forward == (9.5, 9.5) and alone.overhead_included  # the zero-cost fallback, every column


def test_a_stage_with_whole_and_split_backwards_pools_them_into_b_plus_w():
    """DualPipeV runs whole backwards in its pairs and B and W apart near the end: both are estimates of one
    backward's time, and the model costs a whole one B + W, so they are pooled by their numbers of samples and B
    and W keep the split ones' share. Taken apart (before), stage 1's B + W came from one micro-batch while three
    whole backwards said otherwise."""
    from validate.predict.calibrate import assemble, in_schedule_costs
    sched = schedules.generate("dualpipev", 2, 4)
    split = sched.split_backward
    key = sched.key
    acts = [a for d in range(2) for a in sched.actions[d]]
    # every whole backward 50 ms, every split one B 20 + W 40 = 60 ms, on every stage
    dur = {"F": 0.02, "B_full": 0.05, "B": 0.02, "W": 0.04, "U": 0.001}
    compute = [(key(a), 0.0, dur["B_full" if a.kind.value == "B" and (a.stage, a.mb) not in split
                                  else a.kind.value]) for a in acts]
    ctx = in_schedule_costs(sched, compute)
    for s in range(sched.stages):
        whole = sum(1 for a in acts if a.stage == s and a.kind.value == "B" and (a.stage, a.mb) not in split)
        halves = sum(1 for a in acts if a.stage == s and a.kind.value == "W")
        assert whole and halves  # every stage of DualPipeV runs both kinds
        total = (whole * 0.05 + halves * 0.06) / (whole + halves)
        assert ctx[s]["B"] + ctx[s]["W"] == pytest.approx(total) and ctx[s]["B_full"] == pytest.approx(total)
        assert ctx[s]["B"] / ctx[s]["W"] == pytest.approx(0.5)
    iso = {c: 0.0 for c in COLUMNS}
    iso.update(forward=1.0, backward=1.0, weight=1.0)
    c = assemble({s: dict(iso) for s in range(4)}, devices=2, ping=None, overhead=0.0, emulated=False,
                 in_schedule=ctx, add_overhead=False).costs
    assert [b + w for b, w in zip(c.backward, c.weight)] == pytest.approx([ctx[s]["B_full"] for s in range(4)])


def test_noise_floor_closed_form():
    from validate.run import noise_floor
    flat = noise_floor([2.0] * 5, None, None)
    assert (flat.makespans, flat.stage_costs, flat.noise) == (0.0, 0.0, 0.0)
    runs = [1.0, 1.0, 1.2, 1.0, 0.8]  # p10 0.88, p90 1.12 (linear), median 1
    assert noise_floor(runs, None, None).makespans == pytest.approx(0.12)
    before = {0: {"forward": 1.0, "backward": 2.0, "weight": 0.0}, 1: {"forward": 1.0, "backward": 2.0}}
    after = {0: {"forward": 1.3, "backward": 2.0, "weight": 0.0}, 1: {"forward": 1.0, "backward": 2.0}}
    got = noise_floor([1.0], before, after)
    assert got.stage_costs == pytest.approx(3.3 / 3.0 - 1) and got.noise == got.stage_costs


def test_an_error_inside_the_noise_is_called_not_significant():
    from validate.compare.report import format_summary
    sched = schedules.gpipe(2, 2)
    quiet = build_report(sched, SPEC, "gloo", _fake_launch(sched), given_costs=None, hardware=None, output_dir=None,
                         calibration="isolated")
    noisy = build_report(sched, SPEC, "gloo", _fake_launch(sched, after_scale=1e4), given_costs=None, hardware=None,
                         output_dir=None, calibration="isolated")
    assert quiet.noise_parts["stage_costs"] == 0.0 and quiet.noise_parts["makespans"] == 0.0  # one run, steady costs
    assert noisy.noise > abs(noisy.makespan_error) and not noisy.significant
    assert "not significant (within measurement noise" in format_summary(noisy)
    assert noisy.to_dict()["significant"] is False


def test_the_comparison_of_any_two_results_needs_no_torch_and_writes_every_file(tmp_path):
    # what pipesim ingest and validate --runtime torch report through (validate.ingest.report)
    import subprocess
    import sys

    from sim.model.cost import uniform
    from sim.simulate import simulate
    from validate.compare.results import compare_results
    from validate.compare.report import write_comparison_report
    sched = schedules.one_f_one_b(2, 4)
    a = simulate(sched, uniform(2, forward=1.0, backward=2.0))
    b = simulate(sched, uniform(2, forward=1.1, backward=2.0))
    summary = compare_results(a, b)
    assert summary["makespan_error"] == pytest.approx((b.metrics.makespan - a.metrics.makespan) / a.metrics.makespan)
    assert summary["makespan_error"] > 0 and summary["start_error_worst"] > 0
    assert compare_results(a, a)["start_error_worst"] == 0.0
    paths = write_comparison_report(a, b, folder=tmp_path / "out", stem="x", title="t", summary=summary,
                                    sections=[("S", "body")], costs=a.costs, hardware=a.hardware)
    assert set(paths) == {"report", "figure", "trace", "json", "costs", "hardware", "html"}  # html: issue 24
    assert all(p.exists() for p in paths.values()) and "## S" in paths["report"].read_text()
    code = "import sys, validate.compare.results, validate.compare.report; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0

def test_calibration_drift_closed_form():
    from sim.model.cost import uniform
    from validate.run import calibration_drift
    sched = schedules.gpipe(2, 2)
    costs = uniform(2, forward=1.0, backward=2.0)

    def run(f, b):  # every action of the schedule, F lasting f and B lasting b
        out, t = [], 0.0
        for d in range(2):
            for a in sched.actions[d]:
                dur = {"F": f, "B": b}.get(a.kind.value, 0.0)
                out.append((sched.key(a), t, t + dur))
                t += dur
        return out
    assert calibration_drift(sched, costs, [run(1.0, 2.0)] * 3) == pytest.approx(0.0)
    assert calibration_drift(sched, costs, [run(1.5, 3.0), run(1.5, 3.0), run(1.0, 2.0)]) == pytest.approx(0.5)


def test_calibration_drift_counts_a_partly_split_backward_once():
    """DualPipeV splits the backward of some micro-batches only: B_full and B + W are the same quantity.
    A run at exactly the costs the prediction used has no drift (summing both said 67%)."""
    from sim.model.cost import uniform
    from validate.run import calibration_drift
    sched = schedules.dualpipev(2, 4)
    assert sched.split_backward and any(a.kind.value == "B" and (a.stage, a.mb) not in sched.split_backward
                                        for acts in sched.actions.values() for a in acts)
    costs = uniform(sched.stages, forward=1.0, backward=2.0, weight=0.5)

    def run(scale):  # every action at its cost, times scale: a full backward lasts B + W
        out, t = [], 0.0
        for d in range(sched.devices):
            for a in sched.actions[d]:
                full = a.kind.value == "B" and (a.stage, a.mb) not in sched.split_backward
                dur = scale * {"F": 1.0, "B": 2.5 if full else 2.0, "W": 0.5}.get(a.kind.value, 0.0)
                out.append((sched.key(a), t, t + dur))
                t += dur
        return out
    assert calibration_drift(sched, costs, [run(1.0)] * 2) == pytest.approx(0.0)
    assert calibration_drift(sched, costs, [run(1.2)] * 2) == pytest.approx(0.2)
