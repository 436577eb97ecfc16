"""The data-parallel gradient reduction of a planned pipeline, bucketed and overlapped with the last backward.

    from sim.search.gradient_sync import exposed_gradient_sync
    sync = exposed_gradient_sync(result, grad_bytes_per_stage, data=8, bandwidth=25e9, latency=5e-6)
    sync.exposed        # seconds the reduction adds after the pipeline's last action

Megatron-LM (``--overlap-grad-reduce``) and PyTorch DDP do not wait for the whole pipeline to drain: gradients are
grouped in buckets (Megatron: max(40,000,000, 1,000,000 x d) parameters, megatron/core/distributed/
distributed_data_parallel.py; DDP: 25 MB), and a bucket's collective starts as soon as its last gradient is
final, on a communication stream that runs one collective at a time while the backward goes on. With the
distributed optimizer (ZeRO-1) the collective is a reduce-scatter, and the updated parameters come back with an
all-gather that Megatron overlaps with the next iteration's forward (``--overlap-param-gather``); without it, an
all-reduce.

When a gradient is final is read from the simulated timeline: stage s's gradients are produced by the backward
(B, or W when the schedule splits it) of its last micro-batch, layer by layer from its last layer to its first,
so they become final evenly over that action's span (``[start of its first such action, end of its last]``).
Each device's buckets then run in the order they fill; their durations are those of the collectives model,
:func:`sim.engines.collectives.simulate_collective` (a ring over the d replicas, on the link between replicas:
``gpu.link(cross_node=t x d > gpus per node)``, as :func:`sim.model.estimate.data_parallel_sync_time`). A ring
all-reduce is a reduce-scatter followed by an all-gather of the same number of steps and bytes (Patarasuk and
Yuan 2009), so a reduce-scatter takes half its time. The ring's time is not simulated message by message here
(tens of ms a ring, in a planner's inner loop): :func:`ring_allreduce_time` adds the message times as the
simulation's clock adds them, which gives the simulation's float exactly (tests/test_collectives_ring.py).

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["GradientSync", "exposed_gradient_sync", "megatron_bucket_bytes", "ring_allreduce_time"]


@dataclass(frozen=True, slots=True)
class GradientSync:
    """The gradient reduction of one iteration."""

    exposed: float
    """Seconds after the pipeline's last action until every device has reduced its gradients."""
    total: float
    """Seconds of reduction on the busiest device's communication stream (what no overlap would add)."""
    allgather: float
    """Seconds of the distributed optimizer's parameter all-gather (overlapped with the next forward; 0 without)."""
    buckets: int
    """Buckets on the busiest device."""


def megatron_bucket_bytes(data: int, bytes_per_parameter: float) -> float:
    """Megatron-LM's default bucket: max(40,000,000, 1,000,000 x d) parameters, in bytes."""
    return max(40_000_000, 1_000_000 * data) * bytes_per_parameter


@lru_cache(maxsize=256)
def ring_allreduce_time(workers: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds of a ring all-reduce of *nbytes* over *workers* (N): 2 (N-1) (latency + n / (N bandwidth))
    (Patarasuk and Yuan 2009: N-1 reduce-scatter and N-1 all-gather steps of n/N bytes each), as the float
    ``simulate_collective("ring", ...).time`` gives (:mod:`sim.engines.collectives`).

    In that simulation each worker sends its next message when the previous one arrives, so its clock advances by
    one message time ``latency + (n / N) / bandwidth`` 2 (N-1) times, each a float addition (simpy's ``now +
    delay``). Multiplying by 2 (N-1) instead rounds differently (241 of 300 random cases differ by an ulp or a
    few); adding the same terms in the same order gives the simulation's float bit for bit.
    """
    if workers <= 1 or nbytes <= 0:
        return 0.0
    step = latency + (nbytes / workers) / bandwidth  # one message of n/N bytes (simulate_collective: chunk / bw)
    time = 0.0
    for _ in range(2 * (workers - 1)):
        time += step
    return time


def _stage_windows(result) -> dict[int, tuple[int, float, float]]:
    """stage -> (device, start, end) of the backward work of its last micro-batch in the timeline."""
    frame = result.timeline
    work = frame[frame["op"].isin(("B", "W"))]
    windows = {}
    for stage, part in work.groupby("stage"):
        last = part[part["microbatch"] == part["microbatch"].max()]
        windows[int(stage)] = (int(last["device"].iloc[0]), float(last["start"].min()), float(last["end"].max()))
    return windows


def exposed_gradient_sync(result, grad_bytes: list[float], *, data: int, bandwidth: float, latency: float,
                          bucket_bytes: float, distributed_optimizer: bool) -> GradientSync:
    """How much of the gradient reduction of *result*'s pipeline shows after its last action (module docstring).

    *result*: a simulated :class:`~sim.results.result.Result` of one iteration; *grad_bytes*: per stage, the bytes
    of its gradients; *data*: replicas d; *bandwidth*, *latency*: the link between replicas.
    """
    if data <= 1:
        return GradientSync(0.0, 0.0, 0.0, 0)
    makespan = float(result.metrics.makespan)
    windows = _stage_windows(result)
    share = 0.5 if distributed_optimizer else 1.0  # reduce-scatter: half a ring all-reduce
    per_device: dict[int, list[tuple[float, float, float]]] = {}
    for stage, (device, start, end) in windows.items():
        per_device.setdefault(device, []).append((end, start, grad_bytes[stage]))
    worst_finish, worst_total, worst_buckets, gather = makespan, 0.0, 0, 0.0
    for device, stages in per_device.items():
        stages.sort()  # the stage whose backward ends first is reduced first
        finish, total, count, filled, ready = 0.0, 0.0, 0, 0.0, 0.0
        device_bytes = sum(b for *_, b in stages)
        for end, start, nbytes in stages:
            left = nbytes
            while left > 0:
                take = min(left, bucket_bytes - filled)
                left -= take
                filled += take
                done = (nbytes - left) / nbytes if nbytes else 1.0
                ready = start + (end - start) * done  # gradients become final evenly over the backward
                if filled >= bucket_bytes:
                    cost = share * ring_allreduce_time(data, filled, bandwidth, latency)
                    finish = max(finish, ready) + cost
                    total += cost
                    count += 1
                    filled = 0.0
        if filled > 0:  # a last partial bucket
            cost = share * ring_allreduce_time(data, filled, bandwidth, latency)
            finish = max(finish, ready) + cost
            total += cost
            count += 1
        if finish > worst_finish:
            worst_finish = finish
        if total > worst_total:
            worst_total, worst_buckets = total, count
        if distributed_optimizer:
            gather = max(gather, 0.5 * ring_allreduce_time(data, device_bytes, bandwidth, latency))
    return GradientSync(exposed=worst_finish - makespan, total=worst_total, allgather=gather, buckets=worst_buckets)
