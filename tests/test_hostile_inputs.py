"""Bad input as a hostile user would give it: every case exits 2 with one short line naming the problem.

Each row of :data:`CASES` is a command line (run in-process through :func:`sim.cli.main`, so the table
stays fast), the exit code it must give and a fragment its one error line must contain. Files the
command lines need are written by the ``files`` fixture; ``{d}`` in an argument is their folder.
A few cases run as subprocesses where the process itself matters (memory limits, the traceback of a bug).
The hypothesis tests at the end feed random bytes and random JSON to every file reader and accept
only a valid result or a typed :class:`sim.errors.PipesimError`.
"""

from __future__ import annotations

import pytest

import sim.cli
from sim.errors import PipesimError, one_line, quote


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``pipesim *argv*`` run in this process."""
    try:
        code = sim.cli.main(argv)
    except SystemExit as exc:  # argparse's --help / --version
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ one error base (issue 15.9)
def test_every_typed_error_is_a_pipesim_error_and_a_value_error():
    import importlib
    import inspect
    import pkgutil

    import sim

    found = []
    for info in pkgutil.walk_packages(sim.__path__, "sim."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Exception) and cls.__module__ == info.name:
                found.append(cls)
                assert issubclass(cls, PipesimError) and issubclass(cls, ValueError), cls
    assert len(found) >= 10  # the walk really saw the package


def test_an_internal_bug_is_a_traceback_with_exit_1_not_a_user_error(monkeypatch, capsys):
    import sim.commands.simulate as command

    def broken(args):
        raise KeyError("internal")  # what a bug of ours looks like: not a PipesimError

    monkeypatch.setattr(command, "simulate_from_args", broken)
    code, _, err = run_cli(["simulate"], capsys)
    assert code == 1
    assert "Traceback" in err and "bug in pipesim" in err and "KeyError" in err


def test_a_plain_value_error_from_a_bug_is_not_reported_as_bad_input(monkeypatch, capsys):
    import sim.commands.simulate as command

    monkeypatch.setattr(command, "simulate_from_args", lambda args: int("x"))  # ValueError, but ours
    code, _, err = run_cli(["simulate"], capsys)
    assert code == 1 and "bug in pipesim" in err


def test_error_lines_are_cut_and_quotes_are_short():
    assert len(one_line(PipesimError("x" * 10_000))) <= 400
    assert one_line(PipesimError("first\nsecond")) == "first"
    assert len(quote("9" * 1_000_000)) < 100
    assert quote("0F0") == "'0F0'"
