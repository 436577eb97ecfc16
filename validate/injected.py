"""A validation with injected variability (``validate --inject``): the specification checked, handed to the ranks for
the launch, and the makespan's predicted distribution compared with the measured one (issue 22).

The emulated workload draws each wait as the simulator's Monte Carlo draws it (:mod:`validate.rank.inject`); the
comparison itself is :mod:`validate.compare.distributions`'.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from validate.compare.validation_report import ValidationReport
from validate.errors import ValidationError
from validate.predict.calibrate import with_overhead

__all__ = ["MIN_ITERATIONS_TIMED", "PREDICTED_SAMPLES", "iterations_timed", "inject_spec", "injecting",
           "predicted_distribution"]


MIN_ITERATIONS_TIMED = 30
"""Fewest timed runs a measured distribution is compared from: with fewer, a p99 is the largest value seen and the
KS distance's critical value is above 0.3."""


def iterations_timed(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_ITERATIONS_TIMED:
        raise ValidationError(f"--iterations-timed must be an integer >= {MIN_ITERATIONS_TIMED} (a distribution needs "
                              f"that many timed runs), got {n!r}")
    return n


def inject_spec(inject, workload: str, workload_options):
    """The parsed ``--inject`` (None without one); only the emulated workload draws its waits."""
    if not inject:
        return None
    from validate.rank.inject import parse_inject

    if workload != "emulated":
        raise ValidationError(f"--inject draws the emulated workload's waits; workload {workload!r} computes for "
                              f"real (use --workload emulated)")
    return parse_inject(inject, seed=int(dict(workload_options or {}).get("seed", 0)))


@contextmanager
def injecting(spec):
    """The ranks find the injection in their environment (:data:`validate.rank.inject.ENVIRONMENT`), set for the
    launch only."""
    from validate.rank.inject import ENVIRONMENT

    before = os.environ.get(ENVIRONMENT)
    if spec is not None:
        os.environ[ENVIRONMENT] = spec.to_json()
    else:
        os.environ.pop(ENVIRONMENT, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENVIRONMENT, None)
        else:
            os.environ[ENVIRONMENT] = before


PREDICTED_SAMPLES = 4000
"""Monte Carlo samples of a predicted distribution (its quantiles' errors are small beside those of 30 runs)."""


def predicted_distribution(report: ValidationReport, given_costs, spec, warmup: int):
    """The Monte Carlo prediction of the makespan's distribution under the injected variability, against the timed
    runs. The emulated stages wait for *given_costs* times the draws; the executor's measured overhead per action
    is added as in every prediction (the calibration of the run shown). The distribution comes from another seed
    than the runs' (it must not replay the measured runs' own draws). Paired besides: emulated stages are reset
    after each run only, so timed run i drew exactly the simulator's sample *warmup* + i of the runs' seed, and
    each run is also compared with its own sample (a shift shows there as a median error, apart from sampling
    noise). Returns the report with its comparison, and the Monte Carlo run."""
    import sim
    from validate.compare.distributions import compare_distributions

    cal = report.calibration
    costs = with_overhead(given_costs, cal.overhead_per_stage) if cal.overhead_included else given_costs
    predicted = report.predicted
    mc = sim.monte_carlo(predicted.schedule, costs, predicted.hardware, samples=PREDICTED_SAMPLES,
                         variability=spec.variability(), seed=spec.seed + 1_000_003,
                         microbatch_size=predicted.microbatch_size)
    measured = np.asarray(report.makespans)
    same_draws = sim.monte_carlo(predicted.schedule, costs, predicted.hardware, samples=warmup + len(measured),
                                 variability=spec.variability(), seed=spec.seed,
                                 microbatch_size=predicted.microbatch_size).makespan[warmup:]
    comparison = compare_distributions(mc.makespan, measured, paired=same_draws)
    return replace(report, distribution=comparison, inject=spec.describe()), mc
