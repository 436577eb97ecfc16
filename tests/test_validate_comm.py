"""The NCCL path, correct by design, checked without a GPU: device binding and eager pair connection (mocks).

NCCL builds a communicator per (group, pair) the first time the pair talks, and both
ranks block until it exists. :meth:`validate.rank.comm.Comm.connect_all` makes every pair
talk once, in one global order, before the run. Here every rank's calls are recorded
through a mocked ``torch.distributed`` and replayed by a rendezvous model (an exchange
completes only when both of its ranks are at it): the recorded orders must finish, and
a rank-dependent order, the lazy creation failure, must be shown stuck by the same model.
"""

import os

import pytest

torch = pytest.importorskip("torch")

from validate.rank import comm as comm_module  # noqa: E402
from validate.rank.comm import Comm  # noqa: E402
from validate.rank.worker import host_id  # noqa: E402


def _recorded(monkeypatch, world: int) -> dict[int, list]:
    """rank -> the exchanges connect_all makes on it: (group, sender, receiver)."""
    calls: dict[int, list] = {}
    for rank in range(world):
        log = calls.setdefault(rank, [])
        monkeypatch.setattr(comm_module.dist, "send", lambda t, dst, group, _r=rank, _l=log: _l.append((group, _r, dst)))
        monkeypatch.setattr(comm_module.dist, "recv", lambda t, src, group, _r=rank, _l=log: _l.append((group, src, _r)))
        Comm(rank=rank, world=world, backend="nccl", timeout=1.0, up="up", down="down").connect_all()
    return calls


def _finishes(calls: dict[int, list]) -> bool:
    """Rendezvous model: the head exchange of a rank completes when it is also the other rank's head."""
    heads = {r: list(ops) for r, ops in calls.items()}
    while any(heads.values()):
        progressed = False
        for r, ops in heads.items():
            if not ops:
                continue
            group, a, b = ops[0]
            other = b if r == a else a
            if heads[other] and heads[other][0] == ops[0]:
                ops.pop(0), heads[other].pop(0)
                progressed = True
                break
        if not progressed:
            return False
    return True


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_pair_is_connected_once_per_group_in_one_order_without_deadlock(monkeypatch, world):
    calls = _recorded(monkeypatch, world)
    pairs = {(g, min(a, b), max(a, b)) for ops in calls.values() for g, a, b in ops}
    assert pairs == {(g, a, b) for g in ("up", "down") for a in range(world) for b in range(a + 1, world)}
    for rank, ops in calls.items():
        assert len(ops) == 2 * (world - 1)
        assert all(g == "up" and a < b or g == "down" and a > b for g, a, b in ops)  # each group's direction
    assert _finishes(calls)


def test_the_model_sees_the_deadlock_of_a_rank_dependent_order(monkeypatch):
    calls = _recorded(monkeypatch, 3)
    calls[1] = list(reversed(calls[1]))  # rank 1 connects its pairs in another order: what lazy creation amounts to
    assert not _finishes(calls)


def test_nccl_binds_the_device_at_init(monkeypatch):
    seen = {}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(comm_module.dist, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(comm_module.dist, "new_group", lambda ranks, backend: f"group:{backend}")
    monkeypatch.setattr(Comm, "connect_all", lambda self, device=None: seen.setdefault("connected", device))
    device = torch.device("cuda", 1)
    c = Comm.from_env("nccl", 5.0, device=device)
    assert seen["device_id"] == device and seen["backend"] == "nccl"
    assert seen["connected"] == device and c.control == "group:gloo"
    seen.clear()
    Comm.from_env("gloo", 5.0, device=torch.device("cpu"))
    assert "device_id" not in seen  # gloo has nothing to bind


def test_hosts_are_told_apart_by_boot_id():
    hid = host_id()
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert len(hid) == 36 and hid.count("-") == 4  # a UUID, not the hostname
    assert hid == host_id()


def test_emulated_on_nccl_is_refused_with_a_reason():
    from validate.run import check_request
    from validate.errors import ValidationError
    with pytest.raises(ValidationError, match="emulated waits on the host"):
        check_request(workload="emulated", backend="nccl", devices=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs")
def test_readme_nccl_example_with_four_ranks(tmp_path):
    # the README's example: pipesim validate -s 1f1b -K 4 -M 8 --workload transformer --backend nccl
    from validate import run_validation
    report = run_validation("1f1b", 4, 8, workload="transformer", backend="nccl", output_dir=tmp_path, timeout=300,
                            repeats=2)
    assert report.gradients_match is True
    assert all(m is not None and m > 0 for m in report.memory)
