"""Figures: Gantt timelines, memory over time, and the charts of a sweep.

Every function takes data (a :class:`~sim.result.Result`, or the sweep's tidy
DataFrame from :mod:`sim.sweep`) and returns a matplotlib ``Figure``; none of them
writes a file (the commands do, with ``fig.savefig``).

Units: time in seconds on every x axis (whatever unit the costs use), memory in
bytes, shown as B / KiB / MiB / GiB by magnitude.

Colours come from one mapping keyed by op (:data:`COLORS`), taken from the
Okabe-Ito palette, which stays distinguishable under the common colour-vision
deficiencies (Okabe & Ito, "Color Universal Design", 2008).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # no pyplot: figures are plain objects, nothing global, no GUI backend
from matplotlib.patches import Patch

from .result import Result
from .timeline import compute_rows, transfer_rows

__all__ = ["COLORS", "gantt", "memory_plot", "sweep_utilization_plot", "sweep_heatmap", "sweep_memory_plot",
           "closed_form_utilization"]

# op -> Okabe-Ito colour; transfers share a hue family with the computation they carry (F -> SEND_F, B -> SEND_B)
COLORS = {
    "F": "#56B4E9",       # sky blue
    "B": "#E69F00",       # orange
    "W": "#009E73",       # bluish green
    "R": "#CC79A7",       # reddish purple
    "U": "#000000",       # black
    "SEND_F": "#0072B2",  # blue
    "SEND_B": "#D55E00",  # vermillion
    "ALLREDUCE": "#F0E442",  # yellow: gradient all-reduce among replicas (sim.replication)
}
_TEXT_COLOR = {"F": "black", "B": "black", "W": "white", "R": "black", "U": "white"}
_NAMES = {"F": "forward F", "B": "backward B", "W": "weight grad W", "R": "recompute R", "U": "update U",
          "SEND_F": "send activation", "SEND_B": "send gradient", "ALLREDUCE": "gradient all-reduce"}
_IDLE = {"facecolor": "white", "edgecolor": "#b0b0b0", "hatch": "////", "linewidth": 0.0}

_FIG_WIDTH = 13.0      # inches
_LEFT, _RIGHT = 0.95, 0.25  # inches of margin left and right of the axes
_FONT = 7.5            # points, box labels


def closed_form_utilization(devices, microbatches):
    """GPipe's utilization for uniform stages, 1 - (K-1)/(M+K-1) (Huang et al., GPipe, NeurIPS 2019, sec. 2.3)."""
    K = np.asarray(devices, dtype=float)
    M = np.asarray(microbatches, dtype=float)
    return 1.0 - (K - 1.0) / (M + K - 1.0)


# ------------------------------------------------------------------------------------------------ Gantt
def gantt(results: Result | Sequence[Result], *, titles: Sequence[str] | None = None, memory: bool = False,
          transfers: bool = True, labels: str | bool = "auto") -> Figure:
    """A Gantt chart of one or several results stacked on one shared time axis.

    One row per device (device 0 on top), one box per computation, labelled like
    the GPipe paper's figure (``F2,3``: forward of stage 2, micro-batch 3). Idle
    time up to the result's makespan is hatched: that is the bubble.

    *titles*: one per result (default: the schedule name, plus "(measured)" for
    measured results). *memory*: add a panel of bytes held per device under each
    chart, with the capacity line when the hardware has one. *transfers*: draw
    transfers as thin bars under each device's row (skipped when no transfer
    takes time). *labels*: ``"auto"`` (full label where it fits, the micro-batch
    alone where only that fits, nothing where the box is too small), ``"full"``,
    ``"short"`` or ``"none"``; ``True`` means "auto" and ``False`` "none".
    """
    results = [results] if isinstance(results, Result) else list(results)
    if not results:
        raise ValueError("gantt needs at least one Result; got an empty list")
    if titles is not None and len(titles) != len(results):
        raise ValueError(f"gantt got {len(titles)} titles for {len(results)} results; give one title per result")
    mode = {True: "auto", False: "none"}.get(labels, labels) if isinstance(labels, bool) else labels
    if mode not in ("auto", "full", "short", "none"):
        raise ValueError(f"labels={labels!r}; use 'auto', 'full', 'short' or 'none'")

    span = max((float(r.timeline["end"].max()) for r in results if len(r.timeline)), default=0.0) or 1.0
    lanes = [transfers and _has_timed_transfers(r) for r in results]
    row_h = [_row_height(r.schedule.devices) for r in results]
    # vertical layout in inches: legend, then per result a title + Gantt (+ memory panel), then the x label
    top, title_h, mem_h, bottom = 0.45, 0.42, 1.5, 0.55
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
    axes = []
    first = None
    for i, r in enumerate(results):
        k = i * (2 if memory else 1)
        ax = fig.add_subplot(grid[k], sharex=first)
        first = first or ax
        title = titles[i] if titles is not None else r.schedule.name + ("" if r.source == "simulated" else f" ({r.source})")
        _draw_gantt(ax, r, title=title, span=span, lane=lanes[i], mode=mode,
                    ax_w=_FIG_WIDTH - _LEFT - _RIGHT, ax_h=heights[k])
        axes.append(ax)
        if memory:
            mem_ax = fig.add_subplot(grid[k + 1], sharex=first)
            _draw_memory(mem_ax, r, legend=True, top=max(_memory_top(x) for x in results))  # one y scale
            axes.append(mem_ax)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel("time (s)")
    first.set_xlim(0, span * 1.01)

    present = set()
    for r, lane in zip(results, lanes):
        comp = compute_rows(r.timeline)
        ops = set(comp.loc[comp["end"] > comp["start"], "op"])  # a zero-time op (e.g. free updates) shows nothing
        if lane:
            ops |= set(transfer_rows(r.timeline)["op"])
        present |= ops
    handles = [Patch(facecolor=COLORS[op], label=_NAMES[op]) for op in COLORS if op in present]
    handles.append(Patch(**_IDLE, label="idle (bubble)"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1 - 0.08 / fig_h))
    return fig


