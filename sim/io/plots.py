"""Figures: Gantt timelines, memory over time, and the charts of a sweep.

Every function takes data (a :class:`~sim.results.result.Result`, or the sweep's tidy
DataFrame from :mod:`sim.search.sweep`: those charts live in :mod:`sim.io.sweep_plots` and are
re-exported here) and returns a matplotlib ``Figure``; none of them writes a file
(the commands do, through :mod:`sim.files`).

Units: time in seconds (whatever unit the costs use), drawn in s, ms or µs by the
span of the run; memory in bytes, shown as B / KiB / MiB / GiB by magnitude.

Colours come from one mapping keyed by op (:data:`COLORS`), taken from the
Okabe-Ito palette, which stays distinguishable under the common colour-vision
deficiencies (Okabe & Ito, "Color Universal Design", 2008).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import matplotlib
import matplotlib.colors
import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # no pyplot: figures are plain objects, nothing global, no GUI backend
from matplotlib.patches import Patch

from sim.errors import PipesimError, plot_text

from sim.results.result import Result
from sim.io.sweep_plots import pareto_plot, sweep_heatmap, sweep_memory_plot, sweep_utilization_plot
from sim.io.figures import FigureSizeError
from sim.io.units import byte_unit
from sim.results.timeline import compute_rows, transfer_rows

__all__ = ["COLORS", "gantt", "check_gantt_size", "MAX_GANTT_BOXES", "MAX_GANTT_ROWS",
           "memory_plot", "inflight_over_time", "sweep_utilization_plot", "sweep_heatmap",
           "sweep_memory_plot", "pareto_plot"]

# op -> Okabe-Ito colour; transfers share a hue family with the computation they carry (F -> SEND_F, B -> SEND_B)
COLORS = {
    "F": "#56B4E9",       # sky blue
    "B": "#E69F00",       # orange
    "W": "#009E73",       # bluish green
    "R": "#CC79A7",       # reddish purple
    "U": "#000000",       # black
    "SEND_F": "#0072B2",  # blue
    "SEND_B": "#D55E00",  # vermillion
    "ALLREDUCE": "#F0E442",  # yellow: gradient all-reduce among replicas (sim.engines.replication)
}
_TEXT_COLOR = {"F": "black", "B": "black", "W": "white", "R": "black", "U": "white"}
_NAMES = {"F": "forward F", "B": "backward B", "W": "weight grad W", "R": "recompute R", "U": "update U",
          "SEND_F": "send activation", "SEND_B": "send gradient", "ALLREDUCE": "gradient all-reduce"}
_IDLE = {"facecolor": "white", "edgecolor": "#b0b0b0", "hatch": "////", "linewidth": 0.0}

_FIG_WIDTH = 13.0      # inches
_LEFT, _RIGHT = 0.95, 0.25  # inches of margin left and right of the axes
_FONT = 7.5            # points, box labels

MAX_GANTT_BOXES = 250_000
"""Most actions one Gantt figure draws. Each box is a path matplotlib keeps and rasterizes: K=64, M=1024 1F1B
(131 k boxes) peaks at ~0.3 GB and ~13 s (benchmarks/bench_limits.py), K=512, M=4096 (4.2 M) needed 4.3 GB and
ended in a MemoryError (issue 26.4). Past ~0.25 M boxes a 13-inch figure shows each as less than a pixel
anyway; a Chrome trace (``pipesim simulate --trace``, opened in Perfetto) is the view for runs that large."""

MAX_GANTT_ROWS = 1_024
"""Most device rows one Gantt figure stacks (0.28 inch each: 1,024 rows are ~37,000 pixels tall at 130 dpi,
within the 65,535 Agg draws)."""


# ------------------------------------------------------------------------------------------------ Gantt
def gantt(results: Result | Sequence[Result], *, titles: Sequence[str] | None = None, memory: bool = False,
          transfers: bool = True, labels: str | bool = "auto", time_unit: str = "auto",
          memory_units: str | None = None) -> Figure:
    """A Gantt chart of one or several results stacked on one shared time axis.

    One row per device (device 0 on top), one box per computation, labelled like
    the GPipe paper's figure (``F2,3``: forward of stage 2, micro-batch 3). Idle
    time up to the result's makespan is hatched: that is the bubble. A device that
    holds several model chunks (interleaved, V-shaped) draws chunk 0 in the op's
    full colour and later chunks in lighter tints, so the chunks (and the V) show
    even where a box only has room for its micro-batch. An update that takes no
    time is a black tick. With several iterations, each device's row is marked
    where its next iteration starts; where a schedule holds several weight versions
    (PipeDream), each box names the version its micro-batch uses (``w2``).

    *titles*: one per result (default: the schedule name, plus "(measured)" for
    measured results). *memory*: add a panel under each chart of bytes held per
    device, with the capacity line when the hardware has one; when no result has
    byte sizes, micro-batches in flight per device instead (the axis says so).
    *transfers*: draw transfers as thin bars under each device's row (skipped when
    no transfer takes time; each drawn at least 4 points wide). *labels*: ``"auto"``
    (the richest label style that fits nearly every box of the figure, one style for
    the whole figure; boxes it does not fit stay blank), ``"full"`` (F2,3),
    ``"short"`` (the micro-batch; stage,micro-batch where devices hold several
    chunks) or ``"none"``; ``True`` means "auto" and ``False`` "none". No label ever
    leaves its box. *time_unit*: ``"s"``, ``"ms"``, ``"us"`` or ``"auto"`` (ms below
    one second, us below one millisecond). *memory_units*: what the memory model's amounts count when they are not
    bytes (e.g. ``"micro-batches of activation"``: the synthesis counts units where the costs give no byte sizes);
    the panel is then drawn unscaled and labelled with it.

    A device running replicas of several stages (data parallelism, :mod:`sim.engines.replication`)
    is drawn grouped by stage: the replicas of stage 0 first, then stage 1, ...
    """
    results = [results] if isinstance(results, Result) else list(results)
    if not results:
        raise PipesimError("gantt needs at least one Result; got an empty list")
    if titles is not None and len(titles) != len(results):
        raise PipesimError(f"gantt got {len(titles)} titles for {len(results)} results; give one title per result")
    mode = {True: "auto", False: "none"}.get(labels, labels) if isinstance(labels, bool) else labels
    if mode not in ("auto", "full", "short", "none"):
        raise PipesimError(f"labels={labels!r}; use 'auto', 'full', 'short' or 'none'")

    span = max((float(r.timeline["end"].max()) for r in results if len(r.timeline)), default=0.0) or 1.0
    unit = _time_unit(span, time_unit)
    lanes = [transfers and _has_timed_transfers(r) for r in results]
    row_h = [_row_height(r.schedule.devices) for r in results]
    boxes = [_boxes(r) for r in results]
    handles = _legend_handles(results, boxes, lanes)
    legend_cols = min(len(handles), 8)
    # vertical layout in inches: legend, then per result a title + Gantt (+ memory panel), then the x label
    top, title_h, mem_h, bottom = 0.2 + 0.25 * -(-len(handles) // legend_cols), 0.42, 1.5, 0.55
    heights = []
    for r, h in zip(results, row_h):
        heights.append(max(0.8, r.schedule.devices * h))
        if memory:
            heights.append(mem_h)
    fig_h = top + bottom + sum(heights) + title_h * len(results) + (0.15 * len(results) if memory else 0)
    fig = Figure(figsize=(_FIG_WIDTH, fig_h))
    gap = title_h / (sum(heights) / len(heights))  # hspace is relative to the mean axes height
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=gap,
                            left=_LEFT / _FIG_WIDTH, right=1 - _RIGHT / _FIG_WIDTH,
                            top=1 - (top + title_h) / fig_h, bottom=bottom / fig_h)
    ax_w = _FIG_WIDTH - _LEFT - _RIGHT
    inch_per_s = ax_w / (span * 1.01)
    tier = _label_tier(boxes, row_h, lanes, mode=mode, inch_per_s=inch_per_s)
    in_flight = memory and not any(_memory_top(r) > 0 for r in results)  # no byte sizes: count micro-batches
    axes = []
    first = None
    for i, r in enumerate(results):
        k = i * (2 if memory else 1)
        ax = fig.add_subplot(grid[k], sharex=first)
        first = first or ax
        title = titles[i] if titles is not None else r.schedule.name + ("" if r.source == "simulated" else f" ({r.source})")
        _draw_gantt(ax, r, boxes[i], title=title, lane=lanes[i], tier=tier, unit=unit, inch_per_s=inch_per_s,
                    row_in=row_h[i])
        axes.append(ax)
        if memory:
            mem_ax = fig.add_subplot(grid[k + 1], sharex=first)
            if in_flight:
                _draw_inflight(mem_ax, r, top=max(_inflight_top(x) for x in results))
            else:
                _draw_memory(mem_ax, r, legend=True, top=max(_memory_top(x) for x in results),  # one y scale
                             units=memory_units)
            axes.append(mem_ax)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({unit[1]})")
    first.set_xlim(0, span * 1.01)
    first.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v * unit[0]:g}"))
    fig.legend(handles=handles, loc="upper center", ncol=legend_cols, frameon=False,
               fontsize=9, bbox_to_anchor=(0.5, 1 - 0.04 / fig_h))
    return fig


def _time_unit(span: float, unit: str) -> tuple[float, str]:
    """(factor from seconds, name) of the time axis."""
    units = {"s": (1.0, "s"), "ms": (1e3, "ms"), "us": (1e6, "µs")}
    if unit == "auto":
        unit = "s" if span >= 1.0 else "ms" if span >= 1e-3 else "us"
    if unit not in units:
        raise PipesimError(f"time_unit={unit!r}; use 's', 'ms', 'us' or 'auto'")
    return units[unit]


def _row_height(devices: int) -> float:
    """Inches per device row: roomy for a few devices, tighter for many."""
    return 0.5 if devices <= 4 else 0.38 if devices <= 8 else 0.28


def _has_timed_transfers(r: Result) -> bool:
    t = transfer_rows(r.timeline)
    return bool(len(t)) and bool((t["end"] > t["start"]).any())


def _row_order(r: Result) -> list[int]:
    """Devices top to bottom. Replicated runs (more devices than the placement uses) group a stage's replicas."""
    K = r.schedule.devices
    if K <= max(r.schedule.placement, default=0) + 1:
        return list(range(K))
    comp = compute_rows(r.timeline)
    first_stage = comp.groupby("device")["stage"].min().to_dict()
    return sorted(range(K), key=lambda d: (first_stage.get(d, r.schedule.stages), d))


