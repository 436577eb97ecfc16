"""The schedules beyond the seeds: interleaved 1F1B, ZB-H1, ZB-H2, ZB-V, DualPipeV, PipeDream-2BW.

Closed forms with uniform stages (F, B, W: one device's share of forward, input
gradient and weight gradient; a chunk of a v-chunk schedule costs 1/v of them),
with and without a link latency L, the memory each paper promises, the documented
refusals, and the timeline invariants (``check``) on every result.

Latency terms (derived from the engine's model: a transfer between devices takes
L, compute and communication overlap): a schedule whose critical path crosses n
device boundaries ends n*L later, as long as L is small against the stage costs.
"""

from __future__ import annotations

import pytest

from sim.schedules import registry as generators
from sim import schedules
from sim.core.config import ConfigError, PipelineConfig
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.core.ir import ActionKind
from sim.simulate import simulate
from sim.results.timeline import compute_rows

NEW = ["interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev", "pipedream-2bw"]
COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5), (2.0, 2.0, 1.0)]


def run(schedule, *, F=1.0, B=2.0, W=0.0, latency=0.0, activation=0.0, weight_bytes=0.0, check=None):
    K, v = schedule.devices, schedule.stages // schedule.devices
    costs = uniform(K, forward=F, backward=B, weight=W, activation_bytes=activation, weight_bytes=weight_bytes)
    if v > 1:
        costs = costs.split_into_chunks(v)
    result = simulate(schedule, costs, Hardware(devices=K, latency=latency))
    if check is not None:
        check(result)
    return result


# ------------------------------------------------------------------ interleaved 1F1B
@pytest.mark.parametrize("K,M,v", [(2, 4, 2), (3, 6, 2), (4, 8, 2), (4, 12, 3), (4, 16, 4)])
@pytest.mark.parametrize("latency", [0.0, 0.05, 0.1])
def test_interleaved_bubble_closed_form(check, K, M, v, latency):
    """Megatron SC'21 section 2.2.2: bubble (K-1)(F+B)/v; with latency the first micro-batch's forward crosses
    the S-1 = Kv-1 stage boundaries down and its backward the same ones back up: + 2(Kv-1)L."""
    F, B = 1.0, 2.0
    r = run(schedules.interleaved_1f1b(K, M, chunks=v), F=F, B=B, latency=latency, check=check)
    assert r.metrics.makespan == pytest.approx(M * (F + B) + (K - 1) * (F + B) / v + 2 * (K * v - 1) * latency)


@pytest.mark.parametrize("K,v", [(2, 2), (4, 2), (4, 3), (4, 4), (8, 2)])
def test_interleaved_first_rank_memory(check, K, v):
    """Rank 0 holds K(1 + (K-1)/(Kv)) stages' worth of activations (Megatron SC'21, section 2.2.2)."""
    A = 1000.0  # activation bytes of one device's share per micro-batch; a chunk keeps A/v
    r = run(schedules.interleaved_1f1b(K, 2 * K, chunks=v), activation=A, check=check)
    assert r.metrics.peak_memory[0] == pytest.approx(A * K * (1 + (K - 1) / (K * v)))
    assert r.metrics.peak_inflight[0] == (K - 1) * 2 + (v - 1) * K + 1  # chunk activations
    assert max(r.metrics.peak_memory) == r.metrics.peak_memory[0]


def test_interleaved_placement_and_order():
    s = schedules.interleaved_1f1b(4, 8, chunks=2)
    assert s.placement == (0, 1, 2, 3, 0, 1, 2, 3)  # stage s on device s % K
    # Megatron's warm-up on rank 0: (K-1)*2 + (v-1)*K = 10 forwards, micro-batches in groups of K per chunk
    assert [str(a) for a in s.actions[0][:10]] == ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3",
                                                   "0F4", "0F5"]
    assert str(s.actions[0][11]) == "4B0"  # backwards start with the last chunk


def test_interleaved_requires_m_multiple_of_k():
    with pytest.raises(ConfigError, match=r"multiple of the devices K.*M=6, K=4.*M=4 or M=8"):
        schedules.interleaved_1f1b(4, 6, chunks=2)
    assert schedules.interleaved_1f1b(4, 6, chunks=1).stages == 4  # one chunk: plain 1F1B, any M
    assert schedules.interleaved_1f1b(4, 6, chunks=1).actions == schedules.one_f_one_b(4, 6).actions


