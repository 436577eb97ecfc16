"""The batched evaluation engine: figures equal to simulate()'s, order and tags kept, rejections as rows,
the same rows from every executor (in process, worker processes, a Dask LocalCluster, an existing scheduler)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.search import batch
from sim import schedules
from sim.search.batch import BatchError, Candidate, Evaluation, evaluate, resolve_chunks
from sim.model.cost import uniform
from sim.errors import PipesimError, PipesimTypeError
from sim.model.hardware import Hardware
from sim.simulate import simulate

COSTS = dict(forward=1.0, backward=2.0, weight=0.5, activation_bytes=3.0, send_bytes=7.0, weight_bytes=5.0)


def grid() -> list[Candidate]:
    """A mixed bag: several schedules and shapes, links, memory caps, rejected configurations."""
    out = []
    for name in ("naive", "gpipe", "1f1b", "pipedream", "interleaved-1f1b", "zb-h1", "zbv"):
        for K in (1, 2, 4):
            for M in (1, 3, 8):
                chunks = resolve_chunks(name, None)
                costs = uniform(K, **COSTS)
                costs = costs.split_into_chunks(chunks) if chunks > 1 else costs
                hw = Hardware(devices=K, latency=0.1, bandwidth=70.0, memory_capacity=20.0)
                out.append(Candidate(schedule=name, devices=K, microbatches=M, costs=costs, hardware=hw,
                                     iterations=2 if name == "pipedream" else 1, tag=(name, K, M)))
    return out


def comparable(e: Evaluation) -> tuple:
    """An Evaluation as a tuple where NaN equals NaN (rejected rows carry NaN figures)."""
    return tuple("nan" if isinstance(v, float) and math.isnan(v) else v
                 for v in (e.tag, e.makespan, e.utilization, e.bubble_fraction, e.bubble_ratio, e.throughput,
                           e.peak_memory, e.peak_inflight, e.weight_versions, e.memory_overflows, e.error))


@pytest.fixture(scope="module")
def in_process() -> list[Evaluation]:
    return evaluate(grid())


def test_every_evaluation_equals_simulate(in_process):
    assert [e.tag for e in in_process] == [c.tag for c in grid()]
    ran = 0
    for c, e in zip(grid(), in_process):
        try:
            schedule = schedules.generate(c.schedule, c.devices, c.microbatches, iterations=c.iterations,
                                          chunks=resolve_chunks(c.schedule, None))
            m = simulate(schedule, c.costs, c.hardware).metrics
        except PipesimError as exc:
            assert e.error == str(exc).splitlines()[0] and math.isnan(e.makespan) and e.peak_memory == ()
            continue
        ran += 1
        assert e.ok and e.error == ""
        assert (e.makespan, e.utilization, e.bubble_fraction, e.bubble_ratio, e.throughput) == \
            (m.makespan, m.utilization, m.bubble_fraction, m.bubble_ratio, m.throughput)
        assert e.peak_memory == tuple(m.peak_memory) and len(e.peak_memory) == c.devices
        assert e.peak_inflight == tuple(m.peak_inflight)
        assert e.weight_versions == tuple(m.weight_versions)
        assert e.memory_overflows == len(m.memory_overflow)
    assert ran > 40 and sum(e.memory_overflows > 0 for e in in_process) > 0  # the cap is really exceeded somewhere
    assert sum(not e.ok for e in in_process) > 0  # and some shapes really are rejected


def test_worker_processes_give_the_same_rows(in_process):
    assert [comparable(e) for e in evaluate(grid(), jobs=2)] == [comparable(e) for e in in_process]


def test_dask_local_cluster_gives_the_same_rows(in_process):
    pytest.importorskip("distributed")
    assert [comparable(e) for e in evaluate(grid(), jobs=1, executor="dask")] == [comparable(e) for e in in_process]


def test_an_existing_dask_scheduler_gives_the_same_rows(in_process):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://")
        rows = evaluate(grid(), executor=f"dask={address}")
    assert [comparable(e) for e in rows] == [comparable(e) for e in in_process]


def test_defaults_are_the_classroom_case():
    e, = evaluate([Candidate(schedule="gpipe", devices=4, microbatches=4)])
    assert e.makespan == 21.0 and e.utilization == pytest.approx(4 / 7)  # (M+K-1)(F+B), F=1, B=2
    # chunked schedules: each chunk costs 1/chunks of the device's share, so the total work is the same
    v, = evaluate([Candidate(schedule="interleaved-1f1b", devices=4, microbatches=8)])
    one, = evaluate([Candidate(schedule="1f1b", devices=4, microbatches=8)])
    assert v.utilization * v.makespan == pytest.approx(one.utilization * one.makespan)
    assert v.makespan < one.makespan  # interleaving shrinks the bubble: (K-1)(F+B)/v


def test_rejections_are_rows_and_name_the_reason():
    rows = evaluate([
        Candidate(schedule="no-such-schedule", devices=2, microbatches=2, tag="name"),
        Candidate(schedule="gpipe", devices=2, microbatches=2, costs=uniform(3), tag="costs"),
        Candidate(schedule="gpipe", devices=2, microbatches=2, hardware=Hardware(devices=4), tag="hardware"),
        Candidate(schedule="interleaved-1f1b", devices=4, microbatches=3, tag="shape"),
        Candidate(schedule="gpipe", devices=0, microbatches=2, tag="K"),
        Candidate(schedule="gpipe", devices=2, microbatches=2, microbatch_size=0.0, tag="size"),
        Candidate(schedule="gpipe", devices=2, microbatches=2, tag="fine"),
    ])
    reasons = {e.tag: e.error for e in rows}
    assert reasons["name"].startswith("unknown schedule 'no-such-schedule'")
    assert "costs have 3 stages" in reasons["costs"]
    assert "hardware describes 4 devices" in reasons["hardware"]
    assert reasons["shape"] and reasons["K"] and "microbatch_size" in reasons["size"]
    assert reasons["fine"] == ""
    assert all("\n" not in r for r in reasons.values())


def test_wrong_arguments_are_refused_before_any_work():
    ok = Candidate(schedule="gpipe", devices=2, microbatches=2)
    with pytest.raises(BatchError, match="unknown executor"):
        evaluate([ok], executor="threads")
    with pytest.raises(BatchError, match="dask=tcp://HOST:PORT"):
        evaluate([ok], executor="dask=")
    for jobs in (0, -1, 1.5, True):
        with pytest.raises(BatchError, match="jobs"):
            evaluate([ok], jobs=jobs)
    with pytest.raises(BatchError, match="Candidate"):
        evaluate([("gpipe", 2, 2)])
    with pytest.raises(PipesimTypeError, match="costs"):
        evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2, costs={"forward": 1})])
    with pytest.raises(PipesimTypeError, match="hardware"):
        evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2, hardware="fast")])
    assert evaluate([]) == []


def test_an_unreachable_scheduler_is_one_clear_error(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(batch, "_CONNECT_TIMEOUT_S", 0.5)
    with pytest.raises(BatchError, match="cannot reach the Dask scheduler"):
        evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2)], executor="dask=tcp://127.0.0.1:9")


def test_a_bug_is_not_turned_into_a_row(monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(batch.schedules, "generate", broken)
    batch._schedule_cache.clear()
    with pytest.raises(ZeroDivisionError):
        evaluate([Candidate(schedule="gpipe", devices=2, microbatches=2)])


def test_schedules_are_generated_once_per_shape(monkeypatch):
    calls = []
    real = schedules.generate

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch.schedules, "generate", counting)
    batch._schedule_cache.clear()
    costs = [uniform(4, forward=f) for f in (0.5, 1.0, 2.0)]
    rows = evaluate([Candidate(schedule="1f1b", devices=4, microbatches=8, costs=c) for c in costs] +
                    [Candidate(schedule="1f1b", devices=4, microbatches=4, costs=c) for c in costs])
    assert calls == [("1f1b", 4, 8), ("1f1b", 4, 4)]
    assert [r.makespan for r in rows[:3]] == [(8 + 3) * (f + 2) for f in (0.5, 1.0, 2.0)]
    # a refused shape is remembered as refused, with the same reason
    again = evaluate([Candidate(schedule="interleaved-1f1b", devices=4, microbatches=3)] * 2)
    assert again[0].error and again[0].error == again[1].error


@given(n=st.integers(1, 5000), workers=st.integers(1, 64))
def test_batches_cover_every_candidate_once_in_order(n, workers):
    cuts = batch._batches(n, workers)
    assert cuts[0][0] == 0 and cuts[-1][1] == n
    assert all(a < b for a, b in cuts) and all(b == a2 for (_, b), (a2, _) in zip(cuts, cuts[1:]))
    assert max(b - a for a, b in cuts) <= batch._MAX_BATCH
    if workers > 1 and n >= workers:
        assert len(cuts) >= workers  # every worker has something to do


def test_chunks_resolve_to_what_each_schedule_is_built_for():
    assert resolve_chunks("1f1b", None) == 1 and resolve_chunks("zbv", None) == 2
    assert resolve_chunks("interleaved-1f1b", None) == 2 and resolve_chunks("interleaved-1f1b", 3) == 3


def test_a_large_run_goes_compiled_and_gives_the_same_floats(monkeypatch):
    pytest.importorskip("numba")
    from sim import jit
    from sim.core import listsched
    from sim.engines import fastpath

    cands = [Candidate(schedule=s, devices=k, microbatches=m, tag=(s, k, m))
             for s in ("1f1b", "zb-h1") for k in (2, 4) for m in range(4, 20)]
    monkeypatch.setattr(batch, "_COMPILE_FROM_ACTIONS", 1000)  # this grid has ~9 k actions in all
    seen = []
    real = listsched.list_schedule

    def spy(flat, *args):
        seen.append(jit.compile_min_actions())
        return real(flat, *args)

    monkeypatch.setattr(fastpath, "list_schedule", spy)
    compiled = evaluate(cands)
    assert seen and set(seen) == {0} and jit.compile_min_actions() > 0  # restored afterwards
    assert "numba" in __import__("sys").modules  # loaded, so the fast path picks the compiled kernel
    seen.clear()
    interpreted = [evaluate([c])[0] for c in cands]  # one at a time: the interpreted kernel
    assert seen and 0 not in seen
    assert [comparable(e) for e in compiled] == [comparable(e) for e in interpreted]
