"""The planner: its winner is brute force's, nothing over the cap is ranked, every rejection has the right reason."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.schedules import registry as generators
from sim.model import gpus
from sim import schedules
from sim.search.batch import resolve_chunks
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.cli import main
from sim.errors import PipesimError
from sim.model.estimate import EstimateError, Parallelism, estimate, pipeline_hardware
from sim.model.models import ModelSpec
from sim.model.efficiency import optimizer_step_time
from sim.search.gradient_sync import exposed_gradient_sync, megatron_bucket_bytes
from sim.search.planner import PlanError, PlanSpace, asynchronous_schedule, pareto_front, plan, simulate_candidate
from sim.simulate import simulate

MODEL = ModelSpec(name="toy", layers=8, hidden=512, heads=8, kv_heads=4, ffn=1536, vocab=4096, seq_len=256,
                  gated_mlp=True, dropout=False)
GPU = gpus.get_gpu("a100-80gb")
SPACE = PlanSpace(schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv"), tensor=(1, 2),
                  microbatch_sizes=(1, 2, 4), chunks=(2,), recompute=("none", "selective", "full"))
N, G = 8, 32


def _brute_force(cap: float, space: PlanSpace = SPACE):
    """Every combination, estimated and simulated directly (no bounds, no batching): (time, config) of the best."""
    best = (math.inf, None)
    for name in space.schedules:
        from sim.search.batch import resolve_chunks
        from sim.schedules import registry as generators
        fixed = getattr(generators.get_generator(name), "CHUNKS", 1)
        for t in space.tensor:
            for p in (1, 2, 4, 8):
                if N % (t * p):
                    continue
                d = N // (t * p)
                for b in space.microbatch_sizes:
                    if G % (d * b):
                        continue
                    M = G // (d * b)
                    for v in ((resolve_chunks(name, None),) if fixed else space.chunks):
                        for r in space.recompute:
                            par = Parallelism(tensor=t, sequence_parallel=t > 1, pipeline=p, chunks=v, data=d,
                                              microbatch_size=b, recompute=r, zero1=True)
                            try:
                                est = estimate(MODEL, GPU, par)
                                s = schedules.generate(name, p, M, recompute=r == "full", chunks=v)
                            except (EstimateError, PipesimError):
                                continue
                            res = simulate(s, est.costs, pipeline_hardware(GPU, par))
                            if max(res.metrics.peak_memory) > cap:
                                continue
                            time = res.metrics.makespan + _overlapped_sync(res, est, par) + _optimizer(est, s, par)
                            if time < best[0]:
                                best = (time, (name, p, t, d, b, M, v, r))
    return best


def _overlapped_sync(res, est, par) -> float:
    """The exposed gradient reduction, computed directly from the candidate's own timeline (no bounds)."""
    if par.data == 1:
        return 0.0
    bandwidth, latency = GPU.link(cross_node=par.tensor * par.data > GPU.gpus_per_node)
    return exposed_gradient_sync(res, list(est.costs.grad_bytes), data=par.data, bandwidth=bandwidth,
                                 latency=latency, bucket_bytes=megatron_bucket_bytes(par.data, MODEL.dtype_bytes),
                                 distributed_optimizer=par.zero1).exposed


def _optimizer(est, s, par) -> float:
    params = [0.0] * par.pipeline
    for stage, w in zip(s.placement, est.costs.weight_bytes):
        params[stage] += w / MODEL.dtype_bytes
    return optimizer_step_time(GPU, max(params) / (par.data if par.zero1 else 1))


@pytest.fixture(scope="module")
def peaks():
    """The peak memories the unconstrained plan sees: caps are chosen between them, so each one bites."""
    return plan(MODEL, GPU, gpus=N, global_batch=G, space=SPACE).ranked["peak_memory"].sort_values().to_numpy()


@pytest.mark.parametrize("quantile", [1.0, 0.5, 0.1, 0.02])
def test_winner_equals_brute_force_and_fits(peaks, quantile):
    cap = float(peaks[int(quantile * (len(peaks) - 1))])
    result = plan(MODEL, GPU, gpus=N, global_batch=G, memory_cap=cap, space=SPACE)
    time, config = _brute_force(cap)
    w = result.winner
    assert w["iteration_time"] == pytest.approx(time, rel=1e-12)
    got = (w["schedule"], w["pipeline"], w["tensor"], w["data"], w["microbatch_size"], w["microbatches"],
           w["chunks"], w["recompute"])
    if got != config:  # a tie is allowed, but only an exact one
        assert w["iteration_time"] == time
    assert (result.ranked["peak_memory"] <= cap).all() and w["peak_memory"] <= cap
    assert max(b["peak"] for b in w["memory_breakdown"]) == pytest.approx(w["peak_memory"])
    assert len(result.ranked) + len(result.asynchronous) + len(result.rejected) == result.candidates
    assert result.ranked["iteration_time"].is_monotonic_increasing


