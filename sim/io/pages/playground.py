"""The schedule playground: every generated schedule of a grid of (schedule, K, M, chunks), as data for the page.

The page (``assets/playground.js``) evaluates times itself with a port of the list scheduler
(``assets/engine.js``), so a student moves a slider and sees the Gantt, the memory and the figures change at
once, offline. What it cannot compute is the order of actions: that is what sim.schedules generates, and what
this module embeds, per schedule and shape: the per-device key lists (:mod:`sim.core.keys`'s codec), where
each device's list starts, the stage -> device placement and the overlapped pairs. A shape that pipesim
refuses (interleaved 1F1B with M not a multiple of K, DualPipeV with M < 2K, ...) is embedded as the refusal's
own message, so the page says why instead of drawing nothing.

    from sim.io.pages import playground_page
    playground_page(max_devices=8, max_microbatches=32)   # the HTML text
"""

from __future__ import annotations

import sys

import numpy as np

from sim import schedules
from sim.errors import PipesimError
from sim.io.pages.html import PageError, render
from sim.io.pages.payload import pack
from sim.schedules import registry

__all__ = ["playground_document", "playground_page", "MAX_DEVICES", "MAX_MICROBATCHES", "INTERLEAVED_CHUNKS"]

MAX_DEVICES = 16
"""The largest K a playground may embed: the page's size grows with K x M x schedules (about 1 MB at 16 x 64)."""
MAX_MICROBATCHES = 64
INTERLEAVED_CHUNKS = (2, 3, 4)
"""Chunks per device offered for schedules that take any number (Megatron's interleaving: 2 is its smallest)."""

DEFAULTS = {"schedule": "1f1b", "compare": "gpipe", "K": 4, "M": 8, "forward": 1.0, "backward": 2.0, "weight": 0.0,
            "latency": 0.0, "activation_bytes": 0.0, "weight_bytes": 0.0}


def _chunk_options(name: str) -> list[int]:
    generator = registry.get_generator(name)
    fixed = getattr(generator, "CHUNKS", 1)
    return [fixed] if fixed else list(INTERLEAVED_CHUNKS)


def playground_document(*, max_devices: int = 8, max_microbatches: int = 32) -> dict:
    """The playground's data: schedules, the grid, every schedule of it as columns, and the refusals."""
    if not 1 <= max_devices <= MAX_DEVICES:
        raise PageError(f"the playground embeds K from 1 to at most {MAX_DEVICES}, got {max_devices}")
    if not 1 <= max_microbatches <= MAX_MICROBATCHES:
        raise PageError(f"the playground embeds M from 1 to at most {MAX_MICROBATCHES}, got {max_microbatches}")
    names = registry.names()
    devices, micro = list(range(1, max_devices + 1)), list(range(1, max_microbatches + 1))
    parts: dict[str, list[np.ndarray]] = {"keys": [], "starts": [], "fused": [], "placement": []}
    at = dict.fromkeys(parts, 0)  # where the next schedule's values start in each column
    entries, refused, info = [], {}, []
    for n, name in enumerate(names):
        generator = registry.get_generator(name)
        options = _chunk_options(name)
        info.append({"name": name, "summary": generator.SUMMARY, "source": generator.SOURCE,
                     "bubble": generator.BUBBLE, "memory": generator.MEMORY, "chunks": options,
                     "default_chunks": registry.default_chunks(name),
                     "variable_chunks": not getattr(generator, "CHUNKS", 1)})
        for K in devices:
            for M in micro:
                for chunks in options:
                    try:
                        s = schedules.generate(name, K, M, chunks=chunks)
                    except PipesimError as exc:  # pipesim's own refusal: the page shows it
                        refused[f"{name}|{K}|{M}|{chunks}"] = str(exc)
                        continue
                    # [schedule, K, M, chunks, S, keys at, keys, starts at, fused at, fused, placement at]
                    entries.append([n, K, M, chunks, s.stages, at["keys"], len(s.keys_array), at["starts"],
                                    at["fused"], len(s.fused), at["placement"]])
                    for part, values in (("keys", s.keys_array), ("starts", s.device_start - s.device_start[0]),
                                         ("fused", s.fused), ("placement", np.asarray(s.placement))):
                        parts[part].append(values)
                        at[part] += len(values)
    dtypes = {"keys": np.int32, "starts": np.int32, "fused": np.int32, "placement": np.int16}
    return {
        "kind": "playground",
        # the page adds busy times as this Python's sum() does (compensated from 3.12 on): the same floats
        "python": {"version": sys.version.split()[0], "compensated_sum": sys.version_info >= (3, 12)},
        "defaults": DEFAULTS | {"K": min(DEFAULTS["K"], max_devices), "M": min(DEFAULTS["M"], max_microbatches)},
        "schedules": info, "K": devices, "M": micro, "entries": entries, "refused": refused,
        # every schedule's arrays end to end; entries say where each one's start (see assets/playground.js, Grid)
        "columns": {name: np.concatenate(values).astype(dtypes[name]) if values else np.zeros(0, dtypes[name])
                    for name, values in parts.items()},
    }


_INTRO = ("<p>Pick a schedule, the number of devices K and micro-batches M, and the costs: the page simulates it "
          "with pipesim's list scheduler (ported to JavaScript, the same numbers as <code>pipesim simulate</code>) "
          "and draws where every device computes and where it waits. Everything runs in this page; it needs no "
          "network and no install.</p>")


def playground_page(*, max_devices: int = 8, max_microbatches: int = 32) -> str:
    """The playground as one self-contained HTML text."""
    doc = playground_document(max_devices=max_devices, max_microbatches=max_microbatches)
    return render(title="pipesim playground", heading="Pipeline schedule playground",
                  scripts=["data.js", "engine.js", "closed_forms.js", "timeline.js", "playground.js"],
                  payload=pack(doc), start="PS.playground.start", intro=_INTRO)
