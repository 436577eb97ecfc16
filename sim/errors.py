"""The one base of every error pipesim raises on purpose, and how such errors are worded.

Each typed error (:class:`sim.ir.ScheduleError`, :class:`sim.cost.CostsError`,
:class:`validate.errors.ValidationError`, ...) derives from :class:`PipesimError`, which is
a ``ValueError`` so callers that catch ``ValueError`` keep working. The command line
catches this base alone and prints its first line with exit code 2: any other exception
is a bug of ours and surfaces as one (a traceback with a request to report it), never as
a user error.

Messages quote the user's input with :func:`quote`, which cuts long text, so that a
hostile one-cell file (``1000000F0``, a megabyte of garbage) still gives one short line.
"""

from __future__ import annotations

__all__ = ["PipesimError", "PipesimTypeError", "quote", "one_line", "MAX_LINE"]

MAX_LINE = 400
"""Characters of an error line the command line prints at most (longer lines are cut, marked '...')."""


class PipesimError(ValueError):
    """Input pipesim refuses, with the reason and how to fix it in the message."""


class PipesimTypeError(PipesimError, TypeError):
    """An argument of the wrong type, e.g. ``simulate(schedule, costs=None)``: names the argument and what it takes."""


def quote(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to about *limit* characters: safe to put user input into a one-line message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def one_line(exc: BaseException, limit: int = MAX_LINE) -> str:
    """The first line of *exc*'s message, at most *limit* characters (the type's name if it has no message)."""
    text = str(exc)
    line = text.splitlines()[0] if text.strip() else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."