def test_memory_bound_is_sound(peaks):
    """Every candidate the cheap bound rejects really is over the cap when simulated."""
    cap = float(peaks[len(peaks) // 4])
    result = plan(MODEL, GPU, gpus=N, global_batch=G, memory_cap=cap, space=SPACE)
    bounded = result.rejected[result.rejected["stage"] == "memory bound"]
    assert len(bounded) > 0
    simulated = result.rejected[result.rejected["stage"] == "simulated"]
    assert len(simulated) > 0 and (simulated["peak_memory"] > cap).all()
    for _, row in simulated.iterrows():
        assert f"over memory by {(row['peak_memory'] - cap) / 2**30:.1f} GiB" in row["reason"]
    for _, row in bounded.iterrows():
        try:
            res = simulate_candidate(MODEL, GPU, row.to_dict(), SPACE, memory_cap=cap)
        except PipesimError:
            continue  # its schedule refuses it as well
        assert max(res.metrics.peak_memory) > cap, row.to_dict()


def test_rejection_reasons():
    small_nodes = replace(GPU, gpus_per_node=2)
    result = plan(MODEL, small_nodes, gpus=12, global_batch=G, memory_cap=1.2e8,
                  space=PlanSpace(schedules=("1f1b", "interleaved-1f1b"), tensor=(1, 2, 4), microbatch_sizes=(1, 4),
                                  chunks=(2, 8), recompute=("none",), pipeline=(1, 2, 3, 8)))
    rej = result.rejected
    def reasons(**where):
        rows = rej
        for k, v in where.items():
            rows = rows[rows[k] == v]
        return set(rows["reason"])
    assert any("not divisible into t x p = 16" in r for r in reasons(tensor=2, pipeline=8))
    assert any("global batch 32 is not divisible by d x b = 12" in r for r in reasons(tensor=1, pipeline=1))
    assert any("spans nodes of 2" in r for r in reasons(tensor=4, pipeline=3))
    assert any("24 stages (p x v) but the model has 8 layers" in r for r in reasons(pipeline=3, chunks=8, tensor=1))
    assert any("multiple of the devices" in r for r in reasons(schedule="interleaved-1f1b", pipeline=3))
    assert set(rej["stage"]) >= {"static", "schedule"}
    assert set(rej["stage"]) & {"simulated", "memory probe"}  # over the cap once simulated (or its probe is)
    for reason in rej[rej["stage"] == "memory probe"]["reason"]:
        assert reason.startswith("over memory")
    simulated = rej[rej["stage"] == "simulated"]
    assert (simulated["peak_memory"] > 1.2e8).all()
    for _, row in simulated.iterrows():
        over = (row["peak_memory"] - 1.2e8) / 2**30
        assert f"over memory by {over:.1f} GiB" in row["reason"]


def test_nothing_fits_gives_no_winner():
    result = plan(MODEL, GPU, gpus=N, global_batch=G, memory_cap=1e6, space=SPACE)
    assert result.winner is None and result.ranked.empty and "no synchronous candidate fits" in result.explanation[0]
    assert "memory" in result.explanation[0]


def test_pareto_front_is_exactly_the_undominated():
    ranked = plan(MODEL, GPU, gpus=N, global_batch=G, space=SPACE).ranked
    front = pareto_front(ranked)
    pts = list(zip(ranked["peak_memory"], ranked["iteration_time"]))
    def dominated(m, t): return any(m2 <= m and t2 <= t and (m2, t2) != (m, t) for m2, t2 in pts)
    for m, t in zip(front["peak_memory"], front["iteration_time"]):
        assert not dominated(m, t)
    front_pts = set(zip(front["peak_memory"], front["iteration_time"]))
    for m, t in pts:
        assert (m, t) in front_pts or dominated(m, t)


def test_bad_plans_are_typed():
    with pytest.raises(PlanError, match="unknown schedule"):
        PlanSpace(schedules=("nope",))
    with pytest.raises(PlanError, match="recompute"):
        PlanSpace(recompute=("sometimes",))
    with pytest.raises(PlanError, match="gpus"):
        plan(MODEL, GPU, gpus=0, global_batch=G)


def test_cli_plan_writes_tables_and_figures(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                 "--seq-len", "2048", "--schedules", "1f1b,zbv", "--tensor-parallel", "1,2", "--microbatch-size",
                 "1,2", "--memory-cap", "40e9", "--top", "3", "--no-progress", "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ranked"]) == 3 and data["winner"]["peak_memory"] <= 40e9
    assert data["candidates"] == data["feasible"] + data["asynchronous_feasible"] + data["rejected"]
    assert "--num-layers 32 " in data["launch"]["megatron"] and data["launch"]["pytorch_csv"]
    for name in ("ranked.csv", "rejected.csv", "pareto.csv", "pareto.png", "winner_gantt.png", "plan.json",
                 "schedule.csv", "asynchronous.csv"):
        assert (out / name).stat().st_size > 0
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                 "--seq-len", "2048", "--schedules", "1f1b", "--tensor-parallel", "1", "--microbatch-size", "1",
                 "--no-progress", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "wins:" in text and "weights + grads" in text
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                 "--schedules", "nope", "-o", str(out)]) == 2
    assert "unknown schedule" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(generators.names()), k=st.integers(1, 4), level=st.integers(1, 4),
       extra=st.integers(0, 6), recompute=st.booleans(), data=st.data())
