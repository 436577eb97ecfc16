"""Message latencies as the distributions a trace shows, and the runtime model's prediction drawn from them.

What a PyTorch-runtime trace on gloo (CPU, a shared 2-core machine) shows, message by message
(:mod:`validate.ingest.messages`; ``benchmarks/bench_runtime.py`` prints it): a receive that its rank waits for
completes ~0.1 ms after the later of the two posts in most cases, whether or not the sender is computing meanwhile
(so gloo's device thread does get the sender's pinned core while the rank computes: the hypothesis that data moves
only while the sender is off its core does not hold), and a few messages per step take 1-8 ms: a call that
returns milliseconds late (``c10d::send`` / ``c10d::recv_``) or a completion that comes milliseconds after both
sides posted, with neither rank computing. Those are the threads waiting for a core (or the pair's lock held by a
thread waiting for one) on a machine whose other work the ranks share cores with; they mostly do not follow from the
schedule and differ from step to step (DualPipeV's second receive posted back to back on one pair is the exception:
README, "Where the slow calls come from"), so the median of the message times (what the link fit takes) leaves out
the tail that sets the makespan: +48..+108% too fast at load 2-3 in one launch.

So the prediction draws every message's three times (its send call, its receive call, its link time from the
later call's return, :attr:`validate.ingest.messages.MessageTimes.posted`; its sender's completion too with
``senders=True``) from their distributions over every profiled step, and every computation's duration from those
of its stage and kind in one profiled step, with that step's dispatch
overhead (the same machine slows computations and the runtime's own time too: a median per stage and kind leaves
out their tail as well), runs the lowered program with them (:func:`validate.ingest.messages.predict_with_messages`)
*draws* times, every step as many, and takes the run of median makespan.

The link times are censored: a message whose receiver began waiting only after it had arrived (the multi-stage
runtime waits for a receive right before the consuming computation) shows only that its time was below the wait's
start less the later call's return. Taking only the messages someone waited for would keep the slow ones; so the
distribution is estimated as for current-status data: P(latency > x) is the share, among the messages whose
threshold (wait start less that return) is at most x, of those that took longer than x (Jewell and van der Laan,
"Current status data: review, recent developments and open problems", 2003: the nonparametric estimate at a
point), made non-increasing. The calls are seen whole and are drawn from their own values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.engines.rendezvous import ProgramRun
from sim.results.result import Result

from validate.compare.idle import split_idle
from validate.ingest.call_overhead import NO_OVERHEAD, CallOverhead
from validate.ingest.messages import MessageModel, MessageTimes, predict_with_messages
from validate.predict.calibrate import dispatch_overhead

__all__ = ["MessageDistributions", "message_distributions", "predict_drawn", "duration_kind", "DEFAULT_DRAWS",
           "sender_evidence", "call_collisions", "collision_evidence", "COLLISION_WINDOW", "STALL_SECONDS",
           "step_stalls", "drawn_stalls"]

DEFAULT_DRAWS = 64
"""Runs per prediction: the median of 64 draws moves by a few tenths of a percent between seeds."""

COLLISION_WINDOW = 1e-4
"""Seconds: a communication call that begins this close to the arrival of an unexpected message for its rank
*collides* with it (:func:`call_collisions`; README, "Where the slow calls come from", gives the figures)."""


@dataclass(frozen=True, slots=True)
class MessageDistributions:
    """What message times a trace shows (seconds)."""

    link: np.ndarray
    """Support of the link time from the later call's return to the completion, increasing."""
    link_p: np.ndarray
    """Probability of each support value (sums to 1)."""
    send_call: np.ndarray
    """Every send call's duration."""
    recv_call: np.ndarray
    messages: int
    """Messages the figures come from."""
    observed: int
    """Of which the receiver waited for (their link time seen exactly)."""
    compute: dict | None = None
    """(stage, kind) -> every measured duration of that computation (seconds; the kind as :func:`duration_kind`
    names it); empty: the costs' medians."""
    dispatch: dict | None = None
    """stage -> {kind letter: mean seconds of runtime gap before one action} over these steps
    (:func:`validate.predict.calibrate.dispatch_overhead`); None: not measured (no communication spans given)."""
    by_step: dict | None = None
    """step -> the distributions of that profiled step alone (None: not kept). Message stalls come in regimes that
    last a step: at load 3-4, 1F1B's per-step median link time was 0.12-0.13 ms in three steps and 0.5-1.6 ms in
    the other two, DualPipeV's 0.7 ms to 2.7 ms with the step's makespan (``benchmarks/bench_runtime.py``'s runs of
    25 Nov 2026). :func:`predict_drawn` gives each profiled step as many runs and takes a run's computations and
    dispatch overhead from its step; with ``by_step=True`` its message times too (a block bootstrap over steps), so
    a run keeps its step's regime."""
    send_collided: np.ndarray | None = None
    """Per :attr:`send_call`: whether that call collided with an unexpected message (:func:`call_collisions`);
    None: not classified (no schedule given). :func:`predict_drawn` draws the calls that collide apart where they
    are classified (``collisions=False``: not)."""
    recv_collided: np.ndarray | None = None
    """Per :attr:`recv_call`, likewise."""
    sender: np.ndarray | None = None
    """Every known time from a message's later call's return to its sender's completion (gloo completes a send once its
    device thread has written it, often before the receiver's thread notices). Drawn only with
    ``predict_drawn(..., senders=True)``: over twelve launches (25 Nov 2026, load 1.0-4.0) the median error was no
    better with them (mean |median error| 7.5% against 7.2% without; gpipe -14.8% against -9.6% in a quiet run),
    the trace's sender completion being likely noticed late (at the sender's own wait) rather than when written."""
    call_overhead: CallOverhead = NO_OVERHEAD
    """The runtime's own time around each call (:mod:`validate.ingest.call_overhead`), charged to every drawn call
    on top of its drawn duration."""

    def draw_link(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.choice(self.link, size=size, p=self.link_p)

    def to_dict(self) -> dict:
        if not self.messages:
            return {"messages": 0, "observed": 0, "link_mean_s": None, "link_median_s": None, "link_p90_s": None,
                    "send_call_median_s": None, "recv_call_median_s": None, "collided_calls": None,
                    "sender_median_s": None}
        mean = float(np.dot(self.link, self.link_p))
        cdf = np.cumsum(self.link_p)
        q = lambda f: float(self.link[min(int(np.searchsorted(cdf, f)), len(self.link) - 1)])  # noqa: E731
        return {"messages": self.messages, "observed": self.observed, "link_mean_s": mean,
                "link_median_s": q(0.5), "link_p90_s": q(0.9),
                "send_call_median_s": float(np.median(self.send_call)),
                "recv_call_median_s": float(np.median(self.recv_call)),
                "collided_calls": None if self.send_collided is None
                else int(self.send_collided.sum() + self.recv_collided.sum()),
                "sender_median_s": float(np.median(self.sender)) if self.sender is not None and len(self.sender)
                else None, "call_overhead": self.call_overhead.to_dict()}


def duration_kind(kind: str, stage: int, microbatch: int, split) -> str:
    """The kind letter a computation's duration is pooled under: a backward whose schedule has no W for the same
    micro-batch (not in *split*, :attr:`sim.core.ir.Schedule.split_backward`) is ``B_full``, the input and weight
    gradients both, as :func:`validate.predict.calibrate.in_schedule_costs` names it. PyTorch's DualPipeV runs
    both kinds at one stage (full backwards in its overlapped pairs, input-only ones before its last W's): pooled
    as one, at probe size a stage-3 backward was drawn from 26.6 and 58.9-70.1 ms alike, the prediction -4.7% off
    and its idle split 2.6 points, against +0.6% and 0.3 apart (``tests/fixtures/ingest``'s probe-sized DualPipeV,
    26 Nov 2026)."""
    return "B_full" if kind == "B" and (stage, microbatch) not in split else kind


def message_distributions(per_step: Mapping[int, Mapping[int, MessageTimes]],
                          steps: Sequence[int] | None = None, results: Mapping | None = None,
                          schedule=None, spans: Mapping | None = None,
                          overhead: CallOverhead | None = None) -> MessageDistributions | None:
    """The distributions of *steps* (default: all) of *per_step* (step -> {key: times}); with *results* (step ->
    measured Result, :attr:`validate.ingest.flow.Ingested.steps`) also the computations' durations, and with
    *spans* too (step -> device -> its communication-call spans, :attr:`validate.ingest.flow.Ingested.comm_spans`)
    the dispatch overhead (:attr:`MessageDistributions.dispatch`); with the
    *schedule* that ran (it places each message's ranks), which calls collided with an unexpected message
    (:attr:`MessageDistributions.send_collided`); *overhead*: the runtime's own time around each call
    (:attr:`validate.ingest.flow.Ingested.call_overhead`; None: none). None when there are messages but none whose
    receiver's wait start is known (their link time is unknown: the link fit instead), or neither messages nor
    computations.

    A run without messages (one rank: K=1) still gets its computations' distributions (``messages`` 0): a
    computation's duration is skewed (one H200, K=1, actions of 0.1-0.6 ms launched by a host that is the
    bottleneck: ZBV's I and W p90 1.7-1.8 x their median), so the medians of the calibration sum to less than a
    step: the busy time 13.0 ms predicted against 14.3-16.4 ms measured, the makespan +10.8% off; drawn as here,
    +0.8% (``benchmarks/gpu_checks.sh``, 26 Nov 2026; ``tests/fixtures/ingest`` keeps that trace)."""
    compute: dict[tuple[int, str], list[float]] = {}
    dispatch = None
    if results and spans is not None:
        dispatch = dispatch_overhead([(results[s], spans.get(s)) for s in (sorted(results) if steps is None else steps)
                                      if s in results]) or None
    for s in (sorted(results or {}) if steps is None else steps):
        result = (results or {}).get(s)
        if result is None:
            continue
        tl = result.timeline
        rows = tl[tl["src"] < 0]
        split = result.schedule.split_backward
        for stage, op, mb, a, b in zip(rows["stage"].tolist(), rows["op"].astype(str).tolist(),
                                       rows["microbatch"].tolist(), rows["start"].tolist(), rows["end"].tolist()):
            compute.setdefault((int(stage), duration_kind(op, int(stage), int(mb), split)), []).append(b - a)
    times, thresholds, seen, sends, recvs, senders, send_hits, recv_hits = [], [], [], [], [], [], [], []
    for s in (sorted(per_step) if steps is None else steps):
        msgs = per_step.get(s, {})
        if schedule is not None and msgs:
            send_hit, recv_hit = _step_collisions(schedule, msgs)
            send_hits += send_hit.tolist()
            recv_hits += recv_hit.tolist()
        for m in msgs.values():
            sends.append(m.send_call[1] - m.send_call[0])
            recvs.append(m.recv_call[1] - m.recv_call[0])
            if m.sender_seconds is not None:
                senders.append(m.sender_seconds)
            if m.wait_start is None:
                continue
            times.append(m.link_seconds)
            thresholds.append(m.wait_start - m.posted)
            seen.append(m.blocked)
    classified = schedule is not None
    by_step = None
    every_step = sorted(set(per_step) | set(results or {}))
    if steps is None and len(every_step) > 1:  # each step's own distributions, for the block bootstrap
        by_step = {k: d for k in every_step
                   if (d := message_distributions(per_step, [k], {k: results[k]} if results and k in results
                                                  else None, schedule, spans, overhead)) is not None}
    if not times:
        if sends or not compute:
            return None
        empty = np.zeros(0)
        return MessageDistributions(link=empty, link_p=empty, send_call=empty, recv_call=empty, messages=0,
                                    observed=0, compute={k: np.array(v) for k, v in compute.items()},
                                    dispatch=dispatch, by_step=by_step, sender=empty,
                                    call_overhead=overhead or NO_OVERHEAD,
                                    send_collided=np.zeros(0, dtype=bool) if classified else None,
                                    recv_collided=np.zeros(0, dtype=bool) if classified else None)
    latency, threshold, exact = np.array(times), np.array(thresholds), np.array(seen)
    support = np.unique(latency[exact]) if exact.any() else np.array([float(np.min(latency))])
    # P(L > x) at each support value x: among the messages whose threshold is <= x, the share seen exactly above x
    # (an unseen one took at most its threshold <= x); non-increasing by a running minimum, 1 before the support
    survive = np.ones(len(support))
    for j, x in enumerate(support):
        at_risk = threshold <= x
        if at_risk.any():
            survive[j] = float(np.mean(exact[at_risk] & (latency[at_risk] > x)))
    survive = np.minimum.accumulate(survive)
    p = -np.diff(np.concatenate([[1.0], survive]))
    p[-1] += survive[-1]  # what survives the largest value seen is put on it
    p = np.clip(p, 0.0, None)
    keep = p > 0
    return MessageDistributions(dispatch=dispatch, by_step=by_step, link=support[keep], link_p=p[keep] / p[keep].sum(),
                                call_overhead=overhead or NO_OVERHEAD,
                                send_call=np.array(sends),
                                recv_call=np.array(recvs), messages=len(sends), observed=int(exact.sum()),
                                compute={k: np.array(v) for k, v in compute.items()}, sender=np.array(senders),
                                send_collided=np.array(send_hits, dtype=bool) if classified else None,
                                recv_collided=np.array(recv_hits, dtype=bool) if classified else None)


def predict_drawn(schedule, costs, hardware, runtime: str, dist: MessageDistributions, *, draws: int = DEFAULT_DRAWS,
                  seed: int = 0, microbatch_size: float = 1.0, by_step: bool = False, senders: bool = False,
                  collisions: bool | None = None, freezes: bool = True,
                  record: list | None = None) -> tuple[Result, ProgramRun, np.ndarray, list]:
    """*draws* runs of *schedule* under *runtime*, each message's calls and link time and each computation's
    duration drawn from *dist* (seeded; a run's computations and dispatch overhead from one profiled step's, every
    step as many runs, see below); returns the run of median makespan (Result and run), every draw's
    makespan and every draw's idle split (:class:`validate.compare.idle.IdleSplit`: one run's split is one sample
    of a spread as wide as the measured steps', so a comparison takes the mean over the draws against the mean
    over the profiled steps).

    *collisions* (the collision rule; None, the default: wherever *dist* is classified,
    ``message_distributions(..., schedule=...)`` as ``validate --runtime torch`` makes it; True requires that): the
    calls that collide with an unexpected message where the run posts them (:func:`call_collisions`) are drawn from
    the trace's colliding calls, as many per step as the trace had, the others from the rest
    (:func:`_with_collisions`). A trace's colliding calls stall to the scheduler's next tick 40-60% of the time, the
    others 1-3% (:data:`COLLISION_WINDOW`). Since a call posts its operation as it returns
    (:mod:`sim.engines.rendezvous`), a stalled call holds up its transfer too, so where the stalls land matters: over
    70 paired runs at 1-ms actions (14 launches of the five schedules) the mean |median error| 4.3% -> 3.5%, within
    5% in 47 -> 53 (README, "A call posts as it returns"). Before that change the rule gained about a point, within
    the launches' noise, and was left as an option.

    *freezes* (the default): a drawn stall holds its pair of ranks (:func:`_with_freezes`): the messages between
    them that start during it end no earlier. Drawn one by one, a stall delayed one rank while the other went on
    and then waited for its results, so the prediction counted as dependency what the traces show as
    communication, both ranks waiting on the pair at once (README, "A stall holds the pair").

    *record*: a list that gets every draw's (message model, result, program run), in the order of the returned
    makespans, for diagnostics such as :func:`drawn_stalls`."""
    classified = dist.send_collided is not None and dist.recv_collided is not None
    if collisions and not classified:
        raise ValueError("predict_drawn(collisions=True) needs distributions made with the schedule "
                         "(message_distributions(..., schedule=...))")
    collisions = classified if collisions is None else collisions
    rng = np.random.default_rng(seed)
    flat = schedule.compiled.flat
    keys = _transfers(schedule)[1]
    split = schedule.split_backward
    kinds = [(a.stage, duration_kind(a.kind.value, a.stage, a.mb, split))
             for a in (schedule.action_of(int(k)) for k in flat.keys.tolist())]
    steps = sorted(dist.by_step or {})
    collided_per_step = (float(dist.send_collided.sum() + dist.recv_collided.sum()) / max(1, len(steps))
                         if collisions else 0.0)
    # every profiled step gives as many runs as the others (one more at most), in a random order: drawn
    # independently, the steps' shares of 64 runs moved the median run by which steps were drawn most. Five steps on
    # one H200 (K=1, 26 Nov 2026), two of them 23-32% slower than the others, each run's dispatch from its step:
    # 6 to 21 runs per step, the run of median makespan from a slow step, -16.3% against the median step while each
    # step's own runs came within 1.9% of that step's makespan (README, "Each run from one profiled step")
    order = rng.permutation(np.resize(np.arange(len(steps)), draws)) if steps else None
    runs = []
    for run_index in range(draws):
        # a run's computations come from one profiled step: a slow step (the machine busy elsewhere for a while)
        # is slow in every action, so drawing each action from every step's durations pooled would give every run
        # a share of that step's slow actions; with five probe-sized steps, one of them 70% slow, the pooled draws
        # predicted 27-29% long (bench_runtime.py --probe, 25 Nov 2026, load 0.2-1.6). Its messages come from
        # that step's too with by_step, else from every step's pooled (no better on the twelve launches measured)
        step = dist.by_step[steps[int(order[run_index])]] if steps else None
        d = step if by_step and step is not None and step.messages else dist
        pools = {**(dist.compute or {}), **((step or dist).compute or {})}  # a (stage, kind) the step lacks: all
        # and its dispatch overhead: the runtime's own time between actions is host time, slow in the same steps
        # as the computations (the H200's five steps above: 217-509 us before a forward of stage 0)
        run_costs = costs.with_dispatch(step.dispatch) if step is not None and step.dispatch else costs
        durations = None
        drawn = [i for i, kind in enumerate(kinds) if kind in pools]
        if drawn:
            durations = np.full(len(kinds), np.nan)  # NaN: an action without measured durations keeps its cost
            for i in drawn:
                durations[i] = rng.choice(pools[kinds[i]])
        has_sender = senders and d.sender is not None and len(d.sender) > 0
        send_pool, recv_pool, stalled = d.send_call, d.recv_call, None
        if collisions and d.messages:
            send_pool, recv_pool, stalled = _collision_pools(d, dist)
        if d.messages:
            model = MessageModel(send_call=dict(zip(keys, rng.choice(send_pool, len(keys)).tolist())),
                                 recv_call=dict(zip(keys, rng.choice(recv_pool, len(keys)).tolist())),
                                 link=dict(zip(keys, d.draw_link(rng, len(keys)).tolist())), bound={},
                                 sender=dict(zip(keys, rng.choice(d.sender, len(keys)).tolist())) if has_sender
                                 else {}, typical_send=float(np.median(d.send_call)),
                                 typical_recv=float(np.median(d.recv_call)), steps=draws,
                                 send_overhead=dist.call_overhead.send, recv_overhead=dist.call_overhead.recv)
        else:  # a trace without messages (one rank, or no communication calls): the links are the hardware's
            model = MessageModel(send_call={}, recv_call={}, link={}, bound={}, sender={}, typical_send=0.0,
                                 typical_recv=0.0, steps=draws)
        run = predict_with_messages(schedule, run_costs, hardware, runtime, model, durations=durations,
                                    microbatch_size=microbatch_size)
        if stalled is not None:
            run, model = _with_collisions(schedule, run_costs, hardware, runtime, model, durations, microbatch_size,
                                          run, rng.choice(stalled, len(keys)), rng.choice(stalled, len(keys)),
                                          rate=collided_per_step, keep=rng.random(2 * len(keys)))
        if freezes and d.messages:
            run = _with_freezes(schedule, run_costs, hardware, runtime, model, durations, microbatch_size, run)
        runs.append(run)
        if record is not None:
            record.append((model, *run))
    spans = np.array([r.metrics.makespan for r, _ in runs])
    splits = [split_idle(r, ran.communication) for r, ran in runs]
    result, ran = runs[int(np.argsort(spans)[(len(spans) - 1) // 2])]
    drew = (f"message times were drawn from the trace's ({dist.messages} messages"
            + (", the calls that collide with an unexpected message from those that did" if collisions else "")
            + (", a stall holding its pair of ranks" if freezes else "")
            if dist.messages else "computations' durations were drawn from the trace's (no messages")
    result.notes[-1] = (f"runtime {runtime}: the run of median makespan of {draws} whose {drew}, "
                        f"validate/ingest/message_draws.py)")
    return result, ran, spans, splits


def _collision_pools(d: MessageDistributions, whole: MessageDistributions):
    """(send calls, receive calls, colliding calls) to draw from: the calls that did not collide by kind, and the
    ones that did, both kinds together (their durations are the stall, not the call); a pool *d* (one step) lacks
    falls back to *whole*'s, and no colliding call at all gives None (nothing to redraw)."""
    def split(dist):
        sends, recvs = dist.send_call[~dist.send_collided], dist.recv_call[~dist.recv_collided]
        hit = np.concatenate([dist.send_call[dist.send_collided], dist.recv_call[dist.recv_collided]])
        return sends, recvs, hit
    sends, recvs, hit = split(d)
    w_sends, w_recvs, w_hit = split(whole) if whole is not d else (sends, recvs, hit)
    sends = sends if len(sends) else (w_sends if len(w_sends) else d.send_call)
    recvs = recvs if len(recvs) else (w_recvs if len(w_recvs) else d.recv_call)
    hit = hit if len(hit) else (w_hit if len(w_hit) else None)
    return sends, recvs, hit


def _transfers(schedule) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
    """(flat positions of the actions that send a result, their keys, their sending and receiving devices) of
    *schedule*: one message each, in the schedule's flat order (what the draws index)."""
    flat = schedule.compiled.flat
    sending = np.flatnonzero(flat.send_to >= 0)
    return sending, flat.keys[sending].tolist(), np.asarray(flat.device)[sending], np.asarray(flat.send_to)[sending]


COLLISION_ROUNDS = 4
"""At most this many re-runs of one draw while the set of colliding calls changes."""


def _with_collisions(schedule, costs, hardware, runtime, model: MessageModel, durations, microbatch_size, run,
                     stalled_send: np.ndarray, stalled_recv: np.ndarray, *, rate: float = math.inf,
                     keep: np.ndarray | None = None):
    """One draw's run with its colliding calls (:func:`call_collisions`, judged by when the run's calls begin, as the
    trace's are: a call's post less its drawn duration) given durations
    drawn from the trace's colliding calls (*stalled_send* / *stalled_recv*, one per message in the schedule's
    message order) instead of *model*'s. Where a call lands depends on the calls before it, so the run is repeated
    with the colliding set of the run before until it no longer changes (:data:`COLLISION_ROUNDS` at most).
    *rate*: the trace's colliding calls per step; where the first run has more, each is kept with probability
    rate / that many (*keep*: a uniform number per call, send calls then receive calls), since the simulated posts
    line up more tightly than the real ones and collide more often."""
    sending, keys, src, dst = _transfers(schedule)
    send_hit = np.zeros(len(keys), dtype=bool)
    recv_hit = np.zeros(len(keys), dtype=bool)
    share = None
    for _ in range(COLLISION_ROUNDS):
        ran = run[1]
        # classified as the trace's calls are, by when the c10d call began: its post (its return) less its duration
        send_start = ran.send_post[sending] - np.array([model.send_call.get(k, model.typical_send) for k in keys])
        recv_start = ran.recv_post[sending] - np.array([model.recv_call.get(k, model.typical_recv) for k in keys])
        s_hit, r_hit = call_collisions(np.where(ran.send_post[sending] >= 0, send_start, -1.0),
                                       np.where(ran.recv_post[sending] >= 0, recv_start, -1.0), src, dst)
        if share is None:  # fixed by the first run: later runs move calls, not the rate
            share = min(1.0, rate / max(1, int(s_hit.sum() + r_hit.sum())))
        if keep is not None and share < 1.0:
            s_hit &= keep[:len(keys)] < share
            r_hit &= keep[len(keys):] < share
        if (s_hit == send_hit).all() and (r_hit == recv_hit).all():
            break
        send_hit, recv_hit = s_hit, r_hit
        changed = replace(model,
                          send_call={k: float(stalled_send[i]) if send_hit[i] else model.send_call[k]
                                     for i, k in enumerate(keys)},
                          recv_call={k: float(stalled_recv[i]) if recv_hit[i] else model.recv_call[k]
                                     for i, k in enumerate(keys)})
        run = predict_with_messages(schedule, costs, hardware, runtime, changed, durations=durations,
                                    microbatch_size=microbatch_size)
        model = changed
    return run, model


STALL_SECONDS = 1e-3
"""A link time or a communication call above this is a stall: the transfers and calls that take milliseconds on
gloo end at the scheduler's tick (README, "The stalls end at the scheduler's tick"), the others take 0.05-0.5 ms."""


def step_stalls(messages: Mapping[int, MessageTimes], result: Result) -> int:
    """The stalls one profiled step shows: its ``c10d`` send and receive calls (*messages*: key -> times) that took
    over :data:`STALL_SECONDS`, and its messages that took that long from the later call's return to their
    completion while the receiving rank computed nothing in their last :data:`STALL_SECONDS` (*result*: the step
    as ingested), as :func:`drawn_stalls` counts a draw's.

    Only messages the runtime waited for count (:attr:`~validate.ingest.messages.MessageTimes.blocked`): the
    others' completion is the start of a wait that found them done, an upper bound of their arrival. Their whole
    transfer counts, not only the time inside their own wait: the multi-stage runtime waits for its receives one
    after the other, so a message that arrived while its rank waited for another one was waited for all the same.
    A step replayed with its own times has the step's count in 8 of 10 steps of the 1-ms interleaved 1F1B fixture
    and is never more than one apart (tests/test_stall_counts.py)."""
    def slow(span):
        return span[1] - span[0] > STALL_SECONDS
    calls = sum(int(slow(m.send_call)) + int(slow(m.recv_call)) for m in messages.values())
    receiver = _receivers(result.schedule)
    return calls + _waited(result, [(m.posted, m.complete, receiver[key]) for key, m in messages.items() if m.blocked])


def drawn_stalls(schedule, model: MessageModel, result: Result, ran: ProgramRun) -> int:
    """The stalls of one draw of :func:`predict_drawn` (its *record*), counted as :func:`step_stalls` counts a
    step's: drawn calls over :data:`STALL_SECONDS`, and transfers that took that long while the receiving device
    computed nothing in their last :data:`STALL_SECONDS`."""
    sending, _, _, dst = _transfers(schedule)
    calls = sum(v > STALL_SECONDS for v in model.send_call.values()) + sum(
        v > STALL_SECONDS for v in model.recv_call.values())
    spans = zip(ran.run.transfer_start[sending].tolist(), ran.run.transfer_end[sending].tolist(), dst.tolist())
    return int(calls) + _waited(result, list(spans))


def _receivers(schedule) -> dict:
    """key of a sending action -> the device its result goes to."""
    _, keys, _, dst = _transfers(schedule)
    return dict(zip(keys, dst.tolist()))


def _waited(result: Result, transfers: list[tuple[float, float, int]]) -> int:
    """How many of *transfers* (start, end, receiving device) took over :data:`STALL_SECONDS` while their receiver
    computed nothing (in *result*'s timeline) in their last :data:`STALL_SECONDS`."""
    rows = result.rows
    computing = rows.computing
    device, begin, finish = rows.device[computing], rows.start[computing], rows.end[computing]
    count = 0
    for start, end, dst in transfers:
        if end - start > STALL_SECONDS:
            mine = device == dst
            count += not np.any((begin[mine] < end) & (finish[mine] > end - STALL_SECONDS))
    return count


FREEZE_ROUNDS = 4
"""At most this many re-runs of one draw while the links its stalls hold change."""


def _with_freezes(schedule, costs, hardware, runtime, model: MessageModel, durations, microbatch_size, run):
    """One draw's run in which a stalled transfer (drawn link time over :data:`STALL_SECONDS`) holds its pair of
    ranks: a message between the same two ranks, either way, whose transfer starts while the stall is in flight
    ends no earlier than the stall. In the traces no such message ends before it: 38 of 38 whose receiver waited
    (25 within 0.2 ms of the stall's end, 13 later; 3 launches of the five schedules at 1-ms actions, 26 Nov 2026),
    where a link time drawn alone for each message ends most of them 0.1 ms after their post. Where a transfer
    starts depends on the links held before it, so the run is repeated with the stalls of the run before until the
    held links no longer change (:data:`FREEZE_ROUNDS` at most). Returns the run."""
    sending, keys, src, dst = _transfers(schedule)
    pair = np.minimum(src, dst) * schedule.devices + np.maximum(src, dst)
    drawn = np.array([model.link.get(k, np.nan) for k in keys], dtype=float)
    stalls = np.flatnonzero(drawn > STALL_SECONDS)
    if not len(stalls):
        return run
    links = drawn
    for _ in range(FREEZE_ROUNDS):
        start, end = run[1].run.transfer_start[sending], run[1].run.transfer_end[sending]
        held = drawn.copy()
        for i in stalls:
            inside = (pair == pair[i]) & (start >= start[i]) & (start < end[i])
            inside[i] = False
            held[inside] = np.fmax(held[inside], end[i] - start[inside])
        if np.array_equal(held, links, equal_nan=True):
            break
        links = held
        held_model = replace(model, link=dict(zip(keys, links.tolist())))
        run = predict_with_messages(schedule, costs, hardware, runtime, held_model, durations=durations,
                                    microbatch_size=microbatch_size)
    return run


def _step_collisions(schedule, msgs: Mapping[int, MessageTimes]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`call_collisions` of one step's messages (key -> times) of a run of *schedule*: each message's ranks are
    its producer's device and the device its result is sent to (the compiled schedule's ``send_to``)."""
    flat = schedule.compiled.flat
    ends = dict(zip(flat.keys.tolist(), zip(np.asarray(flat.device).tolist(), np.asarray(flat.send_to).tolist())))
    ranks = np.array([ends[int(key)] for key in msgs])
    return call_collisions([m.send_call[0] for m in msgs.values()], [m.recv_call[0] for m in msgs.values()],
                           ranks[:, 0], ranks[:, 1])


def sender_evidence(ingested) -> dict:
    """The check of "gloo moves a message only while its sender is off its core" on an ingested run
    (:class:`validate.ingest.flow.Ingested`): the receives someone waited for, split by what their sender did
    during the wait (computing through at least 90% of it, or at most 10%), with the median wait; for those whose
    sender computed, how their completion lies against the end of that computation (negative: before it ends,
    which the hypothesis forbids); and the share of waited-for messages that took longer than 1 ms."""
    schedule = ingested.schedule
    waits: dict[str, list[float]] = {"computing": [], "idle": [], "between": []}
    before_end: list[float] = []
    total = slow = 0
    for step, msgs in ingested.messages.items():
        result = ingested.steps.get(step)
        if result is None:
            continue
        tl = result.timeline
        comp = tl[tl["src"] < 0]
        busy = {int(d): sorted(zip(g["start"].tolist(), g["end"].tolist())) for d, g in comp.groupby("device")}
        for key, m in msgs.items():
            if not m.blocked:
                continue
            src = int(schedule.placement[schedule.action_of(int(key)).stage])
            a, b = max(m.wait_start, m.posted), m.complete
            if b <= a:
                continue
            total += 1
            slow += b - a > 1e-3
            on = sum(max(0.0, min(b, e) - max(a, s)) for s, e in busy.get(src, ()))
            share = on / (b - a)
            kind = "computing" if share >= 0.9 else "idle" if share <= 0.1 else "between"
            waits[kind].append(b - a)
            if kind == "computing":
                run_end = next((e for s, e in busy[src] if s <= a < e), None)
                if run_end is not None:
                    before_end.append(b - run_end)
    med = lambda v: float(np.median(v)) if v else None  # noqa: E731
    return {"waited": total, "over_1ms_share": slow / total if total else None,
            **{f"sender_{k}": {"n": len(v), "median_wait_s": med(v)} for k, v in waits.items()},
            "completion_minus_sender_compute_end_median_s": med(before_end)}


def call_collisions(send_post, recv_post, src, dst, window: float = COLLISION_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Which calls collide with an unexpected message.

    Per message i (arrays of one step, seconds on one clock): *send_post* / *recv_post*, when its send and its
    receive call began (negative: never); *src* / *dst*, the sending and the receiving rank. Message j is
    *unexpected* when it was sent before its receive was posted; it reaches rank ``dst[j]`` at ``send_post[j]``
    (the link's ~0.1 ms is within the window). Returns (send_hit, recv_hit): whether the send call of i (on
    ``src[i]``) / its receive call (on ``dst[i]``) began within *window* of an unexpected message reaching that
    rank. gloo's device thread handles an incoming message holding the pair's mutex (``Pair::handleEvents``,
    gloo/transport/tcp/pair.cc), which the rank's own ``Pair::send`` / ``Pair::recv`` take too."""
    send_post, recv_post = np.asarray(send_post, dtype=float), np.asarray(recv_post, dtype=float)
    src, dst = np.asarray(src), np.asarray(dst)
    unexpected = (send_post >= 0) & (send_post < recv_post)

    def hit(start, rank):
        near = np.abs(start[:, None] - send_post[None, :]) <= window
        return (near & unexpected[None, :] & (rank[:, None] == dst[None, :])).any(axis=1) & (start >= 0)
    return hit(send_post, src), hit(recv_post, dst)


def collision_evidence(ingested, *, slow: float = 1e-3) -> dict:
    """How often a communication call of an ingested run (:class:`validate.ingest.flow.Ingested`) took over *slow*
    seconds when it collided with an unexpected message (:func:`call_collisions`) and when it did not."""
    counts = {"collided": [0, 0], "other": [0, 0]}  # [calls, of which slow]
    for msgs in ingested.messages.values():
        if not msgs:
            continue
        send_hit, recv_hit = _step_collisions(ingested.schedule, msgs)
        for m, sh, rh in zip(msgs.values(), send_hit.tolist(), recv_hit.tolist()):
            for (a, b), hit in ((m.send_call, sh), (m.recv_call, rh)):
                c = counts["collided" if hit else "other"]
                c[0] += 1
                c[1] += b - a > slow
    return {kind: {"calls": calls, "slow": late, "slow_share": late / calls if calls else None}
            for kind, (calls, late) in counts.items()}