def _row_height(devices: int) -> float:
    """Inches per device row: roomy for a few devices, tighter for many."""
    return 0.5 if devices <= 4 else 0.38 if devices <= 8 else 0.28


def _has_timed_transfers(r: Result) -> bool:
    t = transfer_rows(r.timeline)
    return bool(len(t)) and bool((t["end"] > t["start"]).any())


def _draw_gantt(ax, r: Result, *, title: str, span: float, lane: bool, mode: str, ax_w: float, ax_h: float) -> None:
    s, m, tl = r.schedule, r.metrics, r.timeline
    K = s.devices
    bar = (0.06, 0.62) if lane else (0.1, 0.8)  # (offset in the row, height) of the compute bars
    makespan = m.makespan
    # the bubble: hatched background under every device's compute bar, up to this result's makespan
    for d in range(K):
        if makespan > 0:
            ax.broken_barh([(0, makespan)], (d + bar[0], bar[1]), zorder=1, **_IDLE)
    comp = compute_rows(tl)
    for op, rows in comp.groupby("op", sort=False):
        for d, drow in rows.groupby("device"):
            xs = list(zip(drow["start"], drow["end"] - drow["start"]))
            ax.broken_barh(xs, (d + bar[0], bar[1]), facecolor=COLORS.get(op, "gray"), edgecolor="white",
                           linewidth=0.4, zorder=2)
    if lane:
        _draw_transfer_lanes(ax, tl, bar_end=bar[0] + bar[1])
    if mode != "none" and len(comp):
        _label_boxes(ax, comp, mode=mode, inch_per_s=ax_w / (span * 1.01),
                     bar_in=bar[1] * ax_h / max(K, 1), bar=bar)
    if not len(tl):
        ax.text(0.5, 0.5, "no actions in this timeline", transform=ax.transAxes, ha="center", va="center",
                color="0.4")
    ax.set_ylim(K, 0)
    ax.set_yticks([d + bar[0] + bar[1] / 2 for d in range(K)], [f"device {d}" for d in range(K)],
                  fontsize=8 if K <= 8 else 7)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="0.9", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    head = f"{title}: K={K}, M={s.microbatches}"
    if s.stages != K:
        head += f", S={s.stages}"
    if s.iterations != 1:
        head += f", {s.iterations} iterations"
    ax.set_title(f"{head}  |  bubble {m.bubble_fraction:.1%}, utilization {m.utilization:.1%}, "
                 f"makespan {m.makespan:.4g} s", loc="left", fontsize=10)
    for note in r.notes[:1]:
        ax.text(1.0, 1.01, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="0.35")


