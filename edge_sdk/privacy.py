"""Private row heat on the device: randomized response over a table's rows (FedSubAvg).

Hot-and-cold FedSubAvg, appendix F: the server needs n_m, how many devices involve row m, but not
which device does. Each device reports one bit per row of the table: the true bit ("my data
touches row m") with probability ``p = e^eps / (1 + e^eps)``, its flip with ``q = 1 - p``
(Warner's randomized response). Each bit is eps-locally differentially private; the server's
estimate ``sum_i (b'_i - q) / (p - q)`` is unbiased (``orchestrator.strategies.heat``).

The row download is another matter: a device fetches the rows it trains by selection, so the
server sees the rows it asks for. :func:`download_rows` pads the true rows with decoys (each other
row with probability ``decoy_rate``), so the download set is a superset: the server learns that rows
outside it are not the device's, not which rows inside it are. The trained update still shows
which rows changed; hiding that needs secure aggregation or private set union (appendix F's [19]).

numpy only: importing this module loads neither torch nor onnx.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PrivateHeat", "download_rows", "private_hello_fields", "randomized_response"]


@dataclass(frozen=True)
class PrivateHeat:
    """The device's private-heat settings: ``epsilon`` per bit, the size of each table by input
    column (``"0"``, ``"1"``...; the model's, known to the app), and the decoy rate of downloads."""

    epsilon: float
    tables: Mapping[str, int] = field(default_factory=dict)
    decoy_rate: float | None = None  # None: q = 1 / (1 + e^eps), the flip probability

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"private heat needs a finite epsilon > 0, got {self.epsilon}")
        if self.decoy_rate is not None and not 0.0 <= self.decoy_rate <= 1.0:
            raise ValueError(f"decoy_rate must be in [0, 1], got {self.decoy_rate}")
        for column, n in self.tables.items():
            if n < 1:
                raise ValueError(f"table of column {column!r} has {n} rows")

    @property
    def flip(self) -> float:
        return 1.0 / (1.0 + math.exp(self.epsilon))


def randomized_response(rows: np.ndarray, num_rows: int, epsilon: float, rng: np.random.Generator) -> bytes:
    """One bit per table row, the true membership kept with p = e^eps / (1 + e^eps), packed
    (``np.packbits`` order, ``ceil(num_rows / 8)`` bytes)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise ValueError(f"rows outside [0, {num_rows})")
    truth = np.zeros(num_rows, dtype=bool)
    truth[rows] = True
    flip = rng.random(num_rows) < 1.0 / (1.0 + math.exp(epsilon))
    return np.packbits(truth ^ flip).tobytes()


def download_rows(rows: np.ndarray, num_rows: int, decoy_rate: float, rng: np.random.Generator) -> np.ndarray:
    """The rows to download: the true ones plus each other row with probability ``decoy_rate``, sorted."""
    decoys = np.flatnonzero(rng.random(num_rows) < decoy_rate)
    return np.union1d(np.asarray(rows, dtype=np.int64), decoys)


def private_hello_fields(rows: Mapping[str, list[int]], settings: PrivateHeat,
                         rng: np.random.Generator) -> tuple[dict[str, list[int]], dict[str, bytes]]:
    """``Hello.rows`` (padded download sets) and ``Hello.row_bits`` for the columns of ``settings.tables``.

    Columns without a known table size keep their declared rows and get no bits.
    """
    out_rows: dict[str, list[int]] = {}
    bits: dict[str, bytes] = {}
    rate = settings.flip if settings.decoy_rate is None else settings.decoy_rate
    for column, values in rows.items():
        n = settings.tables.get(column)
        if n is None:
            out_rows[column] = list(values)
            continue
        true = np.asarray(values, dtype=np.int64)
        true = true[true < n]  # values past the table cannot be rows of it
        bits[column] = randomized_response(true, n, settings.epsilon, rng)
        out_rows[column] = download_rows(true, n, rate, rng).tolist()
    return out_rows, bits


#: Hello.ext keys of private row heat: the hello fields FedSubAvg declares (its ``HELLO_FIELDS``).
ROW_BITS_KEY, ROW_EPSILON_KEY = "fedsubavg.row_bits", "fedsubavg.row_epsilon"


def private_hello_ext(bits: Mapping[str, bytes], settings: PrivateHeat | None) -> dict[str, object]:
    """The hello's extension fields for private row heat (``bits`` from :func:`private_hello_fields`),
    empty for a device that declares its rows themselves."""
    if settings is None or not bits:
        return {}
    return {ROW_BITS_KEY: dict(bits), ROW_EPSILON_KEY: float(settings.epsilon)}