def test_interleaved_beats_1f1b_on_the_same_model(check):
    base = run(schedules.one_f_one_b(4, 8), check=check).metrics.makespan
    inter = run(schedules.interleaved_1f1b(4, 8, chunks=2), check=check).metrics.makespan
    assert inter == pytest.approx(base - 3 * 3 / 2)  # bubble (K-1)(F+B) halved


# ------------------------------------------------------------------ ZB-H1 / ZB-H2
@pytest.mark.parametrize("K,M,latency", [(2, 4, 0.0), (3, 6, 0.0), (4, 4, 0.0), (4, 8, 0.0), (5, 10, 0.0),
                                         (2, 4, 0.05), (3, 6, 0.05), (4, 8, 0.05), (5, 10, 0.05), (4, 12, 0.1)])
@pytest.mark.parametrize("F,B,W", COSTS)
def test_zb_h1_bubble_closed_form(check, K, M, F, B, W, latency):
    """Qi et al. ICLR 2024, section 3.1: bubble (K-1)(F+B-W) for M >= K. ZB-H1 leaves no slack on stage 0
    between its first B and its last W, so (for M >= 2K, where the two do not overlap) the first
    micro-batch's round trip (down K-1 links, back K-1) and the last one's both lie on the critical
    path: + 4(K-1)L."""
    r = run(schedules.zb_h1(K, M), F=F, B=B, W=W, latency=latency, check=check)
    assert r.metrics.makespan == pytest.approx(M * (F + B + W) + (K - 1) * (F + B - W) + 4 * (K - 1) * latency)


@pytest.mark.parametrize("K,M", [(2, 4), (4, 8), (4, 12), (5, 10)])
def test_zb_h1_memory_is_1f1b_peak(check, K, M):
    r = run(schedules.zb_h1(K, M), W=1.0, activation=1.0, check=check)
    assert r.metrics.peak_inflight == [K] * K  # every stage holds K micro-batches until their W
    assert max(run(schedules.one_f_one_b(K, M), activation=1.0).metrics.peak_inflight) == K


def test_zb_h1_beats_1f1b(check):
    """Same model (B+W of 1F1B's full backward), (K-1)(F+B+W) -> (K-1)(F+B-W)."""
    K, M, F, B, W = 4, 8, 1.0, 1.0, 1.0
    one = run(schedules.one_f_one_b(K, M), F=F, B=B, W=W, check=check).metrics.makespan
    zb = run(schedules.zb_h1(K, M), F=F, B=B, W=W, check=check).metrics.makespan
    assert one - zb == pytest.approx((K - 1) * 2 * W)


@pytest.mark.parametrize("K,M", [(2, 4), (3, 6), (4, 8), (5, 10)])
@pytest.mark.parametrize("F,B,W", COSTS)
def test_zb_h2_bubble_closed_form(check, K, M, F, B, W):
    """Steady state (iterations interlock, each stage's U waits only for its own gradients, the paper's
    section 4): (K-1)(F+B-2W) per iteration; one isolated iteration: (K-1) max(F, F+B-2W)."""
    one = run(schedules.zb_h2(K, M), F=F, B=B, W=W, check=check).metrics.makespan
    assert one == pytest.approx(M * (F + B + W) + (K - 1) * max(F, F + B - 2 * W))
    two = run(schedules.zb_h2(K, M, iterations=2), F=F, B=B, W=W).metrics.makespan
    three = run(schedules.zb_h2(K, M, iterations=3), F=F, B=B, W=W, check=check).metrics.makespan
    assert three - two == pytest.approx(M * (F + B + W) + (K - 1) * (F + B - 2 * W))


@pytest.mark.parametrize("K,M", [(3, 6), (4, 8)])
def test_zb_h2_latency_terms(check, K, M):
    """Steady state: each iteration's parallelogram is shifted by the forward wave down (K-1 links) and the
    gradient wave back up (K-1 links): + 2(K-1)L per iteration. One iteration with B > 2W (stage 0's tail is
    critical): + 2(K-1)L; with F = B = W only the last stage's late start is: + (K-1)L."""
    L = 0.05
    F, B, W = 1.0, 2.0, 1.0
    one = run(schedules.zb_h2(K, M), F=F, B=B, W=W, latency=L, check=check).metrics.makespan
    assert one == pytest.approx(M * (F + B + W) + (K - 1) * (F + B - 2 * W) + 2 * (K - 1) * L)
    period = (run(schedules.zb_h2(K, M, iterations=3), F=F, B=B, W=W, latency=L).metrics.makespan
              - run(schedules.zb_h2(K, M, iterations=2), F=F, B=B, W=W, latency=L).metrics.makespan)
    assert period == pytest.approx(M * (F + B + W) + (K - 1) * (F + B - 2 * W) + 2 * (K - 1) * L)
    equal = run(schedules.zb_h2(K, M), F=1.0, B=1.0, W=1.0, latency=L).metrics.makespan
    assert equal == pytest.approx(M * 3.0 + (K - 1) * 1.0 + (K - 1) * L)


