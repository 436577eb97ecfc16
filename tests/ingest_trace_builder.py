"""Kineto-like traces written from a simulated timeline, for the ingestion tests (no torch).

:func:`traces_from` turns a :class:`sim.results.result.Result` into one trace per rank shaped as PyTorch's
runtimes record them, so that ingesting the traces must give back the simulated timeline:

- ``"PP"``: the multi-stage runtime: ``PP:sFm`` ranges that start as soon as the rank is free and
  first wait for their input (the receive was posted earlier by a ``PP:sRECV_Fm`` range holding
  ``c10d::recv_``, its ``gloo:recv`` span ending when the data arrived), ``PP:sSEND_Fm`` ranges
  holding ``c10d::send`` right after the producer;
- ``"single"``: ScheduleGPipe's ``Forward i`` / ``Backward i``: the receive, the wait, the
  computation and the send all inside the range;
- ``"loose"``: computations marked alone, messages outside every range (Schedule1F1B with marks);
- ``"pattern"``: another runtime's names ``fwd_s<stage>_mb<mb>`` / ``bwd_s<stage>_mb<mb>``;
- ``"gpu"``: the multi-stage runtime on GPUs: CPU ranges launch kernels (``cudaLaunchKernel``,
  ``correlation``) that run at the simulated times; messages are NCCL kernels;
- ``"gpu-single"``: the same with ``Forward i`` / ``Backward i`` ranges and unnamed messages.

Times: microseconds, ``ts`` relative to ``baseTimeNanoseconds``; *offsets_us* shifts each rank's
clock (several hosts).
"""

from __future__ import annotations

import itertools

from sim.core.ir import Action, ActionKind
from sim.results.result import Result
from sim.results.timeline import compute_rows, transfer_rows

US = 1e6
EPS = 1e-3  # microseconds between events the real runtimes separate (ingested times are exact to ~1e-9 s)


def traces_from(result: Result, form: str = "PP", *, offsets_us=None, hosts=None, split: bool = True,
                base_ns: int = 1_700_000_000_000_000_000, step_marker: int | None = None) -> list[dict]:
    sched = result.schedule
    K = sched.devices
    offsets_us = offsets_us or [0.0] * K
    comp = compute_rows(result.timeline)
    sends = transfer_rows(result.timeline)
    rows = {d: [] for d in range(K)}
    for dev, stage, op, mb, start, end in zip(comp["device"], comp["stage"], comp["op"].astype(str),
                                              comp["microbatch"], comp["start"], comp["end"]):
        rows[int(dev)].append((start * US, end * US, Action(int(stage), ActionKind(op), int(mb))))
    arrivals = {}  # (consumer action) -> (producer action, src, transfer start us, arrival us, bytes)
    for op, stage, mb, src, dst, start, end, nbytes in zip(sends["op"].astype(str), sends["stage"], sends["microbatch"],
                                                           sends["src"], sends["dst"], sends["start"], sends["end"],
                                                           sends["bytes"]):
        kind = ActionKind.F if op == "SEND_F" else ActionKind.B
        producer = Action(int(stage), kind, int(mb))
        consumer = Action(int(stage) + 1, ActionKind.F, int(mb)) if kind is ActionKind.F else \
            Action(int(stage) - 1, ActionKind.B, int(mb))
        arrivals[consumer] = (producer, int(src), start * US, end * US, float(nbytes))
    events = {d: [] for d in range(K)}
    corr = itertools.count(1)
    for d in range(K):
        ev = events[d]
        free = 0.0  # when the rank is free to start its next range (end of its last range)
        for start, end, action in sorted(rows[d], key=lambda r: r[0]):
            name = _name(action, form, split, sched)
            incoming = arrivals.get(action)
            if form.startswith("gpu"):
                cpu = free + 1.0
                _launch(ev, d, cpu, name, corr, start, end, kernel="sm80_gemm")
                free = cpu + 2.0
                continue
            if incoming is not None:
                _, src, t_send, arrival, nbytes = incoming
                posted = free + EPS  # the receive is posted once the rank is free (after its last range)
                done = max(arrival, posted)
                if form == "single":  # receive, wait, compute and send, all inside the range
                    ev.append(_x(d, "c10d::recv_", posted, 0.0, args=_msg_args(src, nbytes)))
                    ev.append(_x(d, "gloo:recv", posted, done - posted, cat="user_annotation",
                                 args={"Input type": ["float"]}))
                    ev.append(_x(d, name, posted, end - posted, cat="user_annotation"))
                elif form in ("PP", "pattern"):  # RECV posts it; the computation's range starts by waiting
                    rname = f"PP:{action.stage}RECV_{'F' if action.kind is ActionKind.F else 'B'}{action.mb}"
                    ev.append(_x(d, rname, posted, 0.0, cat="user_annotation"))
                    ev.append(_x(d, "c10d::recv_", posted, 0.0, args=_msg_args(src, nbytes)))
                    ev.append(_x(d, "gloo:recv", posted, done - posted, cat="user_annotation",
                                 args={"Input type": ["float"]}))
                    ev.append(_x(d, name, posted + EPS, end - posted - EPS, cat="user_annotation"))
                else:  # loose: the receive and its wait outside the computation's range
                    posted = free + EPS / 2
                    done = max(arrival, posted)
                    ev.append(_x(d, "c10d::recv_", posted, 0.0, args=_msg_args(src, nbytes)))
                    ev.append(_x(d, "gloo:recv", posted, done - posted, cat="user_annotation",
                                 args={"Input type": ["float"]}))
                    begin = max(start, done) + EPS
                    ev.append(_x(d, name, begin, end - EPS - begin, cat="user_annotation"))
            else:
                pad = EPS if form == "loose" else 0.0  # loose sends lie between the ranges
                ev.append(_x(d, name, start + pad, end - start - 2 * pad, cat="user_annotation"))
            free = end
        for op, stage, mb, src, dst, t0, t1, nbytes in zip(sends["op"].astype(str), sends["stage"], sends["microbatch"],
                                                           sends["src"], sends["dst"], sends["start"], sends["end"],
                                                           sends["bytes"]):
            if int(src) != d:
                continue
            t0, t1 = t0 * US, t1 * US
            letter = "F" if op == "SEND_F" else "B"
            if form.startswith("gpu"):
                continue
            if form == "single":  # the send is posted inside the producer's range, at its end
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            elif form == "loose":
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            else:
                ev.append(_x(d, f"PP:{stage}SEND_{letter}{mb}", t0, 0.0, cat="user_annotation"))
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            ev.append(_x(d, "gloo:send", t0, t1 - t0, cat="user_annotation", args={"Input type": ["float"]}))
    if form.startswith("gpu"):
        _gpu_messages(events, sends, corr, named=form == "gpu")
    out = []
    for d in range(K):
        ev = events[d]
        if step_marker is not None and ev:
            lo = min(e["ts"] for e in ev)
            hi = max(e["ts"] + e["dur"] for e in ev)
            ev.append(_x(d, f"ProfilerStep#{step_marker}", lo - 1.0, hi - lo + 2.0, cat="user_annotation"))
        for e in ev:
            e["ts"] = e["ts"] + offsets_us[d]
        out.append({"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": d, "world_size": K},
                    "host_name": (hosts or ["vm"] * K)[d], "baseTimeNanoseconds": base_ns,
                    "traceEvents": [{"ph": "M", "name": "process_name", "pid": 100 + d, "tid": 0,
                                     "args": {"name": "python"}}] + ev})
    return out