def _chunk_of_stage(placement: Sequence[int]) -> list[int]:
    """stage -> which of its device's chunks it is (0 for the device's first stage, 1 for its second, ...)."""
    seen: dict[int, int] = {}
    out = []
    for device in placement:
        out.append(seen.get(device, 0))
        seen[device] = out[-1] + 1
    return out


CHUNK_SWATCH = "0.35"
"""The legend's chunk swatches: a grey tinted as each op's colour is per chunk (in the op's own colour, chunk 0
would read as that op: "forward F" and "chunk 0" were one swatch)."""


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """*color* mixed with white by *amount* (0: itself, 1: white)."""
    rgb = np.asarray(matplotlib.colors.to_rgb(color))
    return tuple(rgb + (1.0 - rgb) * amount)


def _text_on(face) -> str:
    """Black or white text, whichever reads better on *face* (relative luminance, WCAG 2.x)."""
    rgb = np.asarray(matplotlib.colors.to_rgb(face))
    lin = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return "black" if lin @ [0.2126, 0.7152, 0.0722] > 0.18 else "white"


def _boxes(r: Result) -> pd.DataFrame:
    """The boxes of one chart: one row per computation that takes time, with its face colour and texts.

    This is the one place that turns actions into boxes: a box that stands for several actions (DualPipeV's
    overlapped forward-backward pair, issue 14.2) gets its colour and its joined texts here.
    """
    comp = compute_rows(r.timeline)
    comp = comp[comp["end"] > comp["start"]]  # a zero-time action draws no box and no label (U: a tick instead)
    s = r.schedule
    chunk_of = _chunk_of_stage(s.placement)
    chunks = max(chunk_of, default=0) + 1
    stage = comp["stage"].to_numpy()
    chunk = np.array([chunk_of[x] if 0 <= x < len(chunk_of) else 0 for x in stage], dtype=int)
    faces = [_tint(COLORS.get(op, "#999999"), 0.6 * c / (chunks - 1) if chunks > 1 else 0.0)
             for op, c in zip(comp["op"], chunk)]
    mb = comp["microbatch"].to_numpy()
    out = pd.DataFrame({
        "device": comp["device"].to_numpy(), "start": comp["start"].to_numpy(), "end": comp["end"].to_numpy(),
        "op": comp["op"].to_numpy(), "chunk": chunk, "face": faces, "text_color": [_text_on(f) for f in faces],
        "full": [f"{o}{st},{m}" for o, st, m in zip(comp["op"], stage, mb)],
        "short": [f"{st},{m}" for st, m in zip(stage, mb)] if chunks > 1 else [str(m) for m in mb],
        "mb": [str(m) for m in mb],
    })
    versions = _weight_versions(r, comp)
    out["version"] = versions if versions is not None else ""
    _join_overlapped(out, s, stage, mb)
    out.attrs["chunks"] = chunks
    return out


