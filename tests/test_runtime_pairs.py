"""DualPipeV's overlapped pairs with blocking sends: the backward half ends with the pair, in every engine path.

Issue 27: ``pipesim simulate -s dualpipev -K 2 -M 4 --latency 0.5 --no-overlap`` placed row ``3B1`` at 7.5,
after the pair's forward send, though the pair (0F3;3B1) ends at 7.0.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim import Hardware, schedules, simulate
from sim import jit
from sim.core import listsched
from sim.core.comm_lowering import lower
from sim.core.ir import encode_key
from sim.core.wavefront import wavefront_schedule
from sim.engines.plan import make_plan
from sim.engines.rendezvous import run_program
from sim.model.cost import uniform


def _case():
    s = schedules.generate("dualpipev", 2, 4, chunks=2)
    costs = uniform(2, forward=1.0, backward=2.0).split_into_chunks(2)  # the command line's defaults, per chunk
    return s, make_plan(s, costs, Hardware(devices=2, latency=0.5, overlap=False))


def _pair_rows(plan, start, end):
    """(forward end, backward start, backward end) of every pair."""
    fused = plan.schedule.fused
    return [(end[i], start[i + 1], end[i + 1]) for i in fused.tolist()]


def _check(plan, start, end):
    rows = _pair_rows(plan, start, end)
    assert rows and all(b0 == f_end and b1 == f_end for f_end, b0, b1 in rows), rows


def _args(plan, paired=None):
    flat = plan.flat
    return (flat.device_start, flat.dep_start, flat.dep_slot, plan.occupy, plan.link, plan.send_seconds, plan.links,
            False, plan.paired if paired is None else paired)


def test_the_issue_case_from_the_command_line(tmp_path):
    import subprocess
    import sys

    import pandas as pd

    out = tmp_path / "t.csv"
    subprocess.run([sys.executable, "-m", "sim", "simulate", "-s", "dualpipev", "-K", "2", "-M", "4", "--latency",
                    "0.5", "--no-overlap", "--timeline", str(out)], check=True, capture_output=True)
    tl = pd.read_csv(out)
    b = tl[(tl.op == "B") & (tl.stage == 3) & (tl.microbatch == 1)]
    f = tl[(tl.op == "F") & (tl.stage == 0) & (tl.microbatch == 3)]  # the pair (0F3;3B1)
    assert f.end.item() == 7.0 and b.start.item() == 7.0 and b.end.item() == 7.0


def test_interpreted_kernel():
    _, plan = _case()
    out = listsched._list_schedule(*(a.tolist() if isinstance(a, np.ndarray) else a for a in _args(plan)))
    _check(plan, out[0], out[1])


def test_compiled_kernel():
    kernel = jit.compiled(listsched._list_schedule)
    if kernel is None:
        pytest.skip("numba is not installed")
    _, plan = _case()
    out = kernel(*_args(plan))
    _check(plan, out[0], out[1])


def test_wavefront():
    _, plan = _case()
    out = wavefront_schedule(*_args(plan))
    _check(plan, out[0], out[1])


@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_engines(engine):
    s, plan = _case()
    r = simulate(s, plan.costs, plan.hardware, engine=engine)
    run = r.rows
    key = {int(k): i for i, k in enumerate(s.keys_array.tolist())}
    comp = run.computing
    start, end = np.zeros(len(s.keys_array)), np.zeros(len(s.keys_array))
    keys = encode_key(run.stage[comp], run.op[comp], run.microbatch[comp], s.stages)  # rows -> flat positions
    for k, a, z in zip(keys.tolist(), run.start[comp].tolist(), run.end[comp].tolist()):
        start[key[k]], end[key[k]] = a, z
    _check(plan, start, end)


def test_lowered_program():
    s, plan = _case()
    ran = run_program(plan, lower(s, "pipesim", blocking_sends=True), eager=True).run
    _check(plan, ran.start, ran.end)


def test_the_check_sees_the_old_bug():
    """Without the pair marks the kernel holds the device for the forward's send between the halves: 3B1 at 7.5."""
    _, plan = _case()
    no_pairs = np.zeros(len(plan.durations), dtype=np.bool_)
    out = listsched._list_schedule(*(a.tolist() if isinstance(a, np.ndarray) else a for a in _args(plan, no_pairs)))
    with pytest.raises(AssertionError):
        _check(plan, out[0], out[1])
    assert 7.5 in [b0 for _, b0, _ in _pair_rows(plan, out[0], out[1])]
