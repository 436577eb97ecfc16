"""The validator's typed errors and the names it accepts; importable without torch.

Everything here is checked before any process starts, so bad input costs one
line and exit code 2, not a torch import.
"""

from __future__ import annotations

from sim.errors import PipesimError

__all__ = ["ValidationError", "WorkloadError", "WORKLOADS", "BACKENDS", "check_names"]

WORKLOADS = ("mlp", "transformer", "emulated")
BACKENDS = ("gloo", "nccl")


class ValidationError(PipesimError):
    """A validation request that cannot start: bad backend, no GPUs, unknown workload, bad costs."""


class WorkloadError(PipesimError):
    """A workload that cannot be built: unknown name or bad sizes."""


def check_names(workload: str, backend: str) -> None:
    if workload not in WORKLOADS:
        raise ValidationError(f"unknown workload {workload!r}; choose one of: {', '.join(WORKLOADS)}")
    if backend not in BACKENDS:
        raise ValidationError(f"unknown backend {backend!r}; choose gloo (CPU) or nccl (one GPU per rank)")
