"""The executor on every kind of schedule, all ranks in one process (threads + queues; no torch.distributed).

Gradients of flush schedules must equal one-process training on the whole mini-batch;
PipeDream's weights must equal the one-process emulation of weight stashing; random
valid orders (any placement, split backward, recompute) must run without deadlock
and give the same gradients.
"""

import random

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim.schedules import registry as generators
from sim import schedules  # noqa: E402
from sim.model.cost import uniform  # noqa: E402
from sim.core.ir import Action, ActionKind, Schedule  # noqa: E402
from validate.rank.inprocess import run_in_process  # noqa: E402
from validate.correctness.reference import emulate_updates, max_difference, reference_grads  # noqa: E402
from validate.rank.tracing import measured_timeline  # noqa: E402
from validate.rank.workloads import WorkloadSpec  # noqa: E402

SPEC = WorkloadSpec(name="mlp", width=8, depth=1, batch=3, seed=3)


def _grads_of(result):
    assert not result["errors"], result["errors"]
    return {s: log[0] for r in result["ranks"] for s, log in r.grads.items()}


def _weights_of(result):
    """stage -> the weights after the last update."""
    return {s: log[-1] for r in result["ranks"] for s, log in r.weights.items()}


def _final(log):
    """stage -> the last weights of a reference :class:`UpdateLog`, in float32 like the run's."""
    return {s: {k: v.float() for k, v in log.weights[s][-1].items()} for s in log.weights}


def _assert_close(got, ref, atol=1e-6):
    for s in ref:
        for k in ref[s]:
            torch.testing.assert_close(got[s][k], ref[s][k], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("name,K,M,recompute", [
    ("naive", 2, 3, False), ("gpipe", 2, 4, False), ("gpipe", 2, 4, True), ("1f1b", 2, 4, False),
    ("1f1b", 3, 4, False), ("gpipe", 4, 3, True),
])
def test_flush_schedules_give_one_process_gradients(name, K, M, recompute):
    sched = schedules.generate(name, K, M, recompute=recompute)
    got = _grads_of(run_in_process(sched, SPEC))
    _assert_close(got, reference_grads(SPEC, K, M))


def test_reference_is_not_trivially_equal():
    # the check can fail: other data (another seed) gives other gradients
    a = reference_grads(SPEC, 2, 4)
    b = reference_grads(WorkloadSpec(name="mlp", width=8, depth=1, batch=3, seed=4), 2, 4)
    assert max_difference(a, b)[0] > 1e-3


def test_pipedream_follows_weight_stashing_and_drifts_from_sync_sgd():
    sched = schedules.pipedream(3, 2, iterations=2)
    result = run_in_process(sched, SPEC)
    assert not result["errors"]
    got = _weights_of(result)
    stash = _final(emulate_updates(SPEC, sched, semantics="stash"))
    _assert_close(got, stash, atol=1e-5)
    sync = _final(emulate_updates(SPEC, sched, semantics="sync"))
    assert max_difference(got, sync)[0] > 1e-5  # stashing really differs from synchronous SGD here
    # stage 0 held more than one weight version at some point: the stash is exercised
    assert max_difference(got, {s: {k: v * 0 for k, v in w.items()} for s, w in got.items()})[0] > 0


def test_several_iterations_match_sgd_emulation():
    sched = schedules.one_f_one_b(2, 2, iterations=3)
    got = _weights_of(run_in_process(sched, SPEC))
    _assert_close(got, _final(emulate_updates(SPEC, sched)), atol=1e-5)


def _random_schedule(rng: random.Random, K: int, placement, M: int, split: bool, recompute: bool) -> Schedule:
    """Any valid order: a random topological sort of the derived dependency graph."""
    S = len(placement)
    acts = []
    for m in range(M):
        for s in range(S):
            acts += [Action(s, ActionKind.F, m), Action(s, ActionKind.B, m)]
            if split:
                acts.append(Action(s, ActionKind.W, m))
            if recompute:
                acts.append(Action(s, ActionKind.R, m))
    acts += [Action(s, ActionKind.U, 0) for s in range(S)]
    probe = Schedule.build(name="probe", devices=K, microbatches=M, placement=placement,
                           actions={d: [a for a in acts if placement[a.stage] == d] for d in range(K)})
    deps = {a: set(probe.dependencies(a)) for a in acts}
    done, order = set(), {d: [] for d in range(K)}
    todo = list(acts)
    while todo:
        ready = [a for a in todo if deps[a] <= done]
        a = rng.choice(ready)
        todo.remove(a)
        done.add(a)
        order[placement[a.stage]].append(a)
    return Schedule.build(name="random", devices=K, microbatches=M, placement=placement, actions=order).validate()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([
    (2, (0, 1)), (2, (0, 1, 0, 1)), (2, (0, 1, 1, 0)), (3, (0, 1, 2)), (2, (0, 0, 1))]),
    M=st.integers(1, 3), split=st.booleans(), recompute=st.booleans())
