"""Figures of a sweep (:mod:`sim.search.sweep`'s tidy DataFrame): utilization, heatmaps, peak memory against M.

Each function takes the table and returns a matplotlib ``Figure`` (the commands save it).
Re-exported by :mod:`sim.io.plots`, the home of every figure.
"""

from __future__ import annotations

import matplotlib
import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.engines.collectives import LECTURE, fit_order
from sim.errors import plot_text
from sim.io.units import byte_unit
from sim.schedules.closed_forms import gpipe_utilization

__all__ = ["check_plot_size", "MAX_DEVICE_COUNTS", "sweep_utilization_plot", "sweep_heatmap", "sweep_memory_plot",
           "pareto_plot", "collective_sweep_plot"]


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

    The dashed line is the table's ``closed_form_utilization`` (:mod:`sim.schedules.closed_forms`; a table without that
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
            ax.plot(rows["microbatches"], rows["utilization"], marker="o" if len(rows) <= 32 else None,
                    markersize=3.5, color=colors[k], label=f"K={k}")  # dense sweeps: a line, not a row of dots
            if "closed_form_utilization" in rows:
                closed = rows[rows["closed_form_utilization"].notna()]
                ms, us = closed["microbatches"], closed["closed_form_utilization"]
            else:
                ms = np.unique(np.geomspace(rows["microbatches"].min(), rows["microbatches"].max(), 60).round())
                us = gpipe_utilization(k, ms)
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
            ax.legend(*_thin_legend(handles, labels), fontsize=7.5, loc="best")
        else:
            ax.text(0.5, 0.5, "every configuration failed", transform=ax.transAxes, ha="center", color="0.4")
    _suptitle(fig, "Utilization against micro-batches (dashed: each schedule's closed form, uniform stages)")
    return fig


MAX_DEVICE_COUNTS = 64
"""Most distinct K a sweep's figures draw: one line and one heatmap row per K (0.4 inch each: 64 rows are a
26-inch heatmap). :func:`check_plot_size` refuses more before the sweep runs (``--no-plots`` writes the CSV)."""

_LEGEND_ENDS = 4  # a legend of many K lists the first and last few, with an ellipsis between


def check_plot_size(devices) -> None:
    """Refuse, before a sweep runs, a grid whose figures would have more than :data:`MAX_DEVICE_COUNTS` K."""
    count = len(set(devices))
    if count > MAX_DEVICE_COUNTS:
        from sim.io.figures import FigureSizeError

        raise FigureSizeError(f"the sweep's plots draw a line and a heatmap row per device count: at most "
                              f"{MAX_DEVICE_COUNTS}, and -K gives {count:,}; give fewer K, or --no-plots for the "
                              f"CSV alone")


def _thin_legend(handles: list, labels: list) -> tuple[list, list]:
    """The legend of the K lines (and what follows them): all of them when few, else the first and last
    :data:`_LEGEND_ENDS` with a "..." between (the colours run from dark to light with K)."""
    lines = [i for i, label in enumerate(labels) if label.startswith("K=")]
    if len(lines) <= 2 * _LEGEND_ENDS + 2:
        return handles, labels
    hidden = set(lines[_LEGEND_ENDS:-_LEGEND_ENDS])
    keep = [i for i in range(len(labels)) if i not in hidden]
    cut = keep.index(lines[-_LEGEND_ENDS])
    handles = [handles[i] for i in keep]
    labels = [labels[i] for i in keep]
    handles.insert(cut, matplotlib.lines.Line2D([], [], linestyle="none"))
    labels.insert(cut, f"... ({len(hidden)} more K)")
    return handles, labels


def _panel_title(name: str, rows: pd.DataFrame) -> str:
    """The schedule's name, with its iterations when it ran several (PipeDream's point shows only then)."""
    its = sorted(rows["iterations"].unique()) if "iterations" in rows and len(rows) else [1]
    name = plot_text(name)  # a name from a user's table is drawn as typed, never parsed as math
    return name if its == [1] else f"{name} ({', '.join(str(i) for i in its)} iterations)"


_MAX_TICKS = 16
"""Most M labels on an axis: a dense sweep (M = 1..128) labels its powers of two, not 128 overlapping numbers
(which also cost most of the time to draw: each label is a text to lay out)."""


def _tick_values(values: list) -> list:
    """*values* when few; else the powers of two among them (and the first and last)."""
    if len(values) <= _MAX_TICKS:
        return list(values)
    twos = [v for v in values if v > 0 and int(v) & (int(v) - 1) == 0]
    return sorted({values[0], values[-1], *twos})


def _log2_x(ax, df: pd.DataFrame) -> None:
    ms = sorted(df["microbatches"].unique()) if len(df) else [1]
    ax.set_xscale("log", base=2)
    ticks = _tick_values(ms)
    ax.set_xticks(ticks, [str(m) for m in ticks], fontsize=8)
    ax.minorticks_off()


