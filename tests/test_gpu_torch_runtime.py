"""PyTorch's own runtime on one GPU (issue 27's GPU check): ``validate --runtime torch --backend nccl -K 1``.

One NCCL rank holds every stage (a K=1 pipeline; NCCL refuses two ranks on one device, so multi-GPU runs stay
untested here). The profiler records CUDA activity, and the ingested actions must take their times from the GPU
kernels (CUPTI's device timestamps, the profiler's CUDA events), not from the host ranges that launched them.
Skipped without a CUDA GPU; ``benchmarks/gpu_checks.sh`` runs it on the device machine.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from validate.pytorch.validation import run_torch_validations
    out = tmp_path_factory.mktemp("gpu_torch_runs")
    validations = run_torch_validations(NAMES, 1, 4, workload="mlp", backend="nccl", steps=2, warmup=1, timed=1,
                                        timeout=240, workload_options={"width": 512, "depth": 2, "batch": 64},
                                        output_dir=out)
    return {v.name: v for v in validations}


@pytest.mark.parametrize("name", NAMES)
def test_torch_runtime_on_one_gpu_is_timed_by_its_kernels(runs, name):
    v = runs[name]
    s = v.summary
    ingested = v.comparison.ingested
    assert set(ingested.measured.schedule) == set(ingested.schedule)  # every action recovered
    assert ingested.order_differences == ()
    assert any("on GPU kernels" in n for n in s["notes"]), s["notes"]  # the kernels' times, not the host ranges'
    assert s["gradients_match"] is True
    assert s["measured_makespan"] > 0 and s["predicted_makespan"] > 0
    json.dumps(v.to_dict(), default=str)


def test_the_reference_on_the_gpu_is_the_cpu_one():
    """After an NCCL run the float64 replay computes on the GPU (validate.correctness.reference.reference_device):
    the same numbers as on the CPU, back on the CPU."""
    from sim import schedules
    from validate.correctness.reference import emulate_updates, max_difference, reference_device, reference_grads
    from validate.rank.workloads import WorkloadSpec
    spec = WorkloadSpec(name="transformer", d_model=64, heads=4, seq=16, batch=4, depth=1)
    device = reference_device("nccl")
    assert device.type == "cuda"
    sched = schedules.generate("pipedream", 2, 4, iterations=2)
    on_gpu, on_cpu = emulate_updates(spec, sched, device=device), emulate_updates(spec, sched)
    for s in on_cpu.grads:
        for a, b in zip(on_gpu.grads[s] + on_gpu.weights[s], on_cpu.grads[s] + on_cpu.weights[s]):
            assert all(a[k].device.type == "cpu" for k in a)
            assert max(float((a[k] - b[k]).abs().max()) / max(float(b[k].abs().max()), 1e-300) for k in b) < 1e-10
    absolute, relative = max_difference(reference_grads(spec, 2, 4, device=device), reference_grads(spec, 2, 4))
    assert relative < 1e-6  # float32 copies of float64 gradients: equal up to the float32 rounding
