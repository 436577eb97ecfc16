"""Model and device descriptions: presets match their sources, files are read strictly, bad input is typed."""

from __future__ import annotations

import json

import pytest

from sim.model import gpus, models
from sim.cli import main
from sim.errors import PipesimError
from sim.model.gpus import GpuError, GpuSpec
from sim.model.models import ModelError, ModelSpec


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("llama3-8b", 8.03), ("llama3-70b", 70.6),
                                            ("llama3-405b", 405.9)])
def test_presets_have_the_published_parameter_counts(name, billions):
    """GPT-3: 175B (Brown et al. Table 2.1); Llama 3: 8.03B / 70.6B / 405.9B (the released model cards)."""
    assert models.get_model(name).parameters / 1e9 == pytest.approx(billions, rel=0.01)


def test_gpt_block_parameters_are_narayanans_12h2():
    m = models.get_model("gpt3-175b")
    assert m.layer_parameters == 12 * m.hidden**2 + 4 * m.hidden


def test_small_gpt_matches_the_validators_transformer_workload():
    pytest.importorskip("torch")
    from validate.rank.workloads import WorkloadSpec, build_stage_module

    m = models.get_model("small-gpt")
    spec = WorkloadSpec(name="transformer")
    assert (m.hidden, m.heads, m.seq_len, m.ffn) == (spec.d_model, spec.heads, spec.seq, 4 * spec.d_model)
    module = build_stage_module(spec, 0)
    params = sum(p.numel() for p in module.parameters())
    # the workload's layers have biases (4h + 2f... of them) that the estimate leaves out: under 5% here
    assert spec.depth * m.layer_parameters == pytest.approx(params, rel=0.05)


def test_model_defaults_and_validation():
    m = ModelSpec(layers=2, hidden=64, heads=4, vocab=100, seq_len=32)
    assert m.ffn == 256 and m.kv_heads == 4 and m.head_dim == 16
    for bad in ({"hidden": 65}, {"kv_heads": 3}, {"layers": 0}, {"dtype_bytes": 3}, {"tied_embeddings": "yes"},
                {"vocab": -1}, {"layers": True}):
        with pytest.raises(ModelError):
            ModelSpec(**{**dict(layers=2, hidden=64, heads=4, vocab=100, seq_len=32), **bad})


def test_model_file_round_trip_and_strict_errors(tmp_path):
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"layers": 4, "hidden": 128, "heads": 8, "vocab": 1000, "seq_len": 64}))
    m = models.get_model(str(good))
    assert m.name == "m" and m.layers == 4
    cases = {"unknown": {"layers": 4, "hidden": 128, "heads": 8, "vocab": 10, "seq_len": 4, "colour": 1},
             "lacks": {"layers": 4, "hidden": 128, "heads": 8},
             "divisible": {"layers": 4, "hidden": 100, "heads": 8, "vocab": 10, "seq_len": 4}}
    for words, data in cases.items():
        path = tmp_path / f"{words}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ModelError, match=words):
            models.load_model(path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ModelError, match="not valid JSON"):
        models.load_model(tmp_path / "broken.json")
    with pytest.raises(ModelError, match="unknown model"):
        models.get_model("gpt5")
    with pytest.raises(ModelError, match="cannot read"):
        models.get_model(str(tmp_path / "missing.json"))


def test_gpu_presets_are_dense_bf16_figures():
    h100 = gpus.get_gpu("h100-sxm")
    assert h100.peak_flops == pytest.approx(1979e12 / 2, rel=1e-3)  # datasheet's sparse figure halved
    assert gpus.get_gpu("a100-80gb").peak_flops == 312e12
    assert gpus.get_gpu("mi300x").memory_bytes == 192e9
    assert gpus.get_gpu("h200").memory_bytes == 141e9
    assert h100.link(cross_node=True) == (50e9, 5e-6)


