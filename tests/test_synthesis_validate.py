"""A synthesized schedule run by the validator's executor (torch.distributed, gloo, one process per device): the
order it found runs as it is and trains correctly, its gradients equal one process's (the schedule closes every
stage with an update, so the check has something to compare). The accuracy of the prediction is measured by
benchmarks/bench_synthesis.py --part validate (timings are not asserted in tests)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from sim.model.cost import uniform  # noqa: E402
from sim.model.hardware import Hardware  # noqa: E402
from sim.search.synthesis import synthesize  # noqa: E402
from validate.run import run_validation  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_validator_runs_a_synthesized_order_to_the_one_process_gradients(tmp_path):
    found = synthesize(uniform(2, forward=1.0, backward=1.0, weight=1.0), Hardware(devices=2), microbatches=4,
                       memory_limit=2, method="local", seconds=1)
    assert found.schedule.split_backward  # B and W apart: the executor runs the split backward
    report = run_validation(found.schedule, 2, 4, workload="mlp", output_dir=tmp_path, timeout=240, repeats=1,
                            workload_options={"width": 16, "depth": 1, "batch": 4})
    assert report.gradients_match is True and report.check.error < report.check.tolerance
    ran = report.measured.timeline
    assert len(ran[ran["src"] < 0]) == len(found.schedule)  # every action of the order ran, once
