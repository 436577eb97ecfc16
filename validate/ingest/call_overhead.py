"""The runtime's own time around each communication call: what neither the call nor the dispatch overhead charges.

A PyTorch-runtime trace times each point-to-point call (``c10d::send`` / ``c10d::recv_``), and the model takes the
calls' durations from it (:mod:`validate.ingest.messages`). The runtime does Python work around every call too:
torch 2.13's ``_PipelineScheduleRuntime._step_microbatches`` wraps each SEND_F / RECV_F / SEND_B / RECV_B action in
``record_function("PP:<action>")`` and, inside it, builds the operations (``stage.get_fwd_send_ops(mb)`` and its
three siblings) and posts them through ``_batch_p2p`` / ``dist.batch_isend_irecv``; ``ScheduleGPipe`` and
``Schedule1F1B`` build and post theirs in ``_step_microbatches`` between the computations, with no range of their
own. That time is in no computation, in no call, and not in the dispatch overhead either (the gaps between actions
leave communication time out, :func:`validate.compare.idle.action_gaps`), so nothing charged it: re-running every
profiled step of saved 1-ms launches with its own computations, dispatch and message times, the model ended
+1.4..+4.5% short of the step for every schedule (ZBV +3.7..+4.2%, its last action starting 1.3 ms late, the lag
growing by about 30 us an action), and within +-1% with this time charged (README, "The runtime's own time around a
call").

Measured two ways, by what the trace has:

- ``range``: where the runtime marks each communication action (the multi-stage runtime's ``PP:`` ranges), the mean
  over them of the range's duration less the calls inside it (40-43 us per send and 31-34 us per receive at 1-ms
  actions on this CPU: their sum is the time to charge, so the mean);
- ``before the call``: otherwise, the median of the time on a rank between the end of its previous computation or
  call and the start of a call (the median, since a rank can also sit there for reasons of its own: a step's first
  call follows the barrier).

Every send call is then charged :attr:`CallOverhead.send` more, every receive :attr:`CallOverhead.recv`
(:attr:`validate.ingest.messages.MessageModel.send_overhead`); the call posts its operation as it returns, so the
work before the call delays the post as it does in the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["CallOverhead", "NO_OVERHEAD", "call_overhead", "gaps_before_calls", "spans_before_calls"]


@dataclass(frozen=True, slots=True)
class CallOverhead:
    """Seconds of the runtime's own time each communication call carries beyond the call itself."""

    send: float
    recv: float
    form: str
    """``range`` (the runtime's communication ranges less their calls), ``before the call`` (the time since the
    rank's previous computation or call) or ``none`` (nothing measured)."""
    samples: int
    """Calls it was measured from."""

    def to_dict(self) -> dict:
        return {"send_s": self.send, "recv_s": self.recv, "form": self.form, "samples": self.samples}

    def describe(self) -> str:
        if self.form == "none":
            return "no runtime time around the calls measured"
        where = ("the rest of the runtime's communication ranges" if self.form == "range"
                 else "the time before each call since the rank's previous computation or call")
        return (f"{self.send * 1e6:.0f} us per send call and {self.recv * 1e6:.0f} us per receive of the runtime's "
                f"own time around the call ({where}, {self.samples} calls)")


NO_OVERHEAD = CallOverhead(0.0, 0.0, "none", 0)


