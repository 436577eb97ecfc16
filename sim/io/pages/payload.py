"""The data a page carries: one JSON document whose numeric arrays travel as binary columns, gzip-compressed and
base64-encoded into one text the page inlines (``assets/data.js`` reads it back with the browser's own
``DecompressionStream``; nothing is fetched).

Layout of the bytes before compression::

    b"PSB1"  uint32 little-endian: length of the header
    header   UTF-8 JSON: {"doc": <the document, each array replaced by {"$col": i}>,
                          "columns": [{"dtype": "f8", "offset": o, "length": n}, ...]}
    padding  to the next multiple of 8 bytes, where the columns start
    columns  each little-endian, at a multiple of 8 bytes (a typed array needs its alignment)

Why binary columns: a timeline of 64 ranks x 1,024 micro-batches has ~260 k rows; as JSON text a float costs
up to ~19 bytes and must be parsed, as float64 it costs 8 and the page reads it in place. gzip then shrinks the
generated schedules and the regular times of a simulation about three-fold (the K=64, M=1,024 page: 13.3 MB of
columns gzip to 3.9 MB, 5.2 MB as base64; benchmarks/bench_pages.py prints the page sizes).
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import struct

import numpy as np

__all__ = ["pack", "DTYPES"]

DTYPES = {"f8": np.float64, "f4": np.float32, "i4": np.int32, "i2": np.int16, "i1": np.int8, "u1": np.uint8}
"""The column types the page reads (assets/data.js maps each to a typed array)."""

_CODE = {np.dtype(t).str.lstrip("<|="): code for code, t in DTYPES.items()}


def pack(doc) -> str:
    """*doc* (dicts, lists, str, numbers, numpy arrays) as the page's base64 text; arrays of a type not in
    :data:`DTYPES` are refused (say which type the page should read)."""
    columns: list[np.ndarray] = []

    def walk(value):
        if isinstance(value, np.ndarray):
            code = _CODE.get(value.dtype.newbyteorder("<").str.lstrip("<|="))
            if code is None or value.ndim != 1:
                raise TypeError(f"a page column must be a 1-d array of {', '.join(DTYPES)}, got {value.dtype} "
                                f"with shape {value.shape}")
            columns.append(np.ascontiguousarray(value, dtype=np.dtype(DTYPES[code]).newbyteorder("<")))
            return {"$col": len(columns) - 1}
        if isinstance(value, dict):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if isinstance(value, (np.integer, np.bool_)):
            return value.item()
        if isinstance(value, (float, np.floating)):
            value = float(value)
            return value if math.isfinite(value) else None  # JSON has no inf / nan: the page reads null
        return value

    tree = walk(doc)
    described, offset = [], 0
    for column in columns:
        described.append({"dtype": _CODE[column.dtype.str.lstrip("<|=")], "offset": offset, "length": len(column)})
        offset += -(-column.nbytes // 8) * 8
    text = json.dumps({"doc": tree, "columns": described}, separators=(",", ":"), allow_nan=False).encode()
    parts = [b"PSB1", struct.pack("<I", len(text)), text, b"\0" * (-(8 + len(text)) % 8)]
    for column in columns:
        raw = column.tobytes()
        parts += [raw, b"\0" * (-len(raw) % 8)]
    return base64.b64encode(gzip.compress(b"".join(parts), compresslevel=9, mtime=0)).decode("ascii")
