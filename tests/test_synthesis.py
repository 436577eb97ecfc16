"""Schedule synthesis (sim.synthesize, pipesim synthesize): every result valid and under its cap, the lower
bound a true bound, the zero-bubble schedules' makespans found by the search itself, the checks that guard
against a bad result shown to fire, and the command line's outputs and errors.

The ILP's tests are in tests/test_synthesis_ilp.py (they skip without PuLP).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim import schedules
from sim.cli import main
from sim.core.ir import OP_F, ScheduleError, key_kind
from sim.io.schedule_io import read_schedule_file
from sim.model.cost import StageCosts, uniform
from sim.model.hardware import Hardware
from sim.search import synthesis
from sim.search.synthesis import evaluate_order, schedule_of, synthesize
from sim.search.synthesis_compare import best_fitting, compare_registered, gain
from sim.search.synthesis_greedy import POLICIES, greedy_order
from sim.search.synthesis_problem import (SynthesisError, device_costs_to_stages, lower_bound, make_problem,
                                          v_placement)


def _peaks_fit(found) -> bool:
    return all(p <= c * (1 + 1e-9) for p, c in zip(found.result.memory.peak, found.problem.cap))


# ------------------------------------------------------------------ every result runs, once each, under its cap
@st.composite
def problems(draw):
    K = draw(st.integers(2, 4))
    M = draw(st.integers(1, 6))
    placement = draw(st.sampled_from(["linear", "v"]))
    S = K if placement == "linear" else 2 * K
    cost = st.floats(0.1, 3.0)
    acts = draw(st.lists(st.floats(0.5, 4.0), min_size=S, max_size=S))
    kept = draw(st.sampled_from([None, 0.0, 0.4]))  # what W keeps after B (the zero-bubble paper's M_W / M_B)
    costs = StageCosts(forward=draw(st.lists(cost, min_size=S, max_size=S)),
                       backward=draw(st.lists(cost, min_size=S, max_size=S)),
                       weight=draw(st.lists(st.floats(0.0, 2.0), min_size=S, max_size=S)),
                       activation_bytes=acts, send_bytes=1.0,
                       weight_activation_bytes=None if kept is None else [a * kept for a in acts])
    latency = draw(st.sampled_from([0.0, 0.05, 0.5]))
    limit = draw(st.floats(1.0, 2.5 * K))
    recompute = draw(st.booleans()) if placement == "linear" else False
    return K, M, placement, costs, Hardware(devices=K, latency=latency), limit, recompute


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_result_is_valid_complete_under_its_cap_and_above_the_bound(problem):
    K, M, placement, costs, hardware, limit, recompute = problem
    found = synthesize(costs, hardware, microbatches=M, placement=placement, memory_limit=limit,
                       recompute=recompute, method="local", max_evals=60, seconds=2.0)
    s = found.schedule.validate()  # no deadlock, every action once, on its stage's device
    assert {s.action_of(int(k)) for k in s.keys_array} == s.expected_actions() and len(s) == len(s.expected_actions())
    assert _peaks_fit(found), (found.result.memory.peak, found.problem.cap)
    assert found.makespan >= found.bound * (1 - 1e-9)  # the bound holds for what the search found
    again = sim.simulate(s, found.problem.memory_costs(costs), hardware)  # the result is the exact engine's
    assert again.metrics.makespan == found.makespan


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 5), st.integers(1, 8), st.lists(st.floats(0.1, 3.0), min_size=15, max_size=15),
       st.sampled_from([0.0, 0.1, 1.0]))
def test_the_bound_is_below_every_registered_schedule(K, M, values, latency):
    """Any schedule of the problem, the hand-written ones included, takes at least the bound."""
    costs = StageCosts(forward=values[:K], backward=values[5:5 + K], weight=values[10:10 + K], send_bytes=1.0)
    hardware = Hardware(devices=K, latency=latency)
    bound = lower_bound(make_problem(costs, hardware, microbatches=M))
    for name in ("1f1b", "gpipe", "zb-h1", "zb-h2", "naive"):
        r = sim.simulate(schedules.generate(name, K, M), costs, hardware)
        assert r.metrics.makespan >= bound * (1 - 1e-12), name
    v = v_placement(K)
    bound_v = lower_bound(make_problem(device_costs_to_stages(costs, v), hardware, microbatches=M, placement="v"))
    r = sim.simulate(schedules.zbv(K, max(M, 1)), device_costs_to_stages(costs, v), hardware)
    assert r.metrics.makespan >= bound_v * (1 - 1e-12)


@settings(max_examples=20, deadline=None)
@given(problems())
def test_greedy_orders_never_go_over_the_cap(problem):
    """The greedy's own memory count (in execution order) agrees with the memory model: no policy's order is over
    the cap when the exact engine runs it (a V reserves its later stage's memory, so none deadlocks either)."""
    K, M, placement, costs, hardware, limit, recompute = problem
    p = make_problem(costs, hardware, microbatches=M, placement=placement, memory_limit=limit, recompute=recompute)
    for policy in POLICIES[::5]:
        order = greedy_order(p, policy)
        assert evaluate_order(order, p, costs, hardware) is not None, policy


# ------------------------------------------------------------------ the zero-bubble paper's shapes, found
@pytest.mark.parametrize("K,M", [(4, 8), (4, 12), (6, 12)])
def test_finds_zb_h1_under_1f1b_memory_and_zb_h2_under_twice_that(K, M):
    """F = B = W: under 1F1B's activation memory (K micro-batches) the search meets ZB-H1's makespan; under 2K
    ZB-H2's, which is the bound (Qi et al., ICLR 2024, section 3.1: zero bubble in each device's span)."""
    costs = uniform(K, forward=1.0, backward=1.0, weight=1.0)
    hw = Hardware(devices=K)
    h1 = sim.simulate(schedules.zb_h1(K, M), costs, hw).metrics
    h2 = sim.simulate(schedules.zb_h2(K, M), costs, hw).metrics
    one = synthesize(costs, hw, microbatches=M, memory_limit=K, method="greedy")
    two = synthesize(costs, hw, microbatches=M, memory_limit=2 * K, method="greedy")
    assert one.makespan <= h1.makespan + 1e-9 and max(one.result.metrics.peak_inflight) <= K
    assert two.makespan <= h2.makespan + 1e-9 and two.optimal and two.gap == pytest.approx(0, abs=1e-12)
    assert two.result.metrics.bubble_rate_zb == pytest.approx(0, abs=1e-9)


def test_uneven_stages_under_a_cap_between_1f1b_and_zb_h2_beat_every_registered_schedule_that_fits():
    """First stage 1.5x, last 2x the others, activations in proportion, a byte cap above 1F1B's and below ZB-H2's
    peak: every zero-bubble schedule is over it, and the synthesized schedule (V placement) beats 1F1B."""
    K, M = 6, 12
    scale = [1.5] + [1.0] * (K - 2) + [2.0]
    costs = StageCosts(forward=scale, backward=scale, weight=scale, activation_bytes=scale, send_bytes=1.0)
    hw = Hardware(devices=K, latency=0.02)
    found = synthesize(costs, hw, microbatches=M, memory_bytes=1.5 * K, placement="any", method="local",
                       seconds=5.0)
    rivals = compare_registered(found, costs, hw)
    best = best_fitting(rivals)
    assert best is not None and found.makespan < best.makespan
    assert all(not r.fits for r in rivals if r.name.startswith("zb"))
    g = gain(found, best)
    assert g.seconds == pytest.approx(best.makespan - found.makespan) and "shorter than" in g.line()


def test_an_unsplit_backward_is_compared_with_unsplit_schedules_only():
    """--no-split (a runtime without the B/W split): the search runs each backward as one action, and only the
    schedules that do the same are its rivals."""
    costs = uniform(3, forward=1.0, backward=1.0, weight=1.0)
    hw = Hardware(devices=3)
    found = synthesize(costs, hw, microbatches=6, split=False, memory_limit=3, method="greedy")
    assert not found.schedule.split_backward
    rivals = compare_registered(found, costs, hw)
    assert {r.name for r in rivals} <= {"naive", "gpipe", "1f1b", "interleaved-1f1b"} and rivals
    assert found.makespan <= best_fitting(rivals).makespan + 1e-9
    assert "fits the cap" in gain(found, best_fitting(rivals)).line()


def test_local_search_reports_the_exact_score_of_what_it_returns_and_never_worsens():
    costs = StageCosts(forward=[1.5, 0.7, 1.2, 2.0], backward=[1.0, 1.6, 0.9, 1.8], weight=[0.4, 1.1, 0.6, 0.9])
    hw = Hardware(devices=4, latency=0.05)
    p = make_problem(costs, hw, microbatches=8, memory_limit=3)
    order = greedy_order(p, POLICIES[0])
    start = evaluate_order(order, p, costs, hw)
    best, score, evals = synthesis.improve(order, start, lambda o: evaluate_order(o, p, costs, hw), stages=p.stages,
                                           max_evals=300, seconds=30)
    assert score <= start and evals == 300  # the budget in evaluations is what stopped it
    assert evaluate_order(best, p, costs, hw) == score


# ------------------------------------------------------------------ the checks, shown to fire
def _tiny():
    costs = uniform(3, forward=1.0, backward=1.0, weight=1.0)
    hw = Hardware(devices=3)
    return costs, hw, make_problem(costs, hw, microbatches=4, memory_limit=2)


def test_evaluate_rejects_deadlocks_and_orders_over_the_cap():
    costs, hw, p = _tiny()
    good = greedy_order(p, POLICIES[0])
    assert evaluate_order(good, p, costs, hw) is not None
    stuck = [list(row) for row in good]
    stuck[0].reverse()  # the first device's backwards before its forwards: a deadlock
    assert evaluate_order(stuck, p, costs, hw) is None
    gpipe_like = [sorted(row, key=lambda k: key_kind(k) != OP_F) for row in good]  # every forward first: 4 > 2
    assert evaluate_order(gpipe_like, p, costs, hw) is None
    no_cap = make_problem(costs, hw, microbatches=4)
    assert evaluate_order(gpipe_like, no_cap, costs, hw) is not None  # the same order is fine without a cap


@pytest.mark.parametrize("bug", ["deadlock", "over the cap"])
def test_the_final_check_catches_a_search_that_returns_a_bad_order(monkeypatch, bug):
    """Inject the bug into the local search (return a bad order as if it were better): the final check refuses it
    before anyone sees a schedule."""
    def broken(order, score, evaluate, **kw):
        if bug == "deadlock":
            bad = [list(reversed(row)) for row in order]
        else:
            bad = [sorted(row, key=lambda k: key_kind(k) != OP_F) for row in order]
        return bad, score, 1

    monkeypatch.setattr(synthesis, "improve", broken)
    costs, hw, _ = _tiny()
    with pytest.raises(ScheduleError if bug == "deadlock" else AssertionError):
        synthesize(costs, hw, microbatches=4, memory_limit=2, method="local")


def test_schedule_of_closes_every_stage_with_one_update():
    costs, hw, p = _tiny()
    s = schedule_of(greedy_order(p, POLICIES[0]), p)
    assert s.updates_per_stage == 1 and [str(s.actions[d][-1]) for d in range(3)] == ["0U0", "1U0", "2U0"]


# ------------------------------------------------------------------ problem set-up
def test_memory_limit_counts_micro_batches_of_activations():
    costs = uniform(4, forward=1.0, backward=1.0, weight=1.0, activation_bytes=10.0, weight_bytes=5.0)
    p = make_problem(costs, Hardware(devices=4), microbatches=8, memory_limit=3)
    assert p.cap == (3 * 10.0 + 5.0,) * 4 and not p.units  # static: the weights
    units = make_problem(uniform(4, forward=1.0, backward=1.0, weight=1.0), Hardware(devices=4), microbatches=8,
                         memory_limit=3)
    assert units.units and units.cap == (3.0,) * 4
    v = make_problem(device_costs_to_stages(uniform(4, forward=1.0, backward=1.0, weight=1.0), v_placement(4)),
                     Hardware(devices=4), microbatches=8, memory_limit=3, placement="v")
    assert v.cap == (3.0,) * 4 and v.activation == (0.5,) * 8  # two stages per device share one unit


def test_device_costs_keep_each_devices_work_on_any_placement():
    rows = StageCosts(forward=[1.5, 1.0, 1.0, 2.0], backward=[3.0, 2.0, 2.0, 4.0], activation_bytes=[3, 2, 2, 4])
    for placement in (v_placement(4), tuple(d % 4 for d in range(8))):
        stages = device_costs_to_stages(rows, placement)
        for d in range(4):
            own = [s for s, dev in enumerate(placement) if dev == d]
            assert sum(stages.forward[s] for s in own) == pytest.approx(rows.forward[d])
            assert sum(stages.activation_bytes[s] for s in own) == pytest.approx(rows.activation_bytes[d])


@pytest.mark.parametrize("kwargs,message", [
    (dict(memory_limit=0.5), "cannot run even one micro-batch"),
    (dict(memory_limit=2, memory_bytes=10), "either in bytes"),
    (dict(placement="w"), "unknown placement"),
    (dict(method="annealing"), "unknown method"),
    (dict(microbatches=0), "positive integer"),
])
def test_bad_requests_are_refused_in_words(kwargs, message):
    costs = uniform(3, forward=1.0, backward=1.0, weight=1.0)
    args = dict(microbatches=4) | kwargs
    with pytest.raises(SynthesisError, match=message):
        synthesize(costs, Hardware(devices=3), **args)


def test_wrong_types_and_sizes_are_refused_before_any_search():
    with pytest.raises(TypeError, match="costs must be a StageCosts"):
        synthesize(None, Hardware(devices=2), microbatches=4)
    with pytest.raises(SynthesisError, match="more than the synthesis searches"):
        synthesize(uniform(64, forward=1.0, backward=1.0, weight=1.0), Hardware(devices=64), microbatches=4096)


def test_a_checkpointed_forward_leaves_room_for_its_own_recompute():
    """Found by hypothesis: W keeping 40% after B (M_W < M_B) let device 0 (cap 2, activations 2, checkpoint 1)
    keep F1's checkpoint after B0, and then R1 (2 more) could never fit beside it: every policy got stuck."""
    acts = [2.0, 1.0, 1.0, 1.0]
    costs = StageCosts(forward=[1.0] * 4, backward=[1.0] * 4, weight=[0.0] * 4, activation_bytes=acts,
                       send_bytes=1.0, weight_activation_bytes=[a * 0.4 for a in acts])
    hw = Hardware(devices=4)
    p = make_problem(costs, hw, microbatches=2, memory_limit=1.0, recompute=True)
    for policy in POLICIES:
        assert evaluate_order(greedy_order(p, policy), p, costs, hw) is not None, policy


def test_recompute_lets_a_cap_below_one_micro_batch_of_activations_run():
    costs = uniform(3, forward=1.0, backward=1.0, weight=1.0, activation_bytes=10.0, send_bytes=1.0)
    hw = Hardware(devices=3)
    with pytest.raises(SynthesisError, match="allow recompute"):
        synthesize(costs, hw, microbatches=4, memory_bytes=8.0)
    found = synthesize(costs, hw, microbatches=4, memory_bytes=12.0, recompute=True, method="greedy")
    assert found.schedule.recomputed and _peaks_fit(found)


# ------------------------------------------------------------------ the command line
def test_cli_prints_bound_rivals_gain_and_writes_files(tmp_path, capsys):
    csv, png = tmp_path / "mine.csv", tmp_path / "mine.png"
    code = main(["synthesize", "-K", "4", "-M", "8", "--weight", "1", "--backward", "1", "--memory-limit", "4",
                 "--method", "local", "--seconds", "2", "-o", str(csv), "--gantt", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "lower bound" in out and "zb-h1" in out and "gain:" in out and "over the cap" in out
    back = read_schedule_file(csv)  # PyTorch's CSV, read back: the same orders without the updates
    assert back.devices == 4 and back.microbatches == 8 and len(back) == 4 * 8 * 3 + 4
    assert png.stat().st_size > 10_000


def test_cli_json(capsys):
    assert main(["synthesize", "-K", "3", "-M", "6", "--weight", "0.5", "--memory-limit", "3", "--method", "greedy",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["makespan"] >= out["bound"] and out["cap_units"] == "microbatches"
    assert {r["name"] for r in out["registered"]} >= {"1f1b", "zb-h1", "zb-h2"}
    assert out["gain"]["rival"] in {r["name"] for r in out["registered"] if r["fits"]}
    assert out["schedule"]["devices"] == 3


@pytest.mark.parametrize("argv,message", [
    (["--memory-limit", "0.5", "--weight", "1"], "cannot run even one micro-batch"),
    (["--weight-bytes", "100", "--memory-capacity", "50"], "before any activation"),
    (["--memory-limit", "2", "--memory-capacity", "1e9"], "either as --memory-limit"),
    (["-o", "x.xlsx"], "use a .csv, .json or .txt"),
    (["--method", "ilp", "--placement", "v", "--weight", "1"], "linear placement"),
    (["--forward", "0", "--backward", "0"], "every computation takes 0 s"),
    (["--gantt", "/no/such/folder/g.png"], "does not exist"),
    (["--weight-memory", "1.5"], "not a fraction between 0 and 1"),
    (["--objective", "span", "--method", "ilp", "--weight", "1"], "minimises the makespan"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    pytest.importorskip("pulp") if "ilp" in argv else None
    assert main(["synthesize", "-K", "3", "-M", "4"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and message in err and err.count("\n") == 1


def test_a_loss_to_a_rival_of_another_placement_says_so_and_names_the_option():
    from sim.search.synthesis_compare import Gain
    lost = Gain("zbv", -1.5, -0.059, {"warm-up": [0.0]}, True, placement_searched=False)
    assert lost.line().startswith("none: 1.5 s (5.9%) longer than zbv") and "--placement any" in lost.line()
    assert "--placement" not in Gain("zbv", -1.5, -0.059, {}, True, placement_searched=True).line()


# ------------------------------------------------------------------ the objective
def test_the_span_objective_puts_the_longest_device_span_first():
    """The zero-bubble paper's cost (the longest device's first start to last end): under twice 1F1B's memory with
    W keeping 40% the search reaches a zero bubble rate; the score orders span before makespan (a makespan-first
    score would prefer the shorter makespan)."""
    from sim.search.synthesis_local import Score

    assert Score(10.0, 9.0, 0.0, True) < Score(9.0, 9.5, 0.0, True)
    assert not Score(10.0, 9.0, 0.0) < Score(9.0, 9.5, 0.0)
    costs = uniform(4, forward=1.0, backward=1.0, weight=1.0)
    found = synthesize(costs, Hardware(devices=4), microbatches=8, memory_limit=8, method="local", seconds=1,
                       objective="span", weight_memory=0.4)
    assert found.result.metrics.bubble_rate_zb == pytest.approx(0.0, abs=1e-9)
    assert found.longest_span == pytest.approx(8 * 3.0)
    with pytest.raises(SynthesisError, match="unknown objective"):
        synthesize(costs, Hardware(devices=4), microbatches=8, objective="fast")
    with pytest.raises(SynthesisError, match="minimises the makespan"):
        synthesize(costs, Hardware(devices=4), microbatches=8, objective="span", method="ilp")
