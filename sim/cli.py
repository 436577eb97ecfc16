"""The ``pipesim`` command line: one subcommand per module under :mod:`sim.commands`.

    pipesim simulate --schedule 1f1b --devices 4 --microbatches 8
    pipesim schedules

Bad input (any :class:`sim.errors.PipesimError`, or an OSError such as a missing file) prints one
line, ``pipesim: error: ...``, to stderr and exits with code 2. Any other exception is a bug of
ours: its traceback is shown with a request to report it, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from importlib import import_module

from . import __version__
from .errors import PipesimError, one_line

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
        from .commands.options import join_negative_values  # `--bandwidth -1e9` reaches its check, not argparse's

        args = build_parser().parse_args(join_negative_values(sys.argv[1:] if argv is None else list(argv)))
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `pipesim ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except (PipesimError, OSError) as exc:  # the user's input or environment (a missing file, a full disk)
        print(f"pipesim: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - anything else is a bug of ours: show it as one, never as a user error
        traceback.print_exc()
        print("pipesim: internal error: this is a bug in pipesim, not in your input; please report it with the "
              "command line and the traceback above", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