_OVERLAP_FACE = tuple((np.array(matplotlib.colors.to_rgb(COLORS["F"])) + matplotlib.colors.to_rgb(COLORS["B"])) / 2)
"""An overlapped pair's colour: halfway between forward and backward."""


def _join_overlapped(boxes: pd.DataFrame, schedule, stage: np.ndarray, mb: np.ndarray) -> None:
    """An overlapped forward-backward pair is one box: its forward's row spans the pair (its backward's row takes
    no time and draws nothing), labelled with both halves and coloured between F and B."""
    pairs = {(f.stage, f.mb): b for f, b in schedule.overlapped}
    if not pairs:
        return
    mixed = _OVERLAP_FACE
    for i in np.flatnonzero(boxes["op"].astype(str).to_numpy() == "F"):
        b = pairs.get((int(stage[i]), int(mb[i])))
        if b is None:
            continue
        boxes.at[boxes.index[i], "face"] = mixed
        boxes.at[boxes.index[i], "text_color"] = _text_on(mixed)
        boxes.at[boxes.index[i], "full"] = f"F{stage[i]},{mb[i]}+B{b.stage},{b.mb}"
        short = boxes.at[boxes.index[i], "short"]
        boxes.at[boxes.index[i], "short"] = f"{short}+{b.stage},{b.mb}" if "," in short else f"{short}+{b.mb}"
        boxes.at[boxes.index[i], "mb"] = f"{mb[i]}+{b.mb}"


