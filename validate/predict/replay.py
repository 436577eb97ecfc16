"""Replay: the prediction again, with each timed run's own action times instead of the calibrated costs.

A run's prediction rests on costs calibrated from one sample: the traced run before it
(the rolling prediction of :mod:`validate.predict.prediction`: the last warm-up run for the first
timed run), or each stage alone, or a costs file. When the machine's speed moves between
that sample and the run (other work on a shared machine, a CPU burner beside it), the run's
actions take longer or shorter than the costs say, and the makespan error measures the
machine, not the model.

A replay separates the two. It simulates the same schedule with the same engine and
links, but every action lasts what it measured in that timed run (its compute plus the
executor's own overhead around it, as measured in that run). Then, per run::

    measured / predicted = (replayed / predicted) x (measured / replayed)
                            the costs moved        what the model missed

(``predicted``: that run's own prediction).

The first factor is part of the noise floor (:func:`validate.run.build_report`):
an error the run's own action times explain is the machine's. The second is what no
calibration can explain (dependencies, transfers, scheduling the model does not have),
and it stays in the error.

Units: seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sim.model.cost import StageCosts
from sim.engines.fastpath import run_fast
from sim.model.hardware import Hardware
from sim.core.ir import Schedule
from sim.engines.plan import make_plan

from validate.errors import ValidationError

__all__ = ["replayed_makespans"]


def replayed_makespans(schedule: Schedule, costs: StageCosts | Sequence[StageCosts], hardware: Hardware,
                       runs: Sequence[tuple[Sequence[tuple[int, float, float]], Sequence[tuple[int, float]]]],
                       *, add_overhead: bool = True) -> list[float]:
    """The makespan of *schedule* simulated with each run's own action times, one per run.

    *runs*: per timed run, (compute rows ``(key, start, end)`` of every rank, overhead rows
    ``(key, seconds)`` of every rank: :class:`validate.rank.tracing.RankTrace`'s ``compute`` and
    ``overhead``). *costs* and *hardware*: what the prediction used (links and any action a run
    did not record keep their predicted time); *costs* one per run when each run had its own
    prediction (the rolling prediction, :mod:`validate.predict.prediction`). *add_overhead*: add each
    action's measured overhead to it, as the prediction added the calibrated one (False on GPUs).
    """
    per_run = [costs] * len(runs) if isinstance(costs, StageCosts) else list(costs)
    if len(per_run) != len(runs):
        raise ValidationError(f"replayed_makespans: {len(per_run)} costs for {len(runs)} runs; give one per run "
                              "or one for all")
    plans: dict[int, object] = {}  # id(costs) -> plan: the runs that share costs share a plan
    out = []
    for (compute, overhead), c in zip(runs, per_run):
        if id(c) not in plans:
            plans[id(c)] = make_plan(schedule, c, hardware)
        plan = plans[id(c)]
        keys = plan.flat.keys
        seconds = dict(zip(keys.tolist(), plan.durations.tolist()))
        # never below 0: the list scheduler marks an unfinished result as -1 (sim.engines.fastpath), and one clock per
        # rank keeps end >= start anyway
        seconds.update({k: max(0.0, end - start) for k, start, end in compute})
        if add_overhead:
            for k, extra in overhead:
                seconds[k] = seconds[k] + max(0.0, extra)
        durations = np.fromiter((seconds[k] for k in keys.tolist()), dtype=float, count=len(keys))
        out.append(run_fast(replace(plan, durations=durations, _views={})).makespan)
    return out
