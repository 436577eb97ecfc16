"""The one base of every error pipesim raises on purpose.

Each typed error (:class:`sim.ir.ScheduleError`, :class:`sim.cost.CostsError`,
:class:`validate.errors.ValidationError`, ...) derives from :class:`PipesimError`, which is
a ``ValueError`` so callers that catch ``ValueError`` keep working. The command line
catches this base alone and prints its first line with exit code 2: any other exception
is a bug of ours and surfaces as one (a traceback with a request to report it), never as
a user error.
"""

from __future__ import annotations

__all__ = ["PipesimError", "PipesimTypeError"]


class PipesimError(ValueError):
    """Input pipesim refuses, with the reason and how to fix it in the message."""


class PipesimTypeError(PipesimError, TypeError):
    """An argument of the wrong type, e.g. ``simulate(schedule, costs=None)``: names the argument and what it takes."""
