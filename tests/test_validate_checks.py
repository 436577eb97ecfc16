"""The correctness check can fail: one bug at a time is planted in the executor or a stage, and the check must say so.

All ranks run in one process (validate.rank.inprocess), so each case takes a fraction of a second.
Flush schedules are checked on 1F1B (one iteration: the update itself is compared), weight
stashing on PipeDream (updates while other micro-batches are in flight).
"""

import argparse
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from validate.rank import workloads  # noqa: E402
from validate.correctness.checks import POWER_MARGIN, check_updates, powered_learning_rate, update_log_of  # noqa: E402
from validate.rank.executor import Executor  # noqa: E402
from validate.rank.inprocess import run_in_process  # noqa: E402
from validate.request import WorkloadSpec  # noqa: E402
from validate.rank.workloads import TorchStage  # noqa: E402

SPEC = WorkloadSpec(name="mlp", width=8, depth=2, batch=3, seed=3)  # depth 2: a stage's input gradient uses its weights
FLUSH = schedules.one_f_one_b(2, 4)
ASYNC = schedules.pipedream(2, 4)


def _check(sched):
    spec = powered_learning_rate(SPEC, sched)
    result = run_in_process(sched, spec, timeout=20)
    assert not result["errors"], result["errors"]
    return check_updates(spec, sched, update_log_of(result["ranks"]))


@pytest.mark.parametrize("sched", [FLUSH, ASYNC], ids=["1f1b", "pipedream"])
def test_a_correct_run_passes_with_power(sched):
    check = _check(sched)
    assert check.passed is True and check.error < check.tolerance
    if sched is ASYNC:
        assert set(check.power) == {"synchronous SGD", "no weight stash"}
        assert min(check.power.values()) >= POWER_MARGIN * check.tolerance and check.conclusive
        assert "synchronous SGD would differ by" in check.summary()
    else:
        assert check.power == {}


def _drop_one_gradient(monkeypatch):
    original = TorchStage._accumulate

    def accumulate(self, mb, grads, *rest):
        if mb != 1:  # the contribution of micro-batch 1 is lost
            original(self, mb, grads, *rest)
    monkeypatch.setattr(TorchStage, "_accumulate", accumulate)


def _wrong_loss_scaling(monkeypatch):
    monkeypatch.setattr(workloads, "stage_loss",
                        lambda out, target, group: torch.nn.functional.mse_loss(out, target) / (2 * group))


def _missing_weight_stash(monkeypatch):
    def update(self, u):  # an optimizer stepping in place: micro-batches in flight see the new weights
        acc = self.grads.pop(u, {})
        weights = self.versions[self.current]
        step = {k: acc.get(k, torch.zeros_like(p)) for k, p in weights.items()}
        self.grad_log.append(step)
        with torch.no_grad():
            for k, p in weights.items():
                p.data.sub_(self.spec.lr * step[k])
        self.weight_log.append({k: p.detach().clone() for k, p in weights.items()})
    monkeypatch.setattr(TorchStage, "update", update)


def _wrong_stashed_version(monkeypatch):
    original = TorchStage.backward

    def backward(self, mb, grad_out, *, split):
        self.inflight[mb].version = self.current  # the stash remembers the newest version, not the forward's
        return original(self, mb, grad_out, split=split)
    monkeypatch.setattr(TorchStage, "backward", backward)


def _wrong_sign_update(monkeypatch):
    original = TorchStage.update

    def update(self, u):
        spec = self.spec
        self.spec = SimpleNamespace(**dict(spec.to_dict(), lr=-spec.lr))  # ascent instead of descent
        try:
            original(self, u)
        finally:
            self.spec = spec
    monkeypatch.setattr(TorchStage, "update", update)


def _corrupted_activation(monkeypatch):
    original = Executor._deliver

    def deliver(self, key, out):
        original(self, key, out * 1.001 if self.sends.get(key) is not None else out)
    monkeypatch.setattr(Executor, "_deliver", deliver)


@pytest.mark.parametrize("bug,sched", [
    (_drop_one_gradient, FLUSH), (_drop_one_gradient, ASYNC),
    (_wrong_loss_scaling, FLUSH), (_wrong_loss_scaling, ASYNC),
    (_missing_weight_stash, ASYNC), (_wrong_stashed_version, ASYNC),
    (_wrong_sign_update, FLUSH), (_wrong_sign_update, ASYNC),
    (_corrupted_activation, FLUSH), (_corrupted_activation, ASYNC),
], ids=lambda v: getattr(v, "__name__", None) or getattr(v, "name", None))
def test_every_planted_bug_fails_the_check(monkeypatch, bug, sched):
    bug(monkeypatch)
    check = _check(sched)
    assert check.passed is False, check.summary()
    assert check.summary().startswith("FAILED")


