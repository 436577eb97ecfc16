"""The estimate reproduces its sources: Korthikanti et al. 2022 Table 2 and its first-stage total, Narayanan et al.
2021's FLOP count, ZeRO's bytes per parameter; the memory breakdown adds up; the CLI writes what simulate reads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model import gpus, models
from sim import schedules
from sim.cli import main
from sim.model.cost import load_costs, uniform
from sim.model.estimate import (EstimateError, Parallelism, activation_bytes_per_layer, calibrate_efficiency,
    estimate, layer_flops, pipeline_hardware)
from sim.results.memory_breakdown import BREAKDOWN_KEYS, memory_breakdown
from sim.model.models import ModelSpec
from sim.simulate import simulate

GPT3 = models.get_model("gpt3-175b")
A100 = gpus.get_gpu("a100-80gb")


def table2(s, b, h, a, t, row):
    """Korthikanti et al. 2022, Table 2, written out literally (bytes per layer)."""
    return {
        "none": s * b * h * (34 + 5 * a * s / h),
        "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": s * b * h * (34 / t + 5 * a * s / (h * t)),
        "tp+selective": s * b * h * (10 + 24 / t),
        "tp+sp+selective": s * b * h * (34 / t),
        "full": s * b * h * 2,
    }[row]


ROWS = {"none": (False, "none"), "tp": (False, "none"), "tp+sp": (True, "none"),
        "tp+selective": (False, "selective"), "tp+sp+selective": (True, "selective"), "full": (False, "full")}


@pytest.mark.parametrize("row, t", [("none", 1)] + [(r, t) for r in ROWS if r != "none" for t in (1, 2, 8)])
def test_korthikanti_table2_per_layer(row, t):
    sp, recompute = ROWS[row]
    got = activation_bytes_per_layer(GPT3, 1, tensor=t, sequence_parallel=sp, recompute=recompute)
    assert got == pytest.approx(table2(GPT3.seq_len, 1, GPT3.hidden, GPT3.heads, t, row), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 4096), b=st.integers(1, 16), heads=st.sampled_from([1, 2, 4, 8, 16]),
       head_dim=st.integers(1, 64), t_exp=st.integers(0, 3), row=st.sampled_from(list(ROWS)))
def test_korthikanti_table2_any_shape(s, b, heads, head_dim, t_exp, row):
    t = min(2**t_exp, heads)
    h = heads * head_dim
    m = ModelSpec(layers=1, hidden=h, heads=heads, vocab=0, seq_len=s)  # f = 4h, MHA, dropout, 2 bytes
    sp, recompute = ROWS[row]
    got = activation_bytes_per_layer(m, b, tensor=t, sequence_parallel=sp, recompute=recompute)
    want = table2(s, b, h, heads, t, "tp" if row == "none" else row)
    assert got == pytest.approx(want, rel=1e-9)


def test_grouped_query_and_swiglu_shrink_or_grow_the_right_terms():
    base = ModelSpec(layers=1, hidden=1024, heads=16, vocab=0, seq_len=512, dropout=False)
    gqa = replace(base, kv_heads=4)
    s, b, h = 512, 1, 1024
    # K and V: 4 s b h_kv instead of 4 s b h
    assert activation_bytes_per_layer(base, b) - activation_bytes_per_layer(gqa, b) == 4 * s * b * (h - 256)
    gated = replace(base, gated_mlp=True)
    assert activation_bytes_per_layer(gated, b) - activation_bytes_per_layer(base, b) == 2 * s * b * base.ffn
    # no dropout: 2 s b h of masks and 3 a s^2 b of softmax dropout are gone
    with_dropout = replace(base, dropout=True)
    assert activation_bytes_per_layer(with_dropout, b) - activation_bytes_per_layer(base, b) \
        == 2 * s * b * h + 3 * 16 * s * s * b


def test_korthikanti_first_stage_total():
    """Section 4.3: with 1F1B the first of p stages keeps p micro-batches of its L/p layers, so its activations are
    s b h L / t x 34 (sequence parallel + selective recompute), independent of p, plus the embedding's dropout
    mask s b h p / t. The simulated peak of device 0 holds exactly that."""
    p, t = 8, 8
    par = Parallelism(tensor=t, sequence_parallel=True, pipeline=p, recompute="selective")
    est = estimate(GPT3, A100, par, layers_per_stage=[GPT3.layers // p] * p)
    result = simulate(schedules.one_f_one_b(p, 2 * p), est.costs, pipeline_hardware(A100, par))
    s, b, h, L = GPT3.seq_len, 1, GPT3.hidden, GPT3.layers
    want = s * b * h * L / t * 34 + s * b * h * p / t
    assert memory_breakdown(result)[0]["activations"] == pytest.approx(want, rel=1e-12)
    assert want / 2**30 == pytest.approx(9.59, abs=0.01)  # GiB: 175B on 64 A100s as in the paper's Table 3 setup


def test_flops_are_narayanans_formula():
    """Narayanan et al. 2021, eq. (3): F+B+W of a batch B = 72 B s L h^2 (1 + s / (6h) + V / (12 L h))."""
    for b in (1, 4):
        est = estimate(GPT3, A100, Parallelism(tensor=8, pipeline=8, microbatch_size=b))
        s, L, h, V = GPT3.seq_len, GPT3.layers, GPT3.hidden, GPT3.vocab
        assert est.model_flops_per_microbatch == pytest.approx(
            72 * b * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)
    dense, attention = layer_flops(GPT3, 1)
    assert dense == 24 * GPT3.seq_len * GPT3.hidden**2 and attention == 4 * GPT3.seq_len**2 * GPT3.hidden


def test_backward_splits_into_input_and_weight_gradients():
    """Without communication, F + B + W = 3 F per block; W = the dense part (zero-bubble paper's split)."""
    m = replace(GPT3, vocab=0)
    est = estimate(m, A100, Parallelism(pipeline=4), efficiency=0.5)
    c = est.costs
    dense, attention = layer_flops(m, 1)
    per_block = 1 / (A100.peak_flops * 0.5)
    assert c.forward[1] == pytest.approx(24 * (dense + attention) * per_block)
    assert c.weight[1] == pytest.approx(24 * dense * per_block)
    assert c.forward[1] + c.backward[1] + c.weight[1] == pytest.approx(3 * c.forward[1])


def test_tensor_parallel_adds_two_allreduces_per_pass():
    m = replace(GPT3, vocab=0)
    one = estimate(m, A100, Parallelism(pipeline=8, tensor=1), layers_per_stage=[12] * 8, efficiency=0.5).costs
    eight = estimate(m, A100, Parallelism(pipeline=8, tensor=8), layers_per_stage=[12] * 8, efficiency=0.5).costs
    n = GPT3.seq_len * GPT3.hidden * 2  # s b h bf16
    ring = 2 * 7 * (A100.intra_node_latency + n / 8 / A100.intra_node_bandwidth)
    assert eight.forward[0] == pytest.approx(one.forward[0] / 8 + 12 * 2 * ring)
    assert eight.weight[0] == pytest.approx(one.weight[0] / 8)  # W has no communication


def test_weights_grads_optimizer_are_zero_bytes_per_parameter():
    """Mixed-precision Adam: 2 + 2 + 12 bytes per parameter (ZeRO section 3.1); ZeRO-1 splits the 12 over d."""
    llama = models.get_model("llama3-8b")
    c = estimate(llama, A100, Parallelism()).costs
    assert sum(c.weight_bytes) == sum(c.grad_bytes) == 2 * llama.parameters
    assert sum(c.optimizer_bytes) == 12 * llama.parameters
    z = estimate(llama, A100, Parallelism(data=4, zero1=True)).costs
    assert sum(z.optimizer_bytes) == 3 * llama.parameters


def test_end_stages_carry_embedding_and_output_and_get_fewer_blocks():
    llama = models.get_model("llama3-8b")
    est = estimate(llama, A100, Parallelism(pipeline=4))
    layers = [hi - lo for lo, hi in est.bounds]
    assert sum(layers) == llama.layers and est.bounds[0][0] == 0 and est.bounds[-1][1] == llama.layers
    assert layers[-1] < max(layers)  # the 128k-vocabulary output layer weighs like several blocks
    equal = estimate(llama, A100, Parallelism(pipeline=4), layers_per_stage=[8] * 4)
    def slowest(e): return max(f + b + w for f, b, w in zip(e.costs.forward, e.costs.backward, e.costs.weight))
    assert slowest(est) < slowest(equal)
    assert est.costs.send_bytes[-1] == 0 and est.costs.send_bytes[0] == llama.seq_len * llama.hidden * 2


def test_full_recompute_keeps_inputs_and_recomputes_the_forward():
    par = Parallelism(tensor=8, pipeline=8, recompute="full")
    est = estimate(GPT3, A100, par, layers_per_stage=[12] * 8)
    c = est.costs
    assert c.checkpoint_bytes[3] == 12 * 2 * GPT3.seq_len * GPT3.hidden  # Table 2: 2 s b h per layer
    assert c.recompute[3] == pytest.approx(c.forward[3])
    result = simulate(schedules.one_f_one_b(8, 16, recompute=True), c, pipeline_hardware(A100, par))
    assert memory_breakdown(result)[3]["activations"] < estimate(
        GPT3, A100, replace(par, recompute="none"), layers_per_stage=[12] * 8).costs.activation_bytes[3]


@pytest.mark.parametrize("kwargs, message", [
    ({"tensor": 5}, "cannot be split"), ({"tensor": 3}, "divisible by tensor degree 3"),
    ({"pipeline": 97}, "need at least 97"), ({"recompute": "some"}, "recompute"),
])
def test_layouts_the_model_cannot_take(kwargs, message):
    with pytest.raises(EstimateError, match=message):
        estimate(GPT3, A100, Parallelism(**kwargs))


def test_layers_per_stage_and_efficiency_are_checked():
    with pytest.raises(EstimateError, match="summing to 96"):
        estimate(GPT3, A100, Parallelism(pipeline=2), layers_per_stage=[40, 40])
    with pytest.raises(EstimateError, match="efficiency"):
        estimate(GPT3, A100, Parallelism(), efficiency=1.5)


def test_calibration_recovers_the_efficiency_of_a_measurement():
    small = models.get_model("small-gpt")
    par = Parallelism(pipeline=2, microbatch_size=8)
    measured = estimate(small, A100, par, efficiency=0.23).costs
    at_peak = estimate(small, A100, par, efficiency=1.0)
    assert calibrate_efficiency(measured, at_peak) == pytest.approx(0.23)
    with pytest.raises(EstimateError, match="faster than peak"):
        calibrate_efficiency(measured.scaled(0.1), at_peak)
    with pytest.raises(EstimateError, match="stages"):
        calibrate_efficiency(uniform(3), at_peak)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "pipedream", "zb-h1", "zbv", "interleaved-1f1b", "pipedream-2bw"]),
       k=st.integers(2, 4), extra=st.integers(0, 4), recompute=st.booleans(), iterations=st.integers(1, 2))
