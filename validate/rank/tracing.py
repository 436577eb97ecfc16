"""Timestamps of every action and transfer, and the measured timeline built from them.

Each rank records, on its own clock (:func:`validate.rank.comm.clock`, seconds):

- computations: (action key, start, end). On CPU with ``perf_counter`` around the
  action; on GPU with CUDA events recorded around it on the compute stream and
  resolved once after the run (no synchronization per action): an event's time is
  the host time of a reference event plus ``elapsed_time`` from it.
- sends: (producer key, time the ``isend`` was issued, destination, bytes).
- arrivals: (producer key, time the receiver saw the message complete).
- overhead: (action key, host seconds the executor spent around the action on its own
  work: receives completed and posted, the send issued, tracing; not computing, not waiting).

On GPUs, sends and arrivals are CUDA events too, recorded on the rank's stream (the
send's, just before it is issued; the arrival's, right after the stream was made to
wait for the receive), so compute and transfer rows share one clock per device.

Rank 0 shifts every rank onto its own clock (offsets from
:meth:`validate.rank.comm.Comm.clock_offsets`; zero on one host) and builds a timeline
in :mod:`sim.results.timeline`'s schema: a transfer row runs from the sender's ``isend``
to the receiver's arrival, ``device`` = sender. Times start at 0 = the earliest
action of the run.

Across hosts, :func:`pair_check` estimates the offsets a second, independent way: from the
matched send/receive pairs of the traces (the causality bounds of
:func:`validate.ingest.clocks.align_clocks`, what ``pipesim ingest`` does with PyTorch's traces),
and says how it compares with the ping-pong estimate the timeline uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from sim.core.ir import Schedule, key_kind, transfer_op
from sim.results.timeline import timeline_frame

from validate.rank.comm import clock

__all__ = ["RankTrace", "Tracer", "measured_timeline", "pair_check"]


@dataclass(slots=True)
class RankTrace:
    """What one rank recorded, in seconds of its own clock (picklable, sent to rank 0)."""

    rank: int
    compute: list[tuple[int, float, float]] = field(default_factory=list)
    """(action key, start, end)"""
    sends: list[tuple[int, float, int, int]] = field(default_factory=list)
    """(producer key, isend time, destination rank, bytes)"""
    arrivals: dict[int, float] = field(default_factory=dict)
    """producer key -> time the message was seen complete"""
    overhead: list[tuple[int, float]] = field(default_factory=list)
    """(action key, seconds of the executor's own work around it: host time, neither computing nor waiting)"""


class Tracer:
    """Records one rank's actions; CUDA events on GPUs, ``perf_counter`` otherwise."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.trace = RankTrace(rank=rank)
        self.cuda = device.type == "cuda"
        self._events: list[tuple[int, object, object]] = []
        self._sends: list[tuple[int, object, int, int]] = []
        self._arrivals: dict[int, object] = {}
        if self.cuda:
            torch.cuda.synchronize(device)
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
            torch.cuda.synchronize(device)
            self._ref_host = clock()

    def begin(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return clock()

    def end(self, key: int, started) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((key, started, ev))
        else:
            self.trace.compute.append((key, started, clock()))

    def overhead(self, key: int, seconds: float) -> None:
        """The executor's own host time around action *key* (see :mod:`validate.rank.executor`)."""
        self.trace.overhead.append((key, seconds))

    def sent(self, producer: int, dst: int, nbytes: int) -> None:
        if self.cuda:
            self._sends.append((producer, self.begin(), dst, nbytes))
        else:
            self.trace.sends.append((producer, clock(), dst, nbytes))

    def arrived(self, producer: int, at: float | None = None) -> None:
        if self.cuda:
            if producer not in self._arrivals:
                self._arrivals[producer] = self.begin()
        else:
            self.trace.arrivals.setdefault(producer, clock() if at is None else at)

    def _host(self, event) -> float:
        return self._ref_host + self._ref.elapsed_time(event) / 1e3

    def finish(self) -> RankTrace:
        """Resolve CUDA events (one synchronization, after the run)."""
        if self.cuda:
            torch.cuda.synchronize()
            for key, a, b in self._events:
                self.trace.compute.append((key, self._host(a), self._host(b)))
            for key, ev, dst, nbytes in self._sends:
                self.trace.sends.append((key, self._host(ev), dst, nbytes))
            for key, ev in self._arrivals.items():
                self.trace.arrivals.setdefault(key, self._host(ev))
            self._events.clear()
            self._sends.clear()
            self._arrivals.clear()
        return self.trace


def measured_timeline(schedule: Schedule, traces: list[RankTrace], offsets: list[float]) -> pd.DataFrame:
    """One timeline (schema of :mod:`sim.results.timeline`) from every rank's trace, on rank 0's clock."""
    device, key, op, start, end, src, dst, nbytes = ([] for _ in range(8))
    arrivals: dict[int, float] = {}
    for t in traces:
        for k, at in t.arrivals.items():
            arrivals[k] = at - offsets[t.rank]
    for t in traces:
        off = offsets[t.rank]
        for k, a, b in t.compute:
            device.append(t.rank), key.append(k), op.append(key_kind(k)), start.append(a - off), end.append(b - off)
            src.append(-1), dst.append(-1), nbytes.append(0)
    for t in traces:
        off = offsets[t.rank]
        for k, a, d, n in t.sends:
            a -= off
            device.append(t.rank), key.append(k), op.append(transfer_op(k)), start.append(a)
            end.append(max(a, arrivals.get(k, a))), src.append(t.rank), dst.append(d), nbytes.append(n)
    t0 = min(start) if start else 0.0
    return timeline_frame(schedule, device=device, key=key, op=op, start=np.asarray(start) - t0,
                          end=np.asarray(end) - t0, src=src, dst=dst, nbytes=nbytes)


def pair_check(traces: list[list[RankTrace]], clocks) -> str:
    """A report line: the clock offsets from every matched send/receive pair of the timed runs, against the
    ping-pong estimate of *clocks* (:class:`validate.request.ClockOffsets`). *traces*: run -> rank -> trace.

    Pairs are (sender, receiver, ``isend`` time on the sender's clock, arrival on the receiver's); each bounds
    the offset between the two clocks (a message is not seen before it was sent). The two estimates are
    independent (ping-pong on the control group before and after the runs, pairs during them), so they must
    agree within their uncertainties; where they do not, the line says so.
    """
    from validate.ingest.clocks import ClockError, align_clocks

    ranks = len(traces[0]) if traces else 0
    pairs = []
    for run in traces:
        arrived = {(t.rank, k): at for t in run for k, at in t.arrivals.items()}
        for t in run:
            for k, sent, dst, _ in t.sends:
                if (dst, k) in arrived:  # microseconds, as align_clocks takes them
                    pairs.append((t.rank, dst, sent * 1e6, arrived[(dst, k)] * 1e6))
    try:
        pairs_est = align_clocks(pairs, ranks, shared=False)
    except ClockError as exc:
        return f"clock check by matched send/receive pairs not possible: {exc}"
    parts, agree = [], True
    for r in range(1, ranks):
        # align_clocks: add offsets[r] to rank r's times; ClockOffsets: subtract offsets[r]
        by_pairs, by_ping = -pairs_est.offsets[r], clocks.offsets[r] * 1e6
        margin = pairs_est.uncertainty[r] + clocks.uncertainty[r] * 1e6
        agree &= abs(by_pairs - by_ping) <= margin
        parts.append(f"rank {r} {by_pairs:+.0f} us ± {pairs_est.uncertainty[r]:.0f} us (ping-pong {by_ping:+.0f} us "
                     f"± {clocks.uncertainty[r] * 1e6:.0f} us)")
    verdict = ("they agree" if agree
               else "they DISAGREE beyond their uncertainties: the clocks moved, or a link is asymmetric")
    return (f"clock check by {len(pairs)} matched send/receive pairs (offset to rank 0): " + "; ".join(parts)
            + f"; {verdict}")
