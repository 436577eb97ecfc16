"""Old module paths of the validator (pipesim 0.2's flat layout) as thin aliases of their new homes.

See :mod:`sim.moved`: each old path warns and gives the new module; ``torchrun -m validate.worker`` runs
:mod:`validate.torchrun`. ``validate.compare`` and ``validate.ingest`` are packages now and give their old
names themselves.
"""

from __future__ import annotations

__all__ = ["VALIDATE_MOVED"]

VALIDATE_MOVED: dict[str, str] = {
    "validate.comparison": "validate.run",
    "validate.report": "validate.compare.report",
    "validate.idle": "validate.compare.idle",
    "validate.checks": "validate.correctness.checks",
    "validate.reference": "validate.correctness.reference",
    "validate.trace_reader": "validate.ingest.reader",
    "validate.trace_actions": "validate.ingest.actions",
    "validate.trace_clocks": "validate.ingest.clocks",
    "validate.trace_calibration": "validate.ingest.calibration",
    "validate.ingest_report": "validate.ingest.report",
    "validate.calibrate": "validate.predict.calibrate",
    "validate.prediction": "validate.predict.prediction",
    "validate.replay": "validate.predict.replay",
    "validate.profile_layers": "validate.predict.profile_layers",
    "validate.torch_runtime": "validate.pytorch.runtime",
    "validate.torch_schedules": "validate.pytorch.schedules",
    "validate.torch_validation": "validate.pytorch.validation",
    "validate.worker": "validate.torchrun",
    "validate.executor": "validate.rank.executor",
    "validate.comm": "validate.rank.comm",
    "validate.tracing": "validate.rank.tracing",
    "validate.workloads": "validate.rank.workloads",
    "validate.inprocess": "validate.rank.inprocess",
    "validate.command": "sim.cli.validate",
}
"""old module path -> new module path"""
