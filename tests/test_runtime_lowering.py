"""Lowering schedules to explicit sends, receives and waits: PyTorch's own lowered form is the reference."""

from __future__ import annotations

import numpy as np
import pytest

from sim import schedules
from sim.core.comm_lowering import STEP_POST, STEP_WAIT, lower
from sim.model.runtimes import get_runtime


def _torch_lowered(schedule):
    """torch's ``_add_send_recv`` applied to *schedule*'s compute order (tests may use torch's private names)."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _Action, _add_send_recv

    from sim.io.schedule_io import pytorch_rows

    # our compute order in torch's cells (an overlapped pair as one OVERLAP_F_B action, B as B: torch's lowering
    # treats a full and an input-gradient backward alike)
    rows = pytorch_rows(schedule, torch_version="2.5")
    compute = {d: [_Action.from_str(cell) for cell in rows[d]] for d in range(schedule.devices)}
    placement = list(schedule.placement)
    lowered = _add_send_recv(compute, stage_to_rank=lambda s: placement[s], num_stages=schedule.stages)
    out = {}
    for d, acts in lowered.items():  # an OVERLAP_F_B action prints as "(0F3;3B1)OVERLAP_F_B": its two actions
        out[d] = [str(x) for a in acts for x in (a.sub_actions or (a,))]
    return out


@pytest.mark.parametrize("name,K,M", [("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 4, 8), ("zbv", 2, 4),
                                      ("zbv", 4, 8), ("1f1b", 3, 5), ("gpipe", 4, 4), ("dualpipev", 2, 8),
                                      ("dualpipev", 4, 16)])
def test_multi_stage_lowering_is_torchs_add_send_recv(name, K, M):
    from validate.ingest.flow import without_updates  # torch's schedules have no optimizer step

    s = without_updates(schedules.generate(name, K, M, chunks=None if name in ("1f1b", "gpipe") else 2))
    program = lower(s, "torch-multi")
    assert program.to_pytorch() == _torch_lowered(s)


def test_torch_profile_picks_the_loop_that_runs_the_order():
    torch = get_runtime("torch")
    assert torch.lowering(schedules.gpipe(4, 8)) == "torch-gpipe"
    assert torch.lowering(schedules.generate("interleaved-1f1b", 2, 4, chunks=2)) == "torch-multi"
    assert torch.lowering(schedules.generate("zbv", 2, 4, chunks=2)) == "torch-multi"
    assert get_runtime("megatron").lowering(schedules.gpipe(2, 2)) == "megatron"


def test_torch_1f1b_fuses_sends_with_the_next_receive():
    """Schedule1F1B, K=2, M=3, rank 0: warm-up F0 F1 (F1's send kept for the first backward), then
    ``fwd_send_bwd_recv`` before B0, ``bwd_send_fwd_recv`` before F2, ... (torch 2.13, _step_microbatches)."""
    from validate.pytorch.schedules import executed_order

    s = executed_order("Schedule1F1B", 2, 3)
    program = lower(s, get_runtime("torch").lowering(s))
    assert program.lowering == "torch-1f1b"
    assert program.to_text().splitlines()[0] == (
        "0: 0F0 0SEND_F0 0F1 WAIT(0SEND_F0) 0SEND_F1+0RECV_B0 WAIT(0SEND_F1+0RECV_B0) 0B0 0F2 "
        "0SEND_F2+0RECV_B1 WAIT(0SEND_F2+0RECV_B1) 0B1 0RECV_B2 WAIT(0RECV_B2) 0B2")


def test_megatron_pairs_with_the_same_peer_and_blocks():
    s = schedules.one_f_one_b(2, 4)
    program = lower(s, "megatron")
    rank1 = [program.step_text(op, arg) for op, arg in program.steps(1)]
    # the last stage: receive F0, compute F0 B0, then send_backward_recv_forward with stage 0 as one batch
    assert rank1[:4] == ["1RECV_F0", "WAIT(1RECV_F0)", "1F0", "1B0"]
    assert rank1[4:6] == ["1SEND_B0+1RECV_F1", "WAIT(1SEND_B0+1RECV_F1)"]
    assert all(op != STEP_POST or program.steps(1)[k + 1][0] == STEP_WAIT
               for k, (op, _) in enumerate(program.steps(1)))  # every batch waited at once


def test_pipesim_lowering_posts_receives_ahead():
    s = schedules.gpipe(2, 2)
    text = lower(s, "pipesim").to_text().splitlines()
    assert text[1].startswith("1: 1RECV_F0 1RECV_F1 1F0")


def test_the_lowered_csv_reads_back_as_the_same_schedule(tmp_path):
    """--comm-csv writes PyTorch's lowered form; reading it back (communication cells are derived, so skipped) gives
    the compute schedule again, overlapped pairs included."""
    from sim.io.schedule_io import read_pytorch_csv, write_lowered_csv
    from validate.ingest.flow import without_updates

    for name in ("interleaved-1f1b", "dualpipev"):
        s = without_updates(schedules.generate(name, 2, 8 if name == "dualpipev" else 4, chunks=2))
        path = write_lowered_csv(lower(s, get_runtime("torch").lowering(s)), tmp_path / f"{name}.csv")
        cells = path.read_text().split()
        assert any("SEND_F" in c for c in cells) and any("RECV_B" in c for c in cells)
        back = without_updates(read_pytorch_csv(path))
        assert back.actions == s.actions and back.overlapped == s.overlapped


def test_simulate_prints_and_writes_the_lowered_schedule(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sim", "simulate", "-s", "1f1b", "-K", "2", "-M", "3", "--runtime",
                          "torch", "--show-comm", "--comm-csv", str(tmp_path / "c.csv")],
                         capture_output=True, text=True, check=True).stdout
    assert "lowered for the torch runtime (torch-1f1b):" in out
    assert "0SEND_F1+0RECV_B0 WAIT(0SEND_F1+0RECV_B0) 0B0" in out
    assert (tmp_path / "c.csv").read_text().splitlines()[0].startswith("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0")


# ------------------------------------------------------------------ Megatron's interleaved schedule
def test_megatron_interleaved_posts_as_forward_backward_pipelining_with_interleaving():
    """K=3, 2 chunks, M=3 (megatron-core 0.16, schedules.py): rank 0 receives nothing until the last rank's first
    forward is K-1 virtual micro-batches behind; a steady forward's send waits for the backward after it."""
    s = schedules.generate("interleaved-1f1b", 3, 3)
    program = lower(s, "megatron")
    assert program.lowering == "megatron"
    text = program.to_text().splitlines()
    assert text[0].startswith("0: 0F0 0SEND_F0 WAIT(0SEND_F0) 0F1 0SEND_F1 WAIT(0SEND_F1) 0F2 3RECV_F0+0SEND_F2 ")
    # rank 1, steady: the forward 4F2 and the backward 4B0, then one batch of both sends and the next receive
    assert "4F2 4B0 4SEND_B0+4SEND_F2+4RECV_B1 WAIT(4SEND_B0+4SEND_F2+4RECV_B1)" in text[1]
    # the last warm-up forward also receives the first backward's gradient
    assert "4RECV_F2+4SEND_F1+4RECV_B0 WAIT(4RECV_F2+4SEND_F1+4RECV_B0) 4F2" in text[1]


@pytest.mark.parametrize("K,M,chunks,iterations", [(3, 3, 2, 1), (3, 6, 2, 2), (4, 8, 2, 1), (4, 4, 3, 1),
                                                   (5, 10, 2, 1), (4, 12, 4, 1)])
def test_megatron_interleaved_lowers_pipesims_order(K, M, chunks, iterations):
    """pipesim's interleaved-1f1b is Megatron's order on every rank (the lowering walks Megatron's table and refuses
    any other), and every transfer's receive is posted in its send's order."""
    for lowering in ("megatron", "megatron-overlap", "megatron-overlap-flush"):
        program = lower(schedules.generate("interleaved-1f1b", K, M, chunks=chunks, iterations=iterations), lowering)
        flat = program.schedule.compiled.flat
        posted = [i for d in range(K) for op, arg in program.steps(d) if op == STEP_POST for i in program.batch(arg)]
        assert sorted(i for i in posted if i >= 0) == sorted(~i for i in posted if i < 0) == \
            sorted(np.flatnonzero(flat.send_to >= 0).tolist()), lowering


def test_megatron_interleaved_refuses_what_megatron_cannot_run():
    from sim.core.comm_lowering import LoweringError
    with pytest.raises(LoweringError, match="with 2 pipeline ranks"):
        lower(schedules.generate("interleaved-1f1b", 2, 4), "megatron")
    s = schedules.generate("interleaved-1f1b", 3, 3)
    swapped = {d: list(a) for d, a in s.actions.items()}
    swapped[1][0], swapped[1][1] = swapped[1][1], swapped[1][0]  # rank 1 runs its first two forwards the other way
    with pytest.raises(LoweringError, match="rank 1's action 1 is 1F1 where Megatron runs 1F0"):
        lower(s.replace_actions(swapped), "megatron")


def test_megatron_overlap_posts_the_steady_state_without_waiting():
    """``--runtime megatron-overlap`` (Megatron-LM's training default for the interleaved schedule): the last rank
    posts its next activation receive after a forward and waits for it only before the next forward; an odd rank
    posts a call's receive before its send (``_p2p_ops``); two ranks lower (two process groups, one per direction)."""
    program = lower(schedules.generate("interleaved-1f1b", 3, 3), "megatron-overlap")
    assert program.lowering == "megatron-overlap"
    text = program.to_text().splitlines()
    assert "5F0 5RECV_F1 5B0 5SEND_B0 WAIT(5RECV_F1) 5F1" in text[2]
    assert text[1].startswith("1: 1RECV_F0 WAIT(1RECV_F0) 1F0 1RECV_F1 1SEND_F0 WAIT(1RECV_F1) WAIT(1SEND_F0) 1F1")
    assert text[0].startswith("0: 0F0 0SEND_F0 WAIT(0SEND_F0)")
    assert lower(schedules.generate("interleaved-1f1b", 2, 4), "megatron-overlap").lowering == "megatron-overlap"
    # without model chunks Megatron-LM turns overlap off: the megatron lowering
    assert get_runtime("megatron-overlap").lowering(schedules.one_f_one_b(3, 4)) == "megatron"


def test_megatron_overlap_flush_posts_the_warm_up_and_cool_down_without_waiting_too():
    """``--runtime megatron-overlap-flush`` (``overlap_p2p_comm_warmup_flush``, read from megatron-core 0.16's
    ``forward_backward_pipelining_with_interleaving``): a rank with a previous rank posts the next activation's
    receive before each warm-up forward and waits for it before the next one; the first rank posts it with its send;
    a forward's send is waited after the next forward's; the cool-down mirrors it. The steady state is
    ``megatron-overlap``'s."""
    s = schedules.generate("interleaved-1f1b", 2, 4)
    flush = lower(s, "megatron-overlap-flush").to_text().splitlines()
    overlap = lower(s, "megatron-overlap").to_text().splitlines()
    assert flush[1].startswith("1: 1RECV_F0 WAIT(1RECV_F0) 1RECV_F1 1F0 1SEND_F0 WAIT(1RECV_F1) 3RECV_F0 1F1 "
                               "1SEND_F1 WAIT(1SEND_F0) WAIT(3RECV_F0) 3F0")
    assert overlap[1].startswith("1: 1RECV_F0 WAIT(1RECV_F0) 1F0 1RECV_F1 1SEND_F0 WAIT(1RECV_F1) WAIT(1SEND_F0) 1F1")
    assert flush[0].startswith("0: 0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 WAIT(0SEND_F0) WAIT(2RECV_F0) 2F0")
    # the cool-down of rank 0 (not the last): the next gradient's receive ahead of each backward
    assert "WAIT(2RECV_B2) 2RECV_B3 2B2 2SEND_B2 WAIT(2RECV_B3) 0RECV_B2 2B3 2SEND_B3 WAIT(2SEND_B2)" in flush[0]
    assert get_runtime("megatron-overlap-flush").lowering(schedules.one_f_one_b(3, 4)) == "megatron"
    assert get_runtime("megatron-overlap-flush").lowering(s) == "megatron-overlap-flush"
