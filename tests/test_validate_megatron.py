"""Real Megatron-LM: megatron-core's own pipeline schedules on gloo ranks (``pipesim validate --runtime megatron``).

Two launches (session fixtures) run Megatron's ``forward_backward_pipelining_without_interleaving`` (K=2) and
``forward_backward_pipelining_with_interleaving`` (K=4, 2 chunks) on a tiny MLP under torch.profiler with
``with_stack=True``, as Megatron profiles. Every action must be read back in Megatron's order, the step's gradients
must equal one-process training, and the ``megatron`` lowering must post every batch of sends and receives where
the ranks did (:mod:`validate.ingest.posting`); holding the trace against another runtime's lowering must fail.
Two more run Megatron-LM's overlapped modes of the interleaved schedule on 2 ranks (``overlap_p2p_comm``, and with
``overlap_p2p_comm_warmup_flush``), each held against its own lowering and the other's.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from sim import schedules  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.core.comm_lowering import lower  # noqa: E402
from validate.ingest.flow import without_updates  # noqa: E402
from validate.ingest.posting import check_posting  # noqa: E402

pytestmark = pytest.mark.slow

SHAPES = {"1f1b": (2, 4), "interleaved-1f1b": (4, 4)}
"""schedule -> (K, M): Megatron's interleaved schedule needs more than 2 ranks."""


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    from validate.pytorch.validation import run_torch_validations
    out = tmp_path_factory.mktemp("megatron_runs")
    validations = {}
    for name, (K, M) in SHAPES.items():
        [validations[name]] = run_torch_validations(
            [name], K, M, workload="mlp", steps=2, warmup=1, timed=1, timeout=240, runtime="megatron",
            workload_options={"width": 16, "depth": 1, "batch": 2}, output_dir=out)
    return validations


OVERLAPPED = {"megatron-overlap": "megatron-overlap-flush", "megatron-overlap-flush": "megatron-overlap"}
"""Megatron-LM's overlapped modes (overlap_p2p_comm; with overlap_p2p_comm_warmup_flush) -> the other one."""


@pytest.fixture(scope="session", params=sorted(OVERLAPPED))
def overlap_run(request, tmp_path_factory):
    """Megatron-LM's overlapped modes for the interleaved schedule (the training default, and with
    --overlap-p2p-communication-warmup-flush), on 2 ranks: they run there."""
    from validate.pytorch.validation import run_torch_validations
    [v] = run_torch_validations(["interleaved-1f1b"], 2, 4, workload="mlp", steps=2, warmup=1, timed=1, timeout=240,
                                runtime=request.param, workload_options={"width": 16, "depth": 1, "batch": 2},
                                output_dir=tmp_path_factory.mktemp(request.param))
    return request.param, v


def test_the_overlapped_modes_post_where_megatron_did_with_one_process_gradients(overlap_run):
    runtime, run = overlap_run
    s = run.summary
    assert s["gradients_match"] is True, s["check"]
    assert s["runtime"] == runtime and s["runtime_model"]["lowering"] == runtime
    assert s["posting"] == {"matches": True, "ranks": 2, "steps": 2, "difference": None}
    # megatron-core's batched, blocking mode posts elsewhere (pipesim's executor too), and so does the other mode
    schedule = without_updates(schedules.generate("interleaved-1f1b", 2, 4))
    traces = [run.paths[f"trace_rank{r}"] for r in range(2)]
    assert not check_posting(traces, lower(schedule, "pipesim")).matches
    assert not check_posting(traces, lower(schedule, OVERLAPPED[runtime])).matches
    with pytest.raises(Exception, match="with 2 pipeline ranks"):
        lower(schedule, "megatron")


@pytest.fixture(scope="session")
def user_run(tmp_path_factory):
    """The README's own-model example (a GPT decoder: token ids in, one boundary shape) under Megatron."""
    from validate.pytorch.validation import run_torch_validations
    [v] = run_torch_validations(["1f1b"], 2, 2, workload="examples.gpt_decoder:pipeline", steps=1, warmup=1, timed=1,
                                timeout=240, runtime="megatron", output_dir=tmp_path_factory.mktemp("megatron_user"))
    return v


def test_the_users_own_model_runs_in_megatron_with_one_process_gradients(user_run):
    assert user_run.summary["gradients_match"] is True, user_run.summary["check"]
    assert user_run.summary["posting"]["matches"] is True


