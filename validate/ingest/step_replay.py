"""Every profiled step replayed from its own measurements: the runtime model's error, step by step, free of the
spread between steps. Needs no torch.

    from validate.ingest.step_replay import replay_steps
    replays = replay_steps(ingested, model.costs, model.hardware, "torch", microbatch_size=64)
    replays.error_median, replays.error_range, replays.without_error_range

``validate --runtime torch`` compares one prediction with every profiled step, so the p10..p90 of its makespan
error can be no narrower than the steps' own spread; at 1-ms actions on a shared 2-core machine a launch's steps
spread -25..+38% around their median (README, "The stalls end at the scheduler's tick"), whatever the model. Here
each step is predicted from what that step measured, and nothing else:

- every computation at its measured duration (the compute part of its range, as the what-if replay's *actual*:
  :mod:`validate.ingest.whatif`);
- the dispatch overhead measured in that step's gaps (:func:`validate.predict.calibrate.dispatch_overhead` over its
  own spans; given costs keep their dispatch columns);
- every message's send and receive call, link and sender time as that step measured them
  (:func:`validate.ingest.messages.message_model` of the step alone: a replay of its communication), a link time
  measured only where the receiver's wait took longer than a wait for a message already there takes on this trace
  (:func:`validate.ingest.messages.wait_return_seconds`; otherwise the completion only bounds it), less the time it
  queued behind the message before it on its link, which the engines' link queue adds back
  (:func:`validate.ingest.messages.queue_free_links`);

run under the runtime's posting points and rendezvous links (:func:`validate.ingest.messages.predict_with_messages`).
Its makespan is emergent: the waits, the order the calls hold each device in, and what each transfer waits for
come from the model, so a wrong posting point, link rule or dispatch charge shows as an error in every step. The
same step replayed *without* the runtime model (the same measured computations, eager links at the trace's link fit,
no dispatch overhead, the prediction before issue 27) is what the check is held against: at 1-ms actions it misses
by +12..+89% (p10..p90 over ten launches of five schedules) where the model's replay stays within -4.1..+3.4%
(26 Nov 2026, README "Each step replayed").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sim.core.ir import Action, ActionKind, Schedule
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware
from sim.results.result import Result
from sim.results.timeline import compute_rows
from sim.simulate import simulate_runtime

from validate.ingest.messages import message_model, predict_with_messages, wait_return_seconds
from validate.predict.calibrate import dispatch_overhead

__all__ = ["StepReplays", "measured_durations", "replay_steps"]

WITHOUT_RUNTIME = "pipesim"
"""The profile of the replay without the runtime model: eager links, every result sent as it is made, no call
times (:mod:`sim.model.runtimes`), the prediction before issue 27."""


@dataclass(frozen=True, slots=True)
class StepReplays:
    """Per profiled step (seconds): its measured makespan, its replay under the runtime model, and its replay
    without it."""

    runtime: str
    measured: Mapping[int, float]
    predicted: Mapping[int, float]
    without: Mapping[int, float]
    wait_return: float = 0.0
    """Seconds a wait takes to return for a message already there (:func:`validate.ingest.messages.
    wait_return_seconds`): a message whose wait took longer was waited for, and its link time is measured."""

    @staticmethod
    def _errors(measured: Mapping[int, float], predicted: Mapping[int, float]) -> np.ndarray:
        """measured / predicted - 1 per step, in step order."""
        return np.array([measured[s] / predicted[s] - 1 if predicted[s] > 0 else math.inf for s in sorted(measured)])

    @property
    def errors(self) -> np.ndarray:
        """measured / replayed - 1 per step, in step order."""
        return self._errors(self.measured, self.predicted)

    @property
    def error_median(self) -> float:
        return float(np.median(self.errors))

    @property
    def error_range(self) -> tuple[float, float]:
        """p10 and p90 of the per-step errors."""
        return _p10_p90(self.errors)

    @property
    def without_errors(self) -> np.ndarray:
        """measured / replayed - 1 per step, in step order, for the replays without the runtime model."""
        return self._errors(self.measured, self.without)

    @property
    def without_error_median(self) -> float:
        return float(np.median(self.without_errors))

    @property
    def without_error_range(self) -> tuple[float, float]:
        return _p10_p90(self.without_errors)

    def to_dict(self) -> dict:
        steps = sorted(self.measured)
        return {"runtime": self.runtime, "steps": steps,
                "measured_s": [self.measured[s] for s in steps], "replayed_s": [self.predicted[s] for s in steps],
                "makespan_error_median": self.error_median, "makespan_error_range": list(self.error_range),
                "wait_return_s": self.wait_return,
                "without": {"runtime": WITHOUT_RUNTIME, "replayed_s": [self.without[s] for s in steps],
                            "makespan_error_median": self.without_error_median,
                            "makespan_error_range": list(self.without_error_range)}}

    def line(self) -> str:
        """The report's line."""
        lo, hi = self.error_range
        wlo, whi = self.without_error_range
        return (f"each of the {len(self.measured)} profiled steps replayed from its own measured computations, "
                f"dispatch and message times under `--runtime {self.runtime}`: error median {self.error_median:+.1%} "
                f"(p10-p90 {lo:+.1%} .. {hi:+.1%}); the same replays without the runtime model (eager links, no "
                f"dispatch) {self.without_error_median:+.1%} ({wlo:+.1%} .. {whi:+.1%})")


