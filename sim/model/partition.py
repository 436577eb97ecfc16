"""Partitioners: which consecutive layers form each pipeline stage, and how often each stage is replicated.

Input: per-layer costs (:class:`sim.model.layers.LayerCosts`). Output: a :class:`Partition`
whose :meth:`Partition.stage_costs` is a :class:`sim.model.cost.StageCosts` that
``pipesim simulate --costs`` takes. Units: seconds per micro-batch, bytes,
bytes per second.

- :func:`gpipe_partition` -- GPipe's balancing (Huang et al., NeurIPS 2019,
  section 2.2: "partition ... to minimize the variance in the estimated costs of all
  cells"): K stages of consecutive layers minimizing the slowest stage's
  forward+backward time, exactly: bisection on the bound, each probe packing stages
  greedily in O(K log L) (the fewest stages under a bound), until no float lies between
  a feasible and an infeasible bound. Among the partitions with that bottleneck, a
  dynamic programme picks the one with the smallest sum of squared stage times (the
  smallest variance) while K L^2 <= EXACT_VARIANCE_WORK; beyond, each cut goes as near
  its ideal place (k/K of the total) as the bound allows, in O(K log L). A model of
  100,000 layers splits in well under a second (the DP took 63 s for 10,000).
- :func:`pipedream_partition` -- PipeDream's planner (Narayanan et al., SOSP 2019,
  section 3.1). With T_l the compute time of layer l, a_l its output bytes, w_l its
  parameter bytes and B the bandwidth::

      T(i->j, m) = 1/m * max( sum_{l=i..j} T_l , W^m(i..j) )     stage i..j on m replicas
      W^m(i..j)  = 2 (m-1)/m * sum w_l / B                      ring all-reduce of its weights
      A(j, m)    = min( T(1->j, m),
                        min_{i<j, 1<=m'<m} max( A(i, m-m'), 2 a_i / B, T(i+1->j, m') ) )

  A(L, K) is the time per sample of the slowest stage (or boundary transfer); the
  throughput in steady state is 1 / A(L, K) micro-batches per second. The paper
  estimates W^m with 4(m-1)/m |w| / B (a push and a pull of every byte through its
  parameter servers); here it is the ring all-reduce's 2(m-1)/m |w| / B, which is what
  :mod:`sim.engines.replication` simulates. Without replication m' = 1: exactly K stages.
"""

from __future__ import annotations

import math
import numbers
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from sim.model.cost import StageCosts
from sim.model.layers import LayerCosts
from sim.errors import PipesimError, PipesimTypeError

__all__ = ["Partition", "PartitionError", "gpipe_partition", "min_max_bounds", "pipedream_partition", "stage_time"]


