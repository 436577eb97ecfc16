"""Gantt, memory and sweep figures: they draw, decode, label and survive edge cases."""

from __future__ import annotations

import json

import matplotlib.colors as mcolors
import matplotlib.image as mpimg
import pytest
from matplotlib.figure import Figure

from sim import schedules
from sim.cli import main
from sim.io.figures import save_figure
from sim.model.cost import uniform
from sim.model.hardware import Hardware
from sim.io.plots import COLORS, gantt, memory_plot
from sim.results.result import make_result
from sim.simulate import simulate
from sim.results.timeline import empty_timeline

OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"}


def run(name, K, M, **hw):
    costs = uniform(K, forward=1.0, backward=2.0, send_bytes=2**20, activation_bytes=2**20, weight_bytes=2**20)
    return simulate(schedules.generate(name, K, M), costs, Hardware(devices=K, **hw))


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def decode(path):
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    return image


def test_colours_are_okabe_ito_and_distinct():
    assert set(COLORS.values()) <= OKABE_ITO
    assert len(set(COLORS.values())) == len(COLORS)
    assert set(COLORS) >= {"F", "B", "W", "R", "U", "SEND_F", "SEND_B"}


def test_gantt_classroom_labels_title_and_png(tmp_path):
    r = run("gpipe", 4, 4)
    fig = gantt(r, labels="full")
    assert isinstance(fig, Figure)
    labels = texts(fig)
    assert "F2,3" in labels and "B0,0" in labels  # the GPipe paper's F<stage>,<micro-batch>
    title = fig.axes[0].get_title(loc="left")
    assert "gpipe" in title and "K=4" in title and "M=4" in title and "bubble 42.9%" in title
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "idle (bubble)" in legend and "forward F" in legend and "backward B" in legend
    assert "send activation" not in legend  # free links: transfers take no time, no lane
    decode(save_figure(fig, tmp_path / "g.png"))


def test_auto_labels_drop_when_boxes_are_small():
    small = texts(gantt(run("1f1b", 4, 4)))
    big = gantt(run("1f1b", 16, 64))
    assert any("," in t for t in small)
    # 16 x 128 boxes on one 13-inch axis: far fewer labels than boxes, and none overflows its box
    assert len(texts(big)) < 16 * 128 / 2
    assert texts(gantt(run("1f1b", 4, 4), labels="none")) == []
    assert all("," not in t for t in texts(gantt(run("1f1b", 4, 4), labels="short")))


def test_stacked_comparison_shares_time_axis_and_memory_panels(tmp_path):
    rs = [run(n, 4, 4) for n in ("naive", "gpipe", "1f1b", "pipedream")]
    fig = gantt(rs, memory=True, titles=["a", "b", "c", "d"])
    assert len(fig.axes) == 8  # a Gantt and a memory panel per result
    assert len({ax.get_xlim() for ax in fig.axes}) == 1
    titles = [ax.get_title(loc="left") for ax in fig.axes[::2]]
    assert titles[0].startswith("a:") and "utilization 25.0%" in titles[0]
    assert "utilization 57.1%" in titles[1]
    decode(save_figure(fig, tmp_path / "cmp.png"))
    with pytest.raises(ValueError, match="one title per result"):
        gantt(rs, titles=["only one"])
    with pytest.raises(ValueError, match="labels"):
        gantt(rs, labels="sometimes")
    with pytest.raises(ValueError):
        gantt([])


def test_transfers_get_a_lane_and_memory_a_capacity_line(tmp_path):
    r = run("1f1b", 4, 8, latency=0.05, bandwidth=4 * 2**20, memory_capacity=6 * 2**20)
    fig = gantt(r, memory=True)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "send activation" in legend and "send gradient" in legend
    mem_labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert "capacity" in mem_labels and "device 0" in mem_labels
    assert "send activation" not in [t.get_text() for t in gantt(r, transfers=False).legends[0].get_texts()]
    decode(save_figure(fig, tmp_path / "links.svg".replace(".svg", ".png")))
    fig = memory_plot(r)
    assert "capacity" in [line.get_label() for line in fig.axes[0].get_lines()]
    decode(save_figure(fig, tmp_path / "mem.png"))


