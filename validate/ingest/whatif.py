"""What-if questions on an ingested step, and its slowdown explained. Needs no torch.

    from validate.ingest.whatif import analyse
    analysis = analyse(ingested, ["stage 2 x0.9", "link 0-1 x2", "median"])
    analysis.answers[0].step_time, analysis.attribution["stage"]

The method is StragglerAnalysis's what-if replay (Lin et al., "Understanding Stragglers in Large Model
Training Using What-if Analysis", OSDI'25, sec. 3: simulate the job's dependency graph with some
operations' durations replaced, here by the same exact engine as every pipesim prediction):

- **actual**: the step replayed with every action at its measured duration (the compute part of its
  range) and every transfer at its measured time where the receiver was already waiting when it was
  sent (then the message timed the link), else at the calibrated link fit (the trace cannot tell
  link time from the receiver's lateness). Its makespan is compared with the measured one: the
  difference is what the replay does not model (gaps between actions, runtime overhead);
- **ideal**: every action at the median of its (stage, kind) over every complete profiled step, every
  transfer at the link fit. ``median`` asks exactly this question;
- a question (:func:`parse_what_if`) changes the actual replay: ``stage 2 x0.9`` stage 2's actions take
  0.9 of their measured time (``stage 2 B x0.9``: only its backwards); ``device 1 x1.1``; ``kind W
  x0.5``; ``link 0-1 x2`` the link between devices 0 and 1 (both ways; ``0->1`` one way) twice as fast
  (each transfer takes half its time); ``median``. Several questions can be joined with ``,`` into one
  scenario (``'stage 1 x0.8, link 0-1 x2'``).

**Attribution** of the excess ``actual - ideal`` to stages, devices, op kinds (F, B, W...) and links,
three ways per group g, each a replay or a walk of one:

- *critical path*: the actual replay's critical path (from the last action back along the input or
  predecessor each one waited for: the chain with no slack, Kelley & Walker 1959), and the sum over g's
  actions and transfers on it of (actual - ideal) duration;
- *fixing g saves*: ``actual - replay(g at ideal, the rest actual)``;
- *g alone costs*: ``replay(g actual, the rest ideal) - ideal`` (StragglerAnalysis's per-op-type and
  per-worker slowdown).

The three agree when one group is slow; they differ when groups overlap in time (fixing one
straggler exposes the next): both are reported. Units: seconds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from sim.core.ir import ActionKind, Schedule
from sim.engines.fastpath import run_fast
from sim.engines.plan import make_plan
from sim.errors import PipesimError
from sim.results.result import Result, make_result

from validate.ingest.step_replay import measured_durations

__all__ = ["WhatIfError", "WhatIf", "Answer", "Analysis", "parse_what_if", "analyse"]


class WhatIfError(PipesimError):
    """A ``--what-if`` question that cannot be read or does not fit the run."""


_TERM = re.compile(r"""^\s*(?:
    (?P<median>median)
  | (?P<what>stage|device)\s+(?P<index>\d+)(?:\s+(?P<kind>[FBIWU]))?\s+x\s*(?P<f1>[0-9.eE+-]+)
  | kind\s+(?P<only>[FBIWU])\s+x\s*(?P<f2>[0-9.eE+-]+)
  | link\s+(?P<a>\d+)\s*(?P<dir>-|->)\s*(?P<b>\d+)\s+x\s*(?P<f3>[0-9.eE+-]+)
)\s*$""", re.VERBOSE | re.IGNORECASE)

_HELP = ("'median', 'stage S xF', 'stage S B xF', 'device D xF', 'kind W xF' (durations times F) or "
         "'link A-B xF' (transfers F times as fast; A->B one way)")


@dataclass(frozen=True, slots=True)
class WhatIf:
    """One term of a question."""

    what: str
    """'median', 'stage', 'device', 'kind' or 'link'."""
    index: int = -1
    kind: str | None = None
    """Only this kind of action (F, B, I, W, U), or every kind."""
    factor: float = 1.0
    """stage / device / kind: durations times this; link: speed times this (transfer time divided)."""
    src: int = -1
    dst: int = -1
    both_ways: bool = True


def parse_what_if(text: str) -> list[WhatIf]:
    """``'stage 2 x0.9, link 0-1 x2'`` -> its terms (module docstring); :class:`WhatIfError` when unreadable."""
    terms = []
    for part in str(text).split(","):
        m = _TERM.match(part)
        if m is None:
            raise WhatIfError(f"--what-if {text!r}: cannot read {part.strip()!r}; write {_HELP}")
        if m["median"]:
            terms.append(WhatIf("median"))
            continue
        raw = m["f1"] or m["f2"] or m["f3"]
        try:
            factor = float(raw)
        except ValueError:
            raise WhatIfError(f"--what-if {text!r}: {raw!r} is not a number") from None
        if not math.isfinite(factor) or factor <= 0 or factor > 1e6:
            raise WhatIfError(f"--what-if {text!r}: the factor must be a positive number up to 1e6, got {raw}")
        kind = (m["kind"] or m["only"] or "").upper() or None
        if m["what"]:
            terms.append(WhatIf(m["what"].lower(), int(m["index"]), kind, factor))
        elif m["only"]:
            terms.append(WhatIf("kind", -1, kind, factor))
        else:
            terms.append(WhatIf("link", factor=factor, src=int(m["a"]), dst=int(m["b"]), both_ways=m["dir"] == "-"))
    return terms


@dataclass(frozen=True, slots=True)
class Answer:
    """A question's predicted step."""

    question: str
    step_time: float
    """Seconds: the replayed makespan."""
    change: float
    """Relative to the actual replay: step_time / actual - 1."""
    result: Result


