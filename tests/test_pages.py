"""The interactive pages without a browser: the data they carry, the wait split, the CLI's checks.

The browser half (the page's JavaScript against ``pipesim simulate``, drawing, screenshots) is
``tests/test_pages_browser.py``.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import re
import struct

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import schedules
from sim.cli import main
from sim.io.pages import PageError, check_page_path, playground_page, sweep_page, timeline_page
from sim.io.pages.html import asset
from sim.io.pages.payload import DTYPES, pack
from sim.io.pages.playground import playground_document
from sim.io.pages.timelines import run_document
from sim.io.pages.waits import action_waits
from sim.results.result import make_result
from sim.schedules import registry

ASSETS = ["data.js", "engine.js", "closed_forms.js", "timeline.js", "playground.js", "report.js", "sweep.js",
          "style.css"]


def unpack(text: str):
    """The document :func:`pack` wrote, read back as assets/data.js reads it (a Python twin of that reader)."""
    raw = gzip.decompress(base64.b64decode(text))
    assert raw[:4] == b"PSB1"
    (length,) = struct.unpack("<I", raw[4:8])
    header = json.loads(raw[8:8 + length])
    base = -(-(8 + length) // 8) * 8
    columns = []
    for c in header["columns"]:
        assert (base + c["offset"]) % 8 == 0  # typed arrays need aligned starts
        dtype = np.dtype(DTYPES[c["dtype"]]).newbyteorder("<")
        columns.append(np.frombuffer(raw, dtype=dtype, count=c["length"], offset=base + c["offset"]))

    def attach(v):
        if isinstance(v, dict):
            return columns[v["$col"]] if "$col" in v else {k: attach(x) for k, x in v.items()}
        return [attach(x) for x in v] if isinstance(v, list) else v
    return attach(header["doc"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(DTYPES)), st.integers(0, 40)), max_size=6),
       st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-10**9, 10**9), st.text(max_size=8),
                                                       st.floats(allow_nan=False, allow_infinity=False)), max_size=4))
def test_payload_round_trip(columns, extra):
    rng = np.random.default_rng(len(columns))
    arrays = [(rng.random(n) * 1000).astype(DTYPES[code]) for code, n in columns]
    doc = {"columns": arrays, "extra": extra, "nested": {"a": arrays[:1]}}
    back = unpack(pack(doc))
    assert back["extra"] == extra
    assert len(back["columns"]) == len(arrays)
    for got, want in zip(back["columns"], arrays):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_payload_refuses_what_the_page_cannot_read():
    with pytest.raises(TypeError, match="1-d array"):
        pack({"x": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="1-d array"):
        pack({"x": np.zeros(3, dtype=np.complex128)})
    assert unpack(pack({"x": float("inf")}))["x"] is None  # JSON has no inf: null, never invalid JSON


def test_assets_request_nothing():
    """No asset names a network address or a way to fetch one; the page's policy forbids requests anyway."""
    for name in ASSETS:
        text = asset(name)
        assert not re.search(r"https?://|//cdn|\bfetch\(|XMLHttpRequest|WebSocket|import\(|<link\b", text), name
    page = playground_page(max_devices=2, max_microbatches=2)
    assert "default-src 'none'" in page and "connect-src 'none'" in page
    assert "http://" not in page and "https://" not in page


def test_playground_embeds_the_generated_schedules():
    doc = playground_document(max_devices=4, max_microbatches=6)
    assert [s["name"] for s in doc["schedules"]] == registry.names()
    cols = doc["columns"]
    rng = np.random.default_rng(0)
    for row in rng.choice(len(doc["entries"]), size=30, replace=False):
        n, K, M, chunks, S, key_at, n_keys, start_at, fused_at, n_fused, place_at = doc["entries"][row]
        s = schedules.generate(registry.names()[n], K, M, chunks=chunks)
        assert np.array_equal(cols["keys"][key_at:key_at + n_keys], s.keys_array)
        assert np.array_equal(cols["starts"][start_at:start_at + K + 1], s.device_start)
        assert np.array_equal(cols["fused"][fused_at:fused_at + n_fused], s.fused)
        assert list(cols["placement"][place_at:place_at + S]) == list(s.placement)
    # every shape is either embedded or refused with pipesim's own words
    embedded = {(doc["schedules"][e[0]]["name"], e[1], e[2], e[3]) for e in doc["entries"]}
    for s in doc["schedules"]:
        for K in doc["K"]:
            for M in doc["M"]:
                for c in s["chunks"]:
                    assert (s["name"], K, M, c) in embedded or f"{s['name']}|{K}|{M}|{c}" in doc["refused"]
    assert "multiple" in doc["refused"]["interleaved-1f1b|3|4|2"]  # M must be a multiple of K


