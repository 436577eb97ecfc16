"""GPU traces: compute from kernels (correlation ids or ac2g flows, any stream, launches from the autograd
thread), NCCL p2p kernels, gpu_user_annotation copies; the fixtures' event shapes against a real Kineto file;
DualPipe-style overlapped pairs (DeepSeek's profile-data shape) against the sum of their parts.

``fixtures/hta/simple_add.gpu.json.gz`` is a real A100 trace from HolisticTraceAnalysis (MIT; README there).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ingest_trace_builder import traces_from
from sim import schedules
from sim.cli import main
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.simulate import simulate
from validate.ingest.flow import ingest, without_updates

REAL = Path(__file__).parent / "fixtures" / "hta" / "simple_add.gpu.json.gz"

# A real NCCL kernel and a real gpu_user_annotation (HolisticTraceAnalysis, tests/data/nccl_parser_config/
# nccl_data.json.gz, an A100 run with torch 2.x; not committed, 750 kB): their args' keys.
NCCL_KERNEL_ARGS = {"External id", "queued", "device", "context", "stream", "correlation", "registers per thread",
                    "shared memory", "blocks per SM", "warps per SM", "grid", "block", "est. achieved occupancy %",
                    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
                    "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks"}
GPU_ANNOTATION_KEYS = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args"}


def _simulated(K=2, M=4):
    sched = without_updates(schedules.generate("1f1b", K, M))
    costs = uniform(K, forward=1e-3, backward=2e-3, activation_bytes=1e6, send_bytes=1e6)
    return simulate(sched, costs, Hardware(devices=K, latency=1e-4, bandwidth=1e10))


def _shape(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return ("list", tuple(sorted({_shape(v) for v in value})))
    return type(value).__name__


def _classes(events):
    out = {}
    for e in events:
        key = (e.get("ph"), e.get("cat"), "nccl" in str(e.get("name", "")).lower())
        out.setdefault(key, e)
    return out


def test_the_gpu_fixtures_have_the_fields_of_a_real_kineto_trace():
    with gzip.open(REAL) as f:
        real = _classes(json.load(f)["traceEvents"])
    res = _simulated()
    ours = _classes([e for t in traces_from(res, "gpu") for e in t["traceEvents"]])
    for key in (("X", "kernel", False), ("X", "cuda_runtime", False), ("s", "ac2g", False), ("f", "ac2g", False)):
        r, o = real[key], ours[key]
        assert set(o) == set(r), (key, set(o) ^ set(r))
        assert {k: _shape(v) for k, v in o.items() if k != "args"} == {k: _shape(v) for k, v in r.items() if k != "args"}
        if "args" in r:
            if key[1] == "cuda_runtime":  # the launch: cudaLaunchKernel in both
                r = next(e for e in json.load(gzip.open(REAL))["traceEvents"] if e.get("name") == "cudaLaunchKernel")
            assert set(o["args"]) == set(r["args"]), (key, set(o["args"]) ^ set(r["args"]))
            assert {k: _shape(v) for k, v in o["args"].items()} == {k: _shape(r["args"][k]) for k in o["args"]}
    nccl = ours[("X", "kernel", True)]
    assert set(nccl["args"]) <= NCCL_KERNEL_ARGS and set(nccl["args"]) >= NCCL_KERNEL_ARGS - {
        "In split size", "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks"}
    assert set(ours[("X", "gpu_user_annotation", False)]) == GPU_ANNOTATION_KEYS


def test_a_real_gpu_trace_without_pipeline_actions_is_one_clean_line(tmp_path, capsys):
    assert main(["ingest", str(REAL), "-s", "gpipe", "-K", "1", "-M", "1", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no pipeline actions" in err[0]


def _ingest(tmp_path, traces, sched):
    paths = []
    for r, t in enumerate(traces):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    return ingest(paths, sched)


def _computations(result):
    c = result.timeline[result.timeline["src"] < 0].sort_values(["device", "start"])
    return list(zip(c["op"].astype(str), c["microbatch"], c["start"].round(9), c["end"].round(9)))


@pytest.mark.parametrize("change", ["none", "flows only", "autograd thread", "annotations only"])
def test_gpu_compute_comes_from_kernels_however_they_are_linked(tmp_path, change):
    res = _simulated()
    traces = traces_from(res, "gpu")
    for t in traces:
        ev = t["traceEvents"]
        if change == "flows only":  # the kernels lose args.correlation: the ac2g arrows link them
            for e in ev:
                if e.get("cat") == "kernel":
                    e["args"].pop("correlation")
        elif change == "autograd thread":  # the backwards' kernels are launched from the autograd engine's thread
            names = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
            for e in ev:
                if e.get("cat") == "user_annotation" and "B" in e["name"][3:]:
                    launch = next(x for x in names.values() if e["ts"] <= x["ts"] <= e["ts"] + e["dur"])
                    launch["tid"] = 4242
        elif change == "annotations only":  # the compute kernels were not recorded; their GPU copies remain
            t["traceEvents"] = [e for e in ev if not (e.get("cat") == "kernel" and "nccl" not in e["name"].lower())]
    ing = _ingest(tmp_path, traces, res.schedule)
    assert _computations(ing.measured) == _computations(res)
    assert (ing.measured.timeline["src"] >= 0).sum() == (res.timeline["src"] >= 0).sum()  # NCCL p2p kernels


def test_without_the_flows_a_kernel_lacking_its_correlation_is_not_used(tmp_path):
    """Injected bug: remove the ac2g arrows too; the compute then falls back to the gpu_user_annotation copies,
    and without those the CPU ranges, whose times differ from the GPU's."""
    res = _simulated()
    traces = traces_from(res, "gpu")
    for t in traces:
        t["traceEvents"] = [e for e in t["traceEvents"] if e.get("cat") not in ("ac2g", "gpu_user_annotation")]
        for e in t["traceEvents"]:
            if e.get("cat") == "kernel":
                e["args"].pop("correlation")
    ing = _ingest(tmp_path, traces, res.schedule)
    assert _computations(ing.measured) != _computations(res)


