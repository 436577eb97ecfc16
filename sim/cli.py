"""The ``pipesim`` command line: one subcommand per module under :mod:`sim.commands`.

    pipesim simulate --schedule 1f1b --devices 4 --microbatches 8
    pipesim schedules

Bad input prints one line, ``pipesim: error: ...``, to stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from . import __version__
from .errors import PipesimError

__all__ = ["main", "build_parser", "UsageError"]

# subcommand module -> the subcommands its register(subparsers) adds. A command line that names one
# subcommand imports only its module (so `pipesim simulate --json` never loads pandas or matplotlib);
# --help, or a name not listed, imports them all. Adding a subcommand is adding a line here.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "sim.commands.simulate": ("simulate", "schedules"),
    "sim.commands.demo": ("demo",),
    "sim.commands.export": ("export",),
    "sim.commands.gantt": ("gantt",),
    "sim.commands.sweep": ("sweep",),
    "sim.commands.notebooks": ("notebooks",),
    "sim.commands.collective": ("collective",),
    "sim.commands.partition": ("partition",),
    "sim.commands.replicate": ("replicate",),
    "sim.commands.ingest": ("ingest",),
    "sim.commands.estimate": ("estimate",),
    "sim.commands.plan": ("plan",),
    "validate.command": ("validate",),
}


class UsageError(PipesimError):
    """Bad command-line input: reported as one line, exit code 2."""


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
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(_named_command(argv)).parse_args(argv)
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `pipesim ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except (ValueError, OSError) as exc:  # every typed error of the API is a ValueError
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"pipesim: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
