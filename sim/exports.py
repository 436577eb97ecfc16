"""Timeline exports: CSV and Parquet (what a spreadsheet or pandas reads back)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from .errors import PipesimError
from .files import atomic_path

__all__ = ["write_timeline", "read_timeline"]


def write_timeline(timeline: pd.DataFrame, path: str | Path) -> Path:
    """Write *timeline* as .csv or .parquet (by suffix), atomically."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise PipesimError(f"cannot write a timeline to {str(path)!r}: use a .csv or .parquet file name")
    with atomic_path(path) as tmp:  # sim.files: no partial file, no stray .tmp, a folder refused at once
        if suffix == ".csv":
            timeline.to_csv(tmp, index=False)
        else:
            timeline.to_parquet(tmp, index=False)
    return path


def read_timeline(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path)