class PartitionError(PipesimError):
    """A partition that cannot be made, e.g. more stages than layers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    method: str
    """'gpipe' or 'pipedream'."""
    bounds: tuple[tuple[int, int], ...]
    """Per stage: its layers [first, end) in model order."""
    replicas: tuple[int, ...]
    """Per stage: how many devices run it (micro-batches dealt round-robin); 1 without replication."""
    stage_times: tuple[float, ...]
    """Per stage: seconds per micro-batch it adds to the pipeline's cycle (compute or weight sync, / replicas)."""
    comm_times: tuple[float, ...]
    """Per boundary s -> s+1: seconds to send the activation and receive its gradient (2 a / B)."""
    time_per_sample: float
    """The slowest stage or boundary: seconds per micro-batch in steady state."""

    @property
    def stages(self) -> int:
        return len(self.bounds)

    @property
    def devices(self) -> int:
        return sum(self.replicas)

    @property
    def throughput(self) -> float:
        """Micro-batches per second in steady state (1 / time_per_sample)."""
        return 1.0 / self.time_per_sample if self.time_per_sample > 0 else math.inf

    @property
    def variance(self) -> float:
        """Population variance of the stage times (seconds^2)."""
        mean = sum(self.stage_times) / len(self.stage_times)
        return sum((t - mean) ** 2 for t in self.stage_times) / len(self.stage_times)

    def stage_costs(self, layers: LayerCosts) -> StageCosts:
        """Per-stage costs for the simulator: sums over each stage's layers.

        send_bytes is the last layer's output (0 for the last stage); activation_bytes the
        outputs of all its layers (kept for the backward); weight and gradient bytes the
        parameters. The backward is not split (weight = 0).
        """
        rows = {"forward": [], "backward": [], "send_bytes": [], "activation_bytes": [], "weight_bytes": [],
                "grad_bytes": []}
        for s, (lo, hi) in enumerate(self.bounds):
            rows["forward"].append(sum(layers.forward[lo:hi]))
            rows["backward"].append(sum(layers.backward[lo:hi]))
            rows["send_bytes"].append(layers.activation_bytes[hi - 1] if s < self.stages - 1 else 0.0)
            rows["activation_bytes"].append(sum(layers.activation_bytes[lo:hi]))
            rows["weight_bytes"].append(sum(layers.parameter_bytes[lo:hi]))
            rows["grad_bytes"].append(sum(layers.parameter_bytes[lo:hi]))
        return StageCosts(**rows)

    def to_dict(self, layers: LayerCosts | None = None) -> dict:
        out = {"method": self.method, "stages": self.stages, "devices": self.devices,
               "time_per_sample": self.time_per_sample, "throughput": self.throughput, "variance": self.variance,
               "stage_list": [{"stage": s, "first_layer": lo, "last_layer": hi - 1, "layers": hi - lo,
                               "replicas": self.replicas[s], "time": self.stage_times[s]}
                              for s, (lo, hi) in enumerate(self.bounds)],
               "boundary_comm_times": list(self.comm_times)}
        if layers is not None:
            for row, (lo, hi) in zip(out["stage_list"], self.bounds):
                row["names"] = [layers.names[lo], layers.names[hi - 1]]
        return out


def _check(layers: LayerCosts, devices: int) -> None:
    if not isinstance(layers, LayerCosts):
        raise PipesimTypeError(f"layers must be a LayerCosts (e.g. sim.model.layers.load_layers(path)), "
                               f"got {type(layers).__name__}")
    if isinstance(devices, bool) or not isinstance(devices, numbers.Integral) or devices < 1:
        raise PartitionError(f"devices must be a positive integer, got {devices!r}")


EXACT_VARIANCE_WORK = 200_000
"""Above this K x L^2, the least-variance tie-break (a quadratic DP) gives way to cuts nearest the ideal split."""


def gpipe_partition(layers: LayerCosts, devices: int) -> Partition:
    """K = *devices* stages of consecutive layers with the smallest possible slowest stage (module docstring)."""
    _check(layers, devices)
    L, K = layers.layers, devices
    if K > L:
        raise PartitionError(f"{K} stages need at least {K} layers, the model has {L}; use --devices {L} or fewer")
    prefix = [0.0] + list(accumulate(layers.compute))
    bounds = min_max_bounds(prefix, K)
    times = tuple(prefix[j] - prefix[i] for i, j in bounds)
    return Partition(method="gpipe", bounds=tuple(bounds), replicas=(1,) * K, stage_times=times,
                     comm_times=(0.0,) * (K - 1), time_per_sample=max(times))


def min_max_bounds(prefix: list[float], K: int) -> list[tuple[int, int]]:
    """The stages of :func:`gpipe_partition` from the prefix sums of checked, finite per-layer costs (``prefix[0]``
    = 0; K <= layers): the estimate calls it directly, without building a LayerCosts."""
    L = len(prefix) - 1
    cap = _bottleneck(prefix, K)
    cap = cap * (1 + 1e-12) + 1e-300  # the stages' own sums may round a hair above the bound they were cut at
    if K * L * L <= EXACT_VARIANCE_WORK:
        return _least_squares_cuts(prefix, K, cap)
    return _balanced_cuts(prefix, K, cap)


