"""``pipesim notebooks``: execute the teaching notebooks and render them with their plots.

    pipesim notebooks -o reports/notebooks              # every notebook, HTML (executed .ipynb without nbconvert)
    pipesim notebooks -o reports/notebooks --only 01,03 --format ipynb

The notebooks' source of truth is ``notebooks/NN_name.py`` in jupytext's percent
format (no stored outputs). This module owns turning such a file into an executed
notebook: it reads it with jupytext, runs every cell in a fresh IPython kernel of
*this* interpreter (so a venv works without an installed kernelspec) and writes
the result. The test suite uses the same functions, so a cell that fails there
fails here too. jupytext, nbclient, nbformat and ipykernel (and nbconvert for
HTML) are the ``dev`` extra; they are imported only when a notebook is run.

Units: timeouts in seconds, per cell.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from sim.errors import PipesimError
from sim.files import check_output_dir, write_text
from sim.cli.options import positive_int

__all__ = ["register", "run", "NotebookError", "notebook_sources", "default_source", "execute", "render"]

FORMATS = ("html", "ipynb", "auto")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookError(PipesimError):
    """A notebook that cannot be found, read or executed; the message says which and how to fix it."""


def default_source() -> Path:
    """The repository's ``notebooks/`` folder (next to the ``sim`` package in a source checkout)."""
    return Path(__file__).resolve().parents[2] / "notebooks"


def notebook_sources(folder: str | Path, only: list[str] | None = None) -> list[Path]:
    """The ``NN_*.py`` notebooks in *folder*, in order; *only*: keep those whose name starts with one of these."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotebookError(f"notebook folder {str(folder)!r} does not exist; run from a source checkout "
                            f"or pass --source DIR")
    paths = sorted(p for p in folder.glob("[0-9][0-9]_*.py"))
    if only:
        paths = [p for p in paths if any(p.name.startswith(prefix) for prefix in only)]
    if not paths:
        wanted = f" matching {', '.join(only)}" if only else ""
        raise NotebookError(f"no notebooks NN_name.py{wanted} in {str(folder)!r}")
    return paths


def _require(module: str):
    from importlib import import_module

    try:
        return import_module(module)
    except ImportError:
        raise NotebookError(f"running notebooks needs the {module!r} package; install the dev extra: "
                            f"pip install -e '.[dev]'") from None


def _kernel_manager(kernel_dir: Path):
    """A kernel manager that starts ipykernel with this interpreter, whatever kernelspecs are installed."""
    _require("ipykernel")
    kernelspec = _require("jupyter_client.kernelspec")
    manager = _require("jupyter_client.manager")
    spec_dir = kernel_dir / "pipesim-python"
    spec_dir.mkdir(parents=True, exist_ok=True)
    write_text(spec_dir / "kernel.json", json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (pipesim)", "language": "python"}))
    specs = kernelspec.KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    # local sockets in the private temporary folder: no TCP port opened, nothing written to the working directory
    if os.name != "posix":
        return manager.KernelManager(kernel_name="pipesim-python", kernel_spec_manager=specs)
    return manager.KernelManager(kernel_name="pipesim-python", kernel_spec_manager=specs, transport="ipc",
                                 ip=str(kernel_dir / "ipc"))


def execute(source: str | Path, *, timeout: float = 120, cwd: str | Path | None = None):
    """Read the jupytext notebook *source*, run all its cells, return the executed notebook (nbformat).

    Raises :class:`NotebookError` naming the notebook, the failing cell and the error.
    *cwd*: the kernel's working directory (default: the notebook's folder).
    """
    jupytext = _require("jupytext")
    nbclient = _require("nbclient")
    source = Path(source)
    try:
        nb = jupytext.read(source, fmt="py:percent")
    except OSError as exc:
        raise NotebookError(f"cannot read notebook {str(source)!r}: {exc.strerror or exc}") from None
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory(prefix="pipesim-kernel-") as kernel_dir:
        km = _kernel_manager(Path(kernel_dir))
        client = nbclient.NotebookClient(nb, km=km, timeout=timeout,
                                         resources={"metadata": {"path": str(cwd or source.parent)}})
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as exc:
            detail = _ANSI.sub("", str(exc))  # the traceback comes with terminal colours
            raise NotebookError(f"notebook {source.name} failed: {_first_error_line(exc)}\n{detail}") from None
        except nbclient.exceptions.CellTimeoutError:
            raise NotebookError(f"notebook {source.name}: a cell ran longer than {timeout:g} s; "
                                f"raise --timeout or shrink the cell") from None
        finally:
            if km.has_kernel:  # nbclient leaves a kernel it was given running; stop it before its folder goes
                km.shutdown_kernel(now=True)
    return nb


def _first_error_line(exc: Exception) -> str:
    ename, evalue = getattr(exc, "ename", ""), getattr(exc, "evalue", "")
    return f"{ename}: {evalue}" if ename else str(exc).strip().splitlines()[-1]


def render(nb, fmt: str) -> tuple[str, str]:
    """The executed notebook *nb* as ``(text, suffix)``: HTML with inline plots, or .ipynb JSON."""
    nbformat = _require("nbformat")
    if fmt == "html":
        exporters = _require("nbconvert")
        body, _ = exporters.HTMLExporter().from_notebook_node(nb)
        return body, ".html"
    return nbformat.writes(nb), ".ipynb"


def register(sub) -> None:
    p = sub.add_parser("notebooks", help="execute the teaching notebooks and render them with their plots",
                       description="Execute notebooks/NN_*.py (jupytext) and write rendered copies.")
    p.add_argument("--output", "-o", default="reports/notebooks", help="output folder (default reports/notebooks)")
    p.add_argument("--source", default=None, help="folder of NN_name.py notebooks (default: the repo's notebooks/)")
    p.add_argument("--only", default=None, help="comma-separated name prefixes, e.g. 01,03")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="html (needs nbconvert), ipynb, or auto: html if nbconvert is installed (default)")
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds per cell (default 300)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    sources = notebook_sources(args.source or default_source(), only)
    fmt = args.format
    if fmt == "auto":
        try:
            import nbconvert  # noqa: F401
            fmt = "html"
        except ImportError:
            fmt = "ipynb"
    elif fmt == "html":
        _require("nbconvert")
    out = check_output_dir(args.output)  # before running anything
    for source in sources:
        print(f"running {source.name} ...", flush=True)
        nb = execute(source, timeout=args.timeout)
        text, suffix = render(nb, fmt)
        final = write_text(out / (source.stem + suffix), text)  # atomic: a reader never sees a half-written file
        print(f"  wrote {final}")
    return 0
