"""Gantt, memory and sweep figures: they draw, decode, label and survive edge cases."""

from __future__ import annotations

import json

import matplotlib.colors as mcolors
import matplotlib.image as mpimg
import pytest
from matplotlib.figure import Figure

from sim import schedules
from sim.cli import main
from sim.commands.gantt import save_figure
from sim.cost import uniform
from sim.hardware import Hardware
from sim.plots import COLORS, gantt, memory_plot
from sim.result import make_result
from sim.simulate import simulate
from sim.timeline import empty_timeline

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
    from sim import generators

    v_shaped = [n for n in generators.names() if getattr(generators.get_generator(n), "CHUNKS", 1) == 2]
    if not v_shaped:
        pytest.skip("no V-shaped schedule registered")
    out = tmp_path / "v.png"
    assert main(["gantt", "-s", f"1f1b,{v_shaped[0]}", "-K", "4", "-M", "8", "-o", str(out), "--json"]) == 0
    stages = [s["stages"] for s in json.loads(capsys.readouterr().out)["schedules"]]
    assert stages == [4, 8]
    decode(out)