def _name(action: Action, form: str, split: bool, sched) -> str:
    kind = action.kind.value
    if kind == "B" and (action.stage, action.mb) in sched.split_backward:
        kind = "I"
    if form in ("single", "gpu-single"):
        return f"{'Forward' if kind == 'F' else 'Backward'} {action.mb}"
    if form == "pattern":
        word = {"F": "fwd", "B": "bwd", "I": "bwdi", "W": "bwdw"}[kind]
        return f"{word}_s{action.stage}_mb{action.mb}"
    return f"PP:{action.stage}{kind}{action.mb}"


def _x(d, name, ts, dur, *, cat="cpu_op", args=None, pid=None, tid=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100 + d if pid is None else pid,
            "tid": 100 + d if tid is None else tid, "ts": float(ts), "dur": float(max(0.0, dur)), "args": args or {}}


def _msg_args(peer: int, nbytes: float) -> dict:
    n = int(nbytes // 4)
    return {"Concrete Inputs": ["", "", str(peer), "0"], "Input type": ["TensorList", "", "Scalar", "Scalar"],
            "Input Dims": [[[n]], [], [], []]}


def _launch(ev, d, cpu, name, corr, start, end, *, kernel):
    c = next(corr)
    ev.append(_x(d, name, cpu, 1.0, cat="user_annotation"))
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + d, "tid": 100 + d,
               "ts": cpu + 0.5, "dur": 0.2, "args": {"correlation": c}})
    ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": d, "tid": 7, "ts": float(start),
               "dur": float(end - start), "args": {"correlation": c, "device": d, "stream": 7}})


def _gpu_messages(events, sends, corr, *, named: bool):
    """NCCL kernels: the send's kernel runs from the transfer's start to its end, so does the receive's."""
    for op, stage, mb, src, dst, t0, t1 in zip(sends["op"].astype(str), sends["stage"], sends["microbatch"],
                                               sends["src"], sends["dst"], sends["start"], sends["end"]):
        t0, t1 = t0 * US, t1 * US
        letter = "F" if op == "SEND_F" else "B"
        for d, kind, name in ((int(src), "send", f"PP:{stage}SEND_{letter}{mb}"),
                              (int(dst), "recv", f"PP:{int(stage) + (1 if letter == 'F' else -1)}RECV_{letter}{mb}")):
            ev = events[d]
            cpu = max((e["ts"] + e["dur"] for e in ev if e["pid"] == 100 + d), default=0.0) + 1.0
            c = next(corr)
            if named:
                ev.append(_x(d, name, cpu, 1.0, cat="user_annotation"))
            ev.append(_x(d, "c10d::send" if kind == "send" else "c10d::recv_", cpu + 0.1, 0.8,
                         args=_msg_args(int(dst if kind == "send" else src), 0.0)))
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + d, "tid": 100 + d,
                       "ts": cpu + 0.3, "dur": 0.2, "args": {"correlation": c}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": d, "tid": 20,
                       "ts": t0, "dur": t1 - t0, "args": {"correlation": c, "device": d, "stream": 20}})
