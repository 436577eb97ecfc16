"""Shared fixtures for the simulator tests: a timeline invariant checker and small builders.

``check_timeline(result)`` asserts everything a simulated (or measured) timeline must
satisfy whatever the schedule, costs or hardware: every action exactly once on its
device and in its device's order, no two computations of a device at once, every
derived dependency met (through a transfer row when producer and consumer sit on
different devices), one transfer at a time per directed link, and metrics that agree
with the rows. Tests call it on every result they make.
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

from sim.core.ir import Action, ActionKind
from sim.results.result import Result
from sim.results.timeline import compute_rows, transfer_rows


def _rows(frame):
    """The rows of *frame* as plain tuples (fast to loop over)."""
    cols = ["device", "stage", "microbatch", "iteration", "op", "start", "end", "src", "dst", "bytes"]
    return list(zip(*(frame[c].astype(str).tolist() if c == "op" else frame[c].tolist() for c in cols)))


def check_timeline(result: Result, *, exact_durations: bool = True, modelled: bool = True) -> None:
    """Assert the invariants of ``result.timeline`` (see the module docstring).

    *exact_durations*: also check that every computation lasts exactly its modelled
    cost (False under jitter, where only transfers keep their exact duration).
    *modelled*: False for measured timelines (a real run, an ingested trace): transfers keep
    their measured duration and size, and a link may carry several messages at once.
    """
    exact_durations = exact_durations and modelled
    sched, costs, hw = result.schedule, result.costs, result.hardware
    tl = result.timeline
    comp, sends = _rows(compute_rows(tl)), _rows(transfer_rows(tl))

    # an overlapped pair is one unit: its forward's row spans the pair (F + B by default), its backward takes no time
    pair_of = {f: b for f, b in sched.overlapped}
    paired = {b for b in pair_of.values()}
    # every action exactly once, on its stage's device, with the right iteration
    by_action = {}
    for dev, stage, mb, it, op, start, end, src, dst, nbytes in comp:
        action = (stage, op, mb)
        assert action not in by_action, f"{stage}{op}{mb} appears twice in the timeline"
        by_action[action] = (dev, start, end)
        assert dev == sched.placement[stage], f"{stage}{op}{mb} ran on device {dev}, not its stage's device"
        a = _action(stage, op, mb)
        assert it == sched.iteration_of(a), f"{a}: iteration {it}, expected {sched.iteration_of(a)}"
        assert end >= start
        if exact_durations:
            cost = costs.cost(stage, a.kind, split=(stage, mb) in sched.split_backward)
            if a in pair_of:
                b = pair_of[a]
                cost += costs.cost(b.stage, b.kind, split=(b.stage, b.mb) in sched.split_backward)
            elif a in paired:
                cost = 0.0
            # end = start + cost in floats: end - start recovers cost up to the rounding of end
            assert _close(end - start, cost, end), f"{a} lasted {end - start}, its cost is {cost}"
    expected = {(a.stage, a.kind.value, a.mb) for a in sched}
    assert set(by_action) == expected, (f"missing {sorted(expected - set(by_action))[:5]}, "
                                        f"extra {sorted(set(by_action) - expected)[:5]}")
    assert len(comp) == len(sched)

    # each device runs its list in order, one computation at a time
    for device, acts in sched.actions.items():
        prev_end = -math.inf
        for a in acts:
            _, start, end = by_action[(a.stage, a.kind.value, a.mb)]
            assert start >= prev_end, f"device {device}: {a} starts at {start} before the previous action ends at {prev_end}"
            prev_end = end
    for device in range(sched.devices):  # the same, by time alone
        spans = sorted((s, e) for d, s, e in by_action.values() if d == device)
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"device {device} runs two computations at once: [{s0}, {e0}) and [{s1}, {e1})"

    # transfers: keyed by what they carry
    by_send = {}
    for dev, stage, mb, it, op, start, end, src, dst, nbytes in sends:
        assert op in ("SEND_F", "SEND_B")
        key = (op, stage, mb, dst)
        assert key not in by_send, f"transfer {key} appears twice"
        assert dev == src == sched.placement[stage] and dst != src
        by_send[key] = (src, start, end, nbytes)
        assert end >= start, f"transfer {key} ends before it starts"
        if modelled:
            size = costs.send_bytes[stage] if op == "SEND_F" else costs.send_bytes[stage - 1]
            assert nbytes == size
            seconds = hw.transfer_time(src, dst, nbytes)
            assert _close(end - start, seconds, end), f"transfer {key} lasted {end - start}, expected {seconds}"

    # every dependency met; cross-device ones through their transfer row
    used = set()
    for a in sched:
        dev, start, _ = by_action[(a.stage, a.kind.value, a.mb)]
        for p in sched.dependencies(a):
            p_dev, _, p_end = by_action[(p.stage, p.kind.value, p.mb)]
            assert start >= p_end, f"{a} starts at {start} before its input {p} ends at {p_end}"
            if p_dev != dev:
                op = "SEND_F" if p.kind is ActionKind.F else "SEND_B"
                key = (op, p.stage, p.mb, dev)
                assert key in by_send, f"{a} on device {dev} needs {p} from device {p_dev} but no transfer row exists"
                _, t_start, t_end, _ = by_send[key]
                assert t_start >= p_end, f"transfer of {p} starts at {t_start} before {p} ends at {p_end}"
                assert start >= t_end, f"{a} starts at {start} before the transfer of {p} arrives at {t_end}"
                used.add(key)
    assert used == set(by_send), f"transfers nobody needs: {sorted(set(by_send) - used)[:5]}"

    # a directed link carries one transfer at a time
    links = defaultdict(list)
    for (op, stage, mb, dst), (src, start, end, _) in by_send.items():
        if modelled:
            links[(src, dst)].append((start, end))
    for link, spans in links.items():
        spans.sort()
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"link {link} carries two transfers at once: [{s0}, {e0}) and [{s1}, {e1})"

    # without overlap a sender computes nothing until its send has left; an overlapped pair (F;B) is one unit:
    # its sends leave when the pair ends, so the action after the pair waits for them, not the pair's own B half
    if not hw.overlap and modelled:
        pair_forwards = set(sched.fused.tolist())  # key-array positions of the pairs' forwards
        for (op, stage, mb, dst), (src, t_start, t_end, _) in by_send.items():
            kind = "F" if op == "SEND_F" else "B"
            acts = sched.actions[src]
            i = acts.index(_action(stage, kind, mb))
            if int(sched.device_start[src]) + i in pair_forwards:
                i += 1  # the pair's backward half runs with it
            if i + 1 < len(acts):
                nxt = acts[i + 1]
                _, n_start, _ = by_action[(nxt.stage, nxt.kind.value, nxt.mb)]
                assert n_start >= t_end, f"device {src} starts {nxt} at {n_start} while its send ends at {t_end}"

    # metrics agree with the rows
    m = result.metrics
    assert m.makespan == (max(tl["end"]) if len(tl) else 0.0)
    for device in range(sched.devices):
        busy = sum(e - s for d, s, e in by_action.values() if d == device)
        assert m.busy[device] == pytest.approx(busy, rel=1e-9, abs=1e-12)
        assert m.busy[device] <= m.makespan * (1 + 1e-12) + 1e-12
    assert 0.0 <= m.utilization <= 1.0 + 1e-12
    assert m.bubble_fraction == pytest.approx(1.0 - m.utilization if m.makespan > 0 else 0.0)


def _close(measured: float, expected: float, scale: float) -> bool:
    """Equal up to the float rounding of a time near *scale* (end = start + cost loses digits of cost)."""
    return abs(measured - expected) <= 1e-12 * max(1.0, abs(scale), abs(expected))


def _action(stage, op, mb):
    return Action(stage, ActionKind(op), mb)


@pytest.fixture(scope="session")
def check():
    """The timeline invariant checker, :func:`check_timeline`."""
    return check_timeline


# --- running the suite on two workers (make test: pytest -n 2 --dist loadgroup) -------------------------------------
# The tests that start processes (validator ranks, torchrun agents, sweep and plan workers, notebook kernels, the
# browser, signals sent to a CLI child) all go to one xdist group, so at most one of them runs at a time: two
# 2-rank launches at once would put four ranks on a 2-core machine, and a test that stops a rank or counts its
# children would see another test's. What runs in process (the simulator, the engines, ingest of kept traces) is
# spread over both workers. A module is put in the group when its source names any of these; a module that starts
# processes through a helper these miss only shares the cores, it does not share a process or a port with another.
_STARTS_PROCESSES = re.compile(
    r"subprocess|Popen|multiprocessing|ProcessPool|torchrun|webdriver|selenium|chromium|nbclient|init_process_group|"
    r"free_port|inprocess|run_torch|run_validation|run_dp_validation|launch|workers|signal|validate\.injected|"
    r"from sim\.cli import main|dask|LocalCluster")


@functools.cache
def _starts_processes(path: str) -> bool:
    try:
        return bool(_STARTS_PROCESSES.search(Path(path).read_text()))
    except OSError:
        return True


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _starts_processes(str(item.path)):
            item.add_marker(pytest.mark.xdist_group("processes"))