def _draw_transfer_lanes(ax, tl: pd.DataFrame, *, bar_end: float) -> None:
    """Transfers as thin bars under the sender's row, one sub-lane per destination device."""
    tr = transfer_rows(tl)
    lane_top, lane_h = bar_end + 0.04, 0.94 - bar_end - 0.04
    for src, rows in tr.groupby("src"):
        dsts = sorted(rows["dst"].unique())
        h = lane_h / len(dsts)
        for j, dst in enumerate(dsts):
            for op, orows in rows[rows["dst"] == dst].groupby("op"):
                xs = list(zip(orows["start"], orows["end"] - orows["start"]))
                ax.broken_barh(xs, (src + lane_top + j * h, h * 0.9), facecolor=COLORS.get(op, "gray"),
                               linewidth=0, zorder=2)


def _text_width_in(text: str, points: float) -> float:
    """Width of *text* in inches, from DejaVu Sans' advance widths (digits and capitals ~0.64 em, comma 0.32 em)."""
    return sum(0.32 if c in ",." else 0.64 for c in text) * points / 72


def _label_boxes(ax, comp: pd.DataFrame, *, mode: str, inch_per_s: float, bar_in: float, bar) -> None:
    """Write 'F2,3' (or just '3') in the boxes; in "auto" mode pick, per op, the richest label that fits
    nearly all of that op's boxes (so a row is labelled evenly), and skip the boxes it still does not fit."""
    if bar_in < _FONT / 72 * 1.15:  # rows too thin for any text
        return
    width_in = ((comp["end"] - comp["start"]) * inch_per_s).to_numpy()
    full = [f"{o}{s},{m}" for o, s, m in zip(comp["op"], comp["stage"], comp["microbatch"])]
    short = [str(m) for m in comp["microbatch"]]
    ops = comp["op"].to_numpy()
    mids = ((comp["start"] + comp["end"]) / 2).to_numpy()
    ys = comp["device"].to_numpy() + bar[0] + bar[1] / 2
    # tiers, richest first: (texts, font size in points)
    tiers = {"full": [(full, _FONT)], "short": [(short, _FONT)], "auto": [(full, _FONT), (full, 6.3), (short, _FONT)]}
    for op in pd.unique(ops):
        idx = np.flatnonzero(ops == op)
        for texts, points in tiers[mode]:
            fits = np.array([width_in[i] >= _text_width_in(texts[i], points) + 0.03 for i in idx])
            if mode != "auto" or fits.mean() >= 0.9:
                break
        else:
            continue  # nothing fits this op's boxes: no labels
        for i, ok in zip(idx, fits):
            if ok or mode != "auto":
                ax.text(mids[i], ys[i], texts[i], ha="center", va="center", fontsize=points,
                        color=_TEXT_COLOR.get(op, "black"), zorder=3, clip_on=True)


# ----------------------------------------------------------------------------------------------- memory
def _byte_unit(peak: float) -> tuple[float, str]:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return float(scale), unit
    return 1.0, "B"


def _memory_top(r: Result) -> float:
    """The highest byte count a memory panel of *r* must show (usage or capacity)."""
    usage, cap = r.memory.usage, r.memory.capacity
    return max([float(usage["bytes"].max()) if len(usage) else 0.0] + ([cap] if cap else []))


def _draw_memory(ax, r: Result, *, legend: bool, top: float | None = None) -> None:
    """Step lines of bytes per device; *top*: the y range to use (shared by stacked panels), in bytes."""
    usage, K = r.memory.usage, r.schedule.devices
    cap = r.memory.capacity
    top = _memory_top(r) if top is None else top
    scale, unit = _byte_unit(top)
    end = max(r.metrics.makespan, float(usage["time"].max()) if len(usage) else 0.0)
    cmap = matplotlib.colormaps["viridis"]
    for d in range(K):
        u = usage[usage["device"] == d].drop_duplicates("time", keep="last")  # the level after each instant
        if not len(u):
            continue
        t = np.append(u["time"].to_numpy(), end)
        b = np.append(u["bytes"].to_numpy(), u["bytes"].to_numpy()[-1]) / scale
        ax.step(t, b, where="post", color=cmap(d / max(K - 1, 1) * 0.9), linewidth=1.2, label=f"device {d}")
    if cap:
        ax.axhline(cap / scale, color="#D55E00", linestyle="--", linewidth=1.2, label="capacity")
    for o in r.memory.overflows:
        ax.plot([o.peak_time], [(cap + o.excess_bytes) / scale], marker="x", color="#D55E00", markersize=8)
    ax.set_ylabel(f"memory ({unit})", fontsize=8)
    ax.set_ylim(0, top / scale * 1.05 or 1.0)
    ax.set_xlim(0, end * 1.01 or 1.0)
    ax.grid(color="0.9", linewidth=0.6)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if legend and K <= 16:  # one line above the panel, in the gap under the Gantt (whose x labels are hidden)
        ax.legend(fontsize=6.5, ncol=K + (1 if cap else 0), loc="lower left", bbox_to_anchor=(0.0, 1.0),
                  frameon=False, handlelength=1.4, columnspacing=1.0, borderaxespad=0.2)