def _weight_versions(r: Result, comp: pd.DataFrame) -> list[str] | None:
    """Per box, 'w<k>': the weight version its micro-batch uses on that stage (k updates of the stage before its
    forward; the backward uses the forward's version: weight stashing). None unless some stage updates its
    weights while a micro-batch is between its forward and backward there (PipeDream): else one version is
    held at a time and the label would say nothing."""
    tl = compute_rows(r.timeline)
    u = tl[tl["op"] == "U"]
    if not len(u):
        return None
    updates = {st: np.sort(rows["end"].to_numpy()) for st, rows in u.groupby("stage")}
    key = ["stage", "microbatch", "iteration"]
    forwards = tl[tl["op"] == "F"].drop_duplicates(key).set_index(key)["start"]
    backwards = tl[tl["op"] == "B"].drop_duplicates(key).set_index(key)["start"]
    span = pd.concat([forwards.rename("f"), backwards.rename("b")], axis=1).dropna()
    used = {k: int(np.searchsorted(updates.get(k[0], np.empty(0)), f, side="right")) for k, f in span["f"].items()}
    stashed = any(int(np.searchsorted(updates.get(k[0], np.empty(0)), b, side="right")) > used[k]
                  for k, b in span["b"].items())
    if not stashed:
        return None
    return ["" if op == "U" else f"w{used.get((st, m, it), 0)}"
            for op, st, m, it in zip(comp["op"], comp["stage"], comp["microbatch"], comp["iteration"])]


def _text_width_in(text: str, points: float) -> float:
    """Width of *text* in inches, from DejaVu Sans' advance widths (digits and capitals ~0.64 em, comma 0.32 em)."""
    return sum(0.32 if c in ",." else 0.64 for c in text) * points / 72


# label styles, richest first: (column of _boxes, font size in points)
_TIERS = {"full": [("full", _FONT), ("full", 6.3), ("full", 5.5)],
          "short": [("short", _FONT), ("short", 6.3), ("short", 5.5)],
          "auto": [("full", _FONT), ("full", 6.3), ("short", _FONT), ("short", 6.3), ("mb", _FONT), ("mb", 6.3)]}


