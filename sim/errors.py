"""The one base of every error pipesim raises on purpose, and how such errors are worded.

Each typed error (:class:`sim.core.ir.ScheduleError`, :class:`sim.model.cost.CostsError`,
:class:`validate.errors.ValidationError`, ...) derives from :class:`PipesimError`, which is
a ``ValueError`` so callers that catch ``ValueError`` keep working. The command line
catches this base alone and prints its first line with exit code 2: any other exception
is a bug of ours and surfaces as one (a traceback with a request to report it), never as
a user error.

Messages quote the user's input with :func:`quote`, which cuts long text, so that a
hostile one-cell file (``1000000F0``, a megabyte of garbage) still gives one short line.
Text that reaches a terminal goes through :func:`terminal_text`, so a name holding escape codes
(``\x1b[2J`` clears the screen) is shown, not obeyed; a name put into a figure goes through
:func:`plot_text`, so ``$\frac{1}{$`` is drawn as typed, not parsed as matplotlib math.

The exit codes of the command line, one table (README, "Exit codes"): :data:`EXIT_OK` 0,
:data:`EXIT_BUG` 1, :data:`EXIT_BAD_INPUT` 2, :data:`EXIT_CHECK_FAILED` 3 (``validate`` found the
prediction or the gradients off), :data:`EXIT_INTERRUPTED` 130 (SIGINT, Ctrl-C) and
:data:`EXIT_TERMINATED` 143 (SIGTERM): 128 + the signal's number, the shell's convention for a
process a signal ended, kept by every command after it has cleaned up.
"""

from __future__ import annotations

import math
import re

__all__ = ["PipesimError", "PipesimTypeError", "Terminated", "quote", "one_line", "terminal_text", "plot_text", "real_number",
           "whole_number", "MAX_LINE", "EXIT_OK", "EXIT_BUG", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED",
           "EXIT_INTERRUPTED", "EXIT_TERMINATED"]

EXIT_OK = 0
"""The command did what was asked."""
EXIT_BUG = 1
"""A bug of pipesim's (any exception that is not a PipesimError): shown with its traceback."""
EXIT_BAD_INPUT = 2
"""Input or environment pipesim refuses (a PipesimError, a missing file, a full disk): one line."""
EXIT_CHECK_FAILED = 3
"""``validate`` ran and a check failed (prediction error past its bound, wrong gradients)."""
EXIT_INTERRUPTED = 130
"""SIGINT (Ctrl-C): 128 + 2."""
EXIT_TERMINATED = 143
"""SIGTERM (``kill``, a CI runner's timeout, a batch system): 128 + 15."""

MAX_LINE = 400
"""Characters of an error line the command line prints at most (longer lines are cut, marked '...')."""


class PipesimError(ValueError):
    """Input pipesim refuses, with the reason and how to fix it in the message."""


class PipesimTypeError(PipesimError, TypeError):
    """An argument of the wrong type, e.g. ``simulate(schedule, costs=None)``: names the argument and what it takes."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (the command line raises it from its signal handler). A KeyboardInterrupt, so everything
    that cleans up after Ctrl-C (worker pools, temporary files, half-written outputs) cleans up after SIGTERM the
    same way; the command line then exits :data:`EXIT_TERMINATED` instead of :data:`EXIT_INTERRUPTED`."""


# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI on some terminals), and the
# bidirectional overrides and isolates that reorder what is shown (Unicode TR9; CVE-2021-42574, "Trojan Source")
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_CR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str, *, carriage_return: bool = False) -> str:
    """*text* safe to show on a terminal: every control character a terminal would obey (escape codes, bell,
    backspace, bidirectional overrides) is written out as ``\\u001b``, the spelling JSON uses, so JSON stays
    valid JSON. Tab and newline stay; *carriage_return* keeps ``\\r`` too (progress bars redraw with it)."""
    pattern = _UNSAFE_KEEP_CR if carriage_return else _UNSAFE
    if pattern.search(text) is None:  # the usual case: nothing to replace
        return text
    return pattern.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


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


def plot_text(text: object) -> str:
    """*text* (a schedule, model or GPU name, a file name) as matplotlib draws it literally: every ``$`` escaped,
    so no name is parsed as math text (matplotlib parses text with an even number of unescaped ``$``,
    matplotlib.cbook.is_math_text; a name such as ``$\\frac{1}{$`` or 3000 nested braces made savefig raise)."""
    return terminal_text(str(text)).replace("$", r"\$")  # control characters shown as on a terminal, not as boxes


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