def test_empty_and_one_device_timelines_draw(tmp_path):
    one = simulate(schedules.generate("gpipe", 1, 1), uniform(1))
    decode(save_figure(gantt(one, memory=True), tmp_path / "one.png"))
    decode(save_figure(memory_plot(one), tmp_path / "one_mem.png"))
    s = schedules.generate("1f1b", 2, 2)
    empty = make_result(s, uniform(2), Hardware(devices=2), empty_timeline(), source="measured")
    fig = gantt([empty, one], memory=True)
    assert "no actions in this timeline" in texts(fig)
    decode(save_figure(fig, tmp_path / "empty.png"))
    decode(save_figure(memory_plot(empty), tmp_path / "empty_mem.png"))


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_cli_gantt_writes_each_format(tmp_path, capsys, suffix):
    out = tmp_path / f"lecture.{suffix}"
    assert main(["gantt", "-s", "naive", "-s", "gpipe", "-K", "4", "-M", "4", "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"] == str(out) and out.stat().st_size > 1000
    assert [s["schedule"] for s in summary["schedules"]] == ["naive", "gpipe"]
    assert summary["schedules"][0]["utilization"] == pytest.approx(0.25)  # the lecture's picture: 25% vs 57%
    assert summary["schedules"][1]["utilization"] == pytest.approx(4 / 7)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("argv, message", [
    (["gantt", "-s", "nope", "-o", "x.png"], "unknown schedule 'nope'"),
    (["gantt", "-s", "1f1b", "-o", "x.txt"], "use a file name ending in .png"),
    (["gantt", "-s", "1f1b", "-K", "0", "-o", "x.png"], "must be at least 1"),
    (["gantt", "-s", "1f1b", "--labels", "many", "-o", "x.png"], "invalid choice"),
    (["gantt", "-s", "1f1b", "-o", "no/such/folder/x.png"], "does not exist"),
])
def test_cli_gantt_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error:") and message in err
    assert not list(tmp_path.iterdir())


def test_colour_of_each_op_is_drawn():
    r = simulate(schedules.generate("zb-h1", 4, 4), uniform(4, weight=1.0, update=0.5))
    fig = gantt(r)
    drawn = {mcolors.to_hex(c).upper() for coll in fig.axes[0].collections for c in coll.get_facecolors()}
    assert {COLORS["F"], COLORS["B"], COLORS["W"], COLORS["U"]} <= drawn


def test_cli_gantt_gives_each_schedule_its_chunks(tmp_path, capsys):
    from sim.schedules import registry as generators

    v_shaped = [n for n in generators.names() if getattr(generators.get_generator(n), "CHUNKS", 1) == 2]
    if not v_shaped:
        pytest.skip("no V-shaped schedule registered")
    out = tmp_path / "v.png"
    assert main(["gantt", "-s", f"1f1b,{v_shaped[0]}", "-K", "4", "-M", "8", "-o", str(out), "--json"]) == 0
    stages = [s["stages"] for s in json.loads(capsys.readouterr().out)["schedules"]]
    assert stages == [4, 8]
    decode(out)


# ------------------------------------------------------------------ issue 14: pictures a teacher can use
def label_texts(fig: Figure, ax_index: int = 0) -> list:
    """The box labels of one Gantt axis (drawn at zorder 3)."""
    return [t for t in fig.axes[ax_index].texts if t.get_zorder() == 3]


def assert_labels_inside_boxes(fig: Figure, result, ax_index: int = 0):
    """Every label's rendered width fits inside the width of the box it sits in."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[ax_index]
    comp = result.timeline[(result.timeline["src"] < 0) & (result.timeline["end"] > result.timeline["start"])]
    px_per_s = ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0]
    for text in label_texts(fig, ax_index):
        x = text.get_position()[0]
        width = text.get_window_extent(renderer).width
        inside = comp[(comp["start"] < x) & (x < comp["end"])]
        assert len(inside), text.get_text()
        box_px = float((inside["end"] - inside["start"]).min()) * px_per_s
        assert width <= box_px, (text.get_text(), width, box_px)


def test_memory_panel_without_byte_sizes_shows_micro_batches_in_flight(tmp_path):
    rs = [simulate(schedules.generate(n, 4, 4), uniform(4)) for n in ("naive", "gpipe", "1f1b", "pipedream")]
    fig = gantt(rs, memory=True)
    for r, ax in zip(rs, fig.axes[1::2]):
        assert "micro-batches in flight" in ax.get_ylabel() and "no byte sizes" in ax.get_ylabel()
        assert ax.get_ylim()[1] >= 4  # not an empty 0-1 B panel
        peaks = [max(line.get_ydata()) for line in ax.get_lines()]
        assert peaks == r.metrics.peak_inflight
    decode(save_figure(fig, tmp_path / "mem.png"))
    with_bytes = gantt(run("gpipe", 4, 4), memory=True)
    assert with_bytes.axes[1].get_ylabel() == "memory (MiB)"


@pytest.mark.parametrize("name, K, M, iterations", [("gpipe", 3, 5, 1), ("1f1b", 4, 6, 2), ("pipedream", 3, 4, 3),
                                                    ("zb-h1", 4, 4, 1), ("zbv", 2, 4, 1)])
def test_inflight_over_time_peaks_at_the_metric(name, K, M, iterations):
    from sim.io.plots import inflight_over_time

    r = simulate(schedules.generate(name, K, M, iterations=iterations), uniform(K, weight=0.5).split_into_chunks(
        schedules.generate(name, K, M).stages // K) if name == "zbv" else uniform(K, weight=0.5))
    usage = inflight_over_time(r.timeline)
    assert usage.groupby("device")["count"].max().tolist() == r.metrics.peak_inflight
    assert (usage.groupby("device")["count"].last() == 0).all()  # everything is released at the end


def test_chunks_are_shaded_and_labels_stay_inside(tmp_path):
    K, M, v = 4, 8, 4
    s = schedules.generate("interleaved-1f1b", K, M, chunks=v)
    r = simulate(s, uniform(K, forward=1.0, backward=2.0).split_into_chunks(v))
    fig = gantt(r)
    forward_shades = {mcolors.to_hex(c) for coll in fig.axes[0].collections for c in coll.get_facecolors()
                      if mcolors.to_hex(c) != "#ffffff"}
    assert len(forward_shades) >= 2 * v  # F and B, one shade per chunk
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [f"chunk {c}" for c in range(v)] == [x for x in legend if x.startswith("chunk")]
    swatches = {h.get_label(): mcolors.to_rgb(h.get_facecolor()) for h in fig.legends[0].legend_handles
                if hasattr(h, "get_facecolor")}
    for c in range(v):  # grey shades: in F's own colour, "chunk 0" was the "forward F" swatch again
        r_, g_, b_ = swatches[f"chunk {c}"]
        assert abs(r_ - g_) < 1e-9 and abs(g_ - b_) < 1e-9 and swatches[f"chunk {c}"] != swatches["forward F"]
    assert_labels_inside_boxes(fig, r)
    v_shaped = simulate(schedules.generate("zbv", K, M), uniform(K, weight=1.0).split_into_chunks(2))
    for labels in ("auto", "full", "short"):
        fig = gantt(v_shaped, labels=labels)
        assert_labels_inside_boxes(fig, v_shaped)
    short = [t.get_text() for t in label_texts(gantt(v_shaped, labels="short", time_unit="s"))]
    assert short and all("," in t for t in short)  # short labels keep the stage where a device holds two
    decode(save_figure(gantt([r, v_shaped]), tmp_path / "chunks.png"))


def test_zero_length_boxes_print_no_label_and_free_updates_are_ticks():
    r = simulate(schedules.generate("1f1b", 4, 4), uniform(4))  # U takes no time
    for labels in ("auto", "short", "full"):
        fig = gantt(r, labels=labels)
        assert len(label_texts(fig)) == 4 * 4 * 2  # F and B only: no stray "0" on the U's
        assert_labels_inside_boxes(fig, r)
    legend = [t.get_text() for t in gantt(r).legends[0].get_texts()]
    assert "update U (no time)" in legend
    paid = simulate(schedules.generate("1f1b", 4, 4), uniform(4, update=0.5))
    legend = [t.get_text() for t in gantt(paid).legends[0].get_texts()]
    assert "update U" in legend and "update U (no time)" not in legend


def test_one_label_style_per_figure():
    import re

    rs = [simulate(schedules.generate(n, 4, 4), uniform(4)) for n in ("naive", "gpipe")]
    fig = gantt(rs)
    labels = label_texts(fig, 0) + label_texts(fig, 1)
    assert {t.get_fontsize() for t in labels} == {labels[0].get_fontsize()}
    assert all(re.fullmatch(r"[FB]\d,\d", t.get_text()) for t in labels)


def test_pipedream_over_iterations_shows_iteration_starts_and_weight_versions(tmp_path):
    costs = uniform(4)
    pd_run = simulate(schedules.generate("pipedream", 4, 4, iterations=3), costs)
    fig = gantt(pd_run)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "iteration 1 \u2192" in texts and "iteration 2 \u2192" in texts
    assert "F0,4\nw1" in texts  # device 0's forward of micro-batch 4 runs after one update: version 1
    assert "B0,1\nw0" in texts  # ... and the backward of micro-batch 1 uses its stashed version 0
    assert any(t.startswith("wk: weight version") for t in (x.get_text() for x in fig.legends[0].get_texts()))
    flush = gantt(simulate(schedules.generate("1f1b", 4, 4, iterations=3), costs))
    assert not any("\nw" in t.get_text() for t in flush.axes[0].texts)  # one version at a time: nothing to say
    assert "iteration 2 \u2192" in [t.get_text() for t in flush.axes[0].texts]
    decode(save_figure(fig, tmp_path / "pd.png"))


def test_short_runs_are_drawn_in_milliseconds():
    r = simulate(schedules.generate("gpipe", 2, 2), uniform(2, forward=1e-3, backward=2e-3))
    fig = gantt(r)
    assert fig.axes[-1].get_xlabel() == "time (ms)"
    assert "makespan 9 ms" in fig.axes[0].get_title(loc="left")
    formatter = fig.axes[0].xaxis.get_major_formatter()
    assert formatter(0.004, 0) == "4"
    assert gantt(r, time_unit="s").axes[-1].get_xlabel() == "time (s)"
    with pytest.raises(ValueError, match="time_unit"):
        gantt(r, time_unit="hours")


def test_replicated_gantt_groups_replicas_and_keeps_transfers_visible():
    from sim.engines.replication import Replication, simulate_replicated

    K, D = 3, 2
    costs = uniform(K, weight_bytes=1e3, grad_bytes=1e3, send_bytes=10.0, activation_bytes=10.0)
    hw = Hardware(devices=D * K, latency=1e-4, bandwidth=1e9)
    result = simulate_replicated(schedules.generate("1f1b", K, 4), costs, Replication(data_parallel=D), hw).as_result(
        costs, hw)
    fig = gantt(result)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == ["device 0\nstage 0", "device 3\nstage 0", "device 1\nstage 1", "device 4\nstage 1",
                     "device 2\nstage 2", "device 5\nstage 2"]
    ax = fig.axes[0]
    px_per_s = ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0]
    lanes = [coll for coll in ax.collections if any(mcolors.to_hex(c).upper() in (COLORS["ALLREDUCE"], COLORS["SEND_F"])
                                                    for c in coll.get_facecolors())]
    assert lanes
    for coll in lanes:  # every transfer bar is at least 4 points wide, however short the transfer
        for path in coll.get_paths():
            xs = path.vertices[:, 0]
            assert (xs.max() - xs.min()) * px_per_s >= 4.0 / 72 * fig.dpi * 0.99
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "gradient all-reduce" in legend


def test_cli_gantt_draws_a_schedule_file_beside_a_generated_one(tmp_path, capsys):
    csv = tmp_path / "zbv.csv"
    assert main(["export", "-s", "zbv", "-K", "4", "-M", "8", "-o", str(csv)]) == 0
    out = tmp_path / "file.png"
    assert main(["gantt", "--schedule-file", str(csv), "-s", "zbv", "-K", "4", "-M", "8", "-o", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [s["stages"] for s in summary["schedules"]] == [8, 8]
    assert summary["schedules"][0]["makespan"] == pytest.approx(summary["schedules"][1]["makespan"])
    decode(out)
    assert main(["gantt", "--schedule-file", str(tmp_path / "missing.csv"), "-o", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()


def test_cli_gantt_memory_without_bytes_says_so(tmp_path, capsys):
    out = tmp_path / "m.png"
    assert main(["gantt", "-s", "naive,gpipe,1f1b,pipedream", "--memory", "-o", str(out)]) == 0
    assert "micro-batches in flight" in capsys.readouterr().out
    decode(out)


def test_an_overlapped_pair_is_one_box_with_both_labels():
    """DualPipeV's overlapped forward-backward pair (issue 14.2): one box spanning the pair, both halves named."""
    from sim.io.plots import _OVERLAP_FACE, _boxes

    s = schedules.dualpipev(2, 4)
    r = simulate(s, uniform(4))
    boxes = _boxes(r)
    for f, b in s.overlapped:
        row = boxes[boxes["full"] == f"F{f.stage},{f.mb}+B{b.stage},{b.mb}"]
        assert len(row) == 1 and tuple(row["face"].iloc[0]) == _OVERLAP_FACE
        assert row["mb"].iloc[0] == f"{f.mb}+{b.mb}"
        assert not (boxes["full"] == f"B{b.stage},{b.mb}").any()  # no second box for the backward half
    fig = gantt(r)
    assert "overlapped F+B pair (one unit)" in [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_a_long_run_note_never_runs_into_the_title():
    """A measured run's note (how it was taken) sat right-aligned on the title line, where the validator's longer
    note ran into the title; it is now a line of its own under the title."""
    from dataclasses import replace

    r = simulate(schedules.one_f_one_b(2, 4), uniform(2, forward=1e-3, backward=2e-3))
    note = ("measured with torch.distributed (gloo) on cpu; 5 timed run(s) after warm-up, the figures below are of "
            "the run of median makespan")
    fig = gantt([r, replace(r, source="measured", notes=[note])], titles=["predicted: 1f1b", "measured: 1f1b on gloo"])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # gantt returns a bare Figure (no pyplot)
    fig.draw(renderer)
    ax = fig.axes[1]
    [text] = [t for t in ax.texts if t.get_text().startswith("measured with")]
    title = ax._left_title.get_window_extent(renderer)  # set_title(loc="left") fills matplotlib's left title
    assert ax._left_title.get_text().startswith("measured: 1f1b on gloo") and title.width > 0
    box = text.get_window_extent(renderer)
    assert not title.overlaps(box) and box.y1 <= title.y0 + 1
