"""Predicted against measured: any two Results compared, the report files, and the idle-time split.

``from validate.compare import compare_results, action_errors`` (the 0.2 module's names) keeps working.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["compare_results", "action_errors"]


def __getattr__(name: str):
    if name in __all__:  # loaded on first use: the report and idle modules do not need pandas' frames
        return getattr(import_module("validate.compare.results"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
