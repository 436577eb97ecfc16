"""Traces of any runtime -> a measured timeline: read the files, find the actions, align the clocks, calibrate,
compare with the prediction (:mod:`validate.ingest.flow` runs these steps).

``from validate.ingest import ingest`` (the 0.2 module's names) keeps working.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["IngestError", "MissingRankError", "NoActionsError", "ScheduleMismatchError", "Ingested", "ingest", "ClockError", "CLOCK_MODES", "without_updates"]


def __getattr__(name: str):
    if name in __all__:  # loaded on first use: reading a trace does not need the whole flow
        return getattr(import_module("validate.ingest.flow"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
