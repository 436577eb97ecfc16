"""Timeline exports: Parquet carries schedule, source and units; CSV round-trips; bad names are refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim import schedules, simulate, uniform
from sim.cli import main
from sim.io.timeline_io import TIMELINE_UNITS, ExportError, read_timeline, write_timeline
from sim.results.timeline import TIMELINE_COLUMNS


@pytest.fixture(scope="module")
def result():
    return simulate(schedules.one_f_one_b(3, 4), uniform(3, send_bytes=8.0))


def test_parquet_carries_schedule_source_and_units(result, tmp_path):
    path = write_timeline(result, tmp_path / "t.parquet")
    back = read_timeline(path)
    pd.testing.assert_frame_equal(back, result.timeline, check_categorical=False, check_dtype=False)
    meta = back.attrs["pipesim"]
    assert meta["schedule"] == "1f1b K=3 S=3 M=4 N=1" and meta["source"] == "simulated"
    assert meta["units"] == {c: TIMELINE_UNITS[c] for c in TIMELINE_COLUMNS}
    assert meta["units"]["start"] == "s" and meta["units"]["bytes"] == "bytes"
    import pyarrow.parquet as pq
    schema = pq.read_schema(path)
    assert schema.field("end").metadata[b"unit"] == b"s"


def test_predicted_and_measured_stay_apart_once_concatenated(result, tmp_path):
    a = write_timeline(result, tmp_path / "predicted.parquet")
    b = write_timeline(result.timeline, tmp_path / "measured.parquet", schedule="1f1b K=3 M=4", source="measured")
    both = pd.concat([read_timeline(a, tag=True), read_timeline(b, tag=True)], ignore_index=True)
    assert len(both) == 2 * len(result.timeline)
    assert both.groupby("source", observed=True).size().to_dict() == {"measured": len(result.timeline),
                                                                      "simulated": len(result.timeline)}


def test_csv_round_trips_and_bad_names_are_refused(result, tmp_path):
    back = read_timeline(write_timeline(result, tmp_path / "t.csv"))
    assert list(back.columns) == TIMELINE_COLUMNS and len(back) == len(result.timeline)
    assert back["end"].max() == result.metrics.makespan
    with pytest.raises(ExportError, match=r"\.csv or \.parquet"):
        write_timeline(result, tmp_path / "t.txt")
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_simulate_timeline_parquet_has_the_metadata(tmp_path, capsys):
    path = tmp_path / "run.parquet"
    assert main(["simulate", "-s", "gpipe", "-K", "2", "-M", "3", "--timeline", str(path), "--json"]) == 0
    capsys.readouterr()
    meta = read_timeline(path).attrs["pipesim"]
    assert meta["schedule"].startswith("gpipe K=2") and meta["source"] == "simulated"
    json.dumps(meta)  # plain JSON