def _deepseek_like(path: Path) -> tuple[float, float, float]:
    """One rank's overlapped F&B pair shaped as DeepSeek's profile-data train.json (not committable: that repository
    states no licence): ProfilerStep#1 > '1F1B' > parts 'attn(F)', 'mlp(B)', 'dispatch(F)', 'mlp(W)', ... each
    launching kernels; the forward's all-to-all runs on stream 27 behind the backward's compute on stream 7.
    Returns (pair, F, B) in microseconds as built."""
    ev, corr, t = [], [100], 1000.0
    pid, tid = 1166, 1166
    plan = [("combine(B)", 7, 300.0), ("attn(F)", 7, 900.0), ("mlp(B)", 7, 700.0), ("dispatch(F)", 27, 1500.0),
            ("dispatch(B)", 7, 100.0), ("mlp(W)", 7, 300.0), ("mlp(F)", 7, 600.0), ("attn(B)", 7, 1200.0),
            ("attn(W)", 7, 100.0), ("combine(F)", 27, 400.0)]
    gpu = {7: 2000.0, 27: 2000.0}
    sums = {"F": 0.0, "B": 0.0}
    for name, stream, dur in plan:
        c = corr[0] = corr[0] + 1
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": tid, "ts": t, "dur": 50.0,
                   "args": {"External id": c, "Ev Idx": c}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                   "ts": t + 10, "dur": 5.0, "args": {"External id": c, "cbid": 211, "correlation": c}})
        start = gpu[stream]
        ev.append({"ph": "X", "cat": "kernel", "name": f"kernel_{name}", "pid": 0, "tid": stream, "ts": start,
                   "dur": dur, "args": {"External id": c, "device": 0, "stream": stream, "correlation": c}})
        gpu[stream] = start + dur
        sums["F" if "(F)" in name else "B"] += dur
        t += 60.0
    first = 2000.0
    last = max(gpu.values())
    ev.append({"ph": "X", "cat": "user_annotation", "name": "1F1B", "pid": pid, "tid": tid, "ts": 990.0,
               "dur": t - 990.0, "args": {"External id": 2}})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": pid, "tid": tid, "ts": 980.0,
               "dur": t - 970.0, "args": {"External id": 1}})
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0,
                                                                          "world_size": 64}, "traceEvents": ev}))
    return last - first, sums["F"], sums["B"]