def _fits(boxes: pd.DataFrame, column: str, points: float, inch_per_s: float) -> np.ndarray:
    width = (boxes["end"] - boxes["start"]).to_numpy() * inch_per_s
    need = np.array([_text_width_in(t, points) for t in boxes[column]]) + 0.03
    return width >= need


def _label_tier(all_boxes: list[pd.DataFrame], row_h: list[float], lanes: list[bool], *, mode: str,
                inch_per_s: float) -> tuple[str, float] | None:
    """One label style for the whole figure: the richest that fits at least 90% of the boxes ("auto"),
    or the requested one at the largest font that fits as many boxes as any (full, short)."""
    if mode == "none":
        return None
    rows_ok = [b for b, h, lane in zip(all_boxes, row_h, lanes) if h * (0.62 if lane else 0.8) >= _FONT / 72 * 1.15]
    boxes = pd.concat(rows_ok, ignore_index=True) if rows_ok else None
    if boxes is None or not len(boxes):
        return None
    best, best_share = None, -1.0
    for column, points in _TIERS[mode]:
        share = float(_fits(boxes, column, points, inch_per_s).mean())
        if mode == "auto" and share >= 0.9:
            return column, points
        if share > best_share + 1e-9:
            best, best_share = (column, points), share
    return best if mode != "auto" and best_share > 0 else None


def check_gantt_size(actions: int, rows: int, *, at_least: bool = False) -> None:
    """Refuse, before anything is drawn (or simulated, with *at_least*: a lower bound from the flags), a Gantt
    figure of more than :data:`MAX_GANTT_BOXES` actions or :data:`MAX_GANTT_ROWS` device rows, saying what fits."""
    about = "at least " if at_least else ""
    if actions > MAX_GANTT_BOXES:
        raise FigureSizeError(
            f"a Gantt chart of {about}{actions:,} actions is more than one figure can draw (up to "
            f"{MAX_GANTT_BOXES:,}, e.g. 1F1B with K x M up to {MAX_GANTT_BOXES // 2:,}: K=64, M=1024); draw fewer "
            f"devices or micro-batches, or write a Chrome trace (pipesim simulate --trace FILE.json) for Perfetto")
    if rows > MAX_GANTT_ROWS:
        raise FigureSizeError(f"a Gantt chart of {rows:,} device rows is taller than a figure can be drawn (up to "
                              f"{MAX_GANTT_ROWS:,} rows in all); draw fewer devices or schedules")


def _draw_gantt(ax, r: Result, boxes: pd.DataFrame, *, title: str, lane: bool, tier, unit, inch_per_s: float,
                row_in: float) -> None:
    s, m, tl = r.schedule, r.metrics, r.timeline
    K = s.devices
    order = _row_order(r)
    row_of = np.empty(max(K, 1), dtype=int)
    row_of[order] = np.arange(K)  # device -> its row, top to bottom
    bar = (0.06, 0.62) if lane else (0.1, 0.8)  # (offset in the row, height) of the compute bars
    makespan = m.makespan
    # the bubble: hatched background under every device's compute bar, up to this result's makespan
    if makespan > 0:
        for row in range(K):
            ax.broken_barh([(0, makespan)], (row + bar[0], bar[1]), zorder=1, **_IDLE)
    if len(boxes):
        for (device, face), rows in boxes.groupby(["device", "face"], sort=False):
            xs = list(zip(rows["start"], rows["end"] - rows["start"]))
            ax.broken_barh(xs, (row_of[device] + bar[0], bar[1]), facecolor=face, edgecolor="white",
                           linewidth=0.4, zorder=2)
    _draw_free_updates(ax, tl, row_of, bar)
    if lane:
        _draw_transfer_lanes(ax, tl, row_of, bar_end=bar[0] + bar[1], min_width=_MIN_TRANSFER_IN / inch_per_s)
    if tier is not None and len(boxes):
        _label_boxes(ax, boxes, row_of, tier=tier, inch_per_s=inch_per_s, bar=bar, bar_in=bar[1] * row_in)
    if s.iterations > 1:
        _draw_iteration_marks(ax, tl, row_of, bar)
    if not len(tl):
        ax.text(0.5, 0.5, "no actions in this timeline", transform=ax.transAxes, ha="center", va="center",
                color="0.4")
    ax.set_ylim(K + (0.3 if s.iterations > 1 else 0.0), 0)  # a strip under the rows for the iteration names
    grouped = order != list(range(K))
    stage_of = compute_rows(tl).groupby("device")["stage"].min().to_dict() if grouped else {}
    names = [f"device {d}" + (f"\nstage {stage_of[d]}" if d in stage_of else "") for d in order]
    ax.set_yticks([row + bar[0] + bar[1] / 2 for row in range(K)], names, fontsize=8 if K <= 8 else 7)
    if grouped:  # a thin line between the groups of replicas of one stage
        for row in range(1, K):
            if stage_of.get(order[row]) != stage_of.get(order[row - 1]):
                ax.axhline(row - 0.02, color="0.55", linewidth=0.8, zorder=0)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="0.9", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    head = f"{plot_text(title)}: K={K}, M={s.microbatches}"  # a schedule's name is the user's: drawn as typed
    if s.stages != K and not grouped:
        head += f", S={s.stages} ({s.stages // K} chunks per device)"
    if s.iterations != 1:
        head += f", {s.iterations} iterations"
    note = r.notes[0] if r.notes else None  # e.g. how a measured run was taken: on its own line under the title,
    # since beside it a long note ran into the title
    ax.set_title(f"{head}  |  bubble {m.bubble_fraction:.1%}, utilization {m.utilization:.1%}, "
                 f"makespan {m.makespan * unit[0]:.4g} {unit[1]}", loc="left", fontsize=10, pad=14 if note else 6)
    if note:
        ax.text(0.0, 1.01, plot_text(textwrap.shorten(note, 190, placeholder=" ...")), transform=ax.transAxes, ha="left",
                va="bottom", fontsize=7, color="0.35")


