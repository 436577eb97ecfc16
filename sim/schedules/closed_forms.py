"""Each schedule's own closed-form utilization, for uniform stages on free links.

    closed_form_utilization("1f1b", devices=4, microbatches=8)                     # 8/11, GPipe's formula
    closed_form_utilization("zb-h1", devices=4, microbatches=8, weight=1.0)        # the zero-bubble paper's

The sweep puts this next to the simulated utilization so a reader sees how far links,
non-uniform stages or small M move a schedule from its textbook figure. Utilization is
busy time over K x makespan; each formula below is the source's bubble turned into that
share, with:

- K devices, M micro-batches per iteration, N iterations, v chunks per device;
- F, B, W, R: one device's share of forward, input-gradient backward, weight-gradient and
  recompute time per micro-batch (a chunk of a chunked schedule costs 1/v of it); schedules
  that do not split the backward run B+W as one pass.

Every formula assumes uniform stages, free links and no optimizer time, and holds only
where its source says it does (M >= K for ZB-H1, F = B = W and M >= 2K-1 for ZB-V, ...);
outside that, and for schedules without one, the answer is NaN ("simulate it"), never a
figure borrowed from another schedule. ``tests/test_closed_forms.py`` and
``tests/test_sweep.py`` check every formula against the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["closed_form_utilization", "gpipe_utilization", "SCHEDULES_WITH_A_CLOSED_FORM"]


def _naive(K, M, N, v, rec, F, B, W, R):
    # one micro-batch in flight: every device idles while the K-1 others work (GPipe, Huang et al. 2019, fig. 2b);
    # a recompute needs only its own forward, so it overlaps other devices' work: no simple formula then
    return math.nan if rec else 1 / K


def _gpipe(K, M, N, v, rec, F, B, W, R):
    # GPipe, Huang et al. 2019, section 2.2: bubble (K-1)/(M+K-1). With re-materialization the M recomputes of the
    # last stage join the critical path: makespan (M+K-1)(F+B) + M*R per iteration (tests/test_closed_forms.py).
    if not rec:
        return M / (M + K - 1)
    work = F + B + W
    return M * (work + R) / ((M + K - 1) * work + M * R)


def _one_f_one_b(K, M, N, v, rec, F, B, W, R):
    # 1F1B keeps GPipe's bubble, (K-1)/(M+K-1) (Narayanan et al., PipeDream-Flush, ICML 2021)
    return math.nan if rec else M / (M + K - 1)


def _no_flush(K, M, N, v, rec, F, B, W, R):
    # PipeDream (SOSP 2019) and PipeDream-2BW (ICML 2021): warm-up and cool-down once in N iterations
    return math.nan if rec else N * M / (N * M + K - 1)


def _interleaved(K, M, N, v, rec, F, B, W, R):
    # Megatron, Narayanan et al., SC'21, section 2.2.2: bubble (K-1)(F+B)/v per device, i.e. (K-1)/(v*M+K-1)
    if rec or (v > 1 and M % K):
        return math.nan
    return v * M / (v * M + K - 1)


def _zb_h1(K, M, N, v, rec, F, B, W, R):
    # Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1: idle (K-1)(F+B-W) per device, M >= K
    if rec or M < K:
        return math.nan
    work = M * (F + B + W)
    return work / (work + (K - 1) * (F + B - W)) if work > 0 else math.nan


def _zb_h2(K, M, N, v, rec, F, B, W, R):
    # Qi et al. (ICLR 2024), section 3.1: one iteration alone idles (K-1) max(F, F+B-2W) per device; later
    # iterations interlock (steady state (K-1)(F+B-2W)), so only N = 1 has this closed form
    if rec or N != 1 or M < 2 * K - 1:
        return math.nan
    work = M * (F + B + W)
    return work / (work + (K - 1) * max(F, F + B - 2 * W)) if work > 0 else math.nan


def _zbv(K, M, N, v, rec, F, B, W, R):
    # Qi et al. (ICLR 2024), section 6: (K-1)F/2 idle per device and iteration for F = B = W, M >= 2K-1;
    # busy 3MF per device, so utilization 3MF / (3MF + (K-1)F/2) = 6M / (6M + K - 1). One iteration: later ones
    # start their warm-up in the previous cool-down, so N > 1 does better than this
    if rec or N != 1 or not (F == B == W > 0) or M < 2 * K - 1:
        return math.nan
    return 6 * M / (6 * M + K - 1)


# CLI name -> formula(K, M, N, v, recompute, F, B, W, R). DualPipeV has none here: how its overlapped pairs are
# costed is being settled (issue 14.2), and a formula that disagrees with the engine would mislead.
_FORMULAS: dict[str, Callable[..., float]] = {
    "naive": _naive,
    "gpipe": _gpipe,
    "1f1b": _one_f_one_b,
    "pipedream": _no_flush,
    "pipedream-2bw": _no_flush,
    "interleaved-1f1b": _interleaved,
    "zb-h1": _zb_h1,
    "zb-h2": _zb_h2,
    "zbv": _zbv,
}

SCHEDULES_WITH_A_CLOSED_FORM = tuple(_FORMULAS)


def closed_form_utilization(schedule: str, *, devices: int, microbatches: int, iterations: int = 1, chunks: int = 1,
                            recompute: bool = False, forward: float = 1.0, backward: float = 2.0,
                            weight: float = 0.0, recompute_cost: float | None = None) -> float:
    """The utilization *schedule*'s source predicts for uniform stages on free links; NaN where it has none.

    Times are one device's share per micro-batch (module docstring); *recompute_cost* defaults to *forward*.
    """
    formula = _FORMULAS.get(schedule)
    if formula is None or devices < 1 or microbatches < 1:
        return math.nan
    R = forward if recompute_cost is None else recompute_cost
    if forward + backward + weight <= 0:
        return math.nan  # nothing to do: no share of anything is busy
    return float(formula(devices, microbatches, iterations, chunks, recompute, forward, backward, weight, R))


def gpipe_utilization(devices, microbatches):
    """GPipe's (and 1F1B's) utilization for uniform stages on free links, 1 - (K-1)/(M+K-1) (Huang et al., GPipe,
    NeurIPS 2019, sec. 2.3), for numbers or numpy arrays of K and M alike (the curves of a sweep's plots):
    ``closed_form_utilization("gpipe", ...)`` for one configuration with its costs."""
    import numpy as np

    K = np.asarray(devices, dtype=float)
    M = np.asarray(microbatches, dtype=float)
    return 1.0 - (K - 1.0) / (M + K - 1.0)