@pytest.mark.parametrize("K", [2, 3, 4, 6])
def test_zb_h2_memory(check, K):
    """Up to 2K-1 micro-batches in flight on the first device (2(K-i)-1 forwards before the first B on stage i)."""
    r = run(schedules.zb_h2(K, 2 * K), W=1.0, activation=1.0, check=check)
    assert r.metrics.peak_inflight[0] == 2 * K - 1
    assert max(r.metrics.peak_inflight) <= 2 * K - 1
    first_b = [a.kind for a in schedules.zb_h2(K, 2 * K).actions[0]].index(ActionKind.B)
    assert first_b == 2 * K - 1


# ------------------------------------------------------------------ ZB-V and DualPipeV
@pytest.mark.parametrize("name,idle", [("zbv", 0.5), ("dualpipev", 1.0)])
@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_v_shaped_bubble_with_equal_costs(check, name, idle, K):
    """F = B = W: ZB-V idles (K-1)F/2 per device (a chunk's forward is F/2); DualPipeV, whose overlapped pairs are one
    unit of F+B that waits for both inputs, (K-1)F; 1F1B 3(K-1)F."""
    M, F = 2 * K + 2, 1.0
    r = run(schedules.generate(name, K, M, chunks=2), F=F, B=F, W=F, check=check)
    assert r.metrics.makespan == pytest.approx(3 * M * F + idle * (K - 1) * F)
    one = run(schedules.one_f_one_b(K, M), F=F, B=F, W=F).metrics.makespan
    assert one == pytest.approx(3 * M * F + 3 * (K - 1) * F)


@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_zbv_memory_is_k_stages(check, K):
    """ZB-V (paper, section 6): every device holds at most K stages' worth of activations, 1F1B's peak."""
    A = 1000.0
    r = run(schedules.zbv(K, 2 * K + 1), W=1.0, activation=A, check=check)
    assert r.metrics.peak_memory == pytest.approx([K * A] * K)
    assert r.metrics.peak_inflight == [2 * K] * K  # chunk activations of A/2 each


@pytest.mark.parametrize("K", [2, 3, 4])
def test_v_placement(K):
    for s in (schedules.zbv(K, 2 * K), schedules.dualpipev(K, 2 * K)):
        assert s.placement == tuple(list(range(K)) + list(reversed(range(K))))
        assert s.stages_of(0) == [0, 2 * K - 1]  # the first and the last stage share device 0


@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_dualpipev_memory_and_pairs(check, K):
    r = run(schedules.dualpipev(K, 2 * K + 2), W=1.0, activation=1.0, check=check)
    assert max(r.metrics.peak_inflight) == 2 * K + 1
    s = schedules.dualpipev(K, 2 * K + 2)
    # overlapped pairs are a forward immediately followed by a full backward of another micro-batch and chunk
    pairs = [(a, b) for a, b in zip(s.actions[0], s.actions[0][1:])
             if a.kind is ActionKind.F and b.kind is ActionKind.B and a.stage != b.stage and a.mb != b.mb]
    assert len(pairs) >= 2
    assert any((b.stage, b.mb) not in s.split_backward for _, b in pairs)
    assert s.split_backward  # the zero-bubble phases split their backwards


@pytest.mark.parametrize("name,chunks,match", [
    ("zbv", 1, "--chunks 2"), ("zbv", 3, "--chunks 2"), ("dualpipev", 1, "--chunks 2"),
    ("zb-h1", 2, "--chunks"), ("zb-h2", 2, "--chunks"), ("pipedream-2bw", 2, "--chunks"),
])
def test_chunks_are_checked(name, chunks, match):
    with pytest.raises(ConfigError, match=match):
        schedules.generate(name, 4, 8, chunks=chunks)
    with pytest.raises(ConfigError, match=match):  # the generator alone says so too
        generators.get_generator(name).generate(PipelineConfig(devices=4, microbatches=8, chunks=chunks))


def test_dualpipev_requires_2k_microbatches():
    with pytest.raises(ConfigError, match=r"at least 2K micro-batches.*M >= 8"):
        schedules.dualpipev(4, 7)


