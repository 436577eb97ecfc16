"""Interactive pages: self-contained HTML files that need no server, no install and no network.

- :func:`playground_page`: the schedule playground (``pipesim page playground -o FILE.html``): controls for the
  schedule, K, M, chunks, costs, links and memory; the page simulates with a JavaScript port of the list
  scheduler whose numbers equal ``pipesim simulate``'s (``tests/test_pages_browser.py``).
- :func:`timeline_page`: zoomable Gantt and memory panels of one or more Results on one time axis, with the
  wait before every action split into dependency, communication and gap (``--html`` of ``simulate``,
  ``gantt``, ``validate`` and ``ingest``).
- :func:`sweep_page`: a sweep's utilization curves with hover (``pipesim sweep --html``).

Each page is one file: its JavaScript and CSS (``assets/``, package data) and its data are inlined, and a
Content-Security-Policy forbids it any request. Why a small canvas renderer of our own rather than Plotly or
Bokeh: see ``benchmarks/bench_pages.py`` and the README's "Interactive pages" (page size and redraw time).
"""

from __future__ import annotations

from pathlib import Path

from sim.files import check_writable, write_text
from sim.io.pages.html import PageError

__all__ = ["PageError", "check_page_path", "write_page", "playground_page", "timeline_page", "sweep_page"]

SUFFIXES = (".html", ".htm")


def check_page_path(path: str | Path) -> Path:
    """Refuse, before any work, a page path that does not end in .html or cannot be written."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise PageError(f"cannot write a page to {str(path)!r}: use a file name ending in .html")
    return check_writable(path)


def write_page(text: str, path: str | Path) -> Path:
    """Write the page *text* to *path* (atomically); return the path."""
    return write_text(check_page_path(path), text)


def playground_page(**kwargs) -> str:
    """See :func:`sim.io.pages.playground.playground_page`."""
    from sim.io.pages.playground import playground_page as build  # generating schedules: loaded when asked for

    return build(**kwargs)


def timeline_page(results, **kwargs) -> str:
    """See :func:`sim.io.pages.timelines.timeline_page`."""
    from sim.io.pages.timelines import timeline_page as build

    return build(results, **kwargs)


def sweep_page(df, **kwargs) -> str:
    """See :func:`sim.io.pages.sweeps.sweep_page`."""
    from sim.io.pages.sweeps import sweep_page as build

    return build(df, **kwargs)
