"""Figures to files: the formats we write, checked before any work, and saved atomically.

No matplotlib import here: a command checks its ``-o`` before it simulates, and only the figure's own
module (:mod:`sim.io.plots`) draws.

Saving never fails on a name (issue 26.8): the figures escape the names they draw
(:func:`sim.errors.plot_text`), and as a second line of defence a text that matplotlib would
parse as math but cannot (``$\\undefinedcmd$``, 3000 nested braces) is drawn literally instead
of raising in the middle of ``savefig``. A PNG past what Agg can draw (65,536 pixels a side) is
refused with one line before drawing.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import PipesimError
from sim.files import atomic_path, check_writable

__all__ = ["FIGURE_FORMATS", "FigureFormatError", "FigureSizeError", "check_figure_path", "save_figure",
           "MAX_PIXELS_PER_SIDE"]

MAX_PIXELS_PER_SIDE = 65_535
"""Agg draws at most 2**16 - 1 pixels a side (matplotlib/backends/backend_agg.py: "Image size of ... pixels is
too large. It must be less than 2^16 in each direction")."""

FIGURE_FORMATS = ("png", "svg", "pdf")


class FigureFormatError(PipesimError):
    """An output file name whose suffix names no figure format we write."""


class FigureSizeError(PipesimError):
    """A figure too large to draw into the format asked for."""


def _figure_format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise FigureFormatError(f"cannot write a figure to {str(path)!r}: use a file name ending in "
                                f"{', '.join('.' + f for f in FIGURE_FORMATS)}")
    return fmt


def check_figure_path(path: str | Path) -> Path:
    """Refuse, before any work, a figure path with an unknown suffix or in a missing folder."""
    path = Path(path)
    _figure_format(path)
    if path.parent != Path("") and not path.parent.is_dir():
        raise FileNotFoundError(f"folder {str(path.parent)!r} does not exist; create it or pick another -o")
    return check_writable(path)


def save_figure(fig, path: str | Path, *, dpi: int = 130) -> Path:
    """Save a matplotlib Figure to *path* (format from the suffix: .png, .svg, .pdf), atomically."""
    path = check_figure_path(path)
    if _figure_format(path) == "png":
        width, height = (float(v) * dpi for v in fig.get_size_inches())
        if max(width, height) > MAX_PIXELS_PER_SIDE:
            raise FigureSizeError(f"the figure would be {width:,.0f} x {height:,.0f} pixels, more than a PNG can be "
                                  f"drawn ({MAX_PIXELS_PER_SIDE:,} a side); draw fewer devices or schedules, or "
                                  f"write .svg or .pdf")
    _literal_where_math_fails(fig)
    extra = {"pil_kwargs": {"compress_level": 3}} if _figure_format(path) == "png" else {}  # 2x faster than 6
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=_figure_format(path), dpi=dpi, **extra)
    return path


def _literal_where_math_fails(fig) -> None:
    """Draw as typed every text of *fig* that matplotlib would parse as math text but cannot (a ValueError
    from its parser, or a RecursionError on deep nesting), instead of letting savefig raise halfway."""
    from matplotlib import cbook, mathtext
    from matplotlib.text import Text

    parser = None
    for text in fig.findobj(Text):
        content = text.get_text()
        if "$" not in content or not text.get_parse_math() or not cbook.is_math_text(content):
            continue
        parser = parser or mathtext.MathTextParser("path")
        try:
            parser.parse(content)
        except (ValueError, RecursionError):
            text.set_parse_math(False)