def call_overhead(range_remainders: Iterable[tuple[str, float]], steps: Mapping | None = None,
                  messages: Mapping | None = None, schedule=None) -> CallOverhead:
    """The :class:`CallOverhead` of a trace: from *range_remainders* (('send' | 'recv', seconds of a communication
    range outside its calls), :attr:`validate.ingest.actions.RankRecords.call_remainders`) where there are any,
    else from the time before each call (:func:`gaps_before_calls` of *steps*, *messages* and *schedule*)."""
    by = {"send": [], "recv": []}
    for direction, seconds in range_remainders:
        by[direction].append(max(0.0, seconds))
    if by["send"] or by["recv"]:
        mean = lambda v: float(np.mean(v)) if v else 0.0  # noqa: E731
        return CallOverhead(mean(by["send"]), mean(by["recv"]), "range", len(by["send"]) + len(by["recv"]))
    if not steps or not messages or schedule is None:
        return NO_OVERHEAD
    gaps = gaps_before_calls(steps, messages, schedule)
    if not (gaps["send"] or gaps["recv"]):
        return NO_OVERHEAD
    median = lambda v: float(np.median(v)) if v else 0.0  # noqa: E731
    return CallOverhead(median(gaps["send"]), median(gaps["recv"]), "before the call",
                        len(gaps["send"]) + len(gaps["recv"]))


def gaps_before_calls(steps: Mapping, messages: Mapping, schedule) -> dict[str, list[float]]:
    """'send' / 'recv' -> for every call of every step in both *steps* (step -> measured Result) and *messages*
    (step -> {key: :class:`validate.ingest.messages.MessageTimes`}), the seconds between the end of its rank's
    previous computation or call and its start (from the step's start where there is neither). *schedule* places
    each message's ranks."""
    out: dict[str, list[float]] = {"send": [], "recv": []}
    for _step, _device, direction, begin, start in _before_calls(steps, messages, schedule):
        out[direction].append(max(0.0, start - begin))
    return out


def spans_before_calls(steps: Mapping, messages: Mapping, schedule) -> dict[int, dict[int, list[tuple[float, float]]]]:
    """step -> device -> the (start, end) seconds before each call that ``before the call`` measures (arguments as
    :func:`gaps_before_calls`). The dispatch overhead leaves them out (:meth:`validate.ingest.flow.Ingested.
    dispatch_spans`): where the rank's next computation had its input already, that time is a gap before it too,
    and charged as both it was counted twice. Megatron's overlapped mode (``validate --runtime megatron-overlap``,
    1-ms actions, 26 Nov 2026): 68 us per send and 81 us per receive before the call, and dispatch 34-198 us per
    action counting the same time again."""
    out: dict[int, dict[int, list[tuple[float, float]]]] = {}
    for step, device, _direction, begin, start in _before_calls(steps, messages, schedule):
        if start > begin:
            out.setdefault(step, {}).setdefault(device, []).append((begin, start))
    return out


def _before_calls(steps: Mapping, messages: Mapping, schedule):
    """(step, device, 'send' | 'recv', end of the rank's previous computation or call, the call's start) of every
    call of every step in both *steps* and *messages*."""
    flat = schedule.compiled.flat
    ranks = dict(zip(flat.keys.tolist(), zip(np.asarray(flat.device).tolist(), np.asarray(flat.send_to).tolist())))
    for step in sorted(set(steps) & set(messages)):
        tl = steps[step].timeline
        computed = tl[tl["src"] < 0]
        ends = {int(d): np.sort(g["end"].to_numpy(dtype=float)) for d, g in computed.groupby("device")}
        calls: dict[int, list[tuple[str, float, float]]] = {}
        for key, m in messages[step].items():
            if int(key) not in ranks:
                continue
            src, dst = ranks[int(key)]
            calls.setdefault(src, []).append(("send", *m.send_call))
            calls.setdefault(dst, []).append(("recv", *m.recv_call))
        for device, mine in calls.items():
            mine.sort(key=lambda c: c[1])
            done = ends.get(device, np.zeros(0))
            call_ends = np.sort(np.array([c[2] for c in mine]))
            for direction, start, _ in mine:
                before = [0.0]
                i = int(np.searchsorted(done, start, side="right"))
                if i:
                    before.append(float(done[i - 1]))
                j = int(np.searchsorted(call_ends, start, side="right"))
                if j:
                    before.append(float(call_ends[j - 1]))
                yield step, device, direction, max(before), start
