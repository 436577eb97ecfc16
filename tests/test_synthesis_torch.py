"""A synthesized schedule in PyTorch's own runtime: its CSV loads with ``_PipelineScheduleRuntime._load_csv`` and
two gloo ranks run it to the same gradients as one process (torch.distributed.pipelining, torch 2.13).

``_load_csv`` is the only way PyTorch offers to run an arbitrary order; ``pipesim validate --runtime torch
--schedule-file`` uses it too (tests/test_validate_schedule_file.py runs it end to end, through the validator's
launcher and report).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

from sim.io.schedule_io import write_pytorch_csv  # noqa: E402
from sim.model.cost import uniform  # noqa: E402
from sim.model.hardware import Hardware  # noqa: E402
from sim.search.synthesis import synthesize  # noqa: E402

K, M, WIDTH = 2, 4, 8

RANK_SCRIPT = textwrap.dedent('''
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    csv_path, out, M, W = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(W, W), torch.nn.Tanh()) for _ in range(world)]
    x, y = torch.randn(M * 2, W), torch.randn(M * 2, W)
    stage = PipelineStage(blocks[rank], rank, world, torch.device("cpu"))
    loss = lambda out, target: torch.nn.functional.mse_loss(out, target, reduction="sum")
    runtime = _PipelineScheduleRuntime([stage], n_microbatches=M, loss_fn=loss, scale_grads=False)
    runtime._load_csv(csv_path)
    if rank == 0:
        runtime.step(x)
    elif rank == world - 1:
        runtime.step(target=y)
    else:
        runtime.step()
    torch.save({n: p.grad for n, p in blocks[rank].named_parameters()}, out)
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference_grads() -> list[dict]:
    """One process: the same model, data and loss, every micro-batch's loss summed."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(K)]
    x, y = torch.randn(M * 2, WIDTH), torch.randn(M * 2, WIDTH)
    out = x
    for block in blocks:
        out = block(out)
    torch.nn.functional.mse_loss(out, y, reduction="sum").backward()
    return [{n: p.grad for n, p in b.named_parameters()} for b in blocks]


@pytest.fixture(scope="module")
def synthesized_csv(tmp_path_factory) -> tuple[Path, object]:
    costs = uniform(K, forward=1.0, backward=1.0, weight=1.0)
    found = synthesize(costs, Hardware(devices=K), microbatches=M, memory_limit=K, method="local", seconds=1)
    path = write_pytorch_csv(found.schedule, tmp_path_factory.mktemp("synth") / "synth.csv")
    return path, found


def _load(path: Path):
    """PyTorch's loader of compute-only CSVs (``PipelineScheduleMulti._load_csv``: parse, then
    ``_validate_schedule``: every F, I, W once per micro-batch and stage, in that order, and the stage -> rank
    mapping), on an object holding only what it reads: no process group is needed to check a file."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    runtime = object.__new__(PipelineScheduleMulti)
    runtime.pipeline_order, runtime._stages = {}, []
    runtime._num_stages, runtime.pp_group_size, runtime._n_microbatches = K, K, M
    PipelineScheduleMulti._load_csv(runtime, str(path))
    return runtime


def test_the_csv_loads_with_pytorchs_load_csv_and_a_broken_one_does_not(synthesized_csv, tmp_path):
    path, found = synthesized_csv
    runtime = _load(path)
    for rank in range(K):
        ours = [str(a) for a in found.schedule.actions[rank] if a.kind.value != "U"]
        assert [str(a).replace("I", "B") for a in runtime.pipeline_order[rank]] == ours
    assert runtime.stage_index_to_group_rank == {0: 0, 1: 1}
    rows = path.read_text().splitlines()
    broken = tmp_path / "broken.csv"  # the bug a wrong order would be: a W before its own input gradient
    cells = rows[0].split(",")
    i_at, w_at = cells.index("0I0"), cells.index("0W0")
    cells[i_at], cells[w_at] = cells[w_at], cells[i_at]
    broken.write_text("\n".join([",".join(cells)] + rows[1:]) + "\n")
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        _load(broken)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gloo_ranks_run_it_in_pytorchs_runtime_with_matching_gradients(synthesized_csv, tmp_path):
    path, _ = synthesized_csv
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = _free_port()
    procs = []
    for rank in range(K):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(K), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(path), str(tmp_path / f"grad{rank}.pt"),
                                       str(M), str(WIDTH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outputs.append(out.decode(errors="replace"))
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)[-3000:]
    reference = _reference_grads()
    for rank in range(K):
        grads = torch.load(tmp_path / f"grad{rank}.pt")
        for name, want in reference[rank].items():
            torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-6)