def test_peak_memory_never_falls_as_m_grows(name, k, level, extra, recompute, data):
    """The planner's memory probes rely on it: per device, the peak with M micro-batches is at least the peak with
    a probe's level x p x v <= M (for every registered schedule, any per-stage bytes and times)."""
    chunks = resolve_chunks(name, None)
    m_probe = level * k * chunks
    m = m_probe + extra * k  # a multiple of p, as interleaving needs
    try:
        small = schedules.generate(name, k, m_probe, recompute=recompute, chunks=chunks)
        big = schedules.generate(name, k, m, recompute=recompute, chunks=chunks)
    except PipesimError:
        return
    n = small.stages
    floats = st.floats(0.1, 10.0)
    costs = uniform(n)
    costs = type(costs)(forward=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        backward=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        weight=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        activation_bytes=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        checkpoint_bytes=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        weight_bytes=data.draw(st.lists(floats, min_size=n, max_size=n)),
                        send_bytes=1.0)
    hw = Hardware(devices=k, latency=data.draw(st.floats(0, 2)), bandwidth=1.0)
    low, high = simulate(small, costs, hw).metrics.peak_memory, simulate(big, costs, hw).metrics.peak_memory
    assert all(h >= l - 1e-9 for l, h in zip(low, high)), (low, high)


def test_memory_probe_rejections_are_sound():
    """A candidate the probe rejects really is over the cap when simulated with its own M."""
    cap = 3.0e8
    result = plan(MODEL, GPU, gpus=N, global_batch=128, memory_cap=cap, space=SPACE)
    probed = result.rejected[result.rejected["stage"] == "memory probe"]
    assert len(probed) > 0
    for _, row in probed.head(15).iterrows():
        res = simulate_candidate(MODEL, GPU, row.to_dict(), SPACE, memory_cap=cap)
        assert max(res.metrics.peak_memory) > cap


def test_twin_rejections_are_sound():
    """A no-recompute candidate rejected because its selective twin is over the cap is over the cap itself."""
    cap = 1.5e8
    result = plan(MODEL, GPU, gpus=N, global_batch=G, memory_cap=cap, space=SPACE)
    twins = result.rejected[result.rejected["reason"].str.contains("twin")]
    assert len(twins) > 0 and (twins["recompute"] == "none").all()
    for _, row in twins.head(15).iterrows():
        res = simulate_candidate(MODEL, GPU, row.to_dict(), SPACE, memory_cap=cap)
        assert max(res.metrics.peak_memory) > cap


def test_asynchronous_schedules_are_ranked_apart_and_never_win():
    """PipeDream and 2BW train on stale weights: a separate table, flagged, even when they are faster."""
    assert [n for n in generators.names() if asynchronous_schedule(n)] == ["pipedream", "pipedream-2bw"]
    space = replace(SPACE, schedules=("1f1b", "pipedream", "pipedream-2bw"), tensor=(1,), recompute=("none",))
    result = plan(MODEL, GPU, gpus=N, global_batch=G, space=space)
    assert set(result.asynchronous["schedule"]) == {"pipedream", "pipedream-2bw"}
    assert set(result.ranked["schedule"]) == {"1f1b"} and result.winner["schedule"] == "1f1b"
    assert len(result.ranked) + len(result.asynchronous) + len(result.rejected) == result.candidates


