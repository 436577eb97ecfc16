"""Every generator's output is what it was before issue 25's speed work, bit for bit, over many (K, M, v) shapes.

``tests/golden/generator_digests.json`` holds, per (schedule, K, M, chunks, iterations, recompute), a SHA-256 of the
schedule's keys, device boundaries, placement and overlapped pairs (or the first line of the error it raised),
written by this file's ``_write`` from the generators as they were before any of them was rewritten for speed.
A rewritten generator must give the same digest for every shape; a test changes one key and sees the digest move.

    PYTHONPATH=. python tests/test_generators_golden.py   # rewrite the digests (only for an intended change)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from sim import schedules
from sim.errors import PipesimError

GOLDEN = Path(__file__).parent / "golden" / "generator_digests.json"
_CHUNKS = {"interleaved-1f1b": (2, 3, 4), "zbv": (2,), "dualpipev": (2,)}  # others: one stage per device


def _shapes():
    for name in schedules.names():
        for chunks in _CHUNKS.get(name, (1,)):
            for K in (1, 2, 3, 4, 5, 6, 8, 12, 16):
                for M in sorted({1, 2, 3, K - 1, K, K + 1, 2 * K, 2 * K + 3, 3 * K, 4 * K, 24, 37} - {0}):
                    for iterations, recompute in ((1, False), (2, False), (1, True), (3, True)):
                        yield name, K, M, chunks, iterations, recompute


def _key(shape) -> str:
    return "{} K={} M={} v={} N={} r={}".format(*shape)


def _digest(schedule) -> str:
    h = hashlib.sha256()
    for part in (schedule.keys_array, schedule.device_start, np.asarray(schedule.placement, dtype=np.int64),
                 np.sort(np.asarray(schedule.fused, dtype=np.int64))):
        h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        h.update(b"|")
    h.update(f"{schedule.name} {schedule.devices} {schedule.stages} {schedule.microbatches} "
             f"{schedule.iterations}".encode())
    return h.hexdigest()[:16]  # 64 bits: a collision by chance is out of reach over a few thousand shapes


def _outcome(name, K, M, chunks, iterations, recompute) -> str:
    try:
        s = schedules.generate(name, K, M, chunks=chunks, iterations=iterations, recompute=recompute)
    except PipesimError as exc:
        return "error: " + str(exc).splitlines()[0]
    return _digest(s)


def _write() -> None:
    GOLDEN.write_text(json.dumps({_key(s): _outcome(*s) for s in _shapes()}, indent=0, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", schedules.names())
def test_generator_output_is_unchanged(name, golden):
    shapes = [s for s in _shapes() if s[0] == name]
    assert len(shapes) > 100
    changed = [_key(s) for s in shapes if golden[_key(s)] != _outcome(*s)]
    assert not changed, f"{len(changed)} shapes differ from the golden digests, e.g. {changed[:5]}"


def test_the_digest_sees_one_changed_key(golden):
    """A generator that swapped two actions of one device would be caught."""
    s = schedules.generate("zb-h2", 4, 8)
    keys = s.keys_array.copy()
    keys[[3, 4]] = keys[[4, 3]]
    swapped = s.replace_keys(keys, s.device_start)
    assert _digest(s) == golden[_key(("zb-h2", 4, 8, 1, 1, False))]
    assert _digest(swapped) != _digest(s)


if __name__ == "__main__":
    _write()
