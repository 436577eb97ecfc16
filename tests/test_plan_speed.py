"""The planner's speed-ups change nothing: grouped evaluation, derived recompute variants, placements from the cache.

``sim.search.batch.evaluate`` runs candidates grouped by schedule shape and hands the rows back in the caller's
order; a recomputing schedule is its cached recompute-free twin through the recompute pass; the planner's stage
placements come from the smallest schedule of a shape, through the same cache. Each test compares with the plain
path (``schedules.generate`` per candidate, in the order given) and fails if the shortcut differs.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.model import gpus, models
from sim.model.models import ModelSpec
from sim.search import batch, plan_memory
from sim.search.batch import Candidate, cached_schedule, evaluate, resolve_chunks
from sim.search.planner import PlanSpace, plan


def _same_schedule(a, b) -> None:
    assert a.name == b.name and a.devices == b.devices and a.microbatches == b.microbatches
    assert tuple(a.placement) == tuple(b.placement)
    assert a.keys_array.tolist() == b.keys_array.tolist()
    assert a.device_start.tolist() == b.device_start.tolist()
    assert sorted(map(int, a.fused)) == sorted(map(int, b.fused))


@pytest.mark.parametrize("name", schedules.names())
def test_recompute_variant_from_the_cache_is_generates_own(name):
    """No generator reads `recompute`: the cached twin through the recompute pass is the generated schedule."""
    chunks = resolve_chunks(name, None)
    for K, M in ((1, 2), (2, 4), (3, 6), (4, 8)):
        try:
            want = schedules.generate(name, K, M, recompute=True, chunks=chunks)
        except ValueError:
            continue
        _same_schedule(cached_schedule(name, K, M, chunks, recompute=True), want)


@pytest.mark.parametrize("name", schedules.names())
def test_placement_from_the_smallest_schedule(name):
    """The placement kept per shape is the one of any M (here 2pv and 3pv, the old probe size and another)."""
    chunks = resolve_chunks(name, None)
    plan_memory.placements_cache.clear()
    for p in (1, 2, 3, 5, 8):
        got = plan_memory.stage_placement(name, p, chunks)
        for M in (2 * p * chunks, 3 * p * chunks):
            assert got == tuple(schedules.generate(name, p, M, chunks=chunks).placement)


def test_rows_come_back_in_the_order_given():
    """Candidates of interleaved shapes, evaluated grouped, come back in the caller's order (a wrong
    un-permutation swaps tags)."""
    rng = random.Random(7)
    shapes = [("1f1b", 4, 8), ("gpipe", 2, 4), ("zb-h1", 4, 4), ("interleaved-1f1b", 2, 4), ("1f1b", 2, 4)]
    cands = [Candidate(schedule=s, devices=K, microbatches=M, recompute=rng.random() < 0.5, tag=i)
             for i, (s, K, M) in enumerate(rng.choice(shapes) for _ in range(40))]
    rows = evaluate(cands)
    assert [r.tag for r in rows] == list(range(40))
    for c, r in zip(cands, rows):
        alone = evaluate([c])[0]
        assert (r.makespan, r.peak_memory, r.error) == (alone.makespan, alone.peak_memory, alone.error)


def _plain_path(monkeypatch) -> None:
    """The path before the speed-ups: generate per look-up, nothing derived, candidates in the order given."""
    def generate_each(name, devices, microbatches, chunks, iterations=1, recompute=False):
        try:
            return schedules.generate(name, devices, microbatches, iterations=iterations, recompute=recompute,
                                      chunks=chunks).validate()
        except ValueError as exc:
            return exc
    monkeypatch.setattr(batch, "_cached", generate_each)
    monkeypatch.setattr(batch, "_shape_key", lambda c: ())
    monkeypatch.setattr(plan_memory, "placements_cache", {})


def test_ranked_plan_is_identical_to_the_plain_path(monkeypatch):
    """A small model's whole plan (ranked, rejected, explanation) is the same with and without the speed-ups."""
    model = ModelSpec(name="small", layers=12, hidden=1024, heads=16, vocab=32000, seq_len=1024)
    space = PlanSpace(schedules=tuple(schedules.names()), pipeline=(1, 2, 4), tensor=(1, 2),
                      microbatch_sizes=(1, 2, 4), chunks=(2, 3))
    gpu = gpus.get_gpu("a100-80gb")
    fast = plan(model, gpu, gpus=8, global_batch=32, space=space, memory_cap=6e9)
    with monkeypatch.context() as m:
        _plain_path(m)
        slow = plan(model, gpu, gpus=8, global_batch=32, space=space, memory_cap=6e9)
    assert len(fast.ranked) > 5 and len(fast.rejected) > 5
    assert fast.ranked.equals(slow.ranked)
    assert fast.rejected.equals(slow.rejected)
    assert fast.explanation == slow.explanation


def _least_squares_loop(prefix, K, cap):
    """The loop the vectorised least-variance split replaced (sim/model/partition.py before issue 25's speed work)."""
    from bisect import bisect_left
    import math

    L = len(prefix) - 1
    sq = [[math.inf] * (L + 1) for _ in range(K + 1)]
    cut = [[-1] * (L + 1) for _ in range(K + 1)]
    sq[0][0] = 0.0
    for k in range(1, K + 1):
        for j in range(k, L - (K - k) + 1):
            first = bisect_left(prefix, prefix[j] - cap, k - 1, j)
            for i in range(first, j):
                t = prefix[j] - prefix[i]
                if t <= cap and sq[k - 1][i] + t * t < sq[k][j]:
                    sq[k][j], cut[k][j] = sq[k - 1][i] + t * t, i
    bounds, j = [], L
    for k in range(K, 0, -1):
        i = cut[k][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


@settings(max_examples=300, deadline=None)
@given(costs=st.lists(st.one_of(st.integers(0, 5).map(float), st.floats(0, 10, allow_nan=False)), min_size=1,
                      max_size=40),
       K=st.integers(1, 12))
def test_least_variance_split_is_the_loops(costs, K):
    """The vectorised DP gives the loop's split, ties (equal layers, zero costs) included."""
    from itertools import accumulate

    from sim.model import partition

    if K > len(costs):
        return
    prefix = [0.0] + list(accumulate(costs))
    cap = partition._bottleneck(prefix, K)
    cap = cap * (1 + 1e-12) + 1e-300
    assert partition._least_squares_cuts(prefix, K, cap) == _least_squares_loop(prefix, K, cap)


def test_a_non_bool_recompute_is_a_typed_error_not_a_traceback():
    """Issue 25 bug b: Candidate(recompute="yes") reached schedules.generate and raised a bare TypeError there."""
    from sim.errors import PipesimError
    from sim.search.batch import Candidate, evaluate

    for bad in ("yes", 1, None, 0.0):
        with pytest.raises(PipesimError, match="recompute") as info:
            evaluate([Candidate(schedule="1f1b", devices=4, microbatches=8, recompute=bad)])
        assert isinstance(info.value, TypeError)  # a PipesimTypeError: both a PipesimError and a TypeError
    import numpy as np

    rows = evaluate([Candidate(schedule="1f1b", devices=4, microbatches=8, recompute=r)
                     for r in (True, np.bool_(True), False)])
    assert rows[0].makespan == rows[1].makespan and rows[0].ok and rows[2].ok
