"""Names are data, never markup (issue 26.8): not matplotlib math in a figure, not escape codes on a terminal.

A schedule named ``$\\undefinedcmd$`` in ``gantt`` and a model named ``$\\frac{1}{$`` in ``plan`` made
matplotlib's math parser raise inside savefig (plan had already written its CSVs), 3000 nested braces a
RecursionError, and ``\\x1b[2J`` in a name cleared the screen it was printed on.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim.cli
from sim.errors import plot_text, terminal_text

HOSTILE = {
    "undefined-command": r"$\undefinedcmd$",
    "unclosed-fraction": r"$\frac{1}{$",
    "nested-braces": "$" + "{" * 3000 + "x" + "}" * 3000 + "$",
    "escape-codes": "evil\x1b[2J\x1b]0;title\x07\x9b31m\u202eright-to-left",
}
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _schedule_named(tmp_path, name: str):
    path = tmp_path / "named.json"
    assert sim.cli.main(["export", "-s", "gpipe", "-K", "2", "-M", "2", "--format", "json", "-o", str(path)]) == 0
    data = json.loads(path.read_text())
    data["name"] = name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_gantt_draws_a_hostile_schedule_name_and_prints_it_escaped(tmp_path, capsys, name):
    schedule = _schedule_named(tmp_path, name)
    capsys.readouterr()
    figure = tmp_path / "named.png"
    code = sim.cli.main(["gantt", "--schedule-file", str(schedule), "-o", str(figure)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert figure.stat().st_size > 1000
    assert not UNSAFE.search(out + err)  # nothing a terminal would obey


def test_without_escaping_the_same_name_breaks_savefig(tmp_path, capsys, monkeypatch):
    """The bug, injected: names passed through as typed and the save-time net switched off."""
    import sim.io.figures
    import sim.io.plots

    monkeypatch.setattr(sim.io.plots, "plot_text", lambda text: str(text))
    monkeypatch.setattr(sim.io.figures, "_literal_where_math_fails", lambda fig: None)
    schedule = _schedule_named(tmp_path, HOSTILE["undefined-command"])
    code = sim.cli.main(["gantt", "--schedule-file", str(schedule), "-o", str(tmp_path / "named.png")])
    assert code == 1 and "ValueError" in capsys.readouterr().err  # matplotlib's parser, reported as our bug


def test_the_save_time_net_alone_keeps_a_figure_savable(tmp_path):
    """A figure drawn by code that forgot plot_text still saves: the unparsable math text is drawn literally."""
    from matplotlib.figure import Figure

    from sim.io.figures import save_figure

    fig = Figure()
    fig.add_subplot().set_title(HOSTILE["nested-braces"])
    fig.suptitle(r"$x^2$ stays math")
    save_figure(fig, tmp_path / "net.png")
    assert (tmp_path / "net.png").stat().st_size > 1000
    assert fig._suptitle.get_parse_math()  # a valid math text is left as it was


def test_plan_with_a_model_named_as_math_writes_everything(tmp_path, capsys):
    from sim.model import models

    spec = dataclasses.asdict(models.PRESETS["small-gpt"]())
    spec["name"] = HOSTILE["unclosed-fraction"]
    model = tmp_path / "model.json"
    model.write_text(json.dumps(spec))
    out_dir = tmp_path / "plan"
    code = sim.cli.main(["plan", "--model", str(model), "--gpu", "cpu", "--gpus", "2", "--global-batch", "4",
                         "--microbatch-size", "1,2", "--tensor-parallel", "1", "--no-progress", "-o", str(out_dir)])
    assert code == 0, capsys.readouterr().err
    assert {"pareto.png", "ranked.csv", "plan.json"} <= {p.name for p in out_dir.iterdir()}


def test_without_the_terminal_filter_escape_codes_reach_the_terminal(tmp_path, capsys, monkeypatch):
    """The bug, injected: the stream filter passes text through; the raw ESC is printed again."""
    schedule = _schedule_named(tmp_path, HOSTILE["escape-codes"])
    capsys.readouterr()
    monkeypatch.setattr(sim.cli, "terminal_text", lambda text, **kw: text)
    assert sim.cli.main(["simulate", "--schedule-file", str(schedule)]) == 0
    assert "\x1b[2J" in capsys.readouterr().out


def test_json_output_stays_json_with_every_name(tmp_path, capsys):
    schedule = _schedule_named(tmp_path, HOSTILE["escape-codes"])
    capsys.readouterr()
    assert sim.cli.main(["simulate", "--schedule-file", str(schedule), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["schedule"] == HOSTILE["escape-codes"] and not UNSAFE.search(out)


@given(st.text())
def test_terminal_text_leaves_nothing_a_terminal_obeys_and_keeps_everything_else(text):
    shown = terminal_text(text)
    assert not UNSAFE.search(shown)
    if not UNSAFE.search(text):
        assert shown == text


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=12))
def test_terminal_text_keeps_json_valid_and_equal(value):
    assert json.loads(terminal_text(json.dumps(value, ensure_ascii=False))) == value


@given(st.text())
def test_plot_text_is_never_math_text(text):
    from matplotlib import cbook

    assert not cbook.is_math_text(plot_text(text))