_MIN_TRANSFER_IN = 4.0 / 72  # a transfer is drawn at least 4 points wide, so a short all-reduce or send still shows


def _draw_free_updates(ax, tl: pd.DataFrame, row_of, bar) -> None:
    """An update U that takes no time: a black tick across the bar, with a small triangle above."""
    comp = compute_rows(tl)
    free = comp[(comp["op"] == "U") & (comp["end"] <= comp["start"])]
    if not len(free):
        return
    rows = row_of[free["device"].to_numpy()]
    ax.vlines(free["start"].to_numpy(), rows + bar[0], rows + bar[0] + bar[1], colors=COLORS["U"], linewidth=1.6,
              zorder=4)
    ax.scatter(free["start"].to_numpy(), rows + bar[0], marker="v", s=14, color=COLORS["U"], zorder=4,
               clip_on=False)


def _draw_iteration_marks(ax, tl: pd.DataFrame, row_of, bar) -> None:
    """Where each device starts iteration i >= 1: a dashed line across its row, named under the bottom row
    (the axis keeps a strip there for the names)."""
    comp = compute_rows(tl)
    firsts = comp[comp["iteration"] > 0].groupby(["iteration", "device"])["start"].min()
    bottom = int(np.max(row_of))
    for (it, device), t in firsts.items():
        row = row_of[device]
        ax.plot([t, t], [row + bar[0] - 0.06, row + bar[0] + bar[1] + 0.06], color="#333333",
                linestyle=(0, (2, 1.5)), linewidth=1.3, zorder=5)
        if row == bottom:
            ax.text(t, bottom + 0.93, f"iteration {it} \u2192", fontsize=7, color="#333333", ha="left", va="top",
                    zorder=5)


def _draw_transfer_lanes(ax, tl: pd.DataFrame, row_of, *, bar_end: float, min_width: float) -> None:
    """Transfers as thin bars under the sender's row, one sub-lane per destination device."""
    tr = transfer_rows(tl)
    lane_top, lane_h = bar_end + 0.04, 0.94 - bar_end - 0.04
    for src, rows in tr.groupby("src"):
        dsts = sorted(rows["dst"].unique())
        h = lane_h / len(dsts)
        for j, dst in enumerate(dsts):
            for op, orows in rows[rows["dst"] == dst].groupby("op"):
                widths = np.maximum((orows["end"] - orows["start"]).to_numpy(), min_width)
                pale = op == "ALLREDUCE"  # yellow needs an edge to show on white
                ax.broken_barh(list(zip(orows["start"], widths)), (row_of[src] + lane_top + j * h, h * 0.9),
                               facecolor=COLORS.get(op, "gray"), edgecolor="0.25" if pale else "none",
                               linewidth=0.5 if pale else 0, zorder=2)


