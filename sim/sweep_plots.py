"""Figures of a sweep (:mod:`sim.sweep`'s tidy DataFrame): utilization, heatmaps, peak memory against M.

Each function takes the table and returns a matplotlib ``Figure`` (the commands save it).
Re-exported by :mod:`sim.plots`, the home of every figure.
"""

from __future__ import annotations

import matplotlib
import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["sweep_utilization_plot", "sweep_heatmap", "sweep_memory_plot", "closed_form_utilization"]


def closed_form_utilization(devices, microbatches):
    """GPipe's utilization for uniform stages, 1 - (K-1)/(M+K-1) (Huang et al., GPipe, NeurIPS 2019, sec. 2.3)."""
    K = np.asarray(devices, dtype=float)
    M = np.asarray(microbatches, dtype=float)
    return 1.0 - (K - 1.0) / (M + K - 1.0)


def _byte_unit(peak: float) -> tuple[float, str]:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return float(scale), unit
    return 1.0, "B"


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
    """Utilization against M, one panel per schedule, one line per K, with the schedule's own closed form dashed.

    The dashed line is the table's ``closed_form_utilization`` (:mod:`sim.closed_forms`; a table without that
    column, from an older sweep, gets GPipe's formula); where a schedule has none for these inputs, no line.
    """
    names = _schedules_in(df)
    fig, axes = _panels(max(len(names), 1))
    ok = _ok(df)
    colors = _device_colors(df["devices"].unique()) if len(df) else {}
    for ax, name in zip(axes, names):
        sub = ok[ok["schedule"] == name]
        any_closed_form = False
        for k, rows in sub.groupby("devices"):
            rows = rows.sort_values("microbatches")
            ax.plot(rows["microbatches"], rows["utilization"], marker="o", markersize=3.5, color=colors[k],
                    label=f"K={k}")
            if "closed_form_utilization" in rows:
                closed = rows[rows["closed_form_utilization"].notna()]
                ms, us = closed["microbatches"], closed["closed_form_utilization"]
            else:
                ms = np.unique(np.geomspace(rows["microbatches"].min(), rows["microbatches"].max(), 60).round())
                us = closed_form_utilization(k, ms)
            if len(ms):
                ax.plot(ms, us, linestyle="--", linewidth=1, color=colors[k], alpha=0.6)
                any_closed_form = True
        ax.set_title(_panel_title(name, sub), fontsize=11)
        _log2_x(ax, df)
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.grid(color="0.9")
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel("utilization")
        if len(sub):
            handles, labels = ax.get_legend_handles_labels()
            if any_closed_form:
                handles.append(matplotlib.lines.Line2D([], [], color="0.4", linestyle="--"))
                labels.append("closed form" if "closed_form_utilization" in sub else "1-(K-1)/(M+K-1)")
            ax.legend(handles, labels, fontsize=7.5, loc="best")
        else:
            ax.text(0.5, 0.5, "every configuration failed", transform=ax.transAxes, ha="center", color="0.4")
    _suptitle(fig, "Utilization against micro-batches (dashed: each schedule's closed form, uniform stages)")
    return fig


def _panel_title(name: str, rows: pd.DataFrame) -> str:
    """The schedule's name, with its iterations when it ran several (PipeDream's point shows only then)."""
    its = sorted(rows["iterations"].unique()) if "iterations" in rows and len(rows) else [1]
    return name if its == [1] else f"{name} ({', '.join(str(i) for i in its)} iterations)"


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
        ax.set_title(_panel_title(name, sub), fontsize=11)
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