@dataclass(frozen=True, slots=True)
class Analysis:
    measured: float
    """Seconds: the measured step (makespan of the ingested timeline)."""
    actual: Result
    """The replay of the measured durations."""
    ideal: Result
    """Every action at its median."""
    answers: list[Answer]
    attribution: dict
    """group kind ('stage', 'device', 'kind', 'link') -> list of rows {group, critical_path_s, fixing_saves_s,
    alone_costs_s, on_path} sorted by critical-path excess."""
    critical_path: list[str]
    """The actual replay's critical path, first to last (actions and transfers as text)."""
    notes: list[str] = field(default_factory=list)

    @property
    def excess(self) -> float:
        return self.actual.metrics.makespan - self.ideal.metrics.makespan

    def to_dict(self) -> dict:
        return {"measured_s": self.measured, "actual_replay_s": self.actual.metrics.makespan,
                "ideal_s": self.ideal.metrics.makespan, "excess_s": self.excess,
                "answers": [{"question": a.question, "step_s": a.step_time, "change": a.change} for a in self.answers],
                "attribution": self.attribution, "critical_path": self.critical_path, "notes": list(self.notes),
                "method": "what-if replay (StragglerAnalysis, OSDI'25) with pipesim's exact engine; critical path "
                          "of the actual replay"}


# ------------------------------------------------------------------------------------------------ the replays
class _Replayer:
    """The measured step's schedule as a plan, and replays of it with chosen durations."""

    def __init__(self, ingested) -> None:
        measured: Result = ingested.measured
        self.schedule: Schedule = measured.schedule
        cal = ingested.calibration
        self.plan = make_plan(self.schedule, cal.costs, cal.hardware)
        flat = self.plan.flat
        self.keys = flat.keys
        self.position = {int(k): i for i, k in enumerate(flat.keys.tolist())}
        self.device = flat.device
        self.send_to = flat.send_to
        self.stage = np.array([self.schedule.action_of(int(k)).stage for k in flat.keys.tolist()], dtype=int)
        self.kind = [self._kind(int(k)) for k in flat.keys.tolist()]
        # ideal: the calibration's medians, I / W / B as the trace named them
        self.ideal_d = np.array([self._median(cal, i) for i in range(len(self.keys))], dtype=float)
        self.ideal_t = self.plan.send_seconds.copy()
        # actual: measured compute; transfers measured where the receiver waited, else the fit
        timed = measured_durations(self.schedule, measured)  # the plan's flat order is the schedule's
        self.actual_d = np.where(np.isnan(timed), self.ideal_d, timed)
        self.actual_t = self.ideal_t.copy()
        for key, seconds in (ingested.link_seconds or {}).items():
            if key in self.position and self.send_to[self.position[key]] >= 0:
                self.actual_t[self.position[key]] = max(0.0, seconds)

    def _kind(self, key: int) -> str:
        a = self.schedule.action_of(key)
        if a.kind is ActionKind.B and (a.stage, a.mb) in self.schedule.split_backward:
            return "I"
        return a.kind.value

    def _median(self, cal, i: int) -> float:
        stage, kind = int(self.stage[i]), self.kind[i]
        st = cal.stats.get((stage, kind))
        return float(self.plan.durations[i]) if st is None else st.median

    def run(self, durations: np.ndarray, transfers: np.ndarray):
        return run_fast(replace(self.plan, durations=durations, send_seconds=transfers, _views={}))

    def result(self, run, note: str) -> Result:
        return make_result(self.schedule, self.plan.costs, self.plan.hardware, run, source="simulated", notes=[note])

    # masks of groups ---------------------------------------------------------------------------------
    def action_mask(self, what: str, index: int, kind: str | None) -> np.ndarray:
        if what == "stage":
            mask = self.stage == index
        elif what == "device":
            mask = self.device == index
        else:
            mask = np.ones(len(self.keys), dtype=bool)
        if kind is not None:
            mask &= np.array([k == kind or (kind == "B" and k == "I") for k in self.kind])
        return mask

    def link_mask(self, src: int, dst: int, both: bool) -> np.ndarray:
        mask = (self.device == src) & (self.send_to == dst)
        if both:
            mask |= (self.device == dst) & (self.send_to == src)
        return mask


