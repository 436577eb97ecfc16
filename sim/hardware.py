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
matrix (row = sender, column = receiver; the diagonal is ignored).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import PipesimError

__all__ = ["Hardware", "HardwareError", "load_hardware", "save_hardware"]


class HardwareError(PipesimError):
    """A hardware description that cannot be used."""


def _matrix(value, devices: int, name: str, *, positive: bool) -> tuple[tuple[float, ...], ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rows = [[float(value)] * devices for _ in range(devices)]
    else:
        try:
            rows = [[float(x) for x in row] for row in value]
        except (TypeError, ValueError):
            raise HardwareError(f"{name} must be a number or a {devices}x{devices} matrix of numbers") from None
        if len(rows) != devices or any(len(r) != devices for r in rows):
            raise HardwareError(f"{name} must be a number or a {devices}x{devices} matrix (row = sender)")
    for a, row in enumerate(rows):
        for b, v in enumerate(row):
            if a == b:
                continue
            if math.isnan(v) or (v <= 0 if positive else v < 0) or (not positive and math.isinf(v)):
                need = "> 0 (inf for unlimited)" if positive else ">= 0 and finite"
                raise HardwareError(f"{name}[{a}][{b}] = {v!r}; it must be {need}")
    return tuple(tuple(r) for r in rows)


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
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            raise HardwareError(f"devices must be a positive integer, got {self.devices!r}")
        object.__setattr__(self, "latency", _matrix(self.latency, self.devices, "latency", positive=False))
        object.__setattr__(self, "bandwidth", _matrix(self.bandwidth, self.devices, "bandwidth", positive=True))
        cap = self.memory_capacity
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0 or math.isinf(cap)):
            raise HardwareError(f"memory_capacity must be a positive number of bytes, got {cap!r}")

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds a transfer of *nbytes* holds link (src, dst): latency + bytes / bandwidth."""
        bw = self.bandwidth[src][dst]
        return self.latency[src][dst] + (nbytes / bw if nbytes > 0 else 0.0)

    @property
    def free_links(self) -> bool:
        return all(self.latency[a][b] == 0 and math.isinf(self.bandwidth[a][b])
                   for a in range(self.devices) for b in range(self.devices) if a != b)

    def to_dict(self) -> dict:
        def compact(m):
            values = {m[a][b] for a in range(self.devices) for b in range(self.devices) if a != b}
            return values.pop() if len(values) == 1 else [list(r) for r in m]

        bw = compact(self.bandwidth)
        return {"devices": self.devices, "latency": compact(self.latency),
                "bandwidth": "inf" if bw == math.inf else bw,
                "memory_capacity": self.memory_capacity, "overlap": self.overlap}


def load_hardware(path: str | Path) -> Hardware:
    """Read a hardware JSON file (format in the module docstring)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise HardwareError(f"cannot read hardware file {str(path)!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise HardwareError(f"hardware file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "devices" not in data:
        raise HardwareError(f"hardware file {str(path)!r} must be a JSON object with at least 'devices'")
    known = {"devices", "latency", "bandwidth", "memory_capacity", "overlap"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"hardware file {str(path)!r} has unknown keys {unknown}; known: {sorted(known)}")
    if data.get("bandwidth") == "inf":
        data["bandwidth"] = math.inf
    return Hardware(**data)


def save_hardware(hardware: Hardware, path: str | Path) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(hardware.to_dict(), indent=2) + "\n")
    tmp.replace(path)
    return path