def _p10_p90(errors: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(errors, 10)), float(np.percentile(errors, 90))


def measured_durations(schedule: Schedule, measured: Result) -> np.ndarray:
    """float[n] in *schedule*'s flat order (``schedule.compiled.flat``): each computation's measured seconds (the
    compute part of its range, the timeline's compute rows); NaN for an action the step did not time."""
    position = {int(k): i for i, k in enumerate(schedule.compiled.flat.keys.tolist())}
    out = np.full(len(position), np.nan)
    rows = compute_rows(measured.timeline)
    for stage, op, mb, start, end in zip(rows["stage"], rows["op"].astype(str), rows["microbatch"], rows["start"],
                                         rows["end"]):
        key = schedule.key(Action(int(stage), ActionKind(op), int(mb)))
        out[position[key]] = max(0.0, float(end - start))
    return out


def replay_steps(ingested, costs: StageCosts, hardware: Hardware, runtime: str, *, own_dispatch: bool = True,
                 plain_costs: StageCosts | None = None, plain_hardware: Hardware | None = None,
                 microbatch_size: float = 1.0) -> StepReplays:
    """Every complete step of *ingested* (:class:`validate.ingest.flow.Ingested`) replayed (module docstring).

    *costs* / *hardware*: the runtime model's (:class:`validate.ingest.calibration.RuntimeCalibration`: dispatch
    columns measured over every step, the links as the runtime's semantics charge them); *own_dispatch*: each step's
    dispatch overhead measured in that step's gaps alone (:func:`validate.predict.calibrate.dispatch_overhead` over
    :meth:`~validate.ingest.flow.Ingested.dispatch_spans`, as the drawn prediction's runs take theirs:
    :mod:`validate.ingest.message_draws`) in place of the costs' (False: the costs' dispatch columns, e.g. given
    costs); *plain_costs* / *plain_hardware*: the trace's calibration the replay without the runtime model uses
    (default: *costs*, *hardware*)."""
    schedule = ingested.schedule
    plain_costs = costs if plain_costs is None else plain_costs
    plain_hardware = hardware if plain_hardware is None else plain_hardware
    spans = ingested.dispatch_spans() if own_dispatch else {}
    slack = wait_return_seconds(ingested.messages)
    measured, predicted, without = {}, {}, {}
    for step, result in sorted(ingested.steps.items()):
        durations = measured_durations(schedule, result)
        # a step without communication spans keeps the costs' (its gaps would count its waits as dispatch)
        own = dispatch_overhead([(result, spans[step])]) if spans.get(step) else None
        step_costs = costs.with_dispatch(own) if own else costs
        messages = message_model(ingested.messages, [step], ingested.call_overhead, slack=slack, schedule=schedule)
        replayed, _ = predict_with_messages(schedule, step_costs, hardware, runtime, messages, durations=durations,
                                            microbatch_size=microbatch_size)
        plain, _ = simulate_runtime(schedule, plain_costs, plain_hardware, runtime=WITHOUT_RUNTIME,
                                    durations=durations, microbatch_size=microbatch_size)
        measured[step] = result.metrics.makespan
        predicted[step] = replayed.metrics.makespan
        without[step] = plain.metrics.makespan
    return StepReplays(runtime=runtime, measured=measured, predicted=predicted, without=without, wait_return=slack)
