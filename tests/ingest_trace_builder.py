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
- ``"gpu-single"``: the same with ``Forward i`` / ``Backward i`` ranges and unnamed messages;
- ``"ops"``: torch 2.13's ``Schedule1F1B`` with the profiler's defaults: no names at all, a forward is
  top-level ``aten::linear`` (``aten::addmm`` inside), a backward ``autograd::engine::evaluate_function``
  spans, messages as in ``"loose"``; the step opens with the runtime's ``aten::tensor_split`` and ends
  with its ``scale_grads`` (``aten::div_``);
- ``"megatron"``: Megatron-LM on GPUs as ``torch.profiler(with_stack=True)`` records it (made from
  Megatron's source, megatron/core/pipeline_parallel/schedules.py and p2p_communication.py, not from a
  Megatron trace): ``python_function`` events ``megatron/core/pipeline_parallel/schedules.py(<line>):
  forward_step`` / ``backward_step`` launching the kernels, messages ``c10d::send`` / ``c10d::recv_``
  holding ProcessGroupNCCL's ``nccl:send a->b`` / ``nccl:recv b<-a`` and their ``ncclDevKernel_SendRecv``.

GPU events carry the fields real Kineto files have (checked against a HolisticTraceAnalysis trace by
``tests/test_ingest_gpu.py``): kernels ``args`` with ``External id``, ``queued``, ``device``, ``context``,
``stream``, ``correlation``, ``registers per thread``, ...; launches ``External id``, ``cbid``,
``correlation``; an ``ac2g`` flow pair per launch; ``gpu_user_annotation`` copies of the named ranges.

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
    ends = {action: end for d in range(K) for _, end, action in rows[d]}  # action -> end, us
    events = {d: [] for d in range(K)}
    corr = itertools.count(1)
    for d in range(K):
        ev = events[d]
        free = 0.0  # when the rank is free to start its next range (end of its last range)
        for start, end, action in sorted(rows[d], key=lambda r: r[0]):
            name = _name(action, form, split, sched)
            incoming = arrivals.get(action)
            if form.startswith("gpu") or form == "megatron":
                cpu = free + 1.0
                _launch(ev, d, cpu, name, corr, start, end, kernel="sm80_gemm",
                        cat="python_function" if form == "megatron" else "user_annotation")
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
                else:  # loose, ops: the receive and its wait outside the computation's range
                    posted = free + EPS / 2
                    done = max(arrival, posted)
                    ev.append(_x(d, "c10d::recv_", posted, 0.0, args=_msg_args(src, nbytes)))
                    ev.append(_x(d, "gloo:recv", posted, done - posted, cat="user_annotation",
                                 args={"Input type": ["float"]}))
                    begin = max(start, done) + EPS
                    _computation(ev, d, name, action, begin, end - EPS - begin, form)
            else:
                pad = EPS if form in ("loose", "ops") else 0.0  # loose sends lie between the ranges
                _computation(ev, d, name, action, start + pad, end - start - 2 * pad, form)
            free = end
        for op, stage, mb, src, dst, t0, t1, nbytes in zip(sends["op"].astype(str), sends["stage"], sends["microbatch"],
                                                           sends["src"], sends["dst"], sends["start"], sends["end"],
                                                           sends["bytes"]):
            if int(src) != d:
                continue
            t0, t1 = t0 * US, t1 * US
            letter = "F" if op == "SEND_F" else "B"
            if form.startswith("gpu") or form == "megatron":
                continue
            if form == "single":  # the send is posted inside the producer's range, at its end
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            elif form == "loose":
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            elif form == "ops":  # isend returns at once: posted when its producer ends, however busy the link
                done = ends[Action(int(stage), ActionKind(letter), int(mb))] + EPS / 4
                ev.append(_x(d, "c10d::send", done, 0.0, args=_msg_args(int(dst), float(nbytes))))
            else:
                ev.append(_x(d, f"PP:{stage}SEND_{letter}{mb}", t0, 0.0, cat="user_annotation"))
                ev.append(_x(d, "c10d::send", t0, 0.0, args=_msg_args(int(dst), float(nbytes))))
            ev.append(_x(d, "gloo:send", t0, t1 - t0, cat="user_annotation", args={"Input type": ["float"]}))
    if form.startswith("gpu") or form == "megatron":
        _gpu_messages(events, sends, corr, named=form == "gpu", titles=form == "megatron")
    if form == "ops":  # the runtime's own ops around the step (schedules.py: _split_inputs, scale_grads)
        for d in range(K):
            ev = events[d]
            lo = min(e["ts"] for e in ev)
            hi = max(e["ts"] + e.get("dur", 0.0) for e in ev)
            ev.append(_x(d, "aten::tensor_split", lo - 3.0, 1.0))
            ev.append(_x(d, "aten::div_", hi + 1.0, 1.0))
    out = []
    for d in range(K):
        ev = events[d]
        if step_marker is not None and ev:
            lo = min(e["ts"] for e in ev)
            hi = max(e["ts"] + e.get("dur", 0.0) for e in ev)
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
    if form == "megatron":
        return "F" if kind == "F" else "B"
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


