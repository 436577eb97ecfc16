"""Random runtime-model cases shared by the runtime tests (tests/test_runtime_messages.py, test_runtime_inputs.py):
a schedule of one of the multi-stage shapes with random costs and one link model."""

from __future__ import annotations

import numpy as np

from sim import schedules
from sim.model.cost import StageCosts
from sim.model.hardware import Hardware

SHAPES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("dualpipev", 2)]
"""(schedule, chunks) pairs: the single-stage runtime's schedules and the multi-stage runtime's."""


def random_case(name: str, chunks: int, K: int, M: int, seed: int):
    """(schedule, costs, hardware, rng) of *name* on K devices with M micro-batches (K M for DualPipeV, which
    needs M >= 2K), random F/B/W, bytes and forward dispatch; None where the schedule refuses the shape."""
    try:
        s = schedules.generate(name, K, M * K if name == "dualpipev" else M, chunks=chunks if chunks > 1 else None)
    except Exception:  # a shape this schedule refuses
        return None
    rng = np.random.default_rng(seed)
    S = s.stages
    costs = StageCosts(forward=rng.uniform(0.5, 2, S).tolist(), backward=rng.uniform(0.5, 3, S).tolist(),
                       weight=rng.uniform(0, 1, S).tolist(), send_bytes=rng.uniform(0, 2e6, S).tolist(),
                       dispatch_forward=rng.uniform(0, 0.2, S).tolist())
    return s, costs, Hardware(devices=K, latency=0.05, bandwidth=4e6), rng
