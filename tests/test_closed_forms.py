"""The textbook formulas, checked against the simulator with uniform stages.

Notation: K devices (= stages), M micro-batches per iteration, N iterations, F / B / R
the forward / backward / recompute time of one stage and micro-batch; free links unless
a test adds latency or bandwidth; update time 0 unless stated.

- naive model parallelism: utilization 1/K (GPipe paper, Huang et al. 2019, fig. 2b).
- GPipe and 1F1B: makespan (M+K-1)(F+B), bubble fraction (K-1)/(M+K-1) (GPipe, section 2.2);
  Megatron's bubble ratio, idle over ideal time, (K-1)/M (Narayanan et al., SC'21, section 2.2).
  1F1B keeps the formula when B < F too (checked below): every device runs F then B for
  each micro-batch with no wait in steady state, so the same critical path of M+K-1
  forward/backward pairs holds whichever of F and B is longer.
- GPipe with recompute: (M+K-1)(F+B) + M*R, not (M+K-1)(F+B+R): R(s,m) needs only F(s,m),
  so a stage runs R for its next micro-batch while the gradient is still on its way from
  stage s+1 (which itself needs exactly R+B more time per micro-batch); only the last
  stage's M recomputes lie on the critical path.
- PipeDream over N iterations: utilization N*M/(N*M+K-1) (warm-up and cool-down paid once;
  Narayanan et al., SOSP 2019); GPipe pays them every iteration: M/(M+K-1).
- A link latency c (or a transfer time bytes/bandwidth) that never makes transfers queue
  (c <= F) adds 2(K-1)c to GPipe's makespan: K-1 hops on the way forward, K-1 back.
"""

from __future__ import annotations

import itertools

import pytest

from sim import Hardware, StageCosts, schedules, simulate, uniform

GRID = list(itertools.product([1, 2, 3, 4, 8], [1, 2, 3, 5, 12]))
RATIOS = [(1.0, 1.0), (1.0, 2.0), (1.0, 3.0), (0.5, 1.75)]  # (F, B) with B >= F
INVERTED = [(2.0, 1.0), (3.0, 1.0), (1.0, 0.25), (1.0, 0.0)]  # B < F


@pytest.mark.parametrize("K,M", GRID)
def test_naive_utilization_is_one_over_k(check, K, M):
    for F, B in RATIOS + INVERTED:
        r = simulate(schedules.naive(K, M), uniform(K, forward=F, backward=B))
        if (F, B) == RATIOS[1]:
            check(r)
        assert r.metrics.makespan == pytest.approx(M * K * (F + B))
        assert r.metrics.utilization == pytest.approx(1 / K)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("K,M", GRID)
def test_flush_schedules_bubble(check, name, K, M):
    for F, B in RATIOS + INVERTED:
        r = simulate(schedules.generate(name, K, M), uniform(K, forward=F, backward=B))
        if (F, B) in (RATIOS[1], INVERTED[0]):
            check(r)
        m = r.metrics
        assert m.makespan == pytest.approx((M + K - 1) * (F + B))
        assert m.bubble_fraction == pytest.approx((K - 1) / (M + K - 1))
        assert m.utilization == pytest.approx(M / (M + K - 1))
        assert m.bubble_ratio == pytest.approx((K - 1) / M)  # Megatron: idle / ideal


def test_k4_m4_is_57_percent_utilization():
    for name in ("gpipe", "1f1b"):
        r = simulate(schedules.generate(name, 4, 4), uniform(4, forward=1, backward=2))
        assert round(r.metrics.utilization, 4) == 0.5714  # 4/7
        assert r.metrics.makespan == 21.0


@pytest.mark.parametrize("K,M", [(1, 1), (2, 3), (4, 4), (4, 8), (6, 5), (8, 12)])
@pytest.mark.parametrize("F,B,R", [(1.0, 2.0, 1.0), (1.0, 2.0, 0.5), (1.0, 1.0, 3.0), (2.0, 1.0, 2.0)])
def test_gpipe_recompute_adds_m_recomputes_to_the_makespan(check, K, M, F, B, R):
    costs = uniform(K, forward=F, backward=B, recompute=R)
    plain = simulate(schedules.gpipe(K, M), costs)
    rec = simulate(schedules.gpipe(K, M, recompute=True), costs)
    check(rec)
    assert plain.metrics.makespan == pytest.approx((M + K - 1) * (F + B))
    assert rec.metrics.makespan == pytest.approx((M + K - 1) * (F + B) + M * R)
    assert rec.metrics.makespan - plain.metrics.makespan == pytest.approx(M * R)
    # the R time is really spent: each device is busy M*R longer
    for busy_plain, busy_rec in zip(plain.metrics.busy, rec.metrics.busy):
        assert busy_rec - busy_plain == pytest.approx(M * R)


