"""The one base of every error pipesim raises on purpose, and how such errors are worded.

Each typed error (:class:`sim.core.ir.ScheduleError`, :class:`sim.model.cost.CostsError`,
:class:`validate.errors.ValidationError`, ...) derives from :class:`PipesimError`, which is
a ``ValueError`` so callers that catch ``ValueError`` keep working. The command line
catches this base alone and prints its first line with exit code 2: any other exception
is a bug of ours and surfaces as one (a traceback with a request to report it), never as
a user error.

Messages quote the user's input with :func:`quote`, which cuts long text, so that a
hostile one-cell file (``1000000F0``, a megabyte of garbage) still gives one short line.
"""

from __future__ import annotations

import math

__all__ = ["PipesimError", "PipesimTypeError", "quote", "one_line", "real_number", "whole_number", "MAX_LINE"]

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


def real_number(value: object, name: str) -> float:
    """*value* as a float if it is a real number of any type (int, float, numpy, Decimal, Fraction), else a
    :class:`PipesimTypeError` naming *name*. Booleans are refused: ``True`` is not a cost. Range checks
    (finite, >= 0) are the caller's."""
    if type(value) is float:  # the usual case, on every simulation: no ABC checks
        return value
    import numbers
    from decimal import Decimal

    if isinstance(value, bool) or getattr(value, "dtype", None) == bool:
        raise PipesimTypeError(f"{name} must be a number, got the bool {value!r}")
    if isinstance(value, (numbers.Real, Decimal)):
        try:
            return float(value)
        except (ArithmeticError, ValueError):  # Fraction(10**400) and the like: past float's range
            return math.inf if value > 0 else -math.inf
    raise PipesimTypeError(f"{name} must be a number, got {type(value).__name__} {quote(value)}")


def whole_number(value: object, name: str) -> int:
    """*value* as an int if it is an integer of any type (int, numpy.int64, ...), else a
    :class:`PipesimTypeError` naming *name*; booleans are refused. Range checks are the caller's."""
    if type(value) is int:  # the usual case (bool is a subclass, not int itself): no ABC checks
        return value
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PipesimTypeError(f"{name} must be an integer, got {type(value).__name__} {quote(value)}")
    return int(value)