# ------------------------------------------------------------------ PipeDream-2BW
@pytest.mark.parametrize("K,M,N", [(2, 2, 3), (4, 4, 3), (4, 8, 3), (3, 5, 4)])
def test_2bw_two_weight_versions_and_delay_one(check, K, M, N):
    s = schedules.pipedream_2bw(K, M, iterations=N)
    r = run(s, activation=1.0, weight_bytes=100.0, check=check)
    assert max(r.metrics.weight_versions) == 2  # double-buffered weights
    assert run(schedules.pipedream(K, M, iterations=N), weight_bytes=100.0).metrics.weight_versions[0] == K
    # every micro-batch of batch t reads the version made after batch t-2: W(t+1) = W(t) - lr grad f(W(t-1))
    comp = compute_rows(r.timeline)
    for stage in range(K):
        rows = comp[comp.stage == stage]
        update_ends = sorted(rows[rows.op == "U"]["end"])
        for mb, start in zip(rows[rows.op == "F"]["microbatch"], rows[rows.op == "F"]["start"]):
            version = sum(end <= start for end in update_ends)
            assert version == max(0, mb // M - 1), (stage, mb)


def test_2bw_pays_the_warmup_once(check):
    K, M, N = 4, 8, 3
    bw = run(schedules.pipedream_2bw(K, M, iterations=N), check=check).metrics.makespan
    flush = run(schedules.one_f_one_b(K, M, iterations=N)).metrics.makespan
    assert bw == pytest.approx(N * M * 3.0 + (K - 1) * 3.0)  # one fill and drain for all N*M micro-batches
    assert bw < flush


def test_2bw_requires_m_at_least_k():
    with pytest.raises(ConfigError, match=r"M >= 4"):
        schedules.pipedream_2bw(4, 3)


# ------------------------------------------------------------------ every new schedule
@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("K,M,N", [(1, 2, 1), (2, 4, 2), (3, 6, 1), (4, 8, 2), (4, 12, 1), (6, 12, 1)])
@pytest.mark.parametrize("latency", [0.0, 0.3])
def test_invariants_of_new_schedules(check, name, K, M, N, latency):
    chunks = getattr(generators.get_generator(name), "CHUNKS", 1) or 2
    s = schedules.generate(name, K, M, iterations=N, chunks=chunks)
    r = run(s, F=1.0, B=1.5, W=0.5, latency=latency, activation=1.0, check=check)
    busy = N * M * (1.0 + 1.5 + 0.5)  # every device does its share (all its chunks) of every micro-batch
    assert r.metrics.busy == pytest.approx([busy] * K)
    assert r.metrics.makespan >= busy


@pytest.mark.parametrize("name", NEW)
def test_documented_in_schedules_command(name, capsys):
    from sim.cli import main
    assert main(["schedules"]) == 0
    out = capsys.readouterr().out
    gen = generators.get_generator(name)
    assert name in out and gen.SOURCE in out and gen.BUBBLE in out and gen.MEMORY in out
    assert any(year in gen.SOURCE for year in ("2021", "2024"))


def test_interleaved_runs_two_chunks_by_default_everywhere(capsys):
    """`-s interleaved-1f1b` without --chunks is the interleaved schedule, not plain 1F1B (F=1, B=2, K=4, M=8:
    1F1B takes 33, two chunks 28.5), in the Python helper, the generator, simulate, gantt and sweep alike."""
    import json as _json

    from sim.cli import main as cli
    from sim.search.sweep import run_sweep

    assert generators.default_chunks("interleaved-1f1b") == 2
    assert schedules.generate("interleaved-1f1b", 4, 8).stages == 8
    assert cli(["simulate", "-s", "interleaved-1f1b", "-K", "4", "-M", "8", "--json"]) in (0, None)
    assert _json.loads(capsys.readouterr().out)["makespan"] == pytest.approx(28.5)
    rows = run_sweep(["interleaved-1f1b"], [4], [8], progress=False)
    assert rows["makespan"].tolist() == pytest.approx([28.5])


# ------------------------------------------------------------------ DualPipeV's overlapped pairs (issue 14.2)
def test_dualpipev_overlapped_pairs_are_one_unit_closed_form(check):
    """F = B = W = 2 (a chunk costs 1), K=4, M=8: with each overlapped pair one unit of F+B that waits for both
    inputs, the makespan is 54; the old model, which ran the pair's halves one after the other as they became
    ready, gave 51."""
    from sim.engines.plan import OverlapFB

    s = schedules.dualpipev(4, 8)
    assert len(s.overlapped) > 0 and all(f.kind is ActionKind.F and b.kind is ActionKind.B for f, b in s.overlapped)
    costs = uniform(8, forward=1, backward=1, weight=1)
    r = simulate(s, costs)
    check(r)
    assert r.metrics.makespan == 54.0
    split = s.replace_keys(s.keys_array, s.device_start)  # the same order, pairs not fused
    assert simulate(split, costs).metrics.makespan == 51.0
    assert simulate(s, costs, engine="simpy").metrics.makespan == 54.0
    # DualPipe's point: overlapping saves time; a pair that takes less than F+B shortens the run
    faster = simulate(s, costs, overlap_fb=OverlapFB(saved=0.25)).metrics.makespan
    assert faster < 54.0
    assert simulate(s, costs, overlap_fb=OverlapFB(seconds=3.0)).metrics.makespan == 54.0  # F + full B = 1 + 2


def test_an_overlapped_pair_waits_for_both_inputs():
    s = schedules.dualpipev(2, 4)
    r = simulate(s, uniform(4, forward=1, backward=1, weight=1))
    tl = r.timeline.set_index(["stage", "op", "microbatch"])
    for f, b in s.overlapped:
        start, end = tl.loc[(f.stage, "F", f.mb), "start"], tl.loc[(f.stage, "F", f.mb), "end"]
        assert tl.loc[(b.stage, "B", b.mb), "start"] == tl.loc[(b.stage, "B", b.mb), "end"] == end  # one unit
        for dep in s.dependencies(f) + s.dependencies(b):  # the inputs of both halves were there at its start
            assert tl.loc[(dep.stage, dep.kind.value, dep.mb), "end"] <= start


def test_overlap_fb_parses_seconds_or_a_saved_share():
    from sim.engines.plan import OverlapError, OverlapFB

    assert OverlapFB.parse("1.5") == OverlapFB(seconds=1.5)
    assert OverlapFB.parse("30%") == OverlapFB(saved=0.3)
    assert OverlapFB(saved=0.25).pair_seconds(1.0, 3.0) == 3.0
    for bad in ("abc", "-1", "100%", "inf", "nan%"):
        with pytest.raises(OverlapError):
            OverlapFB.parse(bad)


def test_bad_overlapped_pairs_are_refused():
    from sim.core.ir import Action, Schedule, ScheduleError

    acts = {0: [Action(0, ActionKind.F, 0), Action(0, ActionKind.F, 1), Action(0, ActionKind.B, 0),
                Action(0, ActionKind.B, 1), Action(0, ActionKind.U, 0)]}
    with pytest.raises(ScheduleError, match="back to back"):
        Schedule.build(name="x", devices=1, microbatches=2, actions=acts,
                       overlapped=[(Action(0, ActionKind.F, 0), Action(0, ActionKind.B, 0))])
    needs_it = Schedule.build(name="x", devices=1, microbatches=2, actions=acts,
                              overlapped=[(Action(0, ActionKind.F, 1), Action(0, ActionKind.B, 0))])
    needs_it.validate()  # 0B0 does not need 0F1: a valid pair
    own = Schedule.build(name="x", devices=1, microbatches=2,
                         actions={0: [Action(0, ActionKind.F, 0), Action(0, ActionKind.B, 0), Action(0, ActionKind.F, 1),
                                      Action(0, ActionKind.B, 1), Action(0, ActionKind.U, 0)]},
                         overlapped=[(Action(0, ActionKind.F, 0), Action(0, ActionKind.B, 0))])
    with pytest.raises(ScheduleError, match="needs the forward's result"):
        own.validate()


def test_overlapped_pairs_survive_csv_json_and_recompute(tmp_path):
    from sim.io.schedule_io import pytorch_rows, read_schedule_file, write_schedule_file

    s = schedules.dualpipev(2, 4)
    cells = [c for row in pytorch_rows(s) for c in row]
    assert "(0F3;3B1)OVERLAP_F_B" in cells  # fused on export, as PyTorch writes it
    back = read_schedule_file(write_schedule_file(s, tmp_path / "dpv.csv", "pytorch-csv"))
    assert set(back.overlapped) == set(s.overlapped)
    again = read_schedule_file(write_schedule_file(s, tmp_path / "dpv.json", "json"))
    assert again.overlapped == s.overlapped
    costs = uniform(4, forward=1, backward=1, weight=1)
    assert simulate(back, costs).metrics.makespan == simulate(s, costs).metrics.makespan
    rec = schedules.dualpipev(2, 4, recompute=True)  # R goes before the whole pair, which stays one unit
    assert len(rec.overlapped) == len(s.overlapped)
    assert simulate(rec, costs).metrics.makespan > 0