@pytest.mark.parametrize("K,M", [(2, 2), (4, 4), (3, 8), (8, 4)])
def test_pipedream_utilization_approaches_one(check, K, M):
    costs = uniform(K, forward=1, backward=2, update=0)
    previous = 0.0
    for N in (1, 2, 3, 5, 8):
        pd_ = simulate(schedules.pipedream(K, M, iterations=N), costs)
        gp = simulate(schedules.gpipe(K, M, iterations=N), costs)
        check(pd_)
        check(gp)
        assert pd_.metrics.utilization == pytest.approx(N * M / (N * M + K - 1))
        assert gp.metrics.utilization == pytest.approx(M / (M + K - 1))  # the bubble recurs every iteration
        assert gp.metrics.makespan == pytest.approx(N * (M + K - 1) * 3)
        assert pd_.metrics.utilization >= previous
        previous = pd_.metrics.utilization
    if K > 1:
        assert previous > gp.metrics.utilization


@pytest.mark.parametrize("K", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("M,N", [(1, 8), (2, 4), (4, 2), (8, 2), (12, 1)])
def test_pipedream_weight_versions(K, M, N):
    """Stage s stashes K-s weight versions (PipeDream, SOSP 2019, section 3.3).

    Stage s reads version v for micro-batch K-s-1+v (after the warm-up, one update per
    backward), so at the end of update u it holds versions max(0, u-K+s+2) .. u+1: K-s of
    them, as soon as the versions in between each have a micro-batch to read them. That
    needs N*M >= 2(K-1) micro-batches in all; with fewer, fewer versions (never more).
    """
    r = simulate(schedules.pipedream(K, M, iterations=N), uniform(K, weight_bytes=100))
    versions = r.metrics.weight_versions
    assert all(v <= K - s for s, v in enumerate(versions))
    if N * M >= 2 * (K - 1):
        assert versions == [K - s for s in range(K)]
        # one weight version is weight_bytes; the peak holds K-s of them
        assert r.metrics.peak_memory == [100.0 * (K - s) for s in range(K)]
    for name in ("gpipe", "1f1b"):  # flush schedules hold one version
        flush = simulate(schedules.generate(name, K, M, iterations=N), uniform(K))
        assert flush.metrics.weight_versions == [1] * K


def test_pipedream_versions_need_enough_microbatches():
    # K=4 needs 6 micro-batches in all for stage 0 to hold 4 versions
    few = simulate(schedules.pipedream(4, 5), uniform(4)).metrics.weight_versions
    enough = simulate(schedules.pipedream(4, 3, iterations=2), uniform(4)).metrics.weight_versions
    assert few[0] < 4
    assert enough == [4, 3, 2, 1]


@pytest.mark.parametrize("K,M", [(1, 4), (2, 1), (2, 4), (4, 4), (5, 3), (8, 8)])
@pytest.mark.parametrize("c", [0.0, 0.1, 0.5, 1.0])
def test_latency_adds_two_k_minus_one_hops(check, K, M, c):
    F, B = 1.0, 2.0
    costs = uniform(K, forward=F, backward=B)
    base = simulate(schedules.gpipe(K, M), costs).metrics.makespan
    r = simulate(schedules.gpipe(K, M), costs, Hardware(devices=K, latency=c))
    check(r)
    assert r.metrics.makespan - base == pytest.approx(2 * (K - 1) * c)


@pytest.mark.parametrize("K,M", [(2, 4), (4, 4), (6, 2)])
@pytest.mark.parametrize("nbytes,bandwidth", [(1e6, 1e7), (5e5, 1e6), (1e9, 1e9)])
def test_bandwidth_adds_two_k_minus_one_transfer_times(check, K, M, nbytes, bandwidth):
    F, B = 1.0, 2.0
    t = nbytes / bandwidth
    assert t <= F
    costs = uniform(K, forward=F, backward=B, send_bytes=nbytes)
    base = simulate(schedules.gpipe(K, M), costs).metrics.makespan
    r = simulate(schedules.gpipe(K, M), costs, Hardware(devices=K, bandwidth=bandwidth))
    check(r)
    assert r.metrics.makespan - base == pytest.approx(2 * (K - 1) * t)
    both = simulate(schedules.gpipe(K, M), costs, Hardware(devices=K, latency=0.25 * F, bandwidth=bandwidth * 4))
    assert both.metrics.makespan - base == pytest.approx(2 * (K - 1) * (0.25 * F + t / 4))


def test_queued_transfers_cost_more_than_the_hops():
    """Beyond c > F the link is the bottleneck: GPipe's forwards queue, so the formula is only a lower bound."""
    K, M, c = 4, 8, 3.0
    costs = uniform(K, forward=1.0, backward=2.0)
    base = simulate(schedules.gpipe(K, M), costs).metrics.makespan
    r = simulate(schedules.gpipe(K, M), costs, Hardware(devices=K, latency=c))
    assert r.metrics.makespan - base > 2 * (K - 1) * c


@pytest.mark.parametrize("K,M", [(2, 2), (4, 4), (4, 8)])
def test_updates_add_once_per_iteration(check, K, M):
    """With update time u > 0 every flush iteration ends with the U of stage 0, after its last backward."""
    u = 0.5
    r = simulate(schedules.gpipe(K, M, iterations=2), uniform(K, forward=1, backward=2, update=u))
    check(r)
    # iteration 2 starts on device 0 after U of iteration 1; the U of the first stage ends the run
    assert r.metrics.makespan == pytest.approx(2 * ((M + K - 1) * 3 + u))


# ------------------------------------------------------------------ the zero-bubble papers' bubble rate
def _zb_rate_by_definition(result) -> float:
    """Qi et al. (ICLR 2024), section 5.1: (cost - busy) / cost, cost = the largest execution time (span) of a
    stage (here: a device, as in the paper's ZB-V); written out over the timeline DataFrame, independently of
    sim.results.metrics."""
    comp = result.timeline[result.timeline["src"] < 0]
    spans = comp.groupby("device")["end"].max() - comp.groupby("device")["start"].min()
    busy = (comp["end"] - comp["start"]).groupby(comp["device"]).sum()
    worst = spans.idxmax()
    return float((spans[worst] - busy[worst]) / spans[worst])


@pytest.mark.parametrize("K,M", [(2, 4), (4, 8), (4, 12), (6, 12)])
def test_bubble_rate_zb_follows_the_zero_bubble_paper(K, M):
    """The paper's table 3 with F = B = W = 1: 1F1B (K-1)(F+B+W), ZB-H1 (K-1)(F+B-W), ZB-H2 (K-1)(F+B-2W) = 0 of
    bubble, rate = bubble / (bubble + M(F+B+W)); ZB-V 0 (section 6: zero bubble when F = B = W, although each
    device idles (K-1)F/2 of the makespan: it starts late or ends early, outside its own span)."""
    expected = {"1f1b": 3 * (K - 1), "zb-h1": (K - 1), "zb-h2": 0, "zbv": 0}
    for name, bubble in expected.items():
        s = schedules.generate(name, K, M)
        if name == "1f1b":
            costs = uniform(K, forward=1, backward=2)  # B here is the full backward: input and weight gradient
        else:
            share = K / s.stages  # V-shaped: each chunk costs half of one device's share
            costs = uniform(s.stages, forward=share, backward=share, weight=share)
        r = simulate(s, costs)
        assert r.metrics.bubble_rate_zb == pytest.approx(bubble / (bubble + 3 * M)), name
        assert r.metrics.bubble_rate_zb == pytest.approx(_zb_rate_by_definition(r)), name
        if name == "zbv":  # where devices start late and end early, the paper's rate is below K x makespan's
            assert r.metrics.bubble_fraction == pytest.approx((K - 1) / 2 / ((K - 1) / 2 + 3 * M))


def test_bubble_rate_zb_of_uneven_stages_matches_the_definition():
    costs = StageCosts(forward=[1, 2, 1.5], backward=[2, 1, 3], weight=[0.5, 1, 0.2])
    for name in ("1f1b", "zb-h1", "gpipe"):
        r = simulate(schedules.generate(name, 3, 7), costs, Hardware(devices=3, latency=0.3))
        assert r.metrics.bubble_rate_zb == pytest.approx(_zb_rate_by_definition(r))


@pytest.mark.parametrize("K", [2, 4])
def test_zbv_bubble_is_paid_once_per_run(K):
    """pipesim schedules' zbv text: the (K-1)F/2 idle comes once per run, not once per iteration."""
    from sim.schedules.registry import get_generator

    M, share = 2 * K, 0.5  # F = B = W = 1 per device share, 0.5 per chunk
    idle = [simulate(schedules.zbv(K, M, iterations=N), uniform(2 * K, forward=share, backward=share, weight=share))
            .metrics.makespan - N * M * 3 for N in (1, 2, 3)]
    assert idle == pytest.approx([(K - 1) / 2] * 3)
    assert "once per run" in get_generator("zbv").BUBBLE