def _args(argv):
    from sim.cli import build_parser
    return build_parser(argv[0]).parse_args(argv)


@pytest.mark.parametrize("argv, words", [
    (["page", "playground", "-o", "x.png"], "ending in .html"),
    (["page", "playground", "-o", "x.html", "--max-devices", "99"], "at most 16"),
    (["page", "playground", "-o", "x.html", "--max-microbatches", "0"], "at least 1"),
    (["simulate", "--html", "x.txt"], "ending in .html"),
    (["gantt", "-o", "g.png", "--html", "x.svg"], "ending in .html"),
    (["sweep", "-o", "out", "--html", "x.png"], "ending in .html"),
    (["validate", "-s", "1f1b", "--html", "x.png"], "ending in .html"),  # before any run (no torch needed)
    (["validate", "--runtime", "torch", "--html", "x.png"], "ending in .html"),  # PyTorch's runtime too
])
def test_cli_refuses_bad_pages(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipesim: error:") and words in err[0]
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_writes_pages(tmp_path, capsys):
    assert main(["page", "playground", "-o", str(tmp_path / "p.html"), "--max-devices", "3",
                 "--max-microbatches", "4"]) == 0
    assert "needs no network" in capsys.readouterr().out
    assert (tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["simulate", "-s", "1f1b", "-K", "4", "-M", "8", "--html", str(tmp_path / "s.html")]) == 0
    doc = _page_doc((tmp_path / "s.html").read_text())
    # every action: F and B of 8 micro-batches on 4 stages, and one update per stage
    assert doc["runs"][0]["title"] == "1f1b" and len(doc["runs"][0]["comp"]["start"]) == 2 * 4 * 8 + 4
    assert main(["gantt", "-s", "gpipe,1f1b", "-K", "4", "-M", "4", "-o", str(tmp_path / "g.png"),
                 "--html", str(tmp_path / "g.html")]) == 0
    assert [r["title"] for r in _page_doc((tmp_path / "g.html").read_text())["runs"]] == ["gpipe", "1f1b"]


def _page_doc(page: str):
    return unpack(re.search(r'id="ps-data">([^<]*)<', page).group(1))


def _measured(result, seed):
    """A 'measured' twin of a simulated run: every action delayed by random runtime overhead, order kept."""
    rng = np.random.default_rng(seed)
    tl = result.timeline.copy()
    tl = tl.sort_values(["device", "start"]).reset_index(drop=True)
    shift = np.zeros(len(tl))
    for d, rows in tl[tl["src"] < 0].groupby("device").groups.items():
        shift[list(rows)] = np.cumsum(rng.random(len(rows)) * 0.05)
    tl["start"] += shift
    tl["end"] += shift
    sends = tl["src"] >= 0
    tl.loc[sends, "end"] += rng.random(int(sends.sum())) * 0.3  # and slower links
    return make_result(result.schedule, result.costs, result.hardware, tl, source="measured")


@pytest.mark.parametrize("name, overlap, seed", [("1f1b", True, 0), ("zb-h1", False, 1), ("interleaved-1f1b", True, 2),
                                                 ("gpipe", True, 3), ("pipedream", False, 4)])
def test_action_waits_add_up_to_the_idle_split(name, overlap, seed):
    """Per device, the waits before its actions plus the drain are validate.compare.idle.split_idle's totals."""
    idle = pytest.importorskip("validate.compare.idle")  # needs no torch, but lives in validate
    s = schedules.generate(name, 4, 8)
    costs = sim.uniform(s.stages, forward=1.0, backward=2.0, weight=0.5, activation_bytes=1e6, send_bytes=1e6)
    result = sim.simulate(s, costs, sim.Hardware(devices=4, latency=0.1, bandwidth=1e7, overlap=overlap))
    for run in (result, _measured(result, seed)):
        rng = np.random.default_rng(seed)
        spans = {d: [(float(a), float(a + rng.random())) for a in rng.random(5) * run.metrics.makespan]
                 for d in range(4)} if run.source == "measured" else None
        split = idle.split_idle(run, spans)
        rows = run.rows
        comp = np.flatnonzero(rows.computing)
        comp = comp[np.lexsort((rows.start[comp], rows.device[comp]))]
        waits = action_waits(run, rows, comp, spans)
        device = rows.device[comp]
        for d in range(4):
            last = float(rows.end[comp][device == d].max())
            drain = max(0.0, run.metrics.makespan - last)
            assert np.sum(waits.dependency[device == d]) + drain == pytest.approx(split.dependency[d], abs=1e-9)
            assert np.sum(waits.communication[device == d]) == pytest.approx(split.communication[d], abs=1e-9)
            assert np.sum(waits.gap[device == d]) == pytest.approx(split.gap[d], abs=1e-9)
        if run.source == "measured":
            assert waits.gap.sum() > 0  # the injected overhead is seen as gaps
        else:
            assert waits.gap.sum() == pytest.approx(0.0, abs=1e-9)  # a simulation has none


def test_waits_see_a_late_transfer_as_communication():
    """Injected bug: a transfer that arrives late. Its consumer's wait must move from gap to communication."""
    s = schedules.generate("gpipe", 2, 1)
    result = sim.simulate(s, sim.uniform(2), sim.Hardware(devices=2))
    tl = result.timeline.copy()
    send = tl.index[tl["op"] == "SEND_F"][0]
    tl.loc[send, "end"] = 1.5  # F0 on device 0 ends at 1; its activation arrives at 1.5
    later = (tl["device"] == 1) & (tl["src"] < 0)
    tl.loc[later, ["start", "end"]] += 0.75  # device 1 starts at 1.75
    run = make_result(s, result.costs, result.hardware, tl, source="measured")
    doc = run_document(run)
    c = doc["comp"]
    first_on_1 = int(c["devStart"][1])
    assert c["wait_dependency"][first_on_1] == pytest.approx(1.0)
    assert c["wait_communication"][first_on_1] == pytest.approx(0.5)
    assert c["wait_gap"][first_on_1] == pytest.approx(0.25)


def test_timeline_document_columns():
    s = schedules.generate("zbv", 4, 8)
    r = sim.simulate(s, sim.uniform(s.stages, activation_bytes=1e6, send_bytes=1e6),
                     sim.Hardware(devices=4, latency=0.01, bandwidth=1e8))
    doc = run_document(r)
    c, x = doc["comp"], doc["xfer"]
    assert int(c["devStart"][-1]) == len(c["start"]) == len(s.keys_array)
    for d in range(4):
        a, b = int(c["devStart"][d]), int(c["devStart"][d + 1])
        assert np.all(np.diff(c["start"][a:b]) >= 0) and np.all(c["start"][a + 1:b] >= c["end"][a:b - 1])
    assert set(np.unique(c["chunk"]).tolist()) == {0, 1}  # a V: two chunks per device
    assert len(x["start"]) == int((r.timeline["src"] >= 0).sum()) and doc["memory"]["integer"] is False
    page = timeline_page([r, r], titles=["a", "b"])
    assert [run["title"] for run in _page_doc(page)["runs"]] == ["a", "b"]
    with pytest.raises(sim.PipesimError, match="one title per result"):
        timeline_page([r], titles=["a", "b"])


def test_sweep_page_document():
    df = pd.DataFrame({"schedule": ["1f1b"] * 4 + ["gpipe"], "devices": [2, 2, 4, 4, 4], "microbatches": [1, 4, 4, 8, 4],
                       "utilization": [0.5, 0.8, 0.57, 0.72, 0.57], "closed_form_utilization": [0.5, 0.8, 4 / 7, np.nan, 4 / 7],
                       "error": ["", "", "", "", "boom"]})
    doc = _page_doc(sweep_page(df))
    assert [p["schedule"] for p in doc["panels"]] == ["1f1b"]
    lines = doc["panels"][0]["lines"]
    assert [line["K"] for line in lines] == [2, 4] and [p["M"] for p in lines[1]["points"]] == [4, 8]
    assert lines[1]["closed"] == [[4, 4 / 7]]  # no dashed point where the formula has none
    assert doc["failed"] == ["gpipe K=4 M=4: boom"]


def test_check_page_path(tmp_path):
    with pytest.raises(PageError):
        check_page_path(tmp_path / "x.png")
    (tmp_path / "d.html").mkdir()
    with pytest.raises(sim.PipesimError, match="existing folder"):
        check_page_path(tmp_path / "d.html")