def test_cpu_preset_is_measured():
    spec = gpus.get_gpu("cpu")
    assert spec.name == "cpu" and 1e8 < spec.peak_flops < 1e13 and spec.memory_bytes > 1e8
    assert spec.intra_node_bandwidth > 1e8


def test_gpu_file_and_errors(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"peak_flops": 1e15, "memory_bytes": 9e10, "intra_node_bandwidth": 1e11,
                                "inter_node_bandwidth": 1e10, "gpus_per_node": 4}))
    assert gpus.get_gpu(str(path)) == GpuSpec(name="g", peak_flops=1e15, memory_bytes=9e10, gpus_per_node=4,
                                              intra_node_bandwidth=1e11, inter_node_bandwidth=1e10)
    path.write_text(json.dumps({"peak_flops": -1, "memory_bytes": 9e10, "intra_node_bandwidth": 1e11,
                                "inter_node_bandwidth": 1e10}))
    with pytest.raises(GpuError, match="peak_flops"):
        gpus.get_gpu(str(path))
    path.write_text(json.dumps({"peak_flops": 1, "memory_bytes": 1, "intra_node_bandwidth": 1,
                                "inter_node_bandwidth": 1, "tflops": 3}))
    with pytest.raises(GpuError, match="unknown keys"):
        gpus.get_gpu(str(path))
    with pytest.raises(GpuError, match="unknown gpu"):
        gpus.get_gpu("tpu")
    assert issubclass(GpuError, PipesimError) and issubclass(ModelError, PipesimError)


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt5", "--gpu", "h100-sxm"], "unknown model 'gpt5'"),
    (["--model", "llama3-8b", "--gpu", "tpu"], "unknown gpu 'tpu'"),
    (["--model", "llama3-8b", "--gpu", "h100-sxm", "--mfu", "1.5"], "must be in (0, 1]"),
])
def test_cli_bad_model_or_gpu_is_one_line_exit_2(argv, message, capsys):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_gpu_kernel_figures_cite_their_sources_and_round_trip(tmp_path):
    """SMs and memory bandwidth from the datasheets, GEMM efficiency from the MAMF table (Bekman): the presets'
    figures; a GPU file may give them (gemm_tile as a JSON list) and bad ones are refused."""
    a100, h100, mi = gpus.get_gpu("a100-80gb"), gpus.get_gpu("h100-sxm"), gpus.get_gpu("mi300x")
    assert (a100.sm_count, a100.hbm_bandwidth, a100.gemm_efficiency) == (108, 2.039e12, 0.859)
    assert (h100.sm_count, h100.hbm_bandwidth, h100.gemm_efficiency) == (132, 3.35e12, 0.801)
    assert mi.sm_count == 304 and mi.gemm_efficiency * mi.peak_flops == pytest.approx(781.9e12, rel=2e-3)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(a100.to_dict()))
    assert gpus.get_gpu(str(path)) == a100
    for key, value, message in (("gemm_tile", [0, 128], "gemm_tile"), ("gemm_efficiency", 1.5, "gemm_efficiency"),
                                ("sm_count", -1, "sm_count"), ("hbm_bandwidth", "fast", "hbm_bandwidth")):
        path.write_text(json.dumps({**a100.to_dict(), key: value}))
        with pytest.raises(GpuError, match=message):
            gpus.get_gpu(str(path))


@pytest.mark.parametrize("field", sorted(models.LIMITS))
def test_model_limits_hold_at_the_edge(field):
    """Each limit admits its own value and refuses the next integer (one line naming the field)."""
    top = models.LIMITS[field]
    base = dict(name="m", layers=4, hidden=64, heads=4, vocab=128, seq_len=32)
    if field == "hidden":
        base["heads"] = 1
    if field in ("heads", "kv_heads"):
        base.update(hidden=2**16, heads=2**16)  # the head limit, on a width it divides
    ModelSpec(**{**base, field: top})
    with pytest.raises(ModelError, match=f"model {field} = {top + 1} is above the limit"):
        ModelSpec(**{**base, field: top + 1})