def _label_boxes(ax, boxes: pd.DataFrame, row_of, *, tier: tuple[str, float], inch_per_s: float, bar,
                 bar_in: float) -> None:
    """Write each box's label in the figure's one style; a box it does not fit stays blank. With weight
    versions, a second line names the version where the box is tall and wide enough."""
    column, points = tier
    fits = _fits(boxes, column, points, inch_per_s)
    mids = ((boxes["start"] + boxes["end"]) / 2).to_numpy()
    ys = row_of[boxes["device"].to_numpy()] + bar[0] + bar[1] / 2
    two_lines = bar_in >= 2.4 * points / 72
    for i in np.flatnonzero(fits):
        text = boxes[column].iat[i]
        version = boxes["version"].iat[i]
        if version and two_lines and (boxes["end"].iat[i] - boxes["start"].iat[i]) * inch_per_s >= \
                _text_width_in(version, points - 1) + 0.03:
            text = f"{text}\n{version}"
        ax.text(mids[i], ys[i], text, ha="center", va="center", fontsize=points, linespacing=0.95,
                color=boxes["text_color"].iat[i], zorder=3, clip_on=True)


def _legend_handles(results: Sequence[Result], boxes: list[pd.DataFrame], lanes: list[bool]) -> list:
    present: set[str] = set()
    chunks = 1
    free_update = False
    for r, b, lane in zip(results, boxes, lanes):
        present |= set(b["op"])
        chunks = max(chunks, b.attrs.get("chunks", 1))
        if lane:
            present |= set(transfer_rows(r.timeline)["op"])
        comp = compute_rows(r.timeline)
        free_update |= bool(((comp["op"] == "U") & (comp["end"] <= comp["start"])).any())
    handles = [Patch(facecolor=COLORS[op], label=_NAMES[op]) for op in COLORS if op in present]
    if free_update:
        handles.append(matplotlib.lines.Line2D([], [], color=COLORS["U"], marker="v", markersize=5, linewidth=1.6,
                                               label="update U (no time)"))
    if any(r.schedule.overlapped for r in results):
        handles.append(Patch(facecolor=_OVERLAP_FACE, label="overlapped F+B pair (one unit)"))
    if any((b["version"] != "").any() for b in boxes):
        handles.append(Patch(facecolor="white", edgecolor="0.6", linewidth=0.4,
                             label="wk: weight version used (k updates before)"))
    if chunks > 1:  # the shades every op takes, chunk 0 to the last: grey, so no swatch reads as one op's colour
        handles += [Patch(facecolor=_tint(CHUNK_SWATCH, 0.6 * c / (chunks - 1)), edgecolor="0.6", linewidth=0.4,
                          label=f"chunk {c}") for c in range(chunks)]
    handles.append(Patch(**_IDLE, label="idle (bubble)"))
    return handles


# ----------------------------------------------------------------------------------------------- memory
def _memory_top(r: Result) -> float:
    """The highest byte count a memory panel of *r* must show (usage or capacity)."""
    usage, cap = r.memory.usage, r.memory.capacity
    return max([float(usage["bytes"].max()) if len(usage) else 0.0] + ([cap] if cap else []))


def inflight_over_time(timeline: pd.DataFrame) -> pd.DataFrame:
    """Micro-batches whose activations a device holds, over time: columns device, time, count (a step function).

    Held from the start of F(s, m) to the end of its W when the backward is split, else of its B, as
    :mod:`sim.results.memory` counts activations; frees before allocations at equal times. Its maximum per device
    is ``metrics.peak_inflight``.
    """
    comp = compute_rows(timeline)
    key = ["stage", "microbatch", "iteration"]
    f = comp[comp["op"] == "F"]
    release = comp[comp["op"].isin(["B", "W"])].sort_values("op").drop_duplicates(key, keep="last")  # W after B
    events = pd.concat([
        pd.DataFrame({"device": f["device"], "time": f["start"], "delta": 1}),
        pd.DataFrame({"device": release["device"], "time": release["end"], "delta": -1}),
    ], ignore_index=True).sort_values(["device", "time", "delta"], kind="stable")
    events["count"] = events.groupby("device")["delta"].cumsum()
    return events.drop_duplicates(["device", "time"], keep="last")[["device", "time", "count"]].reset_index(drop=True)