def sweep_heatmap(df: pd.DataFrame, value: str = "utilization") -> Figure:
    """*value* (default utilization) over (K, M), one heatmap per schedule; failed configurations are grey."""
    names = _schedules_in(df)
    ks = sorted(df["devices"].unique()) if len(df) else []
    ms = sorted(df["microbatches"].unique()) if len(df) else []
    # a cell per (K, M) up to ~7 inches of panel: a dense sweep's 128 Ms stay one readable figure, not 54 inches
    fig, axes = _panels(max(len(names), 1), width=min(7.0, max(3.6, 0.42 * len(ms) + 0.6)),
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
        step = -(-len(ms) // _MAX_TICKS)  # columns are evenly spaced: label every step-th M
        shown = list(range(0, len(ms), step))
        ax.set_xticks(shown, [str(ms[i]) for i in shown], fontsize=8)
        rows = range(0, len(ks), -(-len(ks) // _MAX_TICKS))  # like the columns: every step-th K labelled
        ax.set_yticks(list(rows), [str(ks[i]) for i in rows], fontsize=8)
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel("devices K")
        ax.set_title(plot_text(name), fontsize=11)
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
    scale, unit = byte_unit(float(ok["peak_memory"].max())) if use_bytes else (1.0, "")
    colors = _device_colors(df["devices"].unique()) if len(df) else {}
    values = ok[column].to_numpy(dtype=float) / scale
    log = len(values) and values.min() > 0 and values.max() / values.min() > 8  # wide range: log scale
    for ax, name in zip(axes, names):
        sub = ok[ok["schedule"] == name]
        for k, rows in sub.groupby("devices"):
            rows = rows.sort_values("microbatches")
            ax.plot(rows["microbatches"], rows[column] / scale, marker="o" if len(rows) <= 32 else None,
                    markersize=3.5, color=colors[k], label=f"K={k}")
        ax.set_title(_panel_title(name, sub), fontsize=11)
        _log2_x(ax, df)
        ax.grid(color="0.9")
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel(f"peak memory ({unit}), worst device" if use_bytes else "peak in-flight micro-batches")
        if len(sub):
            ax.legend(*_thin_legend(*ax.get_legend_handles_labels()), fontsize=7.5, loc="upper left")
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


def pareto_plot(result) -> Figure:
    """Iteration time against peak memory of a plan (:class:`sim.search.planner.Plan`): every feasible candidate,
    the Pareto front, the cap."""
    fig = Figure(figsize=(7, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ranked, front = result.ranked, result.pareto
    gib = 2**30
    for name, part in ranked.groupby("schedule", sort=False):
        ax.scatter(part["peak_memory"] / gib, part["iteration_time"], s=12, alpha=0.5, label=plot_text(name))
    if len(front):
        ax.step(front["peak_memory"] / gib, front["iteration_time"], where="post", color="black", lw=1.5,
                label="Pareto front")
    ax.axvline(result.memory_cap / gib, color="red", ls="--", lw=1, label="memory cap")
    if result.winner is not None:
        ax.scatter([result.winner["peak_memory"] / gib], [result.winner["iteration_time"]], marker="*", s=180,
                   color="gold", edgecolor="black", zorder=5, label="winner")
    ax.set_xlabel("peak memory, worst device (GiB)")
    ax.set_ylabel("iteration time (s)")
    ax.set_yscale("log")
    model, gpu = plot_text(result.inputs["model"]["name"]), plot_text(result.inputs["gpu"]["name"])  # users' names
    ax.set_title(f"{model} on {result.inputs['gpus']} x {gpu}, G={result.inputs['global_batch']}")
    ax.legend(fontsize=7, loc="upper right")
    return fig


# the panels of a collective sweep: column -> axis label
_COLLECTIVE_PANELS = (("steps", "time in steps (rounds)"), ("time", "time (s)"),
                       ("peak_node_bytes", "peak node bandwidth (bytes)"), ("total_bytes", "total bandwidth (bytes)"))


def collective_sweep_plot(table: pd.DataFrame, *, title: str | None = None):
    """Log-log panels of steps, time, peak node bytes and total bytes against N, one line per algorithm.

    Each legend gives every line's fitted order (see :func:`sim.engines.collectives.fit_order`); the steps panel is the
    lecture's "time" and tells ring (N) from halving-doubling (log N). Returns the matplotlib Figure.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 9.6), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    markers = "osD^v<>p"
    names = {alg: row for row, alg, _ in LECTURE}
    groups = list(table.groupby("algorithm", sort=False))
    for ax, (col, label) in zip(axes, _COLLECTIVE_PANELS):
        for i, (algorithm, rows) in enumerate(groups):
            rows = rows.sort_values("workers")
            fit = fit_order(rows["workers"], rows[col])
            shown = rows[rows[col] > 0]
            lecture = algorithm in names
            # markers shrink line by line, so lines that coincide (ring and direct, sequential and ring's
            # steps) still show every marker, nested; the algorithms the lecture does not list are hollow
            ax.plot(shown["workers"], shown[col], marker=markers[i % len(markers)], ms=max(3.0, 10.0 - i),
                    markerfacecolor=None if lecture else "none", linestyle="-" if lecture else "--",
                    linewidth=1.6 if lecture else 1.0, label=f"{names.get(algorithm, algorithm)}: {fit.text()}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2 if col == "steps" else 10)
        if col == "steps":
            import matplotlib.ticker

            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ns = sorted(table["workers"].unique()) if len(table) else []
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off() if col != "steps" else None
        ax.set_xlabel("workers N")
        ax.set_ylabel(label)
        ax.set_title(label + (": the lecture's time" if col == "steps" else ""), fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7.5, title="algorithm: fitted growth", title_fontsize=8, loc="upper left")
    nbytes = table["bytes"].iloc[0] if len(table) else 0
    fig.suptitle(title or f"All-reduce of {nbytes:.3g} bytes, simulated message by message "
                          f"(solid: the lecture's five, dashed: others)")
    return fig