def memory_plot(result: Result) -> Figure:
    """Bytes held by every device over time (step functions), with the capacity line and overflows marked."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.add_subplot()
    _draw_memory(ax, result, legend=False)
    K = result.schedule.devices
    if K <= 16 and len(result.memory.usage):
        ax.legend(fontsize=7, ncol=1 if K <= 8 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("time (s)")
    peaks = ", ".join(f"{p / _byte_unit(max(result.metrics.peak_memory))[0]:.3g}" for p in result.metrics.peak_memory[:8])
    unit = _byte_unit(max(result.metrics.peak_memory or [0.0]))[1]
    s = result.schedule
    ax.set_title(f"{s.name}: memory per device, K={K}, M={s.microbatches}  |  peak per device ({unit}): {peaks}"
                 + (" ..." if K > 8 else ""), loc="left", fontsize=10)
    if result.memory.overflows:
        ax.text(0.0, -0.2, f"{len(result.memory.overflows)} device(s) over capacity (x marks the peak)",
                transform=ax.transAxes, color="#D55E00", fontsize=8)
    return fig


# ----------------------------------------------------------------------------------------------- sweeps
def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["error"].fillna("") == ""] if "error" in df else df


def _panels(n: int, *, width: float = 5.2, height: float = 3.4, sharey=True, right: float = 0.25):
    """A grid of *n* panels of *width* x *height* inches, with fixed margins (inches; *right* for a colorbar).

    Fixed margins instead of constrained layout: as readable here, and several times faster to save.
    """
    cols = min(n, 2) if n <= 4 else 3
    rows = -(-n // cols)
    left, top, bottom, wgap, hgap = 0.8, 0.65, 0.55, 0.35, 0.85  # inches
    width = max(width, (7.5 - left - right - (cols - 1) * wgap) / cols)  # room for the figure title
    fig_w = left + cols * width + (cols - 1) * wgap + right
    fig_h = top + rows * height + (rows - 1) * hgap + bottom
    fig = Figure(figsize=(fig_w, fig_h))
    axes = fig.subplots(rows, cols, sharex=True, sharey=sharey, squeeze=False, gridspec_kw={
        "left": left / fig_w, "right": 1 - right / fig_w, "top": 1 - top / fig_h, "bottom": bottom / fig_h,
        "wspace": wgap / width, "hspace": hgap / height}).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[:n]:
        ax.xaxis.set_tick_params(labelbottom=True)  # every panel keeps its M axis
    return fig, axes[:n]


def _suptitle(fig: Figure, text: str) -> None:
    fig.suptitle(text, fontsize=11, y=1 - 0.12 / fig.get_size_inches()[1], va="top")


def _schedules_in(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["schedule"]))


def _device_colors(ks) -> dict:
    cmap = matplotlib.colormaps["viridis"]
    ks = sorted(ks)
    return {k: cmap(i / max(len(ks) - 1, 1) * 0.85) for i, k in enumerate(ks)}


def sweep_utilization_plot(df: pd.DataFrame) -> Figure:
    """Utilization against M, one panel per schedule, one line per K, with GPipe's closed form dashed."""
    names = _schedules_in(df)
    fig, axes = _panels(max(len(names), 1))
    ok = _ok(df)
    colors = _device_colors(df["devices"].unique()) if len(df) else {}
    for ax, name in zip(axes, names):
        sub = ok[ok["schedule"] == name]
        for k, rows in sub.groupby("devices"):
            rows = rows.sort_values("microbatches")
            ax.plot(rows["microbatches"], rows["utilization"], marker="o", markersize=3.5, color=colors[k],
                    label=f"K={k}")
            ms = np.unique(np.geomspace(rows["microbatches"].min(), rows["microbatches"].max(), 60).round())
            ax.plot(ms, closed_form_utilization(k, ms), linestyle="--", linewidth=1, color=colors[k], alpha=0.6)
        ax.set_title(name, fontsize=11)
        _log2_x(ax, df)
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.grid(color="0.9")
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel("utilization")
        if len(sub):
            handles, labels = ax.get_legend_handles_labels()
            handles.append(matplotlib.lines.Line2D([], [], color="0.4", linestyle="--"))
            labels.append("1-(K-1)/(M+K-1)")
            ax.legend(handles, labels, fontsize=7.5, loc="best")
        else:
            ax.text(0.5, 0.5, "every configuration failed", transform=ax.transAxes, ha="center", color="0.4")
    _suptitle(fig, "Utilization against micro-batches (dashed: GPipe closed form for uniform stages)")
    return fig