def test_a_plan_whose_candidates_all_break_divisibility_says_so_and_exits_2(tmp_path, capsys):
    """Issue 26 item 9: 768 GPUs and global batch 1024 rejected every candidate but blamed memory, exit 0."""
    with pytest.raises(PlanError, match=r"all \d+ candidates are impossible before any estimate: \d+ because "
                                        r"global batch 1024 is not divisible"):
        plan(MODEL, GPU, gpus=768, global_batch=1024, space=SPACE)
    out = tmp_path / "plan"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "768", "--global-batch", "1024",
                 "--tensor-parallel", "1", "--pipeline-parallel", "1", "--no-progress", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipesim: error: all ") and "memory" not in err[0]
    assert not out.exists()  # refused before anything was written


def test_unwritable_output_is_refused_before_the_search(tmp_path, capsys, monkeypatch):
    """Issue 26 item 9: `plan -o` that cannot be written failed only after the whole search."""
    import sim.cli.plan as cli_plan

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran before the output was checked")
    monkeypatch.setattr(cli_plan, "plan", no_search)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                 "--no-progress", "-o", str(blocker / "plan")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file, not a folder" in err[0]


def test_the_overlapped_gradient_reduction_is_exact_for_the_winner_and_bounded_for_the_rest():
    result = plan(MODEL, GPU, gpus=N, global_batch=G, space=SPACE)
    ranked = result.ranked
    w = result.winner
    assert w["dp_overlap"] == "simulated" and result.refined >= 1
    assert 0 <= w["dp_exposed"] <= w["dp_sync"] + 1e-15
    # every row not re-simulated could not have been first or second: its lower bound is no better
    assert (ranked["dp_overlap"].iloc[:2] == "simulated").all()
    rest = ranked[ranked["dp_overlap"] == "bound"]
    assert (rest["makespan"] + rest["optimizer"] >= ranked["iteration_time"].iloc[1] - 1e-15).all()
    simulated = ranked[ranked["dp_overlap"] == "simulated"]
    assert (simulated["iteration_time"] <= simulated["makespan"] + simulated["dp_sync"] + simulated["optimizer"]
            + 1e-15).all()


def test_gradient_buckets_overlap_the_backward_and_a_late_bucket_shows():
    """One stage, two buckets: the first reduces while the backward runs, only the tail shows; with one huge
    bucket everything waits for the end of the backward (the injected 'no overlap' case)."""
    from sim.model.cost import StageCosts

    s = schedules.generate("1f1b", 2, 2)
    costs = StageCosts(forward=[1.0, 1.0], backward=[2.0, 2.0], grad_bytes=[8e9, 8e9])
    res = simulate(s, costs)
    grads = [8e9, 8e9]
    ring = 2 * (4 - 1) * (4e9 / 4 / 1e9)  # a 4-replica ring of one 4e9-byte bucket at 1e9 B/s: 6 s
    split = exposed_gradient_sync(res, grads, data=4, bandwidth=1e9, latency=0.0, bucket_bytes=4e9,
                                  distributed_optimizer=False)
    whole = exposed_gradient_sync(res, grads, data=4, bandwidth=1e9, latency=0.0, bucket_bytes=1e12,
                                  distributed_optimizer=False)
    assert whole.exposed == pytest.approx(2 * ring) and whole.buckets == 1
    # stage 0's last backward runs [7, 9] (makespan 9): its first half of gradients is final at 8, so its first
    # bucket reduces over [8, 14] and the second over [14, 20]: 11 s show instead of 12
    assert res.metrics.makespan == 9.0
    assert split.buckets == 2 and split.exposed == pytest.approx(11.0)
    zero = exposed_gradient_sync(res, grads, data=4, bandwidth=1e9, latency=0.0, bucket_bytes=4e9,
                                 distributed_optimizer=True)
    assert zero.exposed == pytest.approx(5.0)  # reduce-scatters of half a ring each: [8, 11], [11, 14]
    assert zero.allgather == pytest.approx(ring)  # the parameters' all-gather, overlapped with the next forward