def test_any_valid_order_runs_and_gives_the_same_gradients(seed, shape, M, split, recompute):
    K, placement = shape
    sched = _random_schedule(random.Random(seed), K, placement, M, split, recompute)
    result = run_in_process(sched, SPEC, timeout=20)
    _assert_close(_grads_of(result), reference_grads(SPEC, len(placement), M))
    tl = measured_timeline(sched, [r.traces[0] for r in result["ranks"]], [0.0] * K)
    comp = tl[tl["src"] < 0]
    assert len(comp) == len(sched)  # every action ran once
    sends = tl[tl["src"] >= 0]
    # a transfer for exactly the dependencies that cross devices (none when the next stage is local)
    assert len(sends) == len(sched.compiled.sends)


def test_emulated_stages_wait_their_costs():
    sched = schedules.gpipe(2, 2)
    costs = uniform(2, forward=0.01, backward=0.02, send_bytes=400)
    result = run_in_process(sched, WorkloadSpec(name="emulated"), costs=costs)
    assert not result["errors"]
    tl = measured_timeline(sched, [r.traces[0] for r in result["ranks"]], [0.0, 0.0])
    comp = tl[(tl["src"] < 0) & (tl["op"] == "B")]
    assert ((comp["end"] - comp["start"]) >= 0.02).all()
    assert set(tl.loc[tl["src"] >= 0, "bytes"]) == {400.0}


def test_injected_fault_names_rank_and_action():
    sched = schedules.gpipe(2, 2)
    result = run_in_process(sched, SPEC, fail_at="1:1B1", timeout=2)
    messages = [str(e) for e in result["errors"]]
    assert any(m.startswith("rank 1 failed at action 1B1") for m in messages), messages


@pytest.mark.parametrize("name", generators.names())
def test_every_registered_schedule_runs_with_the_semantics_of_its_updates(name):
    # the whole IR: interleaved and V-shaped placements (local hand-over), split B/W, several weight versions
    chunks = getattr(generators.get_generator(name), "CHUNKS", 1) or 2
    sched = schedules.generate(name, 2, 4, iterations=2, chunks=chunks)
    result = run_in_process(sched, SPEC, timeout=20)
    assert not result["errors"], result["errors"]
    _assert_close(_weights_of(result), _final(emulate_updates(SPEC, sched)), atol=1e-5)


def test_transformer_stages_give_one_process_gradients():
    spec = WorkloadSpec(name="transformer", d_model=16, heads=2, seq=4, batch=2, depth=1)
    sched = schedules.gpipe(2, 2, recompute=True)
    _assert_close(_grads_of(run_in_process(sched, spec)), reference_grads(spec, 2, 2), atol=1e-5)


def test_bad_workload_sizes_are_refused():
    from validate.rank.workloads import WorkloadError
    with pytest.raises(WorkloadError, match="divisible"):
        WorkloadSpec(name="transformer", d_model=10, heads=3)
    with pytest.raises(WorkloadError, match="width must be a positive integer"):
        WorkloadSpec(name="mlp", width=0)


def test_an_overlapped_pair_waits_for_both_inputs_and_sends_both_results_when_it_ends():
    """DualPipeV's overlapped pairs run as the schedule (and the simulator, and DualPipe's own
    ``_forward_backward_chunk``) defines them: the forward half starts only once the backward half's input is here
    too, and the forward's result leaves only after the backward half has run. Before, the executor ran a pair's
    halves as two actions and sent the forward's result between them: DualPipeV at K=2, M=4 (mlp) measured
    3.7-5.0% shorter than its prediction in every run."""
    sched = schedules.generate("dualpipev", 2, 4)
    assert len(sched.fused)
    result = run_in_process(sched, SPEC, timeout=20)
    assert not result["errors"]
    flat = sched.compiled.flat
    pairs = dict(zip(flat.keys[sched.fused].tolist(), flat.keys[sched.fused + 1].tolist()))
    checked = 0
    for rank in result["ranks"]:
        trace = rank.traces[0]
        ends = {k: e for k, _, e in trace.compute}
        starts = {k: s for k, s, _ in trace.compute}
        sent = {k: t for k, t, _, _ in trace.sends}
        for forward, backward in pairs.items():
            if forward not in starts or forward not in sched.compiled.sends:
                continue  # the other rank's pair, or a last stage's forward (its loss stays here)
            assert sent[forward] >= ends[backward], (sched.action_of(forward), sched.action_of(backward))
            remote = [~d for d in sched.compiled.deps[backward] if d < 0]
            assert all(trace.arrivals[p] <= starts[forward] for p in remote if p in trace.arrivals)
            checked += 1
    assert checked == 3 and len(pairs) == 6  # 0F3, 2F2 and 2F3 send to the other rank (1F3 feeds stage 2 here)
    _assert_close(_grads_of(result), reference_grads(SPEC, sched.stages, sched.microbatches), atol=1e-5)
