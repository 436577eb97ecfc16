"""Monte Carlo on the fast engine (sim.engines.sampling, sim.search.montecarlo): exactness when nothing varies,
reproducibility, every variability source, and the statistics against an independent plain-numpy Monte Carlo."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import sim
from sim.engines import sampling
from sim.engines.fastpath import run_fast
from sim.engines.plan import OverlapFB, make_plan
from sim.engines.sampling import replay_sample, run_samples, topological_order
from sim.engines.variability import Distribution, Pause, Straggler, Variability, VariabilityError
from sim.search.montecarlo import MonteCarloError, monte_carlo


def _plan(name="1f1b", K=4, M=8, *, latency=0.0, bandwidth=math.inf, nbytes=0.0, weight=0.0, overlap=True,
          iterations=1, recompute=False, dispatch=None, overlap_fb=None):
    """A plan of *name*; *dispatch*: the runtime's overhead per action, a number or stage -> {kind: seconds}
    (:meth:`sim.model.cost.StageCosts.with_dispatch`); *overlap_fb*: how long DualPipeV's pairs last."""
    schedule = sim.schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
    costs = sim.uniform(schedule.stages, forward=1.0, backward=2.0, weight=weight, send_bytes=nbytes)
    if dispatch is not None:
        costs = costs.with_dispatch(dispatch)
    hardware = sim.Hardware(devices=K, latency=latency, bandwidth=bandwidth, overlap=overlap)
    return make_plan(schedule, costs, hardware, overlap_fb)


# ---------------------------------------------------------------------------------------------- exactness
def exactness_problems(plan, sampled_plan=None) -> list[str]:
    """How samples of *plan* with nothing varying differ from the fast engine's run of it (none: the same floats).
    *sampled_plan*: the plan the sampling kernel is given instead (a test injects a bug there)."""
    sampled_plan = plan if sampled_plan is None else sampled_plan
    fast = run_fast(plan)
    K = plan.schedule.devices
    arrays = run_samples(sampled_plan, Variability(), samples=3, seed=7)
    problems = []
    if not (arrays.makespan == fast.makespan).all():  # the same floats, not close ones
        problems.append(f"makespan {float(arrays.makespan[0])!r}, the fast engine's {float(fast.makespan)!r}")
    per_device = np.bincount(fast.device, weights=fast.end - fast.start, minlength=K)  # busy: no dispatch overhead
    if not np.allclose(arrays.busy, np.broadcast_to(per_device, (3, K)), rtol=1e-12, atol=1e-12):
        problems.append(f"busy {arrays.busy[0].tolist()}, the fast engine's {per_device.tolist()}")
    start, end, tx_start, tx_end = replay_sample(sampled_plan, Variability(), sample=0, seed=7)
    for name, mine, theirs in (("start", start, fast.start), ("end", end, fast.end),
                               ("transfer start", tx_start, fast.transfer_start),
                               ("transfer end", tx_end, fast.transfer_end)):
        if not np.array_equal(mine, theirs):
            i = int(np.flatnonzero(mine != theirs)[0])
            problems.append(f"{name} of {plan.schedule.action_of(int(plan.flat.keys[i]))}: {float(mine[i])!r}, "
                            f"the fast engine's {float(theirs[i])!r}")
    return problems


_DISPATCH = st.one_of(st.none(), st.sampled_from([0.05, 0.3]),
                      st.fixed_dictionaries({}, optional={k: st.sampled_from([0.0, 0.1, 0.25]) for k in "FBWRU"}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "naive", "zbv", "dualpipev"]),
       K=st.integers(1, 5), M=st.integers(1, 10), latency=st.sampled_from([0.0, 0.05, 0.3]), overlap=st.booleans(),
       weight=st.sampled_from([0.0, 0.5]), iterations=st.integers(1, 2), recompute=st.booleans(), dispatch=_DISPATCH,
       pair=st.sampled_from([None, "1.5", "30%"]))
