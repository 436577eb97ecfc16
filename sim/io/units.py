"""Sizes for people: bytes in binary units (B, KiB, MiB, GiB, TiB), the one formatter of every table and plot."""

from __future__ import annotations

__all__ = ["byte_unit", "format_bytes"]

_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def byte_unit(peak: float) -> tuple[float, str]:
    """(scale, unit) to show sizes up to *peak* bytes: the largest binary unit not above it (bytes below 1 KiB)."""
    for scale, unit in _UNITS:
        if abs(peak) >= scale:
            return float(scale), unit
    return 1.0, "B"


def format_bytes(n: float) -> str:
    """*n* bytes as ``"1.5 GiB"`` (whole bytes below 1 KiB: ``"512 B"``)."""
    scale, unit = byte_unit(n)
    return f"{n:.0f} B" if unit == "B" else f"{n / scale:.1f} {unit}"
