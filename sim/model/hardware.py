"""The machine: K devices, their memory, and the directed links between them.

A transfer of *n* bytes from device *a* to device *b* holds the directed link
(a, b) for ``latency[a][b] + n / bandwidth[a][b]`` seconds; a link carries one
transfer at a time (first come, first served). Free links (latency 0, infinite
bandwidth) are the default, as in the textbook figures.

Units: seconds, bytes, bytes per second.

The hardware file (``--hardware FILE``) is JSON::

    {"devices": 4, "memory_capacity": 8e9, "overlap": true,
     "latency": 2e-5, "bandwidth": 1e10}

where ``latency`` and ``bandwidth`` are each a number (every link) or a K x K
matrix (row = sender, column = receiver; the diagonal is ignored), ``bandwidth`` may be
``"inf"`` (unlimited), and ``overlap`` is a JSON boolean (the string ``"false"`` is refused,
never read as true). One number for every link is stored as one shared row, so a machine of
10^5 devices costs O(K) memory; more than :data:`MAX_DEVICES` devices are refused. Numbers may
be of any real type (numpy, Decimal, Fraction); a wrong type is a TypeError naming the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.files import read_json, write_text
from sim.errors import PipesimError, PipesimTypeError, quote, real_number, whole_number

__all__ = ["Hardware", "HardwareError", "load_hardware", "save_hardware", "MAX_DEVICES"]

MAX_DEVICES = 1 << 20
"""The most devices pipesim models (1,048,576). Far above any pipeline degree in use (hundreds), and low
enough that a typo such as ``{"devices": 10000000000}`` is refused at once instead of exhausting memory."""


class HardwareError(PipesimError):
    """A hardware description that cannot be used."""


def _check_link(v: float, where: str, *, positive: bool) -> None:
    if math.isnan(v) or (v <= 0 if positive else v < 0) or (not positive and math.isinf(v)):
        need = "> 0 (inf for unlimited)" if positive else ">= 0 and finite"
        raise HardwareError(f"{where} = {v!r}; it must be {need}")


def _matrix(value, devices: int, name: str, *, positive: bool) -> tuple[tuple[float, ...], ...]:
    if isinstance(value, str) and name == "bandwidth" and value.strip().lower() == "inf":
        value = math.inf  # the hardware file's spelling of unlimited bandwidth
    if not isinstance(value, (str, bytes, Sequence)) and not hasattr(value, "__len__"):
        v = real_number(value, name)
        _check_link(v, name, positive=positive)
        row = (v,) * devices  # one row object shared by every sender: O(K) memory, however large K is
        return (row,) * devices
    if isinstance(value, (str, bytes)):
        raise PipesimTypeError(f"{name} must be a number or a {devices}x{devices} matrix of numbers, "
                               f"got the string {quote(value)}")
    if len(value) != devices:  # before converting anything: a huge matrix of the wrong size is refused at once
        raise HardwareError(f"{name} must be a number or a {devices}x{devices} matrix (row = sender); "
                            f"it has {len(value)} rows")
    rows = []
    for a, row in enumerate(value):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != devices:
            raise HardwareError(f"{name} must be a number or a {devices}x{devices} matrix (row = sender); "
                                f"row {a} is {quote(row)}")
        rows.append(tuple(real_number(x, f"{name}[{a}][{b}]") for b, x in enumerate(row)))
    for a, row in enumerate(rows):
        for b, v in enumerate(row):
            if a != b:
                _check_link(v, f"{name}[{a}][{b}]", positive=positive)
    return tuple(rows)


def _uniform(matrix: tuple[tuple[float, ...], ...]) -> float | None:
    """The one value of every link of *matrix*, or None if links differ; O(K) for the shared rows of a number."""
    first = matrix[0]
    if all(row is first for row in matrix) and len(set(first)) == 1:
        return first[0]
    devices = len(matrix)
    values = {matrix[a][b] for a in range(devices) for b in range(devices) if a != b}
    if len(values) > 1:
        return None
    return values.pop() if values else first[0]  # one device: no links; its own entry stands for all


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """K devices with a memory capacity and directed links."""

    devices: int
    """K, the number of devices."""
    latency: float | Sequence[Sequence[float]] = 0.0
    """Seconds per transfer: one number for every link, or a K x K matrix (row = sender)."""
    bandwidth: float | Sequence[Sequence[float]] = math.inf
    """Bytes per second: one number for every link, or a K x K matrix (row = sender)."""
    memory_capacity: float | None = None
    """Bytes per device; exceeding it is reported as an overflow. None: unlimited."""
    overlap: bool = True
    """True: transfers run beside compute. False: the sending device is busy until its send is done."""

    def __post_init__(self) -> None:
        devices = whole_number(self.devices, "devices")  # numpy integers welcome, 4.0 and True are not
        if not 1 <= devices <= MAX_DEVICES:
            raise HardwareError(f"devices must be between 1 and {MAX_DEVICES}, got {self.devices!r}")
        object.__setattr__(self, "devices", devices)
        if not isinstance(self.overlap, bool) and getattr(self.overlap, "dtype", None) != bool:
            # a string such as "false" would count as true: refuse anything but a bool
            raise PipesimTypeError(f"overlap must be true or false (a bool), got {type(self.overlap).__name__} "
                                   f"{quote(self.overlap)}")
        object.__setattr__(self, "overlap", bool(self.overlap))
        object.__setattr__(self, "latency", _matrix(self.latency, devices, "latency", positive=False))
        object.__setattr__(self, "bandwidth", _matrix(self.bandwidth, devices, "bandwidth", positive=True))
        cap = self.memory_capacity
        if cap is not None:
            cap = real_number(cap, "memory_capacity")
            if not cap > 0 or math.isinf(cap):
                raise HardwareError(f"memory_capacity must be a positive, finite number of bytes, got {cap!r}")
            object.__setattr__(self, "memory_capacity", cap)

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds a transfer of *nbytes* holds link (src, dst): latency + bytes / bandwidth."""
        bw = self.bandwidth[src][dst]
        return self.latency[src][dst] + (nbytes / bw if nbytes > 0 else 0.0)

    @property
    def free_links(self) -> bool:
        return _uniform(self.latency) == 0 and _uniform(self.bandwidth) == math.inf

    def to_dict(self) -> dict:
        def compact(m):
            value = _uniform(m)
            return [list(r) for r in m] if value is None else value

        bw = compact(self.bandwidth)
        return {"devices": self.devices, "latency": compact(self.latency),
                "bandwidth": "inf" if bw == math.inf else bw,
                "memory_capacity": self.memory_capacity, "overlap": self.overlap}


