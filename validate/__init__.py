"""pipesim's validator: runs the same Schedule objects on real devices with torch.distributed.

Needs torch (``pip install 'pipesim[validate]'``); the simulator (:mod:`sim`) does not.
Importing this package does not import torch; the names below load on first use.

    from validate import run_validation
    report = run_validation("1f1b", 2, 4, workload="mlp")   # K=2 ranks on CPU (gloo), M=4
    report.to_dict()["makespan_error"], report.significant, report.gradients_match

Modules: :mod:`validate.request` (the typed request and rank results crossing processes;
no torch), :mod:`validate.rank.workloads` (stage modules, emulated stages, the per-rank setup),
:mod:`validate.rank.comm` (every torch.distributed call), :mod:`validate.rank.executor` (one rank
runs its action list), :mod:`validate.rank.tracing`, :mod:`validate.predict.calibrate`,
:mod:`validate.environment` (workload sizing, core pinning, load average),
:mod:`validate.launch` (K local processes), :mod:`validate.rank.worker` (the per-rank entry
point, also for torchrun), :mod:`validate.correctness.reference` (float64 one-process replays),
:mod:`validate.correctness.checks` (the correctness check and its power), :mod:`validate.compare.results`
(any two Results; no torch), :mod:`validate.run` (the whole flow),
:mod:`validate.compare.report`, :mod:`validate.command` (argparse only), :mod:`validate.dp` (DP x PP).
"""

from __future__ import annotations

from importlib import import_module

from sim.moved import install as _install_moved
from validate.moved import VALIDATE_MOVED

_install_moved(VALIDATE_MOVED)  # the 0.2 module paths, for one release (sim.moved)

__all__ = ["run_validation", "run_validations", "ValidationReport", "ValidationError", "RankFailedError"]

_WHERE = {"run_validation": "run", "run_validations": "run", "ValidationReport": "run", "ValidationError": "errors",
          "RankFailedError": "launch"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
