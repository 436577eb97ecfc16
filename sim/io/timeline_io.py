"""Timeline exports: CSV and Parquet (what a spreadsheet or pandas reads back).

    write_timeline(result, "run.parquet")                    # a Result: its schedule and source go along
    write_timeline(frame, "run.parquet", schedule="1f1b K=4 M=8", source="measured")
    read_timeline("run.parquet").attrs["pipesim"]            # {"schedule": ..., "source": ..., "units": {...}}
    pd.concat([read_timeline(p, tag=True) for p in paths])   # rows keep their schedule and source columns

A Parquet file carries, in its schema metadata under the key ``pipesim`` (JSON): the schedule
(name and shape), the source (``simulated`` or ``measured``), and the unit of every column
(:data:`TIMELINE_UNITS`; each column's field metadata holds its unit too), so a predicted and
a measured timeline stay apart once read together. CSV has no place for metadata: its
columns are the timeline's (:mod:`sim.results.timeline`), times in seconds and sizes in bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sim.errors import PipesimError
from sim.files import atomic_path

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_timeline", "read_timeline", "TIMELINE_UNITS", "ExportError"]

METADATA_KEY = b"pipesim"

TIMELINE_UNITS: dict[str, str] = {
    "device": "index (the sender, for a transfer)",
    "stage": "index",
    "microbatch": "index over all iterations (update number for U)",
    "iteration": "index",
    "op": "F, B, W, R, U, SEND_F, SEND_B",
    "start": "s",
    "end": "s",
    "src": "device index (-1: a computation)",
    "dst": "device index (-1: a computation)",
    "bytes": "bytes",
}
"""Column -> unit (or what its values mean) of a timeline (schema in :mod:`sim.results.timeline`)."""


class ExportError(PipesimError):
    """A timeline that cannot be written where asked (an unknown file type)."""


def write_timeline(timeline, path: str | Path, *, schedule: str | None = None, source: str | None = None,
                   extra: Mapping[str, object] | None = None) -> Path:
    """Write a timeline as .csv or .parquet (by suffix), atomically.

    *timeline*: a :class:`~sim.results.result.Result` (its timeline, schedule and source are used) or a
    timeline DataFrame. *schedule*, *source* (``"simulated"`` / ``"measured"``) and *extra*
    (JSON-able) go into a Parquet file's metadata; given here they win over the Result's.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ExportError(f"cannot write a timeline to {str(path)!r}: use a .csv or .parquet file name")
    frame = timeline
    if hasattr(timeline, "timeline") and hasattr(timeline, "schedule"):  # a Result
        frame = timeline.timeline
        schedule = schedule if schedule is not None else _describe(timeline.schedule)
        source = source if source is not None else getattr(timeline, "source", None)
    with atomic_path(path) as tmp:
        if suffix == ".csv":
            frame.to_csv(tmp, index=False)
        else:
            _write_parquet(frame, tmp, {"schedule": schedule, "source": source,
                                        "units": {c: TIMELINE_UNITS.get(c, "") for c in frame.columns},
                                        **dict(extra or {})})
    return path


def read_timeline(path: str | Path, *, tag: bool = False) -> pd.DataFrame:
    """A timeline written by :func:`write_timeline`. From Parquet, ``.attrs["pipesim"]`` holds its metadata;
    with *tag*, the columns ``schedule`` and ``source`` repeat it on every row (for concatenating runs)."""
    import pandas as pd

    path = Path(path)
    if path.suffix.lower() != ".parquet":
        frame = pd.read_csv(path)
        meta: dict = {}
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        meta = json.loads(raw) if raw else {}
        frame = table.to_pandas()
    frame.attrs["pipesim"] = meta
    if tag:
        frame["schedule"] = pd.Categorical([meta.get("schedule")] * len(frame))
        frame["source"] = pd.Categorical([meta.get("source")] * len(frame))
    return frame


def _describe(schedule) -> str:
    parts = [getattr(schedule, "name", str(schedule))]
    for label, attr in (("K", "devices"), ("S", "stages"), ("M", "microbatches"), ("N", "iterations")):
        value = getattr(schedule, attr, None)
        if value is not None:
            parts.append(f"{label}={value}")
    return " ".join(parts)


def _write_parquet(frame: pd.DataFrame, path: Path, meta: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    fields = [f.with_metadata({b"unit": TIMELINE_UNITS[f.name].encode()}) if f.name in TIMELINE_UNITS else f
              for f in table.schema]
    metadata = dict(table.schema.metadata or {})
    metadata[METADATA_KEY] = json.dumps(meta, default=str).encode()
    table = table.cast(pa.schema(fields, metadata=metadata))
    pq.write_table(table, path)
