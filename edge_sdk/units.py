"""Memory sizes as people write them (``512MiB``, ``1.5GiB``, ``300MB``), for a device's ``--budget``.

Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (kB, MB, GB, TB) powers of
1000, as on a spec sheet. A bare ``K``/``M``/``G``/``T`` means the binary unit, as in ``docker --memory``
and ``ulimit``. A plain number is a count of bytes.
"""

from __future__ import annotations

import re

__all__ = ["parse_size"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}

_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``512MiB``, ``1.5GiB``, ``300MB`` or ``4096``.

    Raises :class:`ValueError` naming the accepted units when the text is not a size.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a memory size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a memory size cannot be negative: {text}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"not a memory size: {text!r}")
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(
            f"not a memory size: {text!r}; write a number with an optional unit, "
            "e.g. 512MiB, 1.5GiB, 300MB or 4096 (bytes)"
        )
    unit = match["unit"].lower()
    if unit not in _UNITS:
        raise ValueError(
            f"unknown unit {match['unit']!r} in {text!r}; use one of "
            "B, KiB, MiB, GiB, TiB (1024-based), kB, MB, GB, TB (1000-based), K, M, G, T (1024-based)"
        )
    return round(float(match["number"]) * _UNITS[unit])
