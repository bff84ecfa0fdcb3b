"""Row heat for FedSubAvg: n_m, how many registered devices involve row m of each sparse table.

FedSubAvg (Algorithm 1, line 9 of both FedSubAvg papers) scales row m's aggregated update by
``N / n_m``; its weighted form (hot-and-cold paper, appendix D.4) by ``sum_i w_i / sum_{j: m in S(j)}
w_j``. Both come from one counter: a device adds its weight ``w`` (1, or its sample count) to every
row it involves and to the table's total.

Two modes, chosen per device by what its hello carried (``DeviceInfo.rows``, or the row bits of
FedSubAvg's hello field ``fedsubavg.row_bits``):

- **exact**: the device's index set S(i); the counter adds ``w`` to exactly those rows.
- **private** (hot-and-cold appendix F, randomized response): the device sends one bit per row
  of the table, the true bit kept with probability ``p = e^eps / (1 + e^eps)`` and flipped with
  ``q = 1 - p`` (:mod:`edge_sdk.privacy`). ``E[b'] = q + (p - q) b``, so ``(b' - q) / (p - q)``
  is an unbiased estimate of the true bit b, and ``sum_i w_i (b'_i - q_i) / (p_i - q_i)`` of
  ``n_m`` (devices may even use different epsilons). The counter keeps the raw unbiased sum;
  :meth:`RowHeat.heat` clips it to ``[min weight, total]`` (``[1, N]`` for unit weights) so the
  correction factor stays finite and at least 1. No device's true index set is ever stored: the
  counter holds its reported (randomized) bits only, to take them out when the device leaves.

Work per registration is O(rows the device declares) in exact mode and O(table rows) in private
mode (one bit per row is what the device sends); memory is one float64 per table row, plus, per
registered device, what it sent (its rows, or its packed bits: table rows / 8 bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HEAT_MODES", "RowHeat", "TableHeat", "rr_probabilities"]

#: How a device's contribution to the heat was declared.
HEAT_MODES: tuple[str, ...] = ("exact", "private")


def rr_probabilities(epsilon: float) -> tuple[float, float]:
    """(p, q) of randomized response at ``epsilon``: a bit is kept with p and flipped with q = 1 - p."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"randomized response needs a finite epsilon > 0, got {epsilon}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    return p, 1.0 - p


@dataclass
class _Contribution:
    weight: float
    rows: np.ndarray | None = None  # exact mode: the device's rows
    bits: bytes | None = None  # private mode: its randomized-response bits, packed (np.packbits order)
    epsilon: float = 0.0


@dataclass
class TableHeat:
    """The heat of one table: ``counts[m]`` = sum of the weights of devices involving row m
    (an unbiased estimate in private mode), ``total`` = sum of all devices' weights."""

    num_rows: int
    counts: np.ndarray = field(init=False)
    total: float = 0.0
    min_weight: float = math.inf
    _devices: dict[str, _Contribution] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.counts = np.zeros(self.num_rows, dtype=np.float64)

    def __contains__(self, device_id: str) -> bool:
        return device_id in self._devices

    @property
    def devices(self) -> int:
        return len(self._devices)

    def add_exact(self, device_id: str, rows: np.ndarray, weight: float = 1.0) -> None:
        """Count a device that declared its rows (sorted, distinct, inside the table)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows[0] < 0 or rows[-1] >= self.num_rows):
            raise ValueError(f"rows outside [0, {self.num_rows})")
        self._enter(device_id, _Contribution(float(weight), rows=rows))
        self.counts[rows] += weight  # rows are distinct (checked on the hello), so no add.at is needed

    def add_private(self, device_id: str, bits: bytes, epsilon: float, weight: float = 1.0) -> None:
        """Count a device that sent randomized-response bits (hot-and-cold appendix F)."""
        self._enter(device_id, _Contribution(float(weight), bits=bytes(bits), epsilon=float(epsilon)))
        self.counts += weight * self._debiased(bits, epsilon)

    def remove(self, device_id: str) -> None:
        """Take a device's contribution out (it left)."""
        c = self._devices.pop(device_id, None)
        if c is None:
            return
        self.total -= c.weight
        if c.rows is not None:
            self.counts[c.rows] -= c.weight
        else:
            assert c.bits is not None
            self.counts -= c.weight * self._debiased(c.bits, c.epsilon)
        if not self._devices:
            self.counts[:] = 0.0
            self.total, self.min_weight = 0.0, math.inf

    def heat(self, rows: np.ndarray | None = None) -> np.ndarray:
        """``n_m`` for ``rows`` (all rows by default), clipped to ``[min weight, total]``."""
        counts = self.counts if rows is None else self.counts[rows]
        if not self._devices:
            return np.zeros_like(counts)
        return np.clip(counts, min(self.min_weight, self.total), self.total)

    def _enter(self, device_id: str, c: _Contribution) -> None:
        if not c.weight > 0 or not math.isfinite(c.weight):
            raise ValueError(f"device {device_id!r}: heat weight must be finite and > 0, got {c.weight}")
        self.remove(device_id)
        self._devices[device_id] = c
        self.total += c.weight
        self.min_weight = min(self.min_weight, c.weight)

    def _debiased(self, bits: bytes, epsilon: float) -> np.ndarray:
        """(b' - q) / (p - q) per row: the unbiased estimate of one device's true bits."""
        expected = (self.num_rows + 7) // 8
        if len(bits) != expected:
            raise ValueError(f"{len(bits)} bytes of row bits for a table of {self.num_rows} rows (need {expected})")
        p, q = rr_probabilities(epsilon)
        b = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=self.num_rows).astype(np.float64)
        return (b - q) / (p - q)


class RowHeat:
    """The heat of every sparse table, kept in step with the registered devices.

    :meth:`sync` is called with the devices of a round (``ctx.devices``): new devices are counted,
    devices no longer there are taken out, so ``n_m`` follows registrations and departures.
    """

    def __init__(self, tables: Mapping[str, int]) -> None:
        self.tables = {name: TableHeat(int(n)) for name, n in tables.items()}
        self._weights: dict[str, float] = {}
        self._entries: dict[str, tuple[str, ...]] = {}  # device -> tables it is counted in

    def __getitem__(self, name: str) -> TableHeat:
        return self.tables[name]

    def add(self, device_id: str, entries: Iterable[str], weight: float, *,
            rows: Mapping[str, np.ndarray] | None = None, bits: Mapping[str, bytes] | None = None,
            epsilon: float = 0.0) -> None:
        """Count a device in ``entries`` (the tables it trains), from its rows or its private bits."""
        entries = tuple(entries)
        rows, bits = rows or {}, bits or {}
        for name in entries:
            table = self.tables[name]
            if name in bits:
                table.add_private(device_id, bits[name], epsilon, weight)
            elif name in rows:
                table.add_exact(device_id, rows[name], weight)
            else:
                table.add_exact(device_id, np.empty(0, np.int64), weight)  # involves no row, still one of N
        self._weights[device_id] = weight
        self._entries[device_id] = entries

    def remove(self, device_id: str) -> None:
        for name in self._entries.pop(device_id, ()):
            self.tables[name].remove(device_id)
        self._weights.pop(device_id, None)

    def entries_of(self, device_id: str) -> tuple[str, ...] | None:
        return self._entries.get(device_id)

    @property
    def devices(self) -> set[str]:
        return set(self._entries)