def _check_term(t: WhatIf, rp: _Replayer, text: str) -> None:
    s = rp.schedule
    if t.what == "stage" and not 0 <= t.index < s.stages:
        raise WhatIfError(f"--what-if {text!r}: the run has stages 0..{s.stages - 1}")
    if t.what == "device" and not 0 <= t.index < s.devices:
        raise WhatIfError(f"--what-if {text!r}: the run has devices 0..{s.devices - 1}")
    if t.what == "link":
        if not (0 <= t.src < s.devices and 0 <= t.dst < s.devices) or t.src == t.dst:
            raise WhatIfError(f"--what-if {text!r}: a link joins two different devices of 0..{s.devices - 1}")
        if not rp.link_mask(t.src, t.dst, t.both_ways).any():
            raise WhatIfError(f"--what-if {text!r}: no transfer of the run uses link {t.src}-{t.dst}")


def _scenario(rp: _Replayer, terms: Sequence[WhatIf]) -> tuple[np.ndarray, np.ndarray]:
    d, tr = rp.actual_d.copy(), rp.actual_t.copy()
    for t in terms:
        if t.what == "median":
            d, tr = rp.ideal_d.copy(), rp.ideal_t.copy()
    for t in terms:
        if t.what in ("stage", "device", "kind"):
            mask = rp.action_mask(t.what, t.index, t.kind)
            d[mask] *= t.factor
        elif t.what == "link":
            mask = rp.link_mask(t.src, t.dst, t.both_ways)
            tr[mask] /= t.factor
    return d, tr


# ------------------------------------------------------------------------------------------------ critical path
def _critical_path(rp: _Replayer, run) -> list[tuple[str, int]]:
    """('action' | 'transfer', position) from first to last along the actual replay's zero-slack chain."""
    start, end = np.asarray(run.start), np.asarray(run.end)
    t_end = np.asarray(run.transfer_end)
    deps = rp.plan.deps
    tol = 1e-9 * max(1.0, float(end.max(initial=0.0)))
    device_start = set(np.asarray(rp.plan.flat.device_start).tolist())
    i = int(np.argmax(end)) if len(end) else -1
    path: list[tuple[str, int]] = []
    while i >= 0:
        path.append(("action", i))
        candidates = []
        if i not in device_start:  # the device's previous action
            candidates.append((float(end[i - 1]), "prev", i - 1))
        for p in deps.get(int(rp.keys[i]), ()):
            if p < 0:  # ~producer: its result arrived from another device
                j = rp.position[~p]
                candidates.append((float(t_end[j]), "transfer", j))
            else:
                j = rp.position[p]
                candidates.append((float(end[j]), "prev", j))
        binding = [c for c in candidates if abs(c[0] - start[i]) <= tol]
        if not binding or start[i] <= tol:
            break
        _, how, j = max(binding, key=lambda c: (c[1] == "transfer", c[0]))
        if how == "transfer":
            path.append(("transfer", j))
        i = j
    return path[::-1]


def _label(rp: _Replayer, item: tuple[str, int]) -> str:
    what, i = item
    a = str(rp.schedule.action_of(int(rp.keys[i])))
    return a if what == "action" else f"{a}->{int(rp.send_to[i])}"


