"""pipesim's validator: runs the same Schedule objects on real devices with torch.distributed.

Needs torch (``pip install 'pipesim[validate]'``); the simulator (:mod:`sim`) does not.
Importing this package does not import torch; the names below load on first use.

    from validate import run_validation
    report = run_validation("1f1b", 2, 4, workload="mlp")   # K=2 ranks on CPU (gloo), M=4
    report.to_dict()["makespan_error"], report.gradients_match

Modules: :mod:`validate.workloads` (stage modules and emulated stages),
:mod:`validate.comm` (every torch.distributed call), :mod:`validate.executor` (one rank
runs its action list), :mod:`validate.tracing`, :mod:`validate.calibrate`,
:mod:`validate.launch` (K local processes), :mod:`validate.worker` (the per-rank entry
point, also for torchrun), :mod:`validate.reference` (one-process references),
:mod:`validate.comparison` (the whole flow), :mod:`validate.report`, :mod:`validate.command`.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["run_validation", "run_validations", "ValidationReport", "ValidationError", "RankFailedError"]

_WHERE = {"run_validation": "comparison", "run_validations": "comparison", "ValidationReport": "comparison", "ValidationError": "errors",
          "RankFailedError": "launch"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