def test_memory_breakdown_adds_up_to_the_peak(name, k, extra, recompute, iterations):
    m = k + extra
    if name == "interleaved-1f1b":
        m = k * (1 + extra)
    s = schedules.generate(name, k, m, recompute=recompute, iterations=iterations)
    c = uniform(s.stages, forward=1, backward=2, weight=0.5, activation_bytes=10, checkpoint_bytes=3,
                weight_bytes=100, grad_bytes=7, optimizer_bytes=11, send_bytes=1)
    result = simulate(s, c)
    rows = memory_breakdown(result)
    for row, peak in zip(rows, result.metrics.peak_memory):
        assert sum(row[key] for key in BREAKDOWN_KEYS) == pytest.approx(peak) == row["peak"]
    if name == "pipedream" and iterations == 2:
        assert rows[0]["stashed_weights"] > 0  # weight stashing shows up where it is


def test_cli_estimate_json_and_costs_file(tmp_path, capsys):
    out = tmp_path / "costs.csv"
    assert main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--tensor-parallel", "2",
                 "--sequence-parallel", "--pipeline-parallel", "4", "--microbatch-size", "1", "--seq-len", "4096",
                 "--recompute", "selective", "-s", "1f1b", "-M", "8", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"forward", "backward", "weight", "activation_bytes", "send_bytes", "weight_bytes", "grad_bytes",
            "optimizer_bytes", "layers"} <= set(data["stages"][0])
    assert data["seq_len"] == 4096 and len(data["peak_memory"]) == 4 and data["activation_bytes_per_layer"] > 0
    for row, peak in zip(data["memory_breakdown"], data["peak_memory"]):
        assert sum(row[k] for k in BREAKDOWN_KEYS) == pytest.approx(peak)
    costs = load_costs(out)
    assert list(costs.forward) == [r["forward"] for r in data["stages"]]
    assert main(["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--costs", str(out), "--json"]) == 0
    sim_json = json.loads(capsys.readouterr().out)
    assert sim_json["peak_memory"] == pytest.approx(data["peak_memory"], rel=1e-6)
    assert [r["activations"] for r in sim_json["memory_breakdown"]] == pytest.approx(
        [r["activations"] for r in data["memory_breakdown"]])


