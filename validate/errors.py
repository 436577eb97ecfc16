"""The validator's typed errors and the names it accepts; importable without torch.

Everything here is checked before any process starts, so bad input costs one
line and exit code 2, not a torch import.
"""

from __future__ import annotations

import re

from sim.errors import PipesimError, quote

__all__ = ["ValidationError", "WorkloadError", "WORKLOADS", "BACKENDS", "check_names", "is_entry_point"]

WORKLOADS = ("mlp", "transformer", "emulated")
BACKENDS = ("gloo", "nccl")

_ENTRY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""``package.module:function``, the user's own model (:mod:`validate.rank.user_model`)."""


class ValidationError(PipesimError):
    """A validation request that cannot start: bad backend, no GPUs, unknown workload, bad costs."""


class WorkloadError(PipesimError):
    """A workload that cannot be built: unknown name or bad sizes."""


def is_entry_point(workload: str) -> bool:
    """Whether *workload* names the user's own model, ``package.module:function``."""
    return isinstance(workload, str) and _ENTRY.fullmatch(workload) is not None


def check_names(workload: str, backend: str) -> None:
    if workload not in WORKLOADS and not is_entry_point(workload):
        hint = (" (an entry point is package.module:function)" if isinstance(workload, str) and ":" in workload
                else "")
        raise ValidationError(f"unknown workload {quote(workload)}{hint}; choose one of: {', '.join(WORKLOADS)}, "
                              f"or your own model as package.module:function")
    if backend not in BACKENDS:
        raise ValidationError(f"unknown backend {backend!r}; choose gloo (CPU) or nccl (one GPU per rank)")
