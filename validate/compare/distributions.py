"""Predicted against measured distributions of step time: KS distance, p50 and p99 errors, overlaid CDFs.

A Monte Carlo prediction (:func:`sim.monte_carlo`) is a distribution; a validator run with ``--iterations-timed N``
measures N makespans. Their agreement is judged by

- the two-sample Kolmogorov-Smirnov distance D = sup_x |F_pred(x) - F_meas(x)| (Kolmogorov 1933, Smirnov 1939),
  with the asymptotic critical value at level alpha, c(alpha) sqrt((n + m) / (n m)), c(0.05) = 1.358 (Smirnov's
  limit distribution; e.g. Hollander, Wolfe and Chicken, "Nonparametric Statistical Methods", 3rd ed., 5.4): a
  D below it is "consistent at the 5 % level" - with N = 30 measured runs that is D < 0.25 or so, which is why the
  target of issue 22 (D <= 0.10) needs the predicted distribution to be right, not only unrefuted;
- the relative errors of the p50 and p99 (measured / predicted - 1), quantiles by numpy's default (linear);
- PRISM (arXiv 2510.15596, section 6) reports its predictions within a KS distance of 0.208 of measured ones.

How well a handful of measured steps pins down their median is :func:`median_interval` (the order-statistic
interval of the sign test): with the steps of a 1-ms action run spreading -15..+25% around their median, five
steps leave the median uncertain by about +-10% and forty by about +-3%, which is why ``validate --runtime torch``
profiles about a second of steps by default.

Units: seconds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sim.errors import PipesimError

__all__ = ["DistributionComparison", "compare_distributions", "ks_distance", "median_interval", "cdf_overlay",
           "write_distribution",
           "KS_C_05"]

KS_C_05 = 1.358
"""c(0.05) of the two-sample Kolmogorov-Smirnov test (asymptotic)."""


def median_interval(values, confidence: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of the population *values* were drawn from:
    ``(low, high, coverage)``, the order statistics x_(r) and x_(n+1-r) with the largest r whose coverage
    1 - 2 P(Binomial(n, 1/2) <= r - 1) is at least *confidence* (the sign test's interval: Conover, "Practical
    Nonparametric Statistics", 3rd ed., section 3.2, a confidence interval for a quantile). It assumes nothing
    about the distribution but independent draws. Below five values no interval reaches 90%: the whole range is
    returned with the coverage it has (5 values: 93.75%; 4: 87.5%)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        raise PipesimError("a median interval needs at least one value")
    if not 0 < confidence < 1:
        raise PipesimError(f"confidence is in (0, 1), got {confidence!r}")
    # r = 1 is the whole range; r + 1 drops one more value at each end. tail = P(Binomial(n, 1/2) <= r - 1), the
    # chance that the median lies below x_(r) (and, by symmetry, above x_(n+1-r)); the coverage only falls as r grows
    r, tail = 1, 0.5 ** n
    while r < (n + 1) // 2 and 1 - 2 * (tail + math.comb(n, r) * 0.5 ** n) >= confidence:
        tail += math.comb(n, r) * 0.5 ** n
        r += 1
    coverage = 1 - 2 * tail
    return float(x[r - 1]), float(x[n - r]), coverage


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """sup_x |F_a(x) - F_b(x)| of the two empirical CDFs (evaluated at every observation, where the sup is)."""
    a, b = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if not len(a) or not len(b):
        raise PipesimError("a KS distance needs two non-empty samples")
    x = np.concatenate([a, b])
    fa = np.searchsorted(a, x, side="right") / len(a)
    fb = np.searchsorted(b, x, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


@dataclass(frozen=True, slots=True)
class DistributionComparison:
    """How a predicted distribution of makespans matches a measured one."""

    predicted_samples: int
    measured_samples: int
    ks: float
    """Two-sample KS distance."""
    ks_critical: float
    """The KS distance above which the two differ at the 5 % level."""
    predicted_p50: float
    measured_p50: float
    p50_error: float
    """measured / predicted - 1."""
    predicted_p99: float
    measured_p99: float
    p99_error: float
    predicted_mean: float
    measured_mean: float
    paired_error: float = math.nan
    """Median over the runs of measured / predicted - 1, each run against the prediction with its own draws
    (NaN: not paired). A systematic shift (the model's bias) shows here free of sampling noise."""
    paired_range: tuple[float, float] = (math.nan, math.nan)
    """p10 and p90 of those errors."""
    notes: tuple[str, ...] = ()
    """How the prediction was calibrated (:func:`validate.injected.runtime_terms`), one line each."""

    @property
    def consistent(self) -> bool:
        """Not distinguishable at the 5 % level."""
        return self.ks <= self.ks_critical

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The markdown table rows of a report."""
        return ["| | predicted | measured | error |", "|---|---|---|---|",
                f"| p50 makespan (s) | {self.predicted_p50:.6g} | {self.measured_p50:.6g} | {self.p50_error:+.1%} |",
                f"| p99 makespan (s) | {self.predicted_p99:.6g} | {self.measured_p99:.6g} | {self.p99_error:+.1%} |",
                f"| mean makespan (s) | {self.predicted_mean:.6g} | {self.measured_mean:.6g} | "
                f"{self.measured_mean / self.predicted_mean - 1:+.1%} |",
                "",
                f"KS distance {self.ks:.3f} ({self.predicted_samples} predicted, {self.measured_samples} measured "
                f"samples; {'consistent' if self.consistent else 'different'} at the 5 % level, critical value "
                f"{self.ks_critical:.3f})"] + ([] if math.isnan(self.paired_error) else [
                "", f"Paired (each run against the prediction with its own draws): median error "
                    f"{self.paired_error:+.1%}, p10 {self.paired_range[0]:+.1%}, p90 {self.paired_range[1]:+.1%}"]) + (
                [""] + [f"- {note}" for note in self.notes] if self.notes else [])


def compare_distributions(predicted: np.ndarray, measured: np.ndarray,
                          paired: np.ndarray | None = None, notes: tuple[str, ...] = ()) -> DistributionComparison:
    """Compare a predicted sample of makespans with a measured one (module docstring); *paired*: per measured run,
    the prediction made with that run's own random draws (the injected runs have them)."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    p, m = p[np.isfinite(p)], m[np.isfinite(m)]
    if len(p) < 2 or len(m) < 2:
        raise PipesimError(f"comparing distributions needs at least 2 finite samples on each side, got "
                           f"{len(p)} predicted and {len(m)} measured")
    p50p, p99p = np.quantile(p, (0.5, 0.99))
    p50m, p99m = np.quantile(m, (0.5, 0.99))
    return DistributionComparison(
        predicted_samples=len(p), measured_samples=len(m), ks=ks_distance(p, m),
        ks_critical=KS_C_05 * math.sqrt((len(p) + len(m)) / (len(p) * len(m))),
        predicted_p50=float(p50p), measured_p50=float(p50m), p50_error=float(p50m / p50p - 1),
        predicted_p99=float(p99p), measured_p99=float(p99m), p99_error=float(p99m / p99p - 1),
        predicted_mean=float(p.mean()), measured_mean=float(m.mean()), notes=tuple(notes), **_paired(measured, paired))


def _paired(measured, paired) -> dict:
    if paired is None:
        return {}
    m, q = np.asarray(measured, dtype=float), np.asarray(paired, dtype=float)
    if m.shape != q.shape:
        raise PipesimError(f"paired predictions: {len(q)} for {len(m)} measured runs; give one per run")
    errors = m / q - 1
    return {"paired_error": float(np.median(errors)),
            "paired_range": (float(np.percentile(errors, 10)), float(np.percentile(errors, 90)))}


def cdf_overlay(predicted: np.ndarray, measured: np.ndarray, *, title: str = "makespan: predicted vs measured"):
    """The two CDFs on one axis (a matplotlib Figure; solid: predicted, dashed: measured)."""
    from sim.io.distribution_plots import cdf_figure

    return cdf_figure({"predicted": np.asarray(predicted), "measured": np.asarray(measured)}, title=title,
                      styles={"measured": "--"})


def write_distribution(comparison: DistributionComparison, predicted: np.ndarray, measured: np.ndarray,
                       folder: Path, name: str, inject: str) -> dict[str, Path]:
    """``<name>_distribution.md`` (the table above) and ``<name>_distribution_cdf.png`` (the overlaid CDFs) into
    *folder*, each atomically; returns what -> path."""
    from sim.files import atomic_path

    folder = Path(folder)
    md, png = folder / f"{name}_distribution.md", folder / f"{name}_distribution_cdf.png"
    text = "\n".join([f"# {name}: makespan distribution, predicted vs measured", "",
                      f"Injected: `{inject}` (every action lasted a drawn duration, validate.rank.inject; the "
                      f"prediction is `sim.monte_carlo` of the same specification, validate.injected).", ""]
                     + comparison.lines() + ["", f"![CDFs]({png.name})", ""])
    with atomic_path(md) as tmp:
        tmp.write_text(text)
    fig = cdf_overlay(predicted, measured, title=f"{name}: makespan, predicted ({len(predicted)} samples) vs "
                                                 f"measured ({len(measured)} runs)")
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return {"distribution": md, "distribution_cdf": png}
