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
from sim.model.estimate import EstimateError, Parallelism, data_parallel_sync_time, estimate, pipeline_hardware
from sim.model.models import ModelSpec
from sim.search.planner import PlanError, PlanSpace, pareto_front, plan, simulate_candidate
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
                            grads = [0.0] * p
                            for st, g in zip(s.placement, est.costs.grad_bytes):
                                grads[st] += g
                            time = res.metrics.makespan + data_parallel_sync_time(max(grads), par, GPU)
                            if time < best[0]:
                                best = (time, (name, p, t, d, b, M, v, r))
    return best


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
    assert len(result.ranked) + len(result.rejected) == result.candidates
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
    assert result.winner is None and result.ranked.empty and "no candidate fits" in result.explanation[0]


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
    assert data["candidates"] == data["feasible"] + data["rejected"]
    for name in ("ranked.csv", "rejected.csv", "pareto.csv", "pareto.png", "winner_gantt.png", "plan.json"):
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
