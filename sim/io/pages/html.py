"""One self-contained HTML file: the page's CSS and JavaScript inlined from this package's ``assets/``, its data
inlined as the text of :func:`sim.io.pages.payload.pack`, and a Content-Security-Policy that forbids the page
any request (``default-src 'none'``): the browser itself guarantees that the page works offline and sends
nothing anywhere. Nothing in the assets refers to a network address (``tests/test_pages.py`` checks).
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources

from sim.errors import PipesimError

__all__ = ["render", "asset", "PageError"]


class PageError(PipesimError):
    """A page that cannot be made or written (e.g. an output name that is not .html, a grid too large)."""


# every script runs from the page itself; images only as data: URLs (canvas screenshots); no connection of any kind
_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
           "connect-src 'none'; base-uri 'none'; form-action 'none'")


@cache
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (package data, installed with the code)."""
    text = resources.files("sim.io.pages").joinpath("assets", name).read_text(encoding="utf-8")
    if "</script" in text.lower():  # would end the inline <script> early
        raise ValueError(f"asset {name} contains '</script', which cannot be inlined")
    return text


def render(*, title: str, heading: str, scripts: list[str], payload: str, start: str, intro: str = "") -> str:
    """The page: *scripts* (asset names, in order) inlined, *payload* in a data element, *start* (a JavaScript
    expression taking the root element and the data element's id, returning a Promise of the page's API) run
    once loaded; its API becomes ``window.pipesim`` (with ``loaded: true``), an error is shown in the page and
    in the console."""
    js = "\n".join(asset(name) for name in scripts)
    boot = f"""
(function () {{
  "use strict";
  const root = document.getElementById("ps-root");
  window.pipesim = {{loaded: false}};
  window.pipesim.ready = ({start})(root, "ps-data").then((api) => {{
    Object.assign(window.pipesim, api, {{loaded: true}});
    document.body.classList.add("ps-loaded");
    return window.pipesim;
  }}, (error) => {{
    root.prepend(Object.assign(document.createElement("p"), {{className: "ps-error", textContent: String(error)}}));
    window.pipesim.error = String(error);
    console.error(error);
    throw error;
  }});
}})();"""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{_POLICY}">
<link rel="icon" href="data:,">
<title>{html.escape(title)}</title>
<style>
{asset("style.css")}
</style>
</head>
<body>
<header class="ps-header"><h1>{html.escape(heading)}</h1>{intro}</header>
<main id="ps-root"></main>
<script type="application/octet-stream" id="ps-data">{payload}</script>
<script>
{js}
{boot}
</script>
</body>
</html>
"""
