"""The ``pipesim`` command line: one subcommand per module under :mod:`sim.cli`.

    pipesim simulate --schedule 1f1b --devices 4 --microbatches 8
    pipesim schedules

Bad input (any :class:`sim.errors.PipesimError`, or an OSError such as a missing file) prints one
line, ``pipesim: error: ...``, to stderr and exits with code 2. Any other exception is a bug of
ours: its traceback is shown with a request to report it, and the exit code is 1. Ctrl-C exits 130
and SIGTERM 143, each after the command has cleaned up (SIGTERM raises :class:`sim.errors.Terminated`,
a KeyboardInterrupt, so the same clean-up runs). The exit codes: :mod:`sim.errors` and the README.

Everything the command prints goes through :func:`sim.errors.terminal_text`: a schedule or model
named with terminal escape codes is shown, not obeyed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

from sim import __version__
from sim.cli.options import UsageError, join_negative_values
from sim.errors import (EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, PipesimError,
                        Terminated, one_line, terminal_text)

__all__ = ["main", "build_parser", "UsageError"]


# subcommand module -> the subcommands its register(subparsers) adds. A command line that names one
# subcommand imports only its module (so `pipesim simulate --json` never loads pandas or matplotlib);
# --help, or a name not listed, imports them all. Adding a subcommand is adding a line here.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "sim.cli.simulate": ("simulate", "schedules"),
    "sim.cli.demo": ("demo",),
    "sim.cli.export": ("export",),
    "sim.cli.gantt": ("gantt",),
    "sim.cli.sweep": ("sweep",),
    "sim.cli.notebooks": ("notebooks",),
    "sim.cli.collective": ("collective",),
    "sim.cli.partition": ("partition",),
    "sim.cli.replicate": ("replicate",),
    "sim.cli.ingest": ("ingest",),
    "sim.cli.estimate": ("estimate",),
    "sim.cli.plan": ("plan",),
    "sim.cli.synthesize": ("synthesize",),
    "sim.cli.validate": ("validate",),
    "sim.cli.page": ("page",),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we print one line
        raise UsageError(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with *command* (a subcommand name), only the module that registers it is imported."""
    parser = _Parser(prog="pipesim", description="Simulate, draw and validate pipeline-parallel training schedules.")
    parser.add_argument("--version", action="version", version=f"pipesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    modules = [m for m, names in COMMAND_MODULES.items() if command in names] or list(COMMAND_MODULES)
    for name in modules:
        import_module(name).register(sub)
    return parser


def _named_command(argv: list[str]) -> str | None:
    """The subcommand *argv* names: its first word that is not an option (the top level takes no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Run the command line *argv* (default: ``sys.argv[1:]``); returns the exit code (module docstring)."""
    with _sigterm_raises(), _terminal_streams():
        return _run(argv)


def entry() -> None:
    """The ``pipesim`` and ``python -m sim`` process: :func:`main`, then exit with its code. Once the command is
    done, Ctrl-C is ignored: the interpreter's shutdown (numba's and the pools' clean-up, a few hundred
    milliseconds) restores the default SIGINT action, so a Ctrl-C that came then killed a finished command by signal
    (exit -2) after its files were written, where exit 0 is the truth (tests/test_reliability_signals.py)."""
    code = main()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python leaves an ignored signal ignored at shutdown
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    try:
        # `--bandwidth -1e9` reaches its own check, not argparse's "expected one argument"
        argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
        args = build_parser(_named_command(argv)).parse_args(argv)
        return int(args.func(args) or EXIT_OK)
    except BrokenPipeError:  # e.g. `pipesim ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return EXIT_OK
    except (PipesimError, OSError) as exc:  # the user's input or environment (a missing file, a full disk)
        print(f"pipesim: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Terminated:  # before KeyboardInterrupt, its base
        print("pipesim: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - anything else is a bug of ours: show it as one, never as a user error
        traceback.print_exc()
        print("pipesim: internal error: this is a bug in pipesim, not in your input; please report it with the "
              "command line and the traceback above", file=sys.stderr)
        return EXIT_BUG


def _terminate(signum, frame):
    raise Terminated(f"signal {signum}")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while a command runs (Python's default would end the process at once:
    no worker stopped, no temporary file removed); the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _TerminalStream:
    """A text stream that writes through :func:`terminal_text`; everything else is the wrapped stream's."""

    def __init__(self, stream, *, carriage_return: bool) -> None:
        self._stream = stream
        self._carriage_return = carriage_return

    def write(self, text: str) -> int:
        self._stream.write(terminal_text(text, carriage_return=self._carriage_return))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def _terminal_streams() -> Iterator[None]:
    """stdout and stderr through :func:`terminal_text` while a command runs (stderr keeps ``\\r`` for tqdm's bar)."""
    out, err = sys.stdout, sys.stderr
    if out is not None:
        sys.stdout = _TerminalStream(out, carriage_return=False)
    if err is not None:
        sys.stderr = _TerminalStream(err, carriage_return=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())
