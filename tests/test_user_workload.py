"""The user's own model in the validator (``--workload package.module:function``, issue 27 item 3).

The example of ``examples/gpt_decoder.py`` runs through pipesim's executor (K=2 processes, gloo) and
through PyTorch's own runtime, with the correctness check against float64 one-process training; a
planted loss-scaling bug makes that check fail on the user's model too. Every bad entry point is one
line and exit code 2, and none starts a rank (the launcher is replaced by one that fails the test).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.cli import main  # noqa: E402
from validate.correctness.checks import check_updates, update_log_of  # noqa: E402
from validate.rank import user_model, workloads  # noqa: E402
from validate.rank.inprocess import run_in_process  # noqa: E402
from validate.request import WorkloadSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples.gpt_decoder:pipeline"


def _cli(*args, cwd=ROOT, timeout=240):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "sim", "validate", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_example_runs_through_pipesims_executor_and_passes_the_correctness_check(tmp_path):
    out = _cli("-s", "1f1b", "-K", "2", "-M", "4", "--workload", EXAMPLE, "--repeats", "1", "--json",
               "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["workload"] == "examples.gpt_decoder.pipeline"
    assert d["gradients_match"] is True and d["check"]["error"] < d["check"]["tolerance"]
    assert "float64 one-process training" in d["check"]["what"]
    assert d["measured_makespan"] > 0 and d["predicted_makespan"] > 0
    assert (tmp_path / "1f1b_K2_M4_examples.gpt_decoder.pipeline_R1.md").exists()


@pytest.mark.slow
def test_example_runs_through_pytorchs_runtime(tmp_path):
    out = _cli("--runtime", "torch", "-s", "gpipe", "-K", "2", "-M", "2", "--workload", EXAMPLE, "--repeats", "1",
               "--json", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["runtime"] == "torch" and d["torch_class"] == "ScheduleGPipe"
    assert d["workload"] == EXAMPLE and d["profiled_steps"] == 1
    assert d["gradients_match"] is True and d["check"]["error"] < d["check"]["tolerance"]
    assert (tmp_path / "gpipe_K2_M2_examples.gpt_decoder.pipeline_torch.md").exists()


def _prepared(stages=2, microbatches=4):
    return user_model.prepare(WorkloadSpec(name=EXAMPLE, path=str(ROOT)), stages, microbatches)


def test_prepare_finds_the_boundaries_and_the_microbatch_size():
    spec = _prepared(stages=3)
    assert spec.boundaries == ((8, 32, 64), (8, 32, 64)) and spec.batch == 8 and spec.path == str(ROOT)
    x, target = workloads.microbatch_data(spec, 5)
    assert x.dtype == torch.int64 and x.shape == (8, 32) and torch.equal(x[:, 1:], target[:, :-1])
    assert workloads.build_stage_module(spec, 0) is not workloads.build_stage_module(spec, 0)  # a copy per call
    json_spec = WorkloadSpec(**json.loads(json.dumps(spec.to_dict())))  # the torch runtime's ranks read JSON
    assert json_spec == spec and hash(json_spec) == hash(spec)


@pytest.mark.parametrize("name", ["1f1b", "pipedream"])
def test_in_process_run_of_the_users_model_matches_the_reference(name):
    sched = schedules.generate(name, 2, 4)
    spec = _prepared()
    result = run_in_process(sched, spec, timeout=30)
    assert not result["errors"], result["errors"]
    check = check_updates(spec, sched, update_log_of(result["ranks"]))
    assert check.passed is True, check.summary()


def test_a_wrong_loss_scaling_of_the_users_model_fails_the_check(monkeypatch):
    # the planted bug: the user's loss not divided by g; the reference scales it itself, so the check must see it
    sched = schedules.generate("gpipe", 2, 4)
    spec = _prepared()
    monkeypatch.setattr(workloads, "user_stage_loss", lambda spec, out, target, group:
                        user_model.loss_function(spec)(out, target))
    result = run_in_process(sched, spec, timeout=30)
    check = check_updates(spec, sched, update_log_of(result["ranks"]))
    assert check.passed is False and check.error > 100 * check.tolerance


def test_the_torch_runtimes_gradient_check_fails_a_wrong_scaling_and_a_missing_stage():
    # what --runtime torch compares: one step's gradient per stage against float64 one-process training
    from validate.correctness.checks import check_step_gradients
    from validate.correctness.reference import reference_grads
    spec = _prepared(microbatches=2)
    right = reference_grads(spec, 2, 2, dtype=torch.float32)
    assert check_step_gradients(spec, 2, 2, right).passed is True
    unscaled = {s: {k: 2 * g for k, g in grads.items()} for s, grads in right.items()}  # summed, not averaged, over M
    check = check_step_gradients(spec, 2, 2, unscaled)
    assert check.passed is False and check.error > 100 * check.tolerance
    assert check_step_gradients(spec, 2, 2, {0: right[0]}).passed is False


BAD_MODELS = textwrap.dedent('''
    import random
    import torch
    from torch import nn

    def _batch(mb):
        g = torch.Generator().manual_seed(mb)
        return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)

    def _mse(y, t):
        return ((y - t) ** 2).mean()

    def good(stages):
        return [nn.Linear(8, 8) for _ in range(stages)], _batch, _mse

    def a_module(stages):
        return nn.Sequential(*[nn.Linear(8, 8) for _ in range(stages)])

    def two_things(stages):
        return [nn.Linear(8, 8) for _ in range(stages)], _batch

    def one_stage_short(stages):
        return [nn.Linear(8, 8) for _ in range(stages - 1)], _batch, _mse

    def not_modules(stages):
        return [lambda x: x for _ in range(stages)], _batch, _mse

    def shapes_do_not_chain(stages):
        return [nn.Linear(8, 16)] + [nn.Linear(8, 8) for _ in range(stages - 1)], _batch, _mse

    def double_boundary(stages):
        return [nn.Linear(8, 8).double() for _ in range(stages)], lambda mb: tuple(t.double() for t in _batch(mb)), _mse

    def vector_loss(stages):
        return [nn.Linear(8, 8) for _ in range(stages)], _batch, lambda y, t: (y - t) ** 2

    def bad_batch(stages):
        return [nn.Linear(8, 8) for _ in range(stages)], lambda mb: torch.zeros(4, 8), _mse

    def random_data(stages):
        return [nn.Linear(8, 8) for _ in range(stages)], lambda mb: (torch.randn(4, 8), torch.randn(4, 8)), _mse

    def growing_batch(stages):
        grow = lambda mb: (torch.zeros(4 + mb, 8), torch.zeros(4 + mb, 8))
        return [nn.Linear(8, 8) for _ in range(stages)], grow, _mse

    def random_weights(stages):
        layers = [nn.Linear(8, 8) for _ in range(stages)]
        with torch.no_grad():
            layers[0].weight.fill_(random.random())
        return layers, _batch, _mse

    def raises(stages):
        raise RuntimeError("no GPU here")

    def widening(stages):  # boundaries of (4, 16) then (4, 8): fine for PyTorch's runtimes, not for Megatron's
        return [nn.Linear(8, 16), nn.Linear(16, 8)] + [nn.Linear(8, 8) for _ in range(stages - 2)], _batch, _mse

    NOT_CALLABLE = 3
''')

BAD = {  # function -> what the one line must say
    "a_module": "returned a Sequential; it must return (stage_modules, make_batch, loss)",
    "two_things": "returned a tuple of 2",
    "one_stage_short": "returned 1 stage module(s); the schedule has 2 stages",
    "not_modules": "stage 0 is a function, not an nn.Module",
    "shapes_do_not_chain": "stage 1 cannot take stage 0's output, a torch.float32 tensor of shape (4, 16)",
    "double_boundary": "stage 0 outputs torch.float64; tensors between stages must be float32",
    "vector_loss": "it must return a scalar",
    "bad_batch": "make_batch(0) must return (input, target)",
    "random_data": "make_batch(0) returned different tensors on two calls",
    "growing_batch": "make_batch(1) gives an input of a torch.float32 tensor of shape (5, 8)",
    "random_weights": "two builds with seed 0 gave different weights in stage 0",
    "raises": "calling it with stages=2 raised RuntimeError: no GPU here",
    "NOT_CALLABLE": "'NOT_CALLABLE' is not a function (it is an 'int')",
    "missing": "module 'user_models_under_test' has no 'missing'",
}


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    (folder / "user_models_under_test.py").write_text(BAD_MODELS)
    yield folder
    sys.modules.pop("user_models_under_test", None)


def test_the_fixture_models_good_entry_passes(bad_models):
    spec = user_model.prepare(WorkloadSpec(name="user_models_under_test:good", path=str(bad_models)), 2, 4)
    assert spec.boundaries == ((4, 8),)


@pytest.mark.parametrize("function", sorted(BAD))
def test_bad_entry_points_are_one_line_before_any_rank_starts(function, bad_models, monkeypatch, capsys):
    import validate.launch

    def no_launch(*args, **kwargs):
        raise AssertionError("a rank was launched")

    monkeypatch.setattr(validate.launch, "launch", no_launch)
    monkeypatch.chdir(bad_models)  # the entry point's module is looked up from the folder the command runs in
    code = main(["validate", "-s", "gpipe", "-K", "2", "-M", "4", "--workload", f"user_models_under_test:{function}",
                 "-o", str(bad_models / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("pipesim: error: ") and BAD[function] in err, err
    assert not (bad_models / "out").exists()


def test_megatron_refuses_boundaries_of_two_sizes_before_any_rank_starts(bad_models, monkeypatch, capsys):
    pytest.importorskip("megatron.core")
    import validate.pytorch.runtime

    def no_launch(*args, **kwargs):
        raise AssertionError("a rank was launched")

    monkeypatch.setattr(validate.pytorch.runtime, "run_torch_schedules", no_launch)
    monkeypatch.chdir(bad_models)
    code = main(["validate", "--runtime", "megatron", "-s", "1f1b", "-K", "3", "-M", "3", "--workload",
                 "user_models_under_test:widening", "-o", str(bad_models / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "Megatron's schedules send one tensor shape between every pair of stages; this model's boundaries differ " \
           "((4, 16), (4, 8))" in err, err


@pytest.mark.parametrize("workload, says", [
    ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
    ("examples.gpt_decoder:pipeline:x", "an entry point is package.module:function"),
    ("1bad.module:f", "unknown workload"),
])
def test_bad_entry_point_names(workload, says, capsys):
    assert main(["validate", "-K", "2", "-M", "4", "--workload", workload]) == 2
    assert says in capsys.readouterr().err


def test_sizes_of_builtin_workloads_are_refused_for_the_users_model(capsys):
    assert main(["validate", "-K", "2", "-M", "4", "--workload", EXAMPLE, "--d-model", "64"]) == 2
    assert "--d-model do(es) not apply to --workload examples.gpt_decoder:pipeline" in capsys.readouterr().err

