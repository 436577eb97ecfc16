"""The plan in the forms people launch: every option name is one its project defines, the split survives.

The names below were read from the projects' own code with the repositories' history (recorded here so a renamed
option shows up as a failing test when the lists are refreshed):

- Megatron-LM, NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (22 Aug 2026):
  ``megatron/training/arguments.py`` (explicit ``add_argument`` calls: ``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``, ``--pipeline-model-parallel-layout``, ``--num-layers-per-virtual-
  pipeline-stage``, ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--use-distributed-optimizer``,
  ``--group-query-attention``, ``--max-position-embeddings``, ``--swiglu``, ``--untie-embeddings-and-output-
  weights``, ``--seq-length``) and the fields its ``ArgumentGroupFactory`` (``megatron/training/
  argument_utils.py``, ``"--" + name.replace("_", "-")``) turns into options: ``ModelParallelConfig``
  (``megatron/core/model_parallel_config.py``: tensor_model_parallel_size, pipeline_model_parallel_size,
  sequence_parallel, bf16), ``TransformerConfig`` (``megatron/core/transformer/transformer_config.py``:
  num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, hidden_dropout,
  attention_dropout, recompute_granularity, recompute_method, recompute_num_layers; not in arguments.py's
  exclude list) and ``TrainingConfig`` (``megatron/training/config/training_config.py``: micro_batch_size,
  global_batch_size). Layout strings: ``PipelineParallelLayerLayout.parse_str_to_list``
  (``megatron/core/transformer/pipeline_parallel_layer_layout.py``).
- torchtitan, pytorch/torchtitan at e347b1e5e6b6941d789d16d340145294d82dc71e (15 Feb 2026, the last commit with
  TOML job files, before PR #2386): ``torchtitan/config/job_config.py`` sections ``Parallelism``, ``Training``,
  ``ActivationCheckpoint``; the module names of ``torchtitan/distributed/pipeline_parallel.py``'s
  ``generate_llm_fqn_per_model_part`` (tok_embeddings, layers.i, norm, output).
- PyTorch: ``torch.distributed.pipelining.schedules._PipelineScheduleRuntime._load_csv`` of the installed torch.
"""

from __future__ import annotations

import json
import re

import pytest

try:
    import tomllib  # Python >= 3.11
except ImportError:  # 3.10: the same parser as a package, or these tests skip
    tomllib = pytest.importorskip("tomli")
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.io.launch_formats import (ASYNC_SCHEDULES, TORCHTITAN_SCHEDULES, LaunchError, LaunchSpec, megatron_arguments,
    megatron_layout, torchtitan_toml)
from sim.model.models import ModelSpec, get_model

MEGATRON_ARGUMENTS = frozenset({
    # megatron/training/arguments.py, explicit
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-distributed-optimizer", "--group-query-attention", "--max-position-embeddings", "--swiglu",
    "--untie-embeddings-and-output-weights", "--seq-length",
    # ModelParallelConfig / TransformerConfig / TrainingConfig fields through ArgumentGroupFactory
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel", "--bf16",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--hidden-dropout", "--attention-dropout", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--micro-batch-size", "--global-batch-size",
})
MEGATRON_CHOICES = {"--recompute-granularity": {"full", "selective"}, "--recompute-method": {"uniform", "block"}}
"""TransformerConfig: recompute_granularity Literal['full', 'selective'], recompute_method Literal['uniform',
'block']."""

TORCHTITAN_KEYS = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_microbatch_size", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage"},
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
TORCHTITAN_AC_MODES = {"selective", "full", "memory_budget", "none"}  # job_config.py ActivationCheckpoint.mode

LLAMA = get_model("llama3-8b")


def spec(**kw) -> LaunchSpec:
    base = dict(model=LLAMA, schedule="1f1b", pipeline=4, tensor=2, data=2, microbatch_size=1, microbatches=8,
                chunks=1, recompute="full", sequence_parallel=True, distributed_optimizer=True,
                layers_per_stage=(7, 9, 9, 7))
    base.update(kw)
    return LaunchSpec(**base)