def test_nothing_varies_gives_the_list_schedulers_floats(name, K, M, latency, overlap, weight, iterations, recompute,
                                                         dispatch, pair):
    """Every path of the runtime model the fast engine has: dispatch overhead (uniform or per kind), blocking
    sends, and DualPipeV's overlapped pairs (whose backward half ends with the pair, issue 27)."""
    try:
        schedule = sim.schedules.generate(name, K, M, iterations=iterations, recompute=recompute)
        per_stage = None if not isinstance(dispatch, dict) else {s: dispatch for s in range(schedule.stages)}
        plan = _plan(name, K, M, latency=latency, nbytes=1e6, bandwidth=1e7, weight=weight, overlap=overlap,
                     iterations=iterations, recompute=recompute, dispatch=per_stage or dispatch,
                     overlap_fb=OverlapFB.parse(pair) if pair else None)
    except sim.PipesimError:  # a shape the schedule refuses (e.g. M < K)
        return
    event(f"pairs: {bool(plan.paired.any())}, overhead: {plan.has_overhead}, blocking sends: {not overlap}")
    assert exactness_problems(plan) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(K=st.integers(1, 4), extra=st.integers(0, 4), latency=st.sampled_from([0.05, 0.5]), overlap=st.booleans(),
       weight=st.sampled_from([0.0, 0.5]), dispatch=_DISPATCH, pair=st.sampled_from([None, "1.5", "30%"]))
def test_dualpipev_pairs_are_exact(K, extra, latency, overlap, weight, dispatch, pair):
    """DualPipeV's overlapped pairs, the shapes the property above rarely draws (M >= 2K), with links."""
    per_stage = None if not isinstance(dispatch, dict) else {s: dispatch for s in range(2 * K)}
    plan = _plan("dualpipev", K, 2 * K + extra, latency=latency, nbytes=1e6, bandwidth=1e7, weight=weight,
                 overlap=overlap, dispatch=per_stage or dispatch, overlap_fb=OverlapFB.parse(pair) if pair else None)
    assert plan.paired.any() or K == 1
    assert exactness_problems(plan) == []


def test_dualpipev_with_blocking_sends_links_and_dispatch_is_exact():
    """The issue-27 case (dualpipev K=2 M=4 --latency 0.5 --no-overlap) with a dispatch overhead: pinned, not left
    to the property's draws."""
    plan = _plan("dualpipev", 2, 4, latency=0.5, overlap=False, dispatch={0: {"F": 0.1, "B": 0.2}, 3: {"W": 0.05}})
    assert plan.has_overhead and plan.paired.any()
    assert exactness_problems(plan) == []


def test_the_exactness_check_sees_a_kernel_that_drops_the_dispatch_overhead():
    """The kernel before issue 27's runtime model read the durations only: its samples were short by the overheads
    (1f1b K=4 M=8 --dispatch 0.1: 33.0 s sampled against 35.3 s simulated)."""
    plan = _plan("1f1b", 4, 8, dispatch=0.1)
    no_overhead = dataclasses.replace(plan, overhead=None, _views={})
    problems = exactness_problems(plan, no_overhead)
    assert problems and problems[0].startswith("makespan 33.0")


def test_the_exactness_check_sees_a_kernel_that_ignores_the_pairs():
    """Without the pair marks a blocking pair's forward send holds the device between the two halves (issue 27):
    with F 1 s and B 2 s per stage the backward half of (0F3;3B1) starts at 12.5, after the forward's send,
    instead of at the pair's end 12.0, though the makespan is the same."""
    plan = _plan("dualpipev", 2, 4, latency=0.5, overlap=False)
    unpaired = dataclasses.replace(plan, _views={"paired": np.zeros(len(plan.durations), dtype=np.bool_)})
    problems = exactness_problems(plan, unpaired)
    assert problems and not any(p.startswith("makespan") for p in problems)
    assert problems[0] == "start of 3B1: 12.5, the fast engine's 12.0", problems


def test_a_replayed_sample_is_the_sample():
    plan = _plan("zb-h1", 4, 8, latency=0.1, nbytes=1e6, bandwidth=1e7, weight=1.0)
    var = Variability.parse("lognormal:0.2", links="normal:0.3", stragglers=["device=any,factor=2,prob=0.5"],
                            pause="every=3s,length=0.5s")
    arrays = run_samples(plan, var, samples=40, seed=3)
    for j in (0, 17, 39):
        start, end, _, tx_end = replay_sample(plan, var, sample=j, seed=3)
        assert max(end.max(), tx_end.max()) == arrays.makespan[j]
        assert (end >= start).all()


def test_samples_are_reproducible_and_independent_of_the_batch():
    plan = _plan("1f1b", 4, 8)
    var = Variability.parse("lognormal:0.1", stragglers=["device=2,factor=1.5,prob=0.2"])
    a = run_samples(plan, var, samples=50, seed=11)
    b = run_samples(plan, var, samples=50, seed=11)
    assert np.array_equal(a.makespan, b.makespan) and np.array_equal(a.busy, b.busy)
    part = run_samples(plan, var, samples=10, seed=11, first=20)  # samples 20..29 alone
    assert np.array_equal(part.makespan, a.makespan[20:30])
    other = run_samples(plan, var, samples=50, seed=12)
    assert not np.array_equal(other.makespan, a.makespan)