def test_weight_versions_of_the_references_differ_where_they_should():
    from validate.correctness.checks import is_asynchronous
    assert not is_asynchronous(FLUSH) and is_asynchronous(ASYNC)


def test_a_failed_check_exits_3_and_says_failed_first(monkeypatch, capsys, tmp_path):
    from sim.cli import validate as command
    from validate import run as comparison
    from validate.correctness.checks import CorrectnessCheck

    class FakeReport:
        failed = True
        measured = None
        distribution = None  # no --inject
        paths: dict = {}

    captured = {}

    def fake_run_validation(*args, **kwargs):
        captured.update(kwargs)
        return FakeReport()
    monkeypatch.setattr(comparison, "run_validation", fake_run_validation)
    monkeypatch.setattr("validate.compare.report.format_summary", lambda report: "FAILED: the correctness check failed")
    parser = argparse.ArgumentParser()
    command.add_validate_options(parser)
    args = parser.parse_args(["-s", "gpipe", "--quiet"])
    assert command.run(args) == command.EXIT_CHECK_FAILED == 3
    assert capsys.readouterr().out.startswith("FAILED")
    assert captured["workload_options"] == {"seed": 0}  # no size given: the probe chooses them
    assert CorrectnessCheck(passed=False, error=1.0, worst="stage 0").summary().startswith("FAILED")


def test_tolerance_is_the_larger_of_the_floor_and_the_float32_rounding_of_plain_training():
    from validate.correctness.checks import ROUNDING_MARGIN, TOLERANCE, tolerance_for
    from validate.correctness.reference import emulate_updates
    ref = emulate_updates(SPEC, FLUSH)
    assert tolerance_for(SPEC, FLUSH, ref) == TOLERANCE  # float32 lands at ~1e-7 here: the fixed floor wins
    skewed = type(ref)(grads={s: [{k: v * (1 + 1e-3) for k, v in g.items()} for g in log] for s, log in ref.grads.items()},
                       weights=ref.weights)
    assert tolerance_for(SPEC, FLUSH, skewed) == pytest.approx(ROUNDING_MARGIN * 1e-3, rel=1e-2)


def test_the_reference_computes_where_it_is_told(monkeypatch):
    """The float64 replay runs on the CPU unless a run on NCCL hands it that run's GPU; either way the update log
    is on the CPU. Without CUDA the NCCL case falls back to the CPU."""
    import torch

    from validate.correctness import reference
    assert reference.reference_device("gloo").type == "cpu"
    if not torch.cuda.is_available():
        assert reference.reference_device("nccl").type == "cpu"
    seen = []
    build = reference.build_stage_module
    monkeypatch.setattr(reference, "build_stage_module", lambda spec, s: seen.append(s) or build(spec, s))
    spec = WorkloadSpec(name="mlp", width=8, depth=1, batch=2)
    sched = schedules.generate("1f1b", 2, 4)
    log = reference.emulate_updates(spec, sched, device=torch.device("cpu"))
    assert seen == [0, 1] and all(v.device.type == "cpu" for g in log.grads.values() for d in g for v in d.values())
    assert torch.equal(log.grads[1][0]["0.weight"], reference.emulate_updates(spec, sched).grads[1][0]["0.weight"])


def test_a_reference_too_large_for_the_gpu_is_computed_on_the_cpu(monkeypatch):
    """The whole model in float64 on the one GPU of rank 0 may not fit where its stages were spread over K GPUs:
    an out-of-memory error there falls back to the CPU (the device is faked: any device but the CPU raises it)."""
    import torch

    from validate.correctness import reference
    real_emulate, real_grads = reference._emulate, reference._reference_grads
    tried = []

    def emulate(spec, schedule, semantics, dtype, device):
        tried.append(device.type)
        if device.type != "cpu":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked)")
        return real_emulate(spec, schedule, semantics, dtype, device)

    def grads(spec, stages, microbatches, iteration, dtype, device):
        tried.append(device.type)
        if device.type != "cpu":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked)")
        return real_grads(spec, stages, microbatches, iteration, dtype, device)
    monkeypatch.setattr(reference, "_emulate", emulate)
    monkeypatch.setattr(reference, "_reference_grads", grads)
    spec = WorkloadSpec(name="mlp", width=8, depth=1, batch=2)
    sched = schedules.generate("1f1b", 2, 4)
    log = reference.emulate_updates(spec, sched, device=torch.device("meta"))
    assert tried == ["meta", "cpu"] and log.grads[0][0]["0.weight"].device.type == "cpu"
    tried.clear()
    got = reference.reference_grads(spec, 2, 4, device=torch.device("meta"))
    assert tried == ["meta", "cpu"]
    assert torch.equal(got[1]["0.weight"], reference.reference_grads(spec, 2, 4)[1]["0.weight"])