def test_an_overlapped_pair_is_measured_against_the_sum_of_its_parts(tmp_path, capsys):
    path = tmp_path / "train.json"
    pair, f, b = _deepseek_like(path)
    pattern = r"(?P<part>\w+)\((?P<kind>[FBW])\)"
    assert main(["ingest", str(path), "--overlap-pairs", "--action-pattern", pattern, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (p,) = out["pairs"]
    assert p["range"] == "1F1B"
    assert p["pair_s"] == pytest.approx(pair * 1e-6) and p["forward_s"] == pytest.approx(f * 1e-6)
    assert p["backward_s"] == pytest.approx(b * 1e-6)
    assert p["saved"] == pytest.approx(1 - pair / (f + b))
    assert out["overlap_fb"] == f"{(1 - pair / (f + b)) * 100:.0f}%"
    assert main(["ingest", str(path), "--overlap-pairs", "--action-pattern", r"(?P<kind>nothing)"]) == 2
    assert "no overlapped pair found" in capsys.readouterr().err


def test_an_action_that_launched_no_kernel_sits_where_the_stream_was(tmp_path):
    """PyTorch's first stage skips its input-gradient action (stage.py: "Skip the backward for the first stage";
    its W does the whole backward), so on a GPU PP:0I<m> launches no kernel and has no GPU copy. Seen on an H200
    (ZBV and DualPipeV, K=1, actions of ~1 ms): the host ran ahead of the busy GPU, so the range's host times put
    I(0, m) before the kernels of I(1, m) it depends on, and the ingest refused the order. It is an instant on the
    device's timeline where the stream stood when it was issued: the end of the GPU work launched before it."""
    sched = without_updates(schedules.generate("zbv", 1, 4))
    costs = uniform(sched.stages, forward=1e-3, backward=1e-3, weight=1e-3, activation_bytes=1e6, send_bytes=1e6)
    res = simulate(sched, costs, Hardware(devices=1, latency=1e-4, bandwidth=1e10))
    traces = traces_from(res, "gpu")  # host ranges 3 us apart at the start: far ahead of their kernels
    ev = traces[0]["traceEvents"]
    skipped = {e["args"]["External id"] for e in ev if e.get("cat") == "gpu_user_annotation"
               and e["name"].startswith("PP:0I")}
    assert len(skipped) == 4
    traces[0]["traceEvents"] = [e for e in ev if not (e.get("cat") in ("kernel", "gpu_user_annotation", "cuda_runtime")
                                                      and e["args"].get("External id") in skipped)
                                and not (e.get("cat") == "ac2g" and e.get("id") in skipped)]
    ing = _ingest(tmp_path, traces, res.schedule)
    rows = ing.measured.timeline[ing.measured.timeline["src"] < 0]
    for stage, mb in ((0, m) for m in range(4)):
        row = rows[(rows["stage"] == stage) & (rows["microbatch"] == mb) & (rows["op"].astype(str) == "B")]
        assert len(row) == 1 and float(row["end"].iloc[0]) == float(row["start"].iloc[0])  # no device work
        before = res.timeline[(res.timeline["src"] < 0) & (res.timeline["stage"] == 1) & (res.timeline["microbatch"] == mb)
                              & (res.timeline["op"].astype(str) == "B")]
        assert float(row["start"].iloc[0]) >= float(before["end"].iloc[0]) - 1e-9  # after what it depends on
    assert len(rows) == len(res.timeline[res.timeline["src"] < 0])
