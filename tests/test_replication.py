"""Replicated stages and DP x PP: invariants of the timeline and the all-reduce against its closed form."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules
from sim.model.cost import StageCosts, uniform
from sim.model.hardware import Hardware
from sim.core.ir import Action, ActionKind
from sim.engines.replication import Replication, ReplicationError, simulate_replicated
from sim.simulate import simulate


def check_invariants(run):
    base, rep = run.schedule, run.replication
    reps = rep.replicas or (1,) * base.devices
    W = sum(reps)
    tl = run.timeline
    comp = tl[tl["src"] < 0]
    # every action once per copy (U once per replica), on the device the layout says
    seen = {}
    for row in comp.itertuples(index=False):
        copy = row.device // W
        a = Action(int(row.stage), ActionKind(row.op), int(row.microbatch))
        key = (copy, a, row.device if a.kind is ActionKind.U else None)
        assert key not in seen, f"{key} ran twice"
        seen[key] = row
    expected = 0
    g = base.microbatches_per_update
    for p in range(base.devices):
        for a in base.actions[p]:  # U on every replica, unless updates are per micro-batch (then on its own)
            expected += rep.data_parallel * (reps[p] if a.kind is ActionKind.U and g >= reps[p] else 1)
    assert len(seen) == expected
    # no device runs two computations at once
    for _, rows in comp.groupby("device"):
        rows = rows.sort_values("start")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-9).all()
    send_at = {(r.src, r.dst, r.stage, r.microbatch): (r.start, r.end)
               for r in tl[tl["op"].isin(["SEND_F", "SEND_B"])].itertuples(index=False)}
    allreduce_end = {}  # (receiver, stage, first update of the round) -> last message end
    for r in tl[tl["op"] == "ALLREDUCE"].itertuples(index=False):
        k = (r.dst, r.stage, r.microbatch)
        allreduce_end[k] = max(allreduce_end.get(k, 0.0), r.end)
    updates = base.updates_per_stage
    for (copy, a, dev), row in seen.items():
        for p in base.dependencies(a):
            if a.kind is ActionKind.U:
                prod = seen.get((copy, p, None))
                if prod.device == row.device:
                    assert prod.end <= row.start + 1e-9
                continue
            prod = seen[(copy, p, None)]
            assert prod.end <= row.start + 1e-9, (a, p)
            if prod.device != row.device:  # the data travelled: a send from producer to consumer device
                t0, t1 = send_at[(prod.device, row.device, p.stage, p.mb)]
                assert t0 >= prod.end - 1e-9 and t1 <= row.start + 1e-9
        if a.kind is ActionKind.U:  # U after the all-reduce of its stage and round
            R = reps[base.placement[a.stage]]
            first = a.mb if g >= R else a.mb // R * R
            in_round = R if g >= R else min(R, updates - first)
            if rep.data_parallel * in_round > 1:  # every test here gives the stages weights: something to sync
                assert allreduce_end[(row.device, a.stage, first)] <= row.start + 1e-9


COSTS_BYTES = 1e6


def test_unreplicated_run_matches_the_engine():
    sch = schedules.one_f_one_b(4, 8, iterations=2)
    costs = uniform(4, activation_bytes=1e5, send_bytes=1e5, weight_bytes=1e6)
    hw = Hardware(devices=4, latency=0.05, bandwidth=1e6)
    base = simulate(sch, costs, hw)
    run = simulate_replicated(sch, costs, Replication(), hw)
    cols = ["device", "stage", "microbatch", "op", "start", "end", "src", "dst"]
    a = base.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    b = run.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    assert a.equals(b)
    assert run.metrics.makespan == base.metrics.makespan and run.metrics.peak_memory == base.metrics.peak_memory


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("D", [2, 3, 4])
def test_dp_x_pp_layout_and_ring_allreduce(name, D):
    K, M, n, alpha, bw = 4, 6, 1e6, 0.01, 1e7
    sch = schedules.generate(name, K, M)
    costs = uniform(K, weight_bytes=n, grad_bytes=n)
    run = simulate_replicated(sch, costs, Replication(data_parallel=D), Hardware(devices=D * K, latency=alpha, bandwidth=bw))
    check_invariants(run)
    for d in range(D):  # copy d runs on devices d*K .. d*K+K-1, each the base device's list
        for p in range(K):
            assert [x for _, x in run.device_actions[d * K + p]] == [str(a) for a in sch.actions[p]]
    # each stage's all-reduce among its D replicas takes the ring's 2(D-1)(alpha + n/(D bw))
    base = simulate(sch, costs)
    for row in run.allreduces.itertuples(index=False):
        assert row.end - row.start == pytest.approx(2 * (D - 1) * (alpha + n / D / bw))
    last = run.allreduces["end"].max()
    assert run.metrics.makespan == pytest.approx(last)  # U costs 0: the run ends with the last all-reduce
    assert run.metrics.makespan > base.metrics.makespan
    assert run.metrics.throughput == pytest.approx(D * M / run.metrics.makespan)


def test_overlap_starts_each_stage_as_soon_as_it_is_ready():
    K, D = 4, 2
    sch = schedules.gpipe(K, 4)
    # the last stage (an LM head, say) has the most weights: its all-reduce can hide under the drain
    costs = StageCosts(forward=[1] * K, backward=[2] * K, update=[0.5] * K, weight_bytes=[1e6, 1e6, 1e6, 8e6])
    hw = Hardware(devices=D * K, latency=0.0, bandwidth=1e6)
    early = simulate_replicated(sch, costs, Replication(data_parallel=D, overlap=True), hw)
    late = simulate_replicated(sch, costs, Replication(data_parallel=D, overlap=False), hw)
    check_invariants(early), check_invariants(late)
    assert early.metrics.makespan < late.metrics.makespan
    assert early.allreduces["start"].nunique() == K  # staggered as the backward drains
    assert late.allreduces["start"].nunique() == 1  # all after the flush
    assert max(late.sync_wait) > max(early.sync_wait)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "pipedream"]), K=st.integers(1, 4), M=st.integers(1, 5),
       D=st.integers(1, 3), reps=st.lists(st.integers(1, 3), min_size=4, max_size=4),
       algorithm=st.sampled_from(["ring", "halving-doubling", "tree", "parallel", "sequential"]),
       overlap=st.booleans(), iterations=st.integers(1, 2))
def test_invariants_with_replicated_stages(name, K, M, D, reps, algorithm, overlap, iterations):
    sch = schedules.generate(name, K, M, iterations=iterations)
    reps = tuple(reps[:K])
    g = sch.microbatches_per_update
    if any(g < r for r in reps) and g != 1:
        with pytest.raises(ReplicationError, match="micro-batches per update"):
            simulate_replicated(sch, uniform(K), Replication(data_parallel=D, replicas=reps))
        return
    rep = Replication(data_parallel=D, replicas=reps, algorithm=algorithm, overlap=overlap)
    costs = uniform(K, forward=1.0, backward=2.0, weight_bytes=COSTS_BYTES, send_bytes=1e4, activation_bytes=1e4)
    hw = Hardware(devices=D * sum(reps), latency=0.01, bandwidth=1e7)
    if g == 1 and max(reps) > 1:
        # per-micro-batch updates couple a stage's replicas in rounds: a round's U waits for micro-batches that
        # may only come after it on other devices (e.g. pipedream K=4, M=4, replicas 1,3,1,1): refused, never hung
        try:
            run = simulate_replicated(sch, costs, rep, hw)
        except ReplicationError as exc:
            assert "cannot be split this way" in str(exc)
            return
    else:
        run = simulate_replicated(sch, costs, rep, hw)
    check_invariants(run)


def test_round_robin_of_a_replicated_stage():
    sch = schedules.pipedream(3, 8)
    run = simulate_replicated(sch, uniform(3), Replication(replicas=(2, 1, 1)))
    firsts = [x for _, x in run.device_actions[0] if "F" in x]
    seconds = [x for _, x in run.device_actions[1] if "F" in x]
    assert firsts == ["0F0", "0F2", "0F4", "0F6"] and seconds == ["0F1", "0F3", "0F5", "0F7"]
    assert run.devices == 4
    # each replica updates after its own micro-batches; the two sync once per round of 2 updates
    assert [x for _, x in run.device_actions[0] if "U" in x] == ["0U0", "0U2", "0U4", "0U6"]
    assert [x for _, x in run.device_actions[1] if "U" in x] == ["0U1", "0U3", "0U5", "0U7"]
    ar = run.allreduces
    assert sorted(ar[ar["stage"] == 0]["update"]) == [0, 2, 4, 6]
    check_invariants(run)


def test_errors():
    with pytest.raises(ReplicationError, match="positive"):
        Replication(data_parallel=0)
    with pytest.raises(ReplicationError, match="cannot synchronize"):
        Replication(algorithm="ps")
    sch = schedules.gpipe(2, 2)
    with pytest.raises(ReplicationError, match="one per device"):
        simulate_replicated(sch, uniform(2), Replication(replicas=(1, 1, 1)))
    with pytest.raises(ReplicationError, match="need 4"):
        simulate_replicated(sch, uniform(2), Replication(data_parallel=2), Hardware(devices=2))


def test_cli_json_and_timeline(tmp_path, capsys):
    import json

    import pandas as pd

    from sim.cli import main

    out = tmp_path / "t.csv"
    assert main(["replicate", "-s", "gpipe", "-K", "2", "-M", "2", "-D", "2", "--weight-bytes", "1e6",
                 "--bandwidth", "1e6", "--json", "--timeline", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"] == 4 and len(report["allreduces"]) == 2
    for ar in report["allreduces"]:  # ring over 2 replicas: 2 messages of n/2 each way
        assert ar["end"] - ar["start"] == pytest.approx(1.0)
    tl = pd.read_csv(out)
    assert (tl["op"] == "ALLREDUCE").sum() == 8
    assert main(["replicate", "-K", "2", "--replicas", "0,1"]) == 2


@pytest.mark.slow
def test_dp_validator_real_allreduce_gives_one_process_gradients():
    """2 stages x 2 replicas on 4 gloo processes: real all-reduce, gradients as one-process training."""
    pytest.importorskip("torch")
    from validate.dp import run_dp_validation

    r = run_dp_validation(stages=2, replicas=2, microbatches=2, forward=0.01, backward=0.02)
    assert r["grads_match"], r["grad_max_abs_error"]
    assert r["grad_max_abs"] > 0
    # every traced action found its predicted counterpart: (F + B) x M x 4 ranks + one U per rank
    assert r["actions_measured"] == r["actions_compared"] == 2 * 2 * 4 + 4
    measured = r["measured_timeline"]
    assert (measured["op"] == "ALLREDUCE").sum() == 4
    u = measured[measured["op"] == "U"].set_index("device")["start"]
    ar = measured[measured["op"] == "ALLREDUCE"].set_index("device")["end"]
    assert (u >= ar).all()  # each replica steps only after its all-reduce


def test_cli_replicas_alone_means_one_pipeline_copy(capsys):
    """README: `replicate -s pipedream -K 3 -M 8 --replicas 2,1,1` runs on 4 devices, not 2 x 4 = 8."""
    import json

    from sim.cli import main

    assert main(["replicate", "-s", "pipedream", "-K", "3", "-M", "8", "--replicas", "2,1,1", "--weight-bytes", "4e7",
                 "--bandwidth", "1e9", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"] == 4 and report["data_parallel"] == 1 and report["replicas"] == [2, 1, 1]
    assert main(["replicate", "-s", "pipedream", "-K", "3", "-M", "8", "--replicas", "2,1,1", "-D", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 8  # both, when asked
    assert main(["replicate", "-s", "1f1b", "-K", "2", "-M", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data_parallel"] == 2  # DP x PP stays the default without --replicas


@pytest.mark.parametrize("name", __import__("sim.schedules.registry", fromlist=["names"]).names())
@pytest.mark.parametrize("overlap", [True, False])
def test_one_copy_without_replicas_is_simulate_row_for_row(name, overlap):
    """D=1 and no replicated stage: the replicated run is simulate()'s run, on the same kernel and memory model."""
    from sim.search.batch import resolve_chunks

    K, M, chunks = 4, 8, resolve_chunks(name, None)
    sch = schedules.generate(name, K, M, iterations=2, chunks=chunks)
    costs = uniform(K, forward=1.0, backward=2.0, weight=0.5, update=0.25, send_bytes=3e5, activation_bytes=1e5,
                    weight_bytes=1e6, grad_bytes=1e6)
    costs = costs.split_into_chunks(chunks) if chunks > 1 else costs
    hw = Hardware(devices=K, latency=0.05, bandwidth=1e7, overlap=overlap, memory_capacity=2.5e6)
    base = simulate(sch, costs, hw)
    run = simulate_replicated(sch, costs, Replication(), hw)
    cols = ["device", "stage", "microbatch", "iteration", "op", "start", "end", "src", "dst", "bytes"]
    a = base.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    b = run.timeline[cols].astype({"op": str}).sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    for field in ("makespan", "utilization", "busy", "peak_memory", "peak_inflight", "weight_versions",
                  "memory_overflow", "throughput"):
        assert getattr(run.metrics, field) == getattr(base.metrics, field), field
    pd.testing.assert_frame_equal(run.memory.usage, base.memory.usage, check_exact=True)
    assert list(run.allreduces["messages"]) == [0] * len(run.allreduces)  # one replica: nothing to send


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
def test_replicas_free_what_w_does_not_need_after_b(name):
    """weight_activation_bytes (the part of F's activations W still needs) holds in every replica as in one
    pipeline: a replicated zero-bubble run's memory is the unreplicated run's, device for device."""
    K, M = 3, 6
    sch = schedules.generate(name, K, M)
    kept = uniform(K, forward=1.0, backward=1.0, weight=1.0, activation_bytes=100.0, weight_activation_bytes=30.0)
    one = simulate(sch, kept)
    all_until_w = simulate(sch, uniform(K, forward=1.0, backward=1.0, weight=1.0, activation_bytes=100.0))
    assert one.metrics.peak_memory != all_until_w.metrics.peak_memory  # the column matters in this case
    run = simulate_replicated(sch, kept, Replication(data_parallel=2), Hardware(devices=2 * K))
    assert run.metrics.peak_memory == one.metrics.peak_memory * 2