def load_hardware(path: str | Path, *, devices: int | None = None) -> Hardware:
    """Read a hardware JSON file (format in the module docstring).

    *devices*: the K the caller needs; a file describing another K is refused before its link
    tables are built (a file saying 100000 devices must not cost 100000 x 100000 of anything).
    """
    name = quote(str(path), 200)
    data = read_json(path, what="hardware file", error=HardwareError,
                     expected='a hardware description, a JSON object such as {"devices": 4}')
    if not isinstance(data, dict) or "devices" not in data:
        raise HardwareError(f"hardware file {name} must be a JSON object with at least 'devices'")
    known = {"devices", "latency", "bandwidth", "memory_capacity", "overlap"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"hardware file {name} has unknown keys {quote(unknown, 120)}; known: {sorted(known)}")
    if devices is not None and data["devices"] != devices:
        raise HardwareError(f"hardware file {name} describes {quote(data['devices'])} devices; "
                            f"the schedule needs {devices}")
    try:
        return Hardware(**data)
    except PipesimError as exc:
        raise type(exc)(f"hardware file {name}: {exc}") from None


def save_hardware(hardware: Hardware, path: str | Path) -> Path:
    """Write *hardware* as a hardware JSON file (atomically); return the path."""
    return write_text(path, json.dumps(hardware.to_dict(), indent=2) + "\n")