@pytest.mark.parametrize("name", SHAPES)
def test_megatrons_run_is_read_in_its_order_with_one_process_gradients(runs, check, name):
    v = runs[name]
    K, M = SHAPES[name]
    ing = v.comparison.ingested
    assert set(ing.measured.schedule) == set(ing.schedule) and ing.order_differences == ()
    assert ing.forms == ("megatron",) and ing.actions_inferred == 2 * M * (ing.schedule.stages)
    for result in ing.steps.values():
        check(result, modelled=False)
    s = v.summary
    assert s["gradients_match"] is True, s["check"]
    assert s["runtime"] == "megatron" and s["megatron_function"] == v.cls
    assert v.cls == {"1f1b": "forward_backward_pipelining_without_interleaving",
                     "interleaved-1f1b": "forward_backward_pipelining_with_interleaving"}[name]
    text = v.paths["report"].read_text()
    assert "## Megatron-LM's runtime" in text and "`--runtime megatron`" in text


@pytest.mark.parametrize("name", SHAPES)
def test_the_megatron_lowering_posts_where_megatron_did(runs, name):
    v = runs[name]
    assert v.summary["posting"] == {"matches": True, "ranks": SHAPES[name][0], "steps": 2, "difference": None}
    assert "posting points: the megatron lowering posts every batch" in v.paths["report"].read_text()
    # the check can fail: pipesim's executor posts its receives ahead, and PyTorch's multi-stage runtime right
    # before their consumer (its Schedule1F1B batches as Megatron's non-interleaved loop does, waits aside)
    K, M = SHAPES[name]
    schedule = without_updates(schedules.generate(name, K, M))
    traces = [v.paths[f"trace_rank{r}"] for r in range(K)]
    for lowering in ("pipesim", "torch-multi") if name == "interleaved-1f1b" else ("pipesim",):
        other = check_posting(traces, lower(schedule, lowering))
        assert not other.matches and "rank 0, step" in other.difference and "where the lowering has" in \
            other.difference, lowering


def test_pipesim_ingest_reads_megatrons_traces_with_its_runtime(runs, tmp_path, capsys):
    v = runs["interleaved-1f1b"]
    traces = [str(v.paths[f"trace_rank{r}"]) for r in range(4)]
    rc = main(["ingest", *traces, "--from-megatron", "interleaved", "--chunks", "2", "-K", "4", "-M", "4",
               "--runtime", "megatron", "-o", str(tmp_path), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["stages"] == 8 and d["measured_makespan"] > 0 and d["runtime_model"]["runtime"] == "megatron"


@pytest.mark.parametrize("args,message", [
    (["-s", "gpipe"], "Megatron-LM has no schedule function for 'gpipe'"),
    (["-s", "interleaved-1f1b", "-K", "2", "-M", "4"], "needs more than 2 pipeline ranks"),
    (["-s", "interleaved-1f1b", "-K", "4", "-M", "6"], "-M must be a multiple of -K"),
    (["-s", "1f1b", "--recompute"], "--recompute do(es) not apply to --runtime megatron"),
    (["-s", "1f1b", "--workload", "emulated"], "runs real stage modules"),
])
def test_validate_runtime_megatron_refuses_in_one_line(capsys, args, message):
    rc = main(["validate", "--runtime", "megatron", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_without_megatron_core_the_runtime_says_how_to_get_it(capsys, monkeypatch):
    import validate.pytorch.megatron as megatron
    monkeypatch.setattr(megatron, "megatron_version", lambda: None)
    rc = main(["validate", "--runtime", "megatron", "-s", "1f1b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs megatron-core: pip install 'pipesim[megatron]'" in err[0], err


def test_two_ranks_interleaved_give_wrong_gradients_in_megatron_itself(tmp_path):
    """Why K=2 is refused: run anyway, megatron-core 0.16's batched exchanges pair crosswise on the one link."""
    from validate.pytorch.runtime import run_torch_schedules
    from validate.pytorch.validation import _gradient_check
    from validate.rank.workloads import WorkloadSpec

    schedule = without_updates(schedules.generate("interleaved-1f1b", 2, 4))
    spec = WorkloadSpec(name="mlp", width=16, depth=1, batch=2)
    run = run_torch_schedules([{"name": "j", "cls": "forward_backward_pipelining_with_interleaving",
                                "microbatches": 4, "placement": list(schedule.placement), "runtime": "megatron"}],
                              workload=spec.to_dict(), warmup=1, timed=1, profiled=1, workdir=tmp_path, timeout=120)
    assert _gradient_check(spec, schedule, run["j"]["grads"], "gloo").passed is False