def test_replicated_pipedream_stashes_weight_versions_per_replica():
    """PipeDream over 2 copies: each replica keeps the K-s versions its in-flight micro-batches read (SOSP 2019,
    section 3.3), exactly as the unreplicated pipeline does; the memory includes them."""
    K, M, N = 3, 4, 2
    sch = schedules.pipedream(K, M, iterations=N)
    costs = uniform(K, weight_bytes=100.0)
    one = simulate(sch, costs)
    run = simulate_replicated(sch, costs, Replication(data_parallel=2), Hardware(devices=2 * K))
    assert one.metrics.weight_versions == [K - s for s in range(K)]
    assert run.metrics.weight_versions == one.metrics.weight_versions * 2
    assert run.metrics.peak_memory == [100.0 * v for v in run.metrics.weight_versions]
    check_invariants(run)


def test_allreduce_messages_are_timeline_transfers_on_the_links():
    K, D, n, bw = 2, 3, 3e6, 1e6
    sch = schedules.gpipe(K, 2)
    run = simulate_replicated(sch, uniform(K, weight_bytes=n), Replication(data_parallel=D),
                              Hardware(devices=D * K, bandwidth=bw))
    ar = run.timeline[run.timeline["op"] == "ALLREDUCE"]
    assert len(ar) == K * 2 * D * (D - 1)  # ring: 2(D-1) steps, D messages each, per stage
    assert (ar["bytes"] == n / D).all() and ((ar["end"] - ar["start"]) >= n / D / bw - 1e-12).all()
    for (src, dst), msgs in ar.groupby(["src", "dst"]):  # one link serves one message at a time
        msgs = msgs.sort_values("start")
        assert (msgs["start"].to_numpy()[1:] >= msgs["end"].to_numpy()[:-1] - 1e-12).all()
        assert src % K == dst % K  # replicas of one stage: never a pipeline neighbour's link


def test_overlapped_pairs_stay_one_unit_in_every_copy():
    sch = schedules.dualpipev(2, 4)
    if not len(sch.fused):
        pytest.skip("this DualPipeV has no overlapped pairs")
    costs = uniform(2, weight_bytes=1e6).split_into_chunks(2)
    run = simulate_replicated(sch, costs, Replication(data_parallel=2), Hardware(devices=4, bandwidth=1e8))
    check_invariants(run)
    one = simulate(sch, costs)
    tl = run.timeline[(run.timeline["src"] < 0) & (run.timeline["device"] < 2)]
    base = one.timeline[one.timeline["src"] < 0]
    key = ["device", "stage", "microbatch", "op"]
    # before the all-reduce, copy 0 runs as the lone pipeline: a pair's backward starts when its forward ends
    merged = tl.merge(base, on=key, suffixes=("", "_one"))
    computing = merged[merged["op"] != "U"]
    assert (computing["start"] == computing["start_one"]).all() and (computing["end"] == computing["end_one"]).all()
    with pytest.raises(ReplicationError, match="overlapped forward-backward pairs"):
        simulate_replicated(sch, costs, Replication(replicas=(2, 1)))