_MEGATRON_LINES = {"F": 280, "B": 402}  # megatron/core/pipeline_parallel/schedules.py: def forward_step / backward_step


def _computation(ev, d, name, action: Action, ts, dur, form):
    """One computation as the runtime of *form* records it."""
    if form != "ops":
        ev.append(_x(d, name, ts, dur, cat="user_annotation"))
    elif action.kind is ActionKind.F:  # the model's ops, top level on the pipeline thread
        ev.append(_x(d, "aten::linear", ts, dur))
        ev.append(_x(d, "aten::addmm", ts + dur * 0.1, dur * 0.8))
    else:  # the autograd engine's nodes
        ev.append(_x(d, "autograd::engine::evaluate_function: AddmmBackward0", ts, dur))
        ev.append(_x(d, "AddmmBackward0", ts + dur * 0.05, dur * 0.9))


def _kernel_args(c: int, d: int, stream: int, **extra) -> dict:
    """A kernel's args as Kineto writes them (HolisticTraceAnalysis' test traces, A100)."""
    return {"External id": c, "queued": 0, "device": d, "context": 1, "stream": stream, "correlation": c,
            "registers per thread": 96, "shared memory": 0, "blocks per SM": 1.5, "warps per SM": 6.0,
            "grid": [132, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 9, **extra}


def _launch(ev, d, cpu, name, corr, start, end, *, kernel, cat="user_annotation"):
    c = next(corr)
    if cat == "python_function":  # Megatron's forward_step / backward_step as with_stack=True records them
        func = "forward_step" if name == "F" else "backward_step"
        ev.append({**_x(d, f"megatron/core/pipeline_parallel/schedules.py({_MEGATRON_LINES[name]}): {func}", cpu,
                        1.0, cat=cat), "args": {"Python parent id": 1, "Python id": c, "Python thread": 0}})
    else:
        ev.append(_x(d, name, cpu, 1.0, cat=cat))
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": d, "tid": 7, "ts": float(start),
                   "dur": float(end - start), "args": {"External id": c}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + d, "tid": 100 + d,
               "ts": cpu + 0.5, "dur": 0.2, "args": {"External id": c, "cbid": 211, "correlation": c}})
    ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": d, "tid": 7, "ts": float(start),
               "dur": float(end - start), "args": _kernel_args(c, d, 7)})
    ev += _flow(d, c, cpu + 0.5, float(start), 7)


def _flow(d, c, launch_ts, kernel_ts, stream) -> list[dict]:
    """The ``ac2g`` arrow from a launch to its kernel (Kineto: id = correlation; the end binds to the enclosing
    slice, ``bp: e``)."""
    return [{"ph": "s", "id": c, "pid": 100 + d, "tid": 100 + d, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": c, "pid": d, "tid": stream, "ts": kernel_ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}]


def _gpu_messages(events, sends, corr, *, named: bool, titles: bool = False):
    """NCCL kernels: the send's kernel runs from the transfer's start to its end, so does the receive's."""
    for op, stage, mb, src, dst, t0, t1 in zip(sends["op"].astype(str), sends["stage"], sends["microbatch"],
                                               sends["src"], sends["dst"], sends["start"], sends["end"]):
        t0, t1 = t0 * US, t1 * US
        letter = "F" if op == "SEND_F" else "B"
        for d, kind, name in ((int(src), "send", f"PP:{stage}SEND_{letter}{mb}"),
                              (int(dst), "recv", f"PP:{int(stage) + (1 if letter == 'F' else -1)}RECV_{letter}{mb}")):
            ev = events[d]
            cpu = max((e["ts"] + e.get("dur", 0.0) for e in ev if e["pid"] == 100 + d), default=0.0) + 1.0
            c = next(corr)
            if named:
                ev.append(_x(d, name, cpu, 1.0, cat="user_annotation"))
            ev.append(_x(d, "c10d::send" if kind == "send" else "c10d::recv_", cpu + 0.1, 0.8,
                         args=_msg_args(int(dst if kind == "send" else src), 0.0)))
            if titles:  # ProcessGroupNCCL's profiling title inside the c10d op
                title = f"nccl:send {int(src)}->{int(dst)}" if kind == "send" else f"nccl:recv {int(dst)}<-{int(src)}"
                ev.append(_x(d, title, cpu + 0.15, 0.5, cat="user_annotation"))
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + d, "tid": 100 + d,
                       "ts": cpu + 0.3, "dur": 0.2, "args": {"External id": c, "cbid": 211, "correlation": c}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                       "pid": d, "tid": 20, "ts": t0, "dur": t1 - t0,
                       "args": _kernel_args(c, d, 20, **{"Collective name": kind, "In msg nelems": 0,
                                                         "Out msg nelems": 0, "Group size": 2, "dtype": "Float"})})
            ev += _flow(d, c, cpu + 0.3, t0, 20)
