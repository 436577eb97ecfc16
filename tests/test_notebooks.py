"""The teaching notebooks run top to bottom, and `pipesim notebooks` renders them.

Every notebook in notebooks/ is converted from its jupytext source and executed
in a fresh kernel of this interpreter; a failing cell (including the asserts that
tie each number in the text to the simulator) fails the test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from sim.cli import main  # noqa: E402
from sim.cli.notebooks import NotebookError, default_source, execute, notebook_sources  # noqa: E402

NOTEBOOKS = notebook_sources(default_source())
PER_NOTEBOOK_S = 150  # per cell; the whole set runs in well under 3 minutes on 2 cores


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(source: Path, tmp_path: Path):
    if source.name.startswith("07_"):
        pytest.importorskip("torch", reason="notebook 7 runs the validator, which needs torch")
    nb = execute(source, timeout=PER_NOTEBOOK_S, cwd=tmp_path)  # cwd: a notebook must not write into the repo
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert _outputs(nb, "image/png"), f"{source.name} shows no plot"
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Exercise" in text and "Answer" in text, f"{source.name} needs exercises with worked answers"


def test_notebooks_are_numbered_and_canonical():
    """Distinct numbers; a markdown title first; jupytext writes the file back unchanged (clean diffs)."""
    import jupytext

    assert [p.name[:2] for p in NOTEBOOKS] == sorted({p.name[:2] for p in NOTEBOOKS})
    for p in NOTEBOOKS:
        text = p.read_text()
        assert text.startswith("# %% [markdown]\n# # "), f"{p.name}: start with a markdown title cell"
        assert jupytext.writes(jupytext.reads(text, fmt="py:percent"), fmt="py:percent") == text, p.name


def _write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(body)
    return path


def test_failing_cell_fails_with_its_error(tmp_path: Path):
    src = _write(tmp_path, "01_bad.py", "# %% [markdown]\n# # Bad\n\n# %%\nassert 1 + 1 == 3, 'arithmetic'\n")
    with pytest.raises(NotebookError, match="01_bad.py failed: AssertionError: arithmetic"):
        execute(src, timeout=60)


def test_kernel_is_this_interpreter_and_is_stopped(tmp_path: Path):
    src = _write(tmp_path, "01_which.py", "# %%\nimport os, sys\nprint(sys.executable)\nprint(os.getpid())\n")
    nb = execute(src, timeout=60)
    executable, pid = nb.cells[0].outputs[0]["text"].split()
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    with pytest.raises(ProcessLookupError):  # the kernel does not outlive its notebook
        os.kill(int(pid), 0)


def test_cli_renders_executed_copies(tmp_path: Path, capsys):
    _write(tmp_path, "01_plot.py", "# %% [markdown]\n# # Plot\n\n# %%\n# %matplotlib inline\n"
           "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()\n")
    _write(tmp_path, "02_other.py", "# %%\nprint('hello')\n")
    out = tmp_path / "out"
    assert main(["notebooks", "--source", str(tmp_path), "-o", str(out), "--only", "01", "--format", "ipynb"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["01_plot.ipynb"]
    import nbformat

    nb = nbformat.read(str(out / "01_plot.ipynb"), as_version=4)
    assert _outputs(nb, "image/png")
    pytest.importorskip("nbconvert")
    assert main(["notebooks", "--source", str(tmp_path), "-o", str(out), "--only", "01"]) == 0
    html = (out / "01_plot.html").read_text()
    assert "data:image/png;base64" in html or "image/png" in html


def test_cli_errors_are_one_line(tmp_path: Path, capsys):
    assert main(["notebooks", "--source", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["notebooks", "--source", str(tmp_path), "--only", "99"]) == 2
    assert "no notebooks" in capsys.readouterr().err


def test_command_import_stays_light():
    import subprocess

    code = ("import sys, sim.cli, sim.cli.notebooks; "
            "bad = [m for m in ('torch', 'jupytext', 'nbclient', 'nbconvert') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