def _inflight_top(r: Result) -> float:
    usage = inflight_over_time(r.timeline)
    return float(usage["count"].max()) if len(usage) else 1.0


def _draw_steps(ax, r: Result, usage: pd.DataFrame, column: str, scale: float) -> None:
    K = r.schedule.devices
    end = max(r.metrics.makespan, float(usage["time"].max()) if len(usage) else 0.0)
    cmap = matplotlib.colormaps["viridis"]
    for d in range(K):
        u = usage[usage["device"] == d]
        if not len(u):
            continue
        t = np.append(np.insert(u["time"].to_numpy(), 0, 0.0), end)
        b = np.concatenate([[0.0 if column == "count" else u[column].iat[0]], u[column].to_numpy(),
                            [u[column].to_numpy()[-1]]]) / scale
        ax.step(t, b, where="post", color=cmap(d / max(K - 1, 1) * 0.9), linewidth=1.2, label=f"device {d}")
    ax.set_xlim(0, end * 1.01 or 1.0)
    ax.grid(color="0.9", linewidth=0.6)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _panel_legend(ax, entries: int) -> None:
    """One line above the panel, in the gap under the Gantt (whose x labels are hidden)."""
    if entries <= 17 and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6.5, ncol=entries, loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False,
                  handlelength=1.4, columnspacing=1.0, borderaxespad=0.2)


def _draw_inflight(ax, r: Result, *, top: float) -> None:
    """Micro-batches in flight per device: the memory panel when the costs give no byte sizes."""
    _draw_steps(ax, r, inflight_over_time(r.timeline), "count", 1.0)
    ax.set_ylabel("micro-batches in flight\n(no byte sizes given)", fontsize=7.5)
    ax.set_ylim(0, top * 1.08 or 1.0)
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    _panel_legend(ax, r.schedule.devices)


def _draw_memory(ax, r: Result, *, legend: bool, top: float | None = None, units: str | None = None) -> None:
    """Step lines of bytes per device; *top*: the y range to use (shared by stacked panels), in bytes. *units*: the
    amounts are counts of these, not bytes (drawn unscaled, the label says what they count)."""
    usage, cap = r.memory.usage, r.memory.capacity
    top = _memory_top(r) if top is None else top
    scale, unit = (1.0, None) if units else byte_unit(top)
    _draw_steps(ax, r, usage.drop_duplicates(["device", "time"], keep="last"), "bytes", scale)
    if cap:
        ax.axhline(cap / scale, color="#D55E00", linestyle="--", linewidth=1.2, label="capacity")
    for o in r.memory.overflows:
        ax.plot([o.peak_time], [(cap + o.excess_bytes) / scale], marker="x", color="#D55E00", markersize=8)
    ax.set_ylabel(f"memory ({unit})" if units is None else f"memory\n({units})", fontsize=8 if units is None else 7)
    ax.set_ylim(0, top / scale * 1.05 or 1.0)
    if legend:
        _panel_legend(ax, r.schedule.devices + (1 if cap else 0))


def memory_plot(result: Result) -> Figure:
    """Bytes held by every device over time (step functions), with the capacity line and overflows marked."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.add_subplot()
    _draw_memory(ax, result, legend=False)
    K = result.schedule.devices
    if K <= 16 and len(result.memory.usage):
        ax.legend(fontsize=7, ncol=1 if K <= 8 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("time (s)")
    peaks = ", ".join(f"{p / byte_unit(max(result.metrics.peak_memory))[0]:.3g}" for p in result.metrics.peak_memory[:8])
    unit = byte_unit(max(result.metrics.peak_memory or [0.0]))[1]
    s = result.schedule
    ax.set_title(f"{plot_text(s.name)}: memory per device, K={K}, M={s.microbatches}  |  peak per device ({unit}): {peaks}"
                 + (" ..." if K > 8 else ""), loc="left", fontsize=10)
    if result.memory.overflows:
        ax.text(0.0, -0.2, f"{len(result.memory.overflows)} device(s) over capacity (x marks the peak)",
                transform=ax.transAxes, color="#D55E00", fontsize=8)
    return fig
