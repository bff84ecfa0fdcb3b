"""Memory sizes as people write them (``512MiB``, ``1.5GiB``, ``300MB``) and back.

Parsing lives in the device SDK (:func:`edge_sdk.units.parse_size`, a device reads its own
``--budget``); this module adds the way back for tables and reports.
"""

from __future__ import annotations

from edge_sdk.units import parse_size

__all__ = ["parse_size", "format_size"]


def format_size(num_bytes: int | float) -> str:
    """A byte count in binary units with one decimal, e.g. ``237.0 MiB``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TiB"