def test_two_schedules_see_the_same_draw_for_the_same_action():
    """Common random numbers: the draw of an action depends on its key, not on where the schedule runs it."""
    var = Variability.parse("lognormal:0.3")
    costs = sim.uniform(1, forward=1.0, backward=2.0)
    # one device: the makespan is the sum of the drawn durations, whatever the order
    a = monte_carlo(sim.schedules.gpipe(1, 6), costs, samples=20, variability=var, seed=5)
    b = monte_carlo(sim.schedules.one_f_one_b(1, 6), costs, samples=20, variability=var, seed=5)
    np.testing.assert_allclose(a.makespan, b.makespan, rtol=1e-12)
    assert a.makespan.std() > 0


# ---------------------------------------------------------------------------------------------- distributions
def _factors(code, cv, count, stream=1):
    _, factor = sampling.python_draws(9, 0)  # the kernel's own draws, called from Python
    return np.array([factor(code, cv, stream, i) for i in range(count)])


@pytest.mark.parametrize("code, cv", [(sampling._LOGNORMAL, 0.1), (sampling._LOGNORMAL, 0.5), (sampling._NORMAL, 0.1)])
def test_factors_have_mean_one_and_the_coefficient_of_variation_asked_for(code, cv):
    n = 40_000
    f = _factors(code, cv, n)
    assert f.min() >= 0
    # standard errors: mean cv / sqrt(n); std about cv * sqrt((kurtosis - 1) / (4 n)); 6 of each
    assert abs(f.mean() - 1) < 6 * cv / math.sqrt(n)
    assert abs(f.std() / cv - 1) < 0.05


def test_truncated_normal_is_never_negative():
    f = _factors(sampling._NORMAL, 2.0, 5_000)  # P(1 + 2 z <= 0) = 0.31: redrawn, never clipped
    assert (f > 0).all()


@settings(max_examples=200, deadline=None)
@given(start=st.floats(0, 50), work=st.floats(0.001, 20), every=st.floats(0.5, 5), share=st.floats(0.05, 0.9),
       phase=st.floats(0, 5))
def test_paused_end_matches_a_step_by_step_clock(start, work, every, share, phase):
    length = every * share
    end = sampling._paused_end(start, work, every, length, phase % every)
    # walk the clock in the pause grid: worked time between start and end must equal work
    def worked(t0, t1):
        total, k = 0.0, math.floor((t0 - phase) / every) - 1
        while phase + k * every < t1:
            lo, hi = phase + k * every + length, phase + (k + 1) * every  # a work window
            total += max(0.0, min(hi, t1) - max(lo, t0))
            k += 1
        return total
    assert worked(start, end) == pytest.approx(work, rel=1e-9, abs=1e-9)
    assert end >= start + work - 1e-12


def test_a_certain_straggler_doubles_its_devices_busy_time_and_holds_the_critical_path():
    plan = _plan("1f1b", 4, 8)
    base = run_samples(plan, Variability(), samples=1, seed=0)
    slow = run_samples(plan, Variability(stragglers=(Straggler(device=1, factor=2.0),)), samples=4, seed=0)
    np.testing.assert_allclose(slow.busy[:, 1], 2 * base.busy[0, 1])
    np.testing.assert_allclose(slow.busy[:, [0, 2, 3]], base.busy[:, [0, 2, 3]].repeat(4, 0))
    assert (slow.makespan > base.makespan[0]).all()
    assert (slow.critical_seconds.argmax(axis=1) == 1).all()