def _log2_x(ax, df: pd.DataFrame) -> None:
    ms = sorted(df["microbatches"].unique()) if len(df) else [1]
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms], fontsize=8)
    ax.minorticks_off()


def sweep_heatmap(df: pd.DataFrame, value: str = "utilization") -> Figure:
    """*value* (default utilization) over (K, M), one heatmap per schedule; failed configurations are grey."""
    names = _schedules_in(df)
    ks = sorted(df["devices"].unique()) if len(df) else []
    ms = sorted(df["microbatches"].unique()) if len(df) else []
    fig, axes = _panels(max(len(names), 1), width=max(3.6, 0.42 * len(ms) + 0.6),
                        height=max(1.6, 0.4 * len(ks) + 0.6), sharey=True, right=1.3)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d0d0d0")
    image = None
    ok = _ok(df)
    for ax, name in zip(axes, names):
        grid = (ok[ok["schedule"] == name].pivot_table(index="devices", columns="microbatches", values=value)
                .reindex(index=ks, columns=ms))
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(values, cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="lower")
        if len(ks) * len(ms) <= 200:
            for (i, j), v in np.ndenumerate(values):
                text = "x" if np.isnan(v) else f"{v * 100:.0f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="black" if np.isnan(v) or v > 0.6 else "white")
        ax.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=8)
        ax.set_yticks(range(len(ks)), [str(k) for k in ks], fontsize=8)
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel("devices K")
        ax.set_title(name, fontsize=11)
    if image is not None:
        w, h = fig.get_size_inches()
        cax = fig.add_axes((1 - 1.05 / w, 0.55 / h, 0.18 / w, 1 - 1.2 / h))  # right margin, full height
        fig.colorbar(image, cax=cax, label=f"{value.replace('_', ' ')} (%)",
                     format=matplotlib.ticker.PercentFormatter(1.0))
    rejected = "; x: rejected by the schedule" if len(ok) < len(df) else ""
    _suptitle(fig, f"{value.replace('_', ' ').capitalize()} (%) over devices K and micro-batches M{rejected}")
    return fig


def sweep_memory_plot(df: pd.DataFrame) -> Figure:
    """Peak memory of the worst device against M, one panel per schedule, one line per K.

    When every configuration holds 0 bytes (no sizes in the costs), the peak number of
    micro-batches whose activations are held at once is drawn instead: memory in units
    of one micro-batch's activations.
    """
    names = _schedules_in(df)
    fig, axes = _panels(max(len(names), 1))
    ok = _ok(df)
    use_bytes = len(ok) and float(ok["peak_memory"].max()) > 0
    column = "peak_memory" if use_bytes else "peak_inflight"
    scale, unit = _byte_unit(float(ok["peak_memory"].max())) if use_bytes else (1.0, "")
    colors = _device_colors(df["devices"].unique()) if len(df) else {}
    values = ok[column].to_numpy(dtype=float) / scale
    log = len(values) and values.min() > 0 and values.max() / values.min() > 8  # wide range: log scale
    for ax, name in zip(axes, names):
        sub = ok[ok["schedule"] == name]
        for k, rows in sub.groupby("devices"):
            rows = rows.sort_values("microbatches")
            ax.plot(rows["microbatches"], rows[column] / scale, marker="o", markersize=3.5, color=colors[k],
                    label=f"K={k}")
        ax.set_title(name, fontsize=11)
        _log2_x(ax, df)
        ax.grid(color="0.9")
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel(f"peak memory ({unit}), worst device" if use_bytes else "peak in-flight micro-batches")
        if len(sub):
            ax.legend(fontsize=7.5, loc="upper left")
        else:
            ax.text(0.5, 0.5, "every configuration failed", transform=ax.transAxes, ha="center", color="0.4")
    if log:  # the panels share y: set the scale and limits once, after every panel has its data
        axes[0].set_yscale("log", base=2)
        axes[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    elif len(values):
        axes[0].set_ylim(0, values.max() * 1.08 or 1.0)
    what = "Peak memory of the worst device" if use_bytes else \
        "Peak activations held (micro-batches in flight, worst device; costs give no byte sizes)"
    _suptitle(fig, what)
    return fig