def test_uneven_end_stages_are_reported_and_can_be_what_fits():
    """A large output layer: the balanced split gives the last stage fewer blocks; the plan compares it with the
    even split and says when only the uneven one fits the cap."""
    big_vocab = replace(MODEL, vocab=65536, layers=8)
    space = PlanSpace(schedules=("1f1b",), tensor=(1,), pipeline=(4,), microbatch_sizes=(1,), recompute=("none",))
    loose = plan(big_vocab, GPU, gpus=4, global_batch=8, space=space)
    split = loose.winner["even_split"]
    assert split["uneven"] and split["layers_per_stage"][-1] < split["even_layers_per_stage"][-1]
    assert sum(split["layers_per_stage"]) == big_vocab.layers
    winner_peak = loose.winner["peak_memory"]
    assert split["even_peak_memory"] > winner_peak
    cap = (winner_peak + split["even_peak_memory"]) / 2  # between the two: only the uneven split fits
    tight = plan(big_vocab, GPU, gpus=4, global_batch=8, space=space, memory_cap=cap)
    assert tight.winner["even_split"]["fits_only_uneven"]
    assert any("fits only because of the uneven split" in line for line in tight.explanation)


def test_probe_peaks_scale_with_the_microbatch_size_exactly():
    """The planner probes one micro-batch size per group and scales the others (_probe_group): here every probe of
    the test space is also simulated, and the scaled peaks equal the simulated ones."""
    from sim.search import plan_memory
    from sim.search import planner as P
    from sim.search.batch import evaluate

    space = replace(SPACE, microbatch_sizes=(1, 2, 4), recompute=("none", "selective", "full"))
    rejected, pending, _ = P._screen(MODEL, GPU, N, 64, space, None, 1e12)
    candidates, _ = P._candidates(pending, GPU, space, 1e12)
    groups, checked = {}, 0
    for c in candidates:
        m = c.devices * resolve_chunks(c.schedule, c.chunks)
        key = plan_memory.probe_group(c, m)
        if key is not None:
            groups.setdefault(key, []).append(replace(c, microbatches=m))
    for members in groups.values():
        if len(members) < 2:
            continue
        evs = evaluate(members)
        if any(ev.error for ev in evs):
            continue
        rep, rep_ev = members[0], evs[0]
        for c, ev in zip(members[1:], evs[1:]):
            factor = c.microbatch_size / rep.microbatch_size
            scaled = [s + (p - r) * factor for p, s, r in
                      zip(rep_ev.peak_memory, plan_memory.static_bytes(c), plan_memory.static_bytes(rep))]
            assert scaled == pytest.approx(list(ev.peak_memory), rel=1e-12)
            checked += 1
    assert checked > 10


def test_a_candidate_over_the_cap_is_re_split_by_memory_and_says_so():
    """1F1B keeps p - k micro-batches in flight on stage k: under a cap the balanced [4, 4, 4, 4] split breaks on
    device 0, and fewer blocks there fit. The re-split candidate is simulated exactly, ranked with its split, and
    launched with it; without the re-split nothing would fit (the injected 'no re-split' case)."""
    from sim.search import planner as P

    deep = replace(MODEL, layers=16)
    space = PlanSpace(schedules=("1f1b",), tensor=(1,), pipeline=(4,), microbatch_sizes=(8,), recompute=("none",))
    loose = plan(deep, GPU, gpus=4, global_batch=64, space=space)
    assert loose.winner["layers_per_stage"] == [4, 4, 4, 4] and loose.resplit == 0
    cap = 0.85 * loose.winner["peak_memory"]
    tight = plan(deep, GPU, gpus=4, global_batch=64, space=space, memory_cap=cap)
    w = tight.winner
    assert tight.resplit == 1 and w["split"] and w["peak_memory"] <= cap
    split = [int(n) for n in w["split"].split(",")]
    assert split[0] < 4 and sum(split) == 16 and w["layers_per_stage"] == split
    res = simulate_candidate(deep, GPU, w, space, memory_cap=cap)  # the split survives the round trip
    assert max(res.metrics.peak_memory) == pytest.approx(w["peak_memory"])
    assert any("split to fit memory" in line for line in tight.explanation)
    assert any("fits only because of the uneven split" in line for line in tight.explanation)
    assert len(tight.ranked) + len(tight.asynchronous) + len(tight.rejected) == tight.candidates
    saved = P.MAX_RESPLIT
    P.MAX_RESPLIT = 0
    try:
        assert plan(deep, GPU, gpus=4, global_batch=64, space=space, memory_cap=cap).winner is None
    finally:
        P.MAX_RESPLIT = saved
