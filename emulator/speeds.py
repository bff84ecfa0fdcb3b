"""How fast each emulated device trains: per-device speed factors from a heavy-tailed distribution or
a trace file (docs/buffered.md, "Emulating a heavy-tailed fleet").

Phones differ in speed by ten times and more (a GPU tab's round took 189-223 s against 10-18 s for a
WebAssembly tab of the same role), and the slowest decide what synchronous rounds cost. An emulated
device runs its real training on this machine at this machine's speed; a factor f >= 1 makes it a
device f times slower by holding each report back for ``(f - 1) * base_round_s`` (the emulator's
report delay, :class:`~emulator.faults.Faults` ``delay_s``), ``base_round_s`` being what a round of
real work takes a device of factor 1.

Distributions (``SPEED_DISTRIBUTIONS``), each drawn per device from (seed, device id), so a restarted
device keeps its factor and a fleet is the same fleet in every mode:

- ``pareto`` (shape alpha): f = (1 - u)^(-1/alpha), a Pareto tail from 1; alpha = 1.5 puts the median
  at 1.59, one device in ten above 4.6 and one in a hundred above 21.5;
- ``lognormal`` (shape sigma): f = exp(sigma |z|), half a lognormal from 1;
- ``uniform``: every factor 1 (a fleet of equals).

A trace file gives measured factors instead: JSON ``{"device id": factor, ...}`` or CSV lines
``device id,factor``; a device it does not name gets factor 1.
"""

from __future__ import annotations

import csv
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

__all__ = ["SPEED_DISTRIBUTIONS", "load_speed_trace", "report_delays", "speed_factors"]


def _pareto(u: float, z: float, shape: float) -> float:
    return float((1.0 - u) ** (-1.0 / shape))


def _lognormal(u: float, z: float, shape: float) -> float:
    return float(np.exp(shape * abs(z)))


def _uniform(u: float, z: float, shape: float) -> float:
    return 1.0


#: The speed-factor distributions, by name: (uniform draw u, normal draw z, shape) -> factor >= 1.
SPEED_DISTRIBUTIONS: dict[str, Callable[[float, float, float], float]] = {
    "pareto": _pareto, "lognormal": _lognormal, "uniform": _uniform,
}


def speed_factors(device_ids: Iterable[str], *, distribution: str = "pareto", shape: float = 1.5, seed: int = 0,
                  cap: float = 100.0) -> dict[str, float]:
    """Each device's slowdown factor (>= 1, at most ``cap``), drawn from (seed, device id)."""
    if distribution not in SPEED_DISTRIBUTIONS:
        raise ValueError(f"unknown speed distribution {distribution!r}; known: {', '.join(SPEED_DISTRIBUTIONS)}")
    if shape <= 0 or cap < 1:
        raise ValueError(f"shape must be positive and cap at least 1, got {shape} and {cap}")
    draw = SPEED_DISTRIBUTIONS[distribution]
    out = {}
    for d in device_ids:
        rng = np.random.default_rng([seed, zlib.crc32(d.encode())])
        u, z = rng.random(), rng.standard_normal()
        out[d] = min(cap, max(1.0, draw(u, z, shape)))
    return out


def load_speed_trace(path: Path | str, device_ids: Iterable[str] = ()) -> dict[str, float]:
    """Factors from a trace file (JSON object or CSV ``device,factor``); ``device_ids`` not in it get 1."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        given = {str(k): float(v) for k, v in json.loads(text).items()}
    else:
        given = {row[0].strip(): float(row[1]) for row in csv.reader(text.splitlines())
                 if row and not row[0].startswith("#")}
    bad = {d: f for d, f in given.items() if not f >= 1.0}
    if bad:
        raise ValueError(f"{path}: speed factors must be at least 1: {dict(list(bad.items())[:3])}")
    return {**dict.fromkeys(device_ids, 1.0), **given}


def report_delays(factors: Mapping[str, float], base_round_s: float) -> dict[str, float]:
    """The report delay that makes each device ``factor`` times slower than one whose round takes ``base_round_s``."""
    return {d: round((f - 1.0) * base_round_s, 3) for d, f in factors.items()}
