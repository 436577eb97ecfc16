"""The ``pipesim`` command line: one subcommand per module under :mod:`sim.cli`.

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

from sim import __version__
from sim.cli.options import UsageError, join_negative_values
from sim.errors import PipesimError, one_line

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
    try:

        # `--bandwidth -1e9` reaches its own check, not argparse's "expected one argument"
        argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
        args = build_parser(_named_command(argv)).parse_args(argv)
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