def _bottleneck(prefix: list[float], K: int) -> float:
    """The smallest possible slowest stage of K consecutive stages, by binary search on the bound.

    Whether a bound admits K stages is decided greedily (each stage takes as many layers as fit; a greedy
    packing uses the fewest stages, and fewer than K can always be split further): O(K log L) with bisect on
    the prefix sums. The search keeps a feasible upper end and an infeasible lower end and halves the gap
    until no float lies between them, so the result is the optimum to the last bit: O(K log L x 64) in all,
    instead of the O(K L^2) dynamic programme it replaces (Huang et al.'s balancing, same answer).
    """
    L = len(prefix) - 1
    biggest = max(prefix[i + 1] - prefix[i] for i in range(L))
    lo = max(biggest, prefix[-1] / K)  # no partition beats either: the largest layer, the average stage
    if _stages_needed(prefix, lo) <= K:
        return lo
    hi = prefix[-1]
    while True:
        mid = lo + (hi - lo) / 2
        if not lo < mid < hi:
            return hi
        if _stages_needed(prefix, mid) <= K:
            hi = mid
        else:
            lo = mid


def _stages_needed(prefix: list[float], bound: float) -> float:
    """Fewest consecutive stages covering all layers with none above *bound* (inf if a layer alone is above)."""
    L = len(prefix) - 1
    i, stages = 0, 0
    while i < L:
        j = bisect_right(prefix, prefix[i] + bound, i + 1) - 1  # furthest end with prefix[j] <= prefix[i] + bound
        if j <= i:
            return math.inf
        i, stages = j, stages + 1
    return stages


def _least_squares_cuts(prefix: list[float], K: int, cap: float) -> list[tuple[int, int]]:
    """Among the K-stage partitions with every stage under *cap*: the smallest sum of squared stage times (the
    least variance, GPipe's criterion), by dynamic programming over (stages, prefix of layers): O(K L^2).

    sq[k][j], the least sum over k stages covering layers [0, j), is min over i of sq[k-1][i] + (P[j] - P[i])^2
    for stages [i, j) under the cap; each k is one vectorised step over every (i, j) (the same float operations
    as the loop it replaces, and the first i of the least sum, as that loop kept it: tests/test_plan_speed.py)."""
    P = np.asarray(prefix, dtype=np.float64)
    L = len(P) - 1
    index = np.arange(L + 1)
    t = P[None, :] - P[:, None]  # t[i, j]: the stage [i, j)
    # the first start whose stage is under the cap (bisect on the prefix sums, clamped to j), and i < j
    first = np.minimum(np.searchsorted(P, P - cap, side="left"), index)
    base = (index[:, None] >= first[None, :]) & (index[:, None] < index[None, :]) & (t <= cap)
    squares = t * t
    sq = np.full(L + 1, np.inf)
    sq[0] = 0.0
    cuts = []
    for k in range(1, K + 1):
        ok = base & (index[:, None] >= k - 1) & (index[None, :] >= k) & (index[None, :] <= L - (K - k))
        total = np.where(ok, sq[:, None] + squares, np.inf)
        cut = np.argmin(total, axis=0)  # the first i of the least sum
        sq = total[cut, index]
        cuts.append(np.where(np.isfinite(sq), cut, -1))
    bounds, j = [], L
    for k in range(K, 0, -1):
        i = int(cuts[k - 1][j])
        bounds.append((i, j))
        j = i
    return bounds[::-1]


def _balanced_cuts(prefix: list[float], K: int, cap: float) -> list[tuple[int, int]]:
    """K stages under *cap*, each cut as near its ideal place (k/K of the total) as the cap allows: O(K log L).

    Cut k may lie anywhere from ``need[K-k]`` (the rest must still fit in K-k stages under the cap: right-to-
    left greedy) to the furthest end a stage from cut k-1 reaches under the cap; both ends exist because the
    cap is feasible, so every stage stays under it and the slowest stage is the optimum."""
    L = len(prefix) - 1
    need = [L]  # need[r]: the earliest start from which the last layers fit in r stages
    for _ in range(K):
        end = need[-1]
        need.append(max(0, bisect_left(prefix, prefix[end] - cap, 0, end)) if end > 0 else 0)
    cuts, total = [0], prefix[-1]
    for k in range(1, K):
        prev = cuts[-1]
        low = max(prev + 1, need[K - k])
        high = min(bisect_right(prefix, prefix[prev] + cap, prev + 1) - 1, L - (K - k))
        ideal = bisect_left(prefix, total * k / K, low, high + 1)
        if ideal > low and (ideal > high or prefix[ideal] - total * k / K > total * k / K - prefix[ideal - 1]):
            ideal -= 1
        cuts.append(min(max(ideal, low), high))
    cuts.append(L)
    return [(cuts[k], cuts[k + 1]) for k in range(K)]


