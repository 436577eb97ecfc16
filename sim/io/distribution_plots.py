"""Figures of Monte Carlo runs and measured distributions: makespan CDFs, and the Gantt of a slow sample beside a
typical one.

Like :mod:`sim.io.plots`, every function takes data and returns a matplotlib ``Figure``; none writes a file.
Units: seconds (the costs' unit), drawn in s or ms by the span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from sim.errors import PipesimError
from sim.io.plots import gantt
from sim.search.montecarlo import MonteCarlo

__all__ = ["makespan_cdf", "cdf_figure", "tail_gantt"]

# Okabe-Ito, as sim.io.plots: one colour per curve, distinguishable under colour-vision deficiencies
_CURVES = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(np.asarray(values, dtype=float))
    return x, np.arange(1, len(x) + 1) / len(x)


def cdf_figure(curves: Mapping[str, np.ndarray], *, title: str = "makespan distribution",
               xlabel: str = "makespan (s)", markers: Mapping[str, float] | None = None,
               styles: Mapping[str, str] | None = None) -> Figure:
    """Empirical CDFs of several samples of seconds (label -> values) on one axis, each with its p50 and p99
    marked; *markers*: label -> a vertical reference line (e.g. a deterministic prediction); *styles*: label ->
    a matplotlib line style ('-', '--')."""
    if not curves:
        raise PipesimError("a CDF figure needs at least one set of values")
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, values) in enumerate(curves.items()):
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        x, y = _ecdf(values)
        color = _CURVES[i % len(_CURVES)]
        p50, p99 = np.quantile(values, (0.5, 0.99))
        ax.step(x, y, where="post", color=color, linestyle=(styles or {}).get(label, "-"), linewidth=1.6,
                label=f"{label}: p50 {p50:.4g}, p99 {p99:.4g}")
        ax.plot([p50, p99], [0.5, 0.99], "o", color=color, markersize=4)
    for i, (label, value) in enumerate((markers or {}).items()):
        ax.axvline(value, color="#555555", linestyle=":", linewidth=1)
        ax.annotate(label, (value, 0.02 + 0.07 * i), xytext=(3, 0), textcoords="offset points", fontsize=7.5,
                    color="#333333")
    ax.axhline(0.99, color="#bbbbbb", linewidth=0.6)
    ax.axhline(0.5, color="#bbbbbb", linewidth=0.6)
    ax.set_ylim(0, 1.005)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of samples <= x")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    return fig


def makespan_cdf(runs: Mapping[str, MonteCarlo] | Sequence[MonteCarlo], *, title: str | None = None) -> Figure:
    """The makespan CDF of each Monte Carlo run (a mapping label -> run, or runs labelled by schedule name), with
    each schedule's deterministic makespan as a dotted line: how far the distribution lies to its right is what
    variability costs."""
    if not isinstance(runs, Mapping):
        runs = {mc.schedule.name: mc for mc in runs}
    if not runs:
        raise PipesimError("makespan_cdf needs at least one Monte Carlo run")
    first = next(iter(runs.values()))
    title = title or (f"makespan over {first.samples} samples, K={first.schedule.devices}, "
                      f"M={first.schedule.microbatches}")
    return cdf_figure({label: mc.makespan for label, mc in runs.items()}, title=title,
                      markers={f"{label} nominal": float(mc.nominal.metrics.makespan) for label, mc in runs.items()})


def tail_gantt(mc: MonteCarlo, *, tail: float = 0.99, typical: float = 0.5) -> Figure:
    """The Gantt of the sample at the *tail* quantile (default p99) under the one at *typical* (default the
    median), on one time axis: where the slow step lost its time."""
    slow, usual = mc.quantile_sample(tail), mc.quantile_sample(typical)
    name = mc.schedule.name
    return gantt([mc.sample_result(usual), mc.sample_result(slow)],
                 titles=[f"{name}: p{round(typical * 100)} sample #{usual} ({mc.makespan[usual]:.4g} s)",
                         f"{name}: p{round(tail * 100)} sample #{slow} ({mc.makespan[slow]:.4g} s)"])