# ------------------------------------------------------------------------------------------------ analysis
def analyse(ingested, questions: Sequence[str] = ()) -> Analysis:
    """Answer *questions* (``--what-if`` texts) on *ingested*'s step and attribute its excess (module docstring)."""
    rp = _Replayer(ingested)
    parsed = []
    for q in questions:
        terms = parse_what_if(q)
        for t in terms:
            _check_term(t, rp, q)
        parsed.append((q, terms))
    actual_run = rp.run(rp.actual_d, rp.actual_t)
    ideal_run = rp.run(rp.ideal_d, rp.ideal_t)
    T_actual, T_ideal = float(actual_run.end.max()), float(ideal_run.end.max())
    measured = float(ingested.measured.metrics.makespan)
    notes = [f"the replay of the measured durations gives {T_actual * 1e3:.4g} ms against the measured "
             f"{measured * 1e3:.4g} ms ({(T_actual / measured - 1) if measured else 0:+.1%}): what the replay does not "
             f"have (gaps between actions, runtime overhead) is in that difference"]
    answers = []
    for q, terms in parsed:
        d, tr = _scenario(rp, terms)
        run = rp.run(d, tr)
        t = float(run.end.max())
        answers.append(Answer(q, t, t / T_actual - 1 if T_actual else 0.0, rp.result(run, f"what-if: {q}")))

    path = _critical_path(rp, actual_run)
    groups = _groups(rp)
    attribution: dict[str, list[dict]] = {}
    for family, members in groups.items():
        rows = []
        for name, amask, tmask in members:
            on_path = sum(1 for w, i in path if (amask if w == "action" else tmask)[i])
            cp = sum(float((rp.actual_d if w == "action" else rp.actual_t)[i]
                           - (rp.ideal_d if w == "action" else rp.ideal_t)[i])
                     for w, i in path if (amask if w == "action" else tmask)[i])
            fixed = rp.run(np.where(amask, rp.ideal_d, rp.actual_d), np.where(tmask, rp.ideal_t, rp.actual_t))
            alone = rp.run(np.where(amask, rp.actual_d, rp.ideal_d), np.where(tmask, rp.actual_t, rp.ideal_t))
            rows.append({"group": name, "critical_path_s": cp, "fixing_saves_s": T_actual - float(fixed.end.max()),
                         "alone_costs_s": float(alone.end.max()) - T_ideal, "on_path": on_path})
        rows.sort(key=lambda r: -r["critical_path_s"])
        attribution[family] = rows
    ideal = rp.result(ideal_run, "ideal: every action at its median")
    actual = rp.result(actual_run, "actual: the measured durations replayed")
    return Analysis(measured=measured, actual=actual, ideal=ideal, answers=answers, attribution=attribution,
                    critical_path=[_label(rp, item) for item in path], notes=notes)


def _groups(rp: _Replayer) -> dict[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    n = len(rp.keys)
    none = np.zeros(n, dtype=bool)
    s = rp.schedule
    out: dict[str, list] = defaultdict(list)
    for stage in range(s.stages):
        out["stage"].append((f"stage {stage}", rp.action_mask("stage", stage, None), none))
    for dev in range(s.devices):
        out["device"].append((f"device {dev}", rp.action_mask("device", dev, None), none))
    for kind in sorted(set(rp.kind)):
        out["kind"].append((kind, np.array([k == kind for k in rp.kind]), none))
    pairs = sorted({(min(a, b), max(a, b)) for a, b in zip(rp.device.tolist(), rp.send_to.tolist()) if b >= 0})
    for a, b in pairs:
        out["link"].append((f"link {a}-{b}", none, rp.link_mask(a, b, True)))
    return dict(out)


def format_analysis(a: Analysis, *, top: int = 3) -> list[str]:
    """Markdown lines: the answers, then the attribution tables."""
    ms = lambda s: f"{s * 1e3:.4g} ms"  # noqa: E731
    lines = [f"- measured step {ms(a.measured)}; actual replay {ms(a.actual.metrics.makespan)}; ideal (every "
             f"action at its median) {ms(a.ideal.metrics.makespan)}; excess {ms(a.excess)} "
             f"({a.excess / a.ideal.metrics.makespan if a.ideal.metrics.makespan else 0:+.1%} over the ideal)"]
    for ans in a.answers:
        lines.append(f"- what if `{ans.question}`: {ms(ans.step_time)} ({ans.change:+.1%} against the actual replay)")
    for family, rows in a.attribution.items():
        lines += ["", f"| {family} | on critical path: excess | fixing it saves | it alone costs | actions on path |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['group']} | {ms(r['critical_path_s'])} | {ms(r['fixing_saves_s'])} | "
                         f"{ms(r['alone_costs_s'])} | {r['on_path']} |")
    lines += ["", "critical path (actual replay): " + " ".join(a.critical_path[:60])
              + (" ..." if len(a.critical_path) > 60 else "")]
    return lines + [f"- note: {n}" for n in a.notes]