def stage_time(layers: LayerCosts, first: int, end: int, replicas: int, bandwidth: float) -> float:
    """PipeDream's T(first->end-1, m): seconds per sample of a stage run by *replicas* devices."""
    compute = sum(layers.compute[first:end])
    sync = 0.0
    if replicas > 1 and math.isfinite(bandwidth):
        sync = 2 * (replicas - 1) / replicas * sum(layers.parameter_bytes[first:end]) / bandwidth
    return max(compute, sync) / replicas


def pipedream_partition(layers: LayerCosts, devices: int, *, bandwidth: float = math.inf,
                        replicate: bool = True) -> Partition:
    """PipeDream's planner over layers, devices and replication (DP in the module docstring).

    *bandwidth*: bytes/s of every link (inf: communication is free). *replicate*
    False: every stage on one device, exactly K stages.
    """
    _check(layers, devices)
    if not bandwidth > 0:
        raise PartitionError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    # every communication time is a share of (all activations + all parameters) x 4 / bandwidth: bound it once
    moved = 4.0 * (sum(layers.activation_bytes) + sum(layers.parameter_bytes)) + sum(layers.compute)
    if not math.isfinite(moved / bandwidth):
        raise PartitionError(f"the layers' bytes over a bandwidth of {bandwidth:g} bytes/s take longer than the "
                             f"largest float; check --bandwidth (bytes per second) for a typo")
    L, K = layers.layers, devices
    if not replicate and K > L:
        raise PartitionError(f"{K} unreplicated stages need at least {K} layers, the model has {L}; "
                             f"use --devices {L} or fewer, or --replicate")

    def comm(i: int) -> float:  # boundary after layer i-1: activation forward, gradient back
        return 2 * layers.activation_bytes[i - 1] / bandwidth if math.isfinite(bandwidth) else 0.0

    compute = [0.0] + list(accumulate(layers.compute))
    params = [0.0] + list(accumulate(layers.parameter_bytes))
    finite = math.isfinite(bandwidth)

    def T(i: int, j: int, m: int) -> float:  # stage_time() with prefix sums
        sync = 2 * (m - 1) / m * (params[j] - params[i]) / bandwidth if m > 1 and finite else 0.0
        return max(compute[j] - compute[i], sync) / m

    inf = math.inf
    # A[j][m]: best time per sample of layers [0, j) on exactly m devices; how[j][m] = (i, m') of its last stage
    A = [[inf] * (K + 1) for _ in range(L + 1)]
    how: list[list[tuple[int, int] | None]] = [[None] * (K + 1) for _ in range(L + 1)]
    for j in range(1, L + 1):
        for m in range(1, K + 1):
            if replicate or m == 1:
                A[j][m], how[j][m] = T(0, j, m), (0, m)
            for i in range(1, j):
                for mp in (range(1, m) if replicate else (1,)):
                    if m - mp < 1:
                        continue
                    value = max(A[i][m - mp], comm(i), T(i, j, mp))
                    if value < A[j][m]:
                        A[j][m], how[j][m] = value, (i, mp)
    if A[L][K] == inf:
        raise PartitionError(f"no partition of {L} layers onto {K} devices exists")
    bounds, replicas, j, m = [], [], L, K
    while j > 0:
        i, mp = how[j][m]
        bounds.append((i, j))
        replicas.append(mp)
        j, m = i, m - mp
    bounds.reverse()
    replicas.reverse()
    times = tuple(stage_time(layers, i, j, r, bandwidth) for (i, j), r in zip(bounds, replicas))
    comms = tuple(comm(j) for _, j in bounds[:-1])
    return Partition(method="pipedream", bounds=tuple(bounds), replicas=tuple(replicas), stage_times=times,
                     comm_times=comms, time_per_sample=A[L][K])