def test_cli_estimate_text_and_errors(capsys):
    assert main(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "-T", "8", "-P", "8",
                 "-s", "1f1b", "-M", "8"]) == 0
    out = capsys.readouterr().out
    assert "Korthikanti" in out and "weights + grads" in out
    assert main(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "-s", "1f1b"]) == 2
    assert "together" in capsys.readouterr().err
    assert main(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "-T", "5"]) == 2
    assert "cannot be split" in capsys.readouterr().err


def test_cli_mfu_from_a_measured_costs_file(tmp_path, capsys):
    """A costs file measured at 30% of peak calibrates the estimate to 0.3 (here: written by the estimate itself)."""
    measured = tmp_path / "measured_costs.csv"
    base = ["estimate", "--model", "small-gpt", "--gpu", "a100-80gb", "--pipeline-parallel", "2",
            "--microbatch-size", "8"]
    assert main(base + ["--mfu", "0.3", "-o", str(measured)]) == 0
    capsys.readouterr()
    assert main(base + ["--mfu-from", str(measured), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["efficiency"] == pytest.approx(0.3) and data["calibrated_from"] == str(measured)
    assert main(base[:-4] + ["--pipeline-parallel", "4", "--mfu-from", str(measured)]) == 2
    assert "stages" in capsys.readouterr().err


# --- issue 25 item 6: what is kept between F and B, and what the backward holds --------------------------------------

def test_kept_and_working_bytes_are_named_apart_under_full_recompute(capsys):
    """GPT-3 175B at t=8: Korthikanti's full-recompute row keeps 2 s b h = 48 MiB per block; the recomputed
    backward transiently holds the no-recompute set, 552 MiB (the figure the old field reported as 'kept')."""
    par = Parallelism(tensor=8, pipeline=8, recompute="full")
    est = estimate(GPT3, A100, par)
    assert est.activation_bytes_per_layer == 2 * 2048 * 12288 == 48 * 2**20
    assert est.working_bytes_per_layer == activation_bytes_per_layer(GPT3, 1, tensor=8)
    assert est.working_bytes_per_layer == pytest.approx(552 * 2**20, rel=1e-3)
    plain = estimate(GPT3, A100, replace(par, recompute="none"))
    assert plain.activation_bytes_per_layer == plain.working_bytes_per_layer == est.working_bytes_per_layer
    assert main(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "-T", "8", "-P", "8", "--recompute",
                 "full", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["activation_bytes_per_layer"] == 48 * 2**20 and data["working_bytes_per_layer"] > 11 * 48 * 2**20
    assert main(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "-T", "8", "-P", "8", "--recompute",
                 "full"]) == 0
    text = capsys.readouterr().out
    assert "kept per block and micro-batch between F and B (activation_bytes_per_layer): 0.05 GiB" in text
    assert "(working_bytes_per_layer, the transient peak): 0.54 GiB" in text and "ckpt GiB" in text


# --- issue 25 item 4: the size-aware compute model ------------------------------------------------------------------

def test_gemm_waves_tiles_and_the_memory_roof():
    """One more tile than the SMs run at once costs a second wave; a thin GEMM is bound by memory traffic."""
    from sim.model.efficiency import gemm_time

    tm, tn = A100.gemm_tile
    launch = A100.kernel_launch
    assert A100.sm_count == 108 == 12 * 9
    one_wave = gemm_time(A100, 12 * tm, 9 * tn, 8192) - launch  # exactly 108 tiles
    two_waves = gemm_time(A100, 12 * tm + 1, 9 * tn, 8192) - launch  # 117 tiles: 9 run in a second wave
    assert two_waves == pytest.approx(2 * one_wave)
    full = 2 * tm * A100.sm_count * tn * 8192 / (A100.peak_flops * A100.gemm_efficiency)
    assert one_wave == pytest.approx(full)  # a full wave runs at the benchmarked GEMM efficiency
    thin = gemm_time(A100, 8192, 8192, 1) - launch
    assert thin == pytest.approx(2 * (8192 + 8192 + 8192 * 8192) / A100.hbm_bandwidth)  # the memory roof


def test_larger_models_use_the_gpu_better_and_mfu_overrides():
    """Efficiency grows with the matrices (Narayanan et al. 2021 Table 1's trend); --mfu forces a constant; a device
    without kernel figures (the cpu preset, a bare file) keeps the constant default."""
    small = ModelSpec(name="1.7b", layers=24, hidden=2304, heads=24, vocab=51200, seq_len=2048, tied_embeddings=True)
    large = ModelSpec(name="1t", layers=128, hidden=25600, heads=160, vocab=51200, seq_len=2048, tied_embeddings=True)
    e_small = estimate(small, A100, Parallelism()).efficiency
    e_large = estimate(large, A100, Parallelism(tensor=8, pipeline=64)).efficiency
    e_large_alone = estimate(large, A100, Parallelism(pipeline=64)).efficiency
    assert 0.3 < e_small < e_large_alone <= A100.gemm_efficiency and e_large < e_large_alone  # t=8 communicates
    forced = estimate(large, A100, Parallelism(pipeline=64), efficiency=0.5)
    assert forced.efficiency == 0.5 and forced.compute_model == "constant"
    bare = replace(A100, sm_count=0)
    assert estimate(small, bare, Parallelism()).efficiency == gpus.DEFAULT_MFU
    flash = estimate(small, A100, Parallelism(flash_attention=True)).costs
    assert flash.forward[0] < estimate(small, A100, Parallelism()).costs.forward[0]  # no s x s score traffic


# --- issue 26 item 5: hostile model files ---------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("layers", 10**12, "model layers = 1000000000000 is above the limit of 100,000"),
    ("layers", 10**7, "model layers = 10000000 is above the limit of 100,000"),
    ("hidden", 10**200, "model hidden = 1.000e+200 is above the limit"),
    ("seq_len", 10**200, "model seq_len = 1.000e+200 is above the limit"),
])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_hostile_model_files_are_one_line_exit_2(tmp_path, capsys, field, value, message, command):
    spec = {"name": "hostile", "layers": 4, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32}
    spec[field] = value
    path = tmp_path / "model.json"
    path.write_text(json.dumps(spec))
    extra = ["--gpus", "8", "--global-batch", "8", "-o", str(tmp_path / "out")] if command == "plan" else []
    assert main([command, "--model", str(path), "--gpu", "a100-80gb", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_seq_len_flag_overflow_is_refused_in_plan(tmp_path, capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                 "--seq-len", str(10**200), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seq_len" in err[0] and "above the limit" in err[0]


def test_many_layers_split_without_a_quadratic_partition(monkeypatch):
    """The estimate of 100,000 layers on 4 stages used to run an O(S L^2) dynamic programme (63 s at 10k
    layers); the min-max split now probes the bound a few dozen times, O(S log L) each."""
    from sim.model import partition

    calls = []
    real = partition._stages_needed
    monkeypatch.setattr(partition, "_stages_needed", lambda prefix, bound: calls.append(1) or real(prefix, bound))
    monkeypatch.setattr(partition, "_least_squares_cuts", lambda *a: pytest.fail("the quadratic tie-break ran"))
    wide = ModelSpec(name="deep", layers=100_000, hidden=64, heads=4, vocab=128, seq_len=32)
    est = estimate(wide, A100, Parallelism(pipeline=4), efficiency=0.5)
    counts = [hi - lo for lo, hi in est.bounds]
    assert sum(counts) == 100_000 and max(counts) - min(counts) <= 2
    assert 0 < len(calls) <= 80  # bisection over doubles: at most ~64 halvings plus the first probe
