"""Reading every rank's trace, one or two at a time, reduced at once to its actions and messages. Needs no torch.

A per-rank Kineto trace of a GPU step is hundreds of MB; held as Python objects all at once, 8 of them do
not fit a workstation. Each trace is therefore streamed (:func:`validate.ingest.reader.read_trace`, only
the events ingest uses) and reduced to its :class:`validate.ingest.actions.RankRecords` before the next
one is read, so that only records (a few hundred bytes per action and message) stay. Above
:data:`PARALLEL_MIN_BYTES` two worker processes read two ranks at a time (parsing is CPU-bound: the
machine's second core halves the time; each worker holds one rank's events), started with ``spawn``
(no fork of a process that may hold threads). A progress bar over the bytes read goes to stderr.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from sim.core.ir import Action, Schedule

from validate.ingest.actions import BLOCKING_EXCHANGES, WAIT_CALL, RankRecords, extract_rank
from validate.ingest.message_shapes import MessageShapesError, copy_message_shapes_to_spans
from validate.ingest.reader import Keep, TraceFile, progress_bar, read_trace

__all__ = ["read_ranks", "PARALLEL_MIN_BYTES"]

PARALLEL_MIN_BYTES = 64 << 20
"""Below this many bytes of traces, read them one after the other in this process (a worker process costs
~1 s to start); above, in up to two worker processes (each holds one rank's events at a time)."""


def read_ranks(headers: Sequence[TraceFile], schedule: Schedule, orders: Mapping[int, Sequence[Action]],
               patterns: Sequence[re.Pattern], source: str, *, progress: bool | None = False,
               shapes_from: Sequence[TraceFile] | None = None) -> tuple[list[TraceFile], list[RankRecords]]:
    """Every rank's trace (*headers*, in rank order) streamed and reduced to its records, with a progress bar
    over the bytes read (None: when stderr is a terminal). *orders*: each rank's computations in the
    schedule's order, without U. *shapes_from*: each rank's trace of one step profiled with ``record_shapes``,
    whose messages' sizes and peers every step of its rank's trace takes
    (:func:`validate.ingest.message_shapes.copy_message_shapes_to_spans`). The traces come back without their
    spans: only the records are kept."""
    K = schedule.devices
    keep = Keep(patterns=tuple(patterns), ops=source == "auto" and all(len(schedule.stages_of(r)) == 1 for r in range(K)),
                python=(": forward_step", ": backward_step", *BLOCKING_EXCHANGES) if source == "megatron" else (),
                python_calls=(WAIT_CALL,))
    shaped = [None] * len(headers) if shapes_from is None else [h.path for h in shapes_from]
    jobs = [(h.path, r, tuple(schedule.placement), keep, tuple(patterns), tuple(orders[r]), source, shaped[r])
            for r, h in enumerate(headers)]
    total = sum(os.path.getsize(h.path) for h in headers) + sum(os.path.getsize(p) for p in shaped if p is not None)
    bar = progress_bar(total, enabled=progress)
    workers = min(2, len(jobs), os.cpu_count() or 1)
    try:
        if workers < 2 or total < PARALLEL_MIN_BYTES:
            out = [_read_rank(job + ((bar.update if bar is not None else None),)) for job in jobs]
        else:
            out = _read_in_workers(jobs, workers, bar)
    finally:
        if bar is not None:
            bar.close()
    return [t for t, _ in out], [rec for _, rec in out]


def _read_rank(job: tuple) -> tuple[TraceFile, RankRecords]:
    """Read one trace and reduce it to its records (in a worker process, or here)."""
    path, rank, placement, keep, patterns, order, source, shaped, progress = job
    t = read_trace(path, keep=keep, progress=progress)
    if shaped is not None:  # small: one step
        try:
            copy_message_shapes_to_spans(read_trace(shaped, keep=keep, progress=progress).spans, t.spans)
        except MessageShapesError as exc:
            raise MessageShapesError(f"rank {rank} ({path}, shapes from {shaped}): {exc}") from None
    rec = extract_rank(t, rank, list(placement), patterns=patterns, order=list(order), source=source)
    return replace(t, spans=()), rec


_COUNTER = None
"""In a worker process: the bytes read by all workers (a shared integer the parent shows)."""


def _worker_init(counter) -> None:
    global _COUNTER
    _COUNTER = counter


def _add_read(n: int) -> None:
    with _COUNTER.get_lock():
        _COUNTER.value += n


def _read_counted(job: tuple) -> tuple[TraceFile, RankRecords]:
    return _read_rank(job + (_add_read,))


def _read_in_workers(jobs: list[tuple], workers: int, bar) -> list[tuple[TraceFile, RankRecords]]:
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (the bar's monitor)
    counter = ctx.Value("q", 0)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(counter,)) as pool:
        futures = [pool.submit(_read_counted, job) for job in jobs]
        shown = 0
        while not all(f.done() for f in futures):
            time.sleep(0.2)
            if bar is not None:
                bar.update(counter.value - shown)
                shown = counter.value
        out = [f.result() for f in futures]  # a worker's PipesimError is raised here, as in this process
        if bar is not None:
            bar.update(counter.value - shown)
    return out