def test_a_straggler_strikes_in_the_share_of_samples_asked_for():
    plan = _plan("gpipe", 2, 2)
    n, p = 4000, 0.3
    arrays = run_samples(plan, Variability(stragglers=(Straggler(device=None, factor=3.0, prob=p),)), samples=n,
                         seed=1)
    struck = (arrays.busy > arrays.busy.min(axis=0)).any(axis=1)
    assert abs(struck.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    hit = arrays.busy.argmax(axis=1)[struck]  # device=any: both devices, about half each
    assert abs((hit == 0).mean() - 0.5) < 5 * math.sqrt(0.25 / struck.sum())


def test_a_slow_link_slows_only_its_transfers():
    schedule = sim.schedules.one_f_one_b(3, 4)
    costs = sim.uniform(3, forward=1.0, backward=1.0, send_bytes=1e6)
    hw = sim.Hardware(devices=3, latency=0.0, bandwidth=1e6)  # 1 s per transfer
    base = monte_carlo(schedule, costs, hw, samples=1)
    slow = monte_carlo(schedule, costs, hw, samples=1, slow_links=["src=0,dst=1,factor=3"])
    unused = monte_carlo(schedule, costs, hw, samples=1, slow_links=["src=0,dst=2,factor=3"])  # no such transfer
    assert slow.makespan[0] > base.makespan[0]
    assert unused.makespan[0] == base.makespan[0]
    timeline = slow.sample_result(0).timeline
    sends = timeline[timeline["op"].isin(["SEND_F", "SEND_B"])]
    seconds = (sends["end"] - sends["start"]).round(9)
    on_link = (sends["src"] == 0) & (sends["dst"] == 1)
    assert set(seconds[on_link]) == {3.0} and set(seconds[~on_link]) == {1.0}


def test_aligned_pauses_on_one_device_add_their_length_per_period():
    schedule = sim.schedules.gpipe(1, 10)  # one device, 10 x (F 1 s + B 2 s) = 30 s of work
    mc = monte_carlo(schedule, sim.uniform(1, forward=1.0, backward=2.0), samples=2,
                     pause=Pause(every=4.0, length=1.0, aligned=True))
    # pauses at [0,1), [4,5), ...: 3 s of work per 4 s; 30 s of work end at 40 s (the 10th window's end)
    assert mc.makespan[0] == pytest.approx(40.0)
    assert mc.arrays.busy[0, 0] == pytest.approx(30.0)  # busy excludes the pauses


def test_empirical_resampling_draws_only_measured_durations(tmp_path):
    schedule = sim.schedules.one_f_one_b(2, 4)
    path = tmp_path / "measured.csv"
    rows = ["device,stage,microbatch,op,start,end"]
    for stage in (0, 1):
        for i, (op, seconds) in enumerate([("F", 1.0), ("F", 3.0), ("B", 2.0), ("B", 2.0)]):
            rows.append(f"{stage},{stage},{i},{op},{10 * i},{10 * i + seconds}")
    path.write_text("\n".join(rows) + "\n")
    mc = monte_carlo(schedule, sim.uniform(2), samples=400, variability=f"empirical:{path}", seed=2)
    # busy per device = 4 forwards of 1 or 3 s + 4 backwards of 2 s: 12 + 2 k for k forwards of 3 s
    busy = mc.arrays.busy
    assert set(np.unique(busy)) <= {12.0, 14.0, 16.0, 18.0, 20.0}
    assert abs(busy.mean() - 16.0) < 6 * 2 * math.sqrt(4) / math.sqrt(busy.size)  # E = 8 + 4 x 2


def test_empirical_resampling_refuses_a_timeline_without_the_kinds_the_schedule_runs(tmp_path):
    path = tmp_path / "forwards.csv"
    path.write_text("device,stage,microbatch,op,start,end\n0,0,0,F,0,1\n1,1,0,F,1,2\n")
    with pytest.raises(VariabilityError, match="no measured durations for stage 0 B"):
        monte_carlo(sim.schedules.gpipe(2, 2), sim.uniform(2), samples=5, variability=f"empirical:{path}")


# ---------------------------------------------------------------------------------------------- independent MC
def _reference(schedule, costs, hardware, *, cv, straggler, factor, prob, samples, seed):
    """A plain-numpy Monte Carlo written from the IR's rules alone (README: the schedule IR), vectorised over the
    samples: own topological order, own random numbers (numpy's PCG64), own link queues."""
    rng = np.random.default_rng(seed)
    K, S = schedule.devices, schedule.stages
    orders = {d: list(schedule.actions[d]) for d in range(K)}
    split = schedule.split_backward
    sigma = math.sqrt(math.log1p(cv * cv))
    slow = rng.random(samples) < prob
    dev_factor = np.ones((samples, K))
    dev_factor[slow, straggler] = factor
    done: dict = {}  # action -> end time per sample
    arrive: dict = {}  # action -> arrival of its result on another device
    device_free = np.zeros((K, samples))
    link_free: dict = {}
    pos = [0] * K
    place = schedule.placement

    def inputs(a):
        s, m, kind = a.stage, a.mb, a.kind.value
        if kind == "F":
            return [sim.Action.parse(f"{s - 1}F{m}")] if s > 0 else []
        if kind == "B":
            return [sim.Action.parse(f"{s + 1}B{m}") if s < S - 1 else sim.Action.parse(f"{s}F{m}")]
        if kind == "W":
            return [sim.Action.parse(f"{s}B{m}")]
        # U: after every backward of its stage (its W where split); one iteration here
        return [sim.Action.parse(f"{s}{'W' if (s, mb) in split else 'B'}{mb}") for mb in range(schedule.microbatches)]

    def seconds(a):
        kind = a.kind.value
        if kind == "F":
            return costs.forward[a.stage]
        if kind == "B":
            return costs.backward[a.stage] + (0 if (a.stage, a.mb) in split else costs.weight[a.stage])
        return costs.weight[a.stage] if kind == "W" else costs.update[a.stage]

    remaining = sum(len(v) for v in orders.values())
    while remaining:
        progressed = False
        for d in range(K):
            while pos[d] < len(orders[d]):
                a = orders[d][pos[d]]
                needs = inputs(a)
                if any(n not in done for n in needs):
                    break
                start = device_free[d].copy()
                for n in needs:
                    t = arrive[n] if place[n.stage] != d else done[n]
                    start = np.maximum(start, t)
                draw = np.exp(-0.5 * sigma * sigma + sigma * rng.standard_normal(samples))
                end = start + seconds(a) * draw * dev_factor[:, d]
                done[a] = end
                device_free[d] = end
                # its result travels when a consumer sits on another device (F down, B up)
                kind = a.kind.value
                to = a.stage + 1 if kind == "F" else a.stage - 1 if kind == "B" else None
                if to is not None and 0 <= to < S and place[to] != d:
                    link = (d, place[to])
                    nbytes = costs.send_bytes[a.stage if kind == "F" else a.stage - 1]
                    t0 = np.maximum(link_free.get(link, 0.0), end)
                    arrive[a] = t0 + hardware.latency[d][place[to]] + nbytes / hardware.bandwidth[d][place[to]]
                    link_free[link] = arrive[a]
                pos[d] += 1
                remaining -= 1
                progressed = True
        assert progressed, "the reference walk is stuck"
    last = np.max(np.stack([v for v in done.values()] + [v for v in arrive.values()]), axis=0)
    return last


def _agree(a: np.ndarray, b: np.ndarray, quantiles=(0.5, 0.9, 0.99), sigmas: float = 5.0) -> list[str]:
    """Where two independent samples of one distribution disagree. For the p-quantile q_a of sample a, the share of
    sample b at or below q_a is p up to the binomial errors of both samples: standard deviation sqrt(p (1-p) (1/Na
    + 1/Nb)). The means agree within *sigmas* standard errors of their difference."""
    bad = []
    for p in quantiles:
        q = np.quantile(a, p)
        share = np.mean(b <= q)
        limit = sigmas * math.sqrt(p * (1 - p) * (1 / len(a) + 1 / len(b)))
        if abs(share - p) > limit:
            bad.append(f"p{round(p * 100)}: {share:.4f} of the other sample lies below, want {p} +- {limit:.4f}")
    se = math.sqrt(a.var() / len(a) + b.var() / len(b))
    if abs(a.mean() - b.mean()) > sigmas * se:
        bad.append(f"means {a.mean():.6g} and {b.mean():.6g} differ by more than {sigmas} x {se:.3g}")
    return bad


@pytest.mark.parametrize("name, K, M", [("1f1b", 4, 8), ("zb-h1", 4, 8), ("gpipe", 3, 6)])
def test_quantiles_agree_with_an_independent_numpy_monte_carlo(name, K, M):
    schedule = sim.schedules.generate(name, K, M)
    costs = sim.uniform(K, forward=1.0, backward=1.5, weight=0.5, send_bytes=1e6)
    hardware = sim.Hardware(devices=K, latency=0.05, bandwidth=1e7)
    n = 6000
    mc = monte_carlo(schedule, costs, hardware, samples=n, variability="lognormal:0.1",
                     stragglers=["device=2,factor=1.5,prob=0.2"], seed=4)
    ref = _reference(schedule, costs, hardware, cv=0.1, straggler=2, factor=1.5, prob=0.2, samples=n, seed=99)
    assert _agree(mc.makespan, ref) == []


def test_the_agreement_check_sees_a_one_percent_shift():
    """The check above has the power to see a small bug: a makespan 1 % too long (e.g. a lognormal without its
    -sigma^2/2, whose mean is exp(sigma^2/2) = 1.005 at CV 0.1, times the path) fails it."""
    schedule = sim.schedules.one_f_one_b(4, 8)
    costs = sim.uniform(4, forward=1.0, backward=1.5, weight=0.5, send_bytes=1e6)
    hardware = sim.Hardware(devices=4, latency=0.05, bandwidth=1e7)
    n = 6000
    mc = monte_carlo(schedule, costs, hardware, samples=n, variability="lognormal:0.1", seed=4)
    ref = _reference(schedule, costs, hardware, cv=0.1, straggler=0, factor=1.0, prob=0.0, samples=n, seed=99)
    assert _agree(mc.makespan, ref) == []
    assert _agree(mc.makespan * 1.01, ref) != []
    ref_wrong_cv = _reference(schedule, costs, hardware, cv=0.13, straggler=0, factor=1.0, prob=0.0, samples=n,
                              seed=99)
    assert _agree(mc.makespan, ref_wrong_cv) != []


# ---------------------------------------------------------------------------------------------- API and summary
def test_summary_holds_the_issues_fields():
    mc = monte_carlo(sim.schedules.one_f_one_b(4, 8), sim.uniform(4), samples=300, variability="lognormal:0.1",
                     stragglers=["device=3,factor=2,prob=1"], seed=0)
    d = mc.summary()
    for name in ("makespan", "throughput", "bubble"):
        assert set(d[f"{name}_quantiles"]) == {"p50", "p90", "p99"}
        q = d[f"{name}_quantiles"]
        assert q["p50"] <= q["p90"] <= q["p99"]
        assert d[f"{name}_std"] > 0
    assert d["samples"] == 300
    assert d["critical_path"]["slowest_device"] == 3  # the certain straggler holds the most of the path
    assert len(d["critical_path"]["on_path_share"]) == 4
    assert d["makespan_mean"] > d["nominal_makespan"]
    assert any("p99" in n for n in d["notes"])  # 300 samples: the p99 comes with its warning


@pytest.mark.parametrize("kwargs, match", [
    ({"samples": 0}, "samples must be"),
    ({"samples": 10, "seed": -1}, "seed must be"),
    ({"samples": 10, "variability": "gamma:0.1"}, "lognormal:CV"),
    ({"samples": 10, "variability": "lognormal:-1"}, "coefficient of variation"),
    ({"samples": 10, "stragglers": ["device=9,factor=2"]}, "devices 0..3"),
    ({"samples": 10, "stragglers": "device=1,factor=2"}, "take a list"),
    ({"samples": 10, "pause": "every=10ms,length=20ms"}, "length < every"),
])
def test_bad_arguments_are_one_clear_error(kwargs, match):
    with pytest.raises(sim.PipesimError, match=match):
        monte_carlo(sim.schedules.one_f_one_b(4, 8), sim.uniform(4), **kwargs)


def test_a_deadlocked_schedule_is_named_not_sampled():
    good = sim.schedules.one_f_one_b(2, 2)
    keys = good.keys_array.copy()
    a, b = good.device_start[1], good.device_start[2]
    keys[a:b] = keys[a:b][::-1]  # device 1 runs its backwards first: it waits forever
    bad = good.replace_keys(keys, good.device_start, name="reversed")
    with pytest.raises(sim.ScheduleError):
        monte_carlo(bad, sim.uniform(2), samples=5)
    plan = make_plan(bad, sim.uniform(2), sim.Hardware(devices=2))
    with pytest.raises(sim.ScheduleError):
        topological_order(plan)


def test_quantile_sample_and_its_timeline():
    mc = monte_carlo(sim.schedules.one_f_one_b(4, 8), sim.uniform(4), samples=200, variability="lognormal:0.2",
                     seed=1)
    slow = mc.quantile_sample(0.99)
    assert mc.makespan[slow] == np.sort(mc.makespan)[197]
    result = mc.sample_result(slow)
    assert result.metrics.makespan == mc.makespan[slow]
    with pytest.raises(MonteCarloError):
        mc.sample_result(200)


def test_distribution_specs_parse_and_refuse():
    assert Distribution.parse("lognormal:0.1").cv == 0.1
    assert Variability.parse(None, pause="every=0.5s,length=20ms").pause == Pause(every=0.5, length=0.02)
    assert Straggler.parse("device=any,factor=1.5,prob=0.1").device is None
    for bad in ("device=1", "device=x,factor=2", "device=1,factor=0", "device=1,factor=2,prob=2",
                "device=1,factor=2,device=2", "dev=1,factor=2"):
        with pytest.raises(VariabilityError):
            Straggler.parse(bad)
