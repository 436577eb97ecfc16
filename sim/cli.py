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

# subcommand modules, each with register(subparsers); imported lazily so `import sim` stays light
COMMAND_MODULES = [
    "sim.commands.simulate",
    "sim.commands.demo",
    "sim.commands.export",
    "sim.commands.gantt",
    "sim.commands.sweep",
    "sim.commands.notebooks",
    "sim.commands.collective",
    "sim.commands.partition",
    "sim.commands.replicate",
    "sim.commands.ingest",
    "sim.commands.estimate",
    "sim.commands.plan",
    "validate.command",
]


class UsageError(PipesimError):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we print one line
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pipesim", description="Simulate, draw and validate pipeline-parallel training schedules.")
    parser.add_argument("--version", action="version", version=f"pipesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
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