def parse_megatron_layout(text: str) -> list[list[str]]:
    """Megatron's layout grammar, written from its description: commas are cosmetic, ``(x)*n`` and ``c*n`` repeat,
    ``|`` separates stages, E embedding, t transformer layer, L loss."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(part) for part in text.split("|")]
    assert all(c in "EtLm" for part in stages for c in part), text
    return stages


def arguments(text: str) -> dict[str, str | None]:
    """`--name value` pairs of an argument string (comment lines skipped)."""
    tokens = " ".join(line for line in text.splitlines() if not line.startswith("#")).split()
    out, i = {}, 0
    while i < len(tokens):
        name = tokens[i]
        assert name.startswith("--"), (name, text)
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
        out[name] = value
        i += 2 if value is not None else 1
    return out


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), v=st.sampled_from([1, 2, 3]), data=st.data(),
       recompute=st.sampled_from(["none", "selective", "full"]), d=st.integers(1, 4), t=st.sampled_from([1, 2, 4]))
def test_megatron_arguments_are_megatrons_own_and_give_back_the_split(p, v, data, recompute, d, t):
    S = p * v
    counts = tuple(data.draw(st.lists(st.integers(1, 6), min_size=S, max_size=S)))
    model = ModelSpec(name="m", layers=sum(counts), hidden=512, heads=8, vocab=1024, seq_len=128)
    s = LaunchSpec(model=model, schedule="interleaved-1f1b" if v > 1 else "1f1b", pipeline=p, tensor=t, data=d,
                   microbatch_size=2, microbatches=4 * p, chunks=v, recompute=recompute, sequence_parallel=t > 1,
                   distributed_optimizer=d > 1, layers_per_stage=counts)
    args = arguments(megatron_arguments(s))
    assert set(args) <= MEGATRON_ARGUMENTS, set(args) - MEGATRON_ARGUMENTS
    for name, allowed in MEGATRON_CHOICES.items():
        assert args.get(name) is None or args[name] in allowed
    assert int(args["--tensor-model-parallel-size"]) == t and int(args["--pipeline-model-parallel-size"]) == p
    assert int(args["--global-batch-size"]) == 2 * 4 * p * d and int(args["--micro-batch-size"]) == 2
    assert ("--sequence-parallel" in args) == (t > 1) and ("--use-distributed-optimizer" in args) == (d > 1)
    # the stage split, read back the way Megatron reads it
    L = model.layers
    if "--pipeline-model-parallel-layout" in args:
        stages = parse_megatron_layout(args["--pipeline-model-parallel-layout"].strip('"'))
        assert len(stages) % p == 0 and len(stages) // p == v  # Megatron: layout length / p = virtual stages
        assert [st_.count("t") for st_ in stages] == list(counts)
        assert stages[0][0] == "E" and stages[-1][-1] == "L"
    elif "--decoder-first-pipeline-num-layers" in args:
        first, last = int(args["--decoder-first-pipeline-num-layers"]), int(args["--decoder-last-pipeline-num-layers"])
        middle = (L - first - last) // (p - 2) if p > 2 else 0
        assert [first] + [middle] * (p - 2) + [last] == list(counts) and v == 1
    elif "--num-layers-per-virtual-pipeline-stage" in args:
        assert [int(args["--num-layers-per-virtual-pipeline-stage"])] * S == list(counts)
    else:
        assert len(set(counts)) == 1 and v == 1  # Megatron's default: an even split
    if recompute == "full":
        assert args["--recompute-granularity"] == "full" and args["--recompute-method"] == "uniform"
        assert args["--recompute-num-layers"] == "1"


def test_megatron_notes_what_it_would_run_instead():
    text = megatron_arguments(spec(schedule="zbv", chunks=2, layers_per_stage=(4,) * 8))
    assert text.startswith("# Megatron-LM has no zbv schedule") and "round-robin, not in a V" in text
    assert megatron_arguments(spec()).count("#") == 0
    assert megatron_layout(spec()) == "Et*7|t*9|t*9|t*7L"


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), v=st.sampled_from([1, 2]), data=st.data(),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "pipedream"]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_torchtitan_toml_has_only_its_keys_and_every_module_once(p, v, data, schedule, recompute):
    S = p * v
    counts = tuple(data.draw(st.lists(st.integers(1, 4), min_size=S, max_size=S)))
    model = ModelSpec(name="m", layers=sum(counts), hidden=256, heads=4, vocab=512, seq_len=64)
    s = LaunchSpec(model=model, schedule=schedule, pipeline=p, tensor=1, data=3, microbatch_size=2,
                   microbatches=2 * p, chunks=v, recompute=recompute, sequence_parallel=False,
                   distributed_optimizer=False, layers_per_stage=counts)
    doc = tomllib.loads(torchtitan_toml(s, schedule_csv="/tmp/s.csv"))
    assert set(doc) <= set(TORCHTITAN_KEYS)
    for section, keys in doc.items():
        assert set(keys) <= TORCHTITAN_KEYS[section], set(keys) - TORCHTITAN_KEYS[section]
    par = doc["parallelism"]
    assert par["pipeline_parallel_degree"] == p and par["data_parallel_replicate_degree"] == 3
    assert doc["training"]["local_batch_size"] == 2 * 2 * p and doc["training"]["global_batch_size"] == 3 * 2 * 2 * p
    assert doc["activation_checkpoint"]["mode"] in TORCHTITAN_AC_MODES
    parts = par["module_fqns_per_model_part"]
    flat = [m for part in parts for m in part]
    assert len(parts) == S and flat == ["tok_embeddings"] + [f"layers.{i}" for i in range(model.layers)] + [
        "norm", "output"]
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(counts)
    if schedule in TORCHTITAN_SCHEDULES:
        assert par["pipeline_parallel_schedule"] == TORCHTITAN_SCHEDULES[schedule]
    elif schedule not in ASYNC_SCHEDULES:
        assert par["pipeline_parallel_schedule_csv"] == "/tmp/s.csv"


def test_a_model_without_vocabulary_has_no_end_modules():
    bare = ModelSpec(name="bare", layers=4, hidden=64, heads=4, vocab=0, seq_len=16)
    s = LaunchSpec(model=bare, schedule="1f1b", pipeline=2, tensor=1, data=1, microbatch_size=1, microbatches=2,
                   chunks=1, recompute="none", sequence_parallel=False, distributed_optimizer=False,
                   layers_per_stage=(2, 2))
    parts = tomllib.loads(torchtitan_toml(s))["parallelism"]["module_fqns_per_model_part"]
    assert parts == [["layers.0", "layers.1"], ["layers.2", "layers.3"]]


def test_launch_spec_refuses_a_split_that_is_not_the_models():
    with pytest.raises(LaunchError, match="sums to"):
        spec(layers_per_stage=(8, 8, 8, 7))
    with pytest.raises(LaunchError, match="p x v"):
        spec(layers_per_stage=(16, 16))


def test_plan_emits_each_format_and_the_csv_loads_in_torch(tmp_path, capsys):
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from sim.io.schedule_io import _StandInStage

    out = tmp_path / "plan"
    base = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
            "--seq-len", "2048", "--schedules", "interleaved-1f1b", "--pipeline-parallel", "2",
            "--tensor-parallel", "8", "--microbatch-size", "1", "--chunks", "2", "--no-progress", "-o", str(out)]
    assert main(base + ["--emit", "megatron"]) == 0
    args = arguments(capsys.readouterr().out)
    assert set(args) <= MEGATRON_ARGUMENTS and args["--pipeline-model-parallel-size"] == "2"
    assert main(base + ["--emit", "torchtitan"]) == 0
    doc = tomllib.loads(capsys.readouterr().out)
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert main(base + ["--emit", "csv"]) == 0
    rows = capsys.readouterr().out
    plan_json = json.loads((out / "plan.json").read_text())
    launch = plan_json["launch"]
    assert launch["pytorch_csv"] == str(out / "schedule.csv") and (out / "schedule.csv").read_text() == rows
    assert launch["layers_per_stage"] == plan_json["winner"]["layers_per_stage"]
    # PyTorch's own loader accepts it: p = 2 ranks, 2 stages each, M = 64 / d micro-batches
    w = plan_json["winner"]
    p, v, M = int(w["pipeline"]), int(w["chunks"]), int(w["microbatches"])
    stages = [_StandInStage(r + c * p, p * v, 0, p) for c in range(v) for r in (0,)]
    runtime = torch_schedules._PipelineScheduleRuntime(stages, M)
    runtime._load_csv(str(out / "schedule.csv"))
    assert len(runtime.pipeline_order) == p
    assert sum(len([a for a in row if a is not None]) for row in runtime.pipeline_order.values()) == 2 * p * v * M


def test_emit_refusals_are_one_line(tmp_path, capsys):
    base = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "1024", "--schedules", "1f1b", "--tensor-parallel", "1", "--microbatch-size", "1",
            "--no-progress", "-o", str(tmp_path / "plan")]
    assert main(base + ["--emit", "megatron", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--emit or --json" in err[0]
    assert main(base + ["--emit", "megatron", "--memory-cap", "1e9"]) == 2  # nothing fits: nothing to launch
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to launch" in err[0]
