"""FedSubAvg: federated submodel averaging with per-row heat correction.

Papers: "Federated Submodel Optimization for Hot and Cold Data Features" (hot-and-cold) and
"FedSubAvg: Federated Submodel Averaging" (Algorithm 1 is the same in both). Each device trains the
submodel of the sparse-table rows its data touches; row m is involved by n_m of the N devices.
FedAvg's update of a cold row is diluted by the many sampled devices that do not hold it (Example
1: it decays like (1 - 1/N)^r); FedSubAvg multiplies it back by N / n_m:

    Algorithm 1, line 9:   X_m <- X_m + N / (n_m K) * sum_{i in C_r} dx_{i,m}

and in the sample-weighted form (hot-and-cold appendix D.4), with w_i the device's sample count,

    X_m <- X_m + (sum_{i=1}^N w_i / sum_{j: m in S(j)} w_j) * sum_{i in C_r} w_i dx_{i,m} / sum_{i in C_r} w_i.

Dense entries are involved by every device (n_m = N), so their factor is 1: FedAvg. Rows that no
sampled device touched keep their value bit for bit.

Hooks:

- ``configure``: brings the heat (:class:`orchestrator.strategies.heat.RowHeat`) in step with the registered
  devices (``ctx.devices``: new ones counted, departed ones taken out), samples K devices (line 3)
  and sends each ``train`` for its planned tail with every table in it cut to the device's rows
  (``Selection.of_rows``: lines 5 and 12-14). With EmbracingFL roles a device whose plan freezes a
  table does not train it and is not counted in that table's heat (nor in its N).
- ``on_report``: dense deltas go into :class:`WeightedSums` (per-entry mean over contributors, as
  EmbracingFL); row-sparse deltas into a per-round row accumulator whose work is proportional to
  the rows of the update and whose memory is one slot per touched row (plus one index per table
  row), never a copy of the table per device.
- ``aggregate``: line 9 (or its weighted form) on the touched rows only; one copy of each table
  per round, the new state.

Heat comes from the devices' hellos: exact (``DeviceInfo.rows``) or private (randomized response,
hot-and-cold appendix F, estimated without bias and clipped to [1, N]): the hello fields
``fedsubavg.row_bits`` (per input column, one randomized bit per table row, packed in
``numpy.packbits`` order) and ``fedsubavg.row_epsilon`` (the epsilon they were drawn at), carried in
``Hello.ext`` and parsed here (:data:`HELLO_FIELDS`) into ``DeviceInfo.ext``: row bits by table entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Literal, get_args

import numpy as np

from edge_sdk.protocol import RowSparse
from orchestrator.strategies.base import (
    Combines,
    Weighting,
    DeviceInfo,
    DeviceReport,
    HelloContext,
    HelloField,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.heat import RowHeat
from orchestrator.strategies.selection import Selection
from orchestrator.values import Count

__all__ = ["HELLO_FIELDS", "ROW_BITS", "ROW_EPSILON", "FedSubAvg", "RowSums"]

#: Hello.ext keys of private row heat (what edge_sdk.privacy.private_hello_ext writes).
ROW_BITS, ROW_EPSILON = "fedsubavg.row_bits", "fedsubavg.row_epsilon"


def parse_row_bits(value: object, context: HelloContext) -> Mapping[str, bytes]:
    """``{column: packed bits}`` -> ``{table entry: bits}``: one bit per row of the column's table."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{ROW_BITS} must map input columns to packed bits")
    out: dict[str, bytes] = {}
    for column, packed in value.items():
        entry = context.columns.get(str(column))
        if entry is None:
            raise ValueError(f"{ROW_BITS}[{column}] names no sparse input of the model")
        if not isinstance(packed, bytes) or not packed:
            raise ValueError(f"{ROW_BITS}[{column}] must be non-empty bytes")
        rows = context.shapes[entry][0]
        if len(packed) != (rows + 7) // 8:
            raise ValueError(f"{ROW_BITS}[{column}] has {len(packed)} bytes; the table has {rows} rows "
                             f"({(rows + 7) // 8} bytes)")
        out[entry] = packed
    return MappingProxyType(out)


def parse_row_epsilon(value: object, context: HelloContext) -> float:
    """The randomized response's epsilon: finite and > 0 (bits without one cannot be debiased)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{ROW_EPSILON} must be a finite number > 0, got {value!r}")
    return float(value)


#: What FedSubAvg reads from a hello beyond the protocol's fields (private row heat).
HELLO_FIELDS: Mapping[str, HelloField] = MappingProxyType({
    ROW_BITS: HelloField(parse_row_bits, requires=(ROW_EPSILON,),
                         description="per input column, randomized-response bits of the rows its data touches"),
    ROW_EPSILON: HelloField(parse_row_epsilon, description="the epsilon the row bits were drawn at"),
})

Split = Literal["planned", "zero"]
SPLITS: tuple[str, ...] = get_args(Split)
_BLOCK_ROWS = 1 << 16  # rows updated per step of aggregate


class RowSums:
    """``sum_i w_i dx_{i,m}`` over the rows m touched this round, for one table.

    Work per update is O(its rows); memory is one int32 slot per table row (allocated once per
    round) and one float64 accumulator row per distinct touched row.
    """

    def __init__(self, num_rows: int, row_shape: tuple[int, ...]) -> None:
        self.num_rows = int(num_rows)
        self.row_shape = tuple(row_shape)
        self._slot = np.full(self.num_rows, -1, dtype=np.int32 if self.num_rows < 2**31 else np.int64)
        self._rows = np.empty(0, dtype=np.int64)
        self._acc = np.zeros((0, *self.row_shape), dtype=np.float64)
        self.size = 0

    def add(self, delta: RowSparse, weight: float) -> None:
        idx = np.asarray(delta.indices, dtype=np.int64)
        if idx.size == 0:
            return
        slots = self._slot[idx].astype(np.int64)
        new = slots < 0
        if new.any():
            fresh = idx[new]
            start, stop = self.size, self.size + fresh.size
            self._reserve(stop)
            slots[new] = np.arange(start, stop)
            self._slot[fresh] = slots[new]
            self._rows[start:stop] = fresh
            self.size = stop
        # Indices of one update are distinct (checked on decode), so fancy += is exact.
        self._acc[slots] += np.multiply(delta.values, weight, dtype=np.float64)

    def _reserve(self, n: int) -> None:
        if n <= len(self._rows):
            return
        cap = min(max(n, 2 * len(self._rows), 1024), self.num_rows)  # never more slots than the table has rows
        rows = np.empty(cap, dtype=np.int64)
        rows[: self.size] = self._rows[: self.size]
        acc = np.zeros((cap, *self.row_shape), dtype=np.float64)
        acc[: self.size] = self._acc[: self.size]
        self._rows, self._acc = rows, acc

    @property
    def rows(self) -> np.ndarray:
        return self._rows[: self.size]

    @property
    def sums(self) -> np.ndarray:
        return self._acc[: self.size]


class FedSubAvg(Strategy):
    """Submodel averaging with the heat correction N / n_m per row (Algorithm 1, line 9).

    ``k``: devices per round (line 3's K; None: the server's ``fraction``). ``weighting``:
    ``"samples"`` (appendix D.4's weighted form, the default: what the MovieLens benchmarks ran,
    whose devices hold from tens to thousands of ratings, ``bench/validated.toml``) or ``"uniform"``
    (line 9 as written: every sampled device weighs the same, however little data it holds).
    ``split``: ``"planned"`` trains each device's planned tail (EmbracingFL roles; tables outside it
    are frozen there and the device is not in their heat) or ``"zero"`` (every device trains every
    block; the server checks its budget for the submodel's rows and skips a device that cannot
    hold them).
    ``correction``: False drops the factor (FedAvg over submodels: the row update is
    ``sum_i w_i dx_{i,m} / sum_{i in C_r} w_i``, what FedAvg does with full models, since a device
    that does not hold a row leaves it unchanged), for comparisons on the same code path.
    """

    name = "fedsubavg"
    combines = Combines.own("each table row's update scaled by its heat N / n_m, over row selections")
    #: Devices receive row selections: the server plans them for their declared rows only.
    selects_rows = True
    hello_fields = HELLO_FIELDS

    def __init__(self, k: Count | None = None, weighting: Weighting = "samples", split: Split = "planned",
                 correction: bool = True) -> None:
        self.k, self.weighting, self.split, self.correction = k, weighting, split, correction
        self.heat: RowHeat | None = None
        self._tables: dict[str, int] = {}  # table entry -> its block index
        self._sums: WeightedSums | None = None
        self._rows: dict[str, RowSums] = {}
        self._folded: dict[str, float] = {}  # table entry -> sum of folded weights that carried it (K)
        self._carriers: dict[str, int] = {}
        self._refused = 0

    # -- heat -----------------------------------------------------------------------------------
    def _tables_of(self, ctx: RoundContext) -> dict[str, int]:
        """Sparse tables: the entries any device declared rows (or bits) for, with their block."""
        names = {e for info in ctx.devices.values() for e in (*info.rows, *_row_bits(info))} | set(self._tables)
        out = {}
        for e in sorted(names):
            if e not in ctx.global_state or ctx.global_state[e].ndim < 1:
                raise ValueError(f"declared rows for {e!r}, which is not a table of the model")
            out[e] = _block_of(e, ctx.blocks)
        return out

    def device_weight(self, info: DeviceInfo) -> float:
        """w_i: 1, or the device's sample count (appendix D.4)."""
        return float(info.num_samples) if self.weighting == "samples" else 1.0

    def _split_of(self, info: DeviceInfo) -> int:
        return info.split if self.split == "planned" else 0

    def _sync(self, ctx: RoundContext) -> None:
        """n_m follows the registered devices: count new ones, take out those that left."""
        tables = self._tables_of(ctx)
        if self.heat is None or set(tables) != set(self._tables):
            self.heat = RowHeat({e: ctx.global_state[e].shape[0] for e in tables})
        self._tables = tables
        heat = self.heat
        for gone in heat.devices - set(ctx.devices):
            heat.remove(gone)
        for d, info in ctx.devices.items():
            w = self.device_weight(info)
            if w <= 0:
                heat.remove(d)
                continue
            split = self._split_of(info)
            entries = tuple(e for e, b in tables.items() if b >= split)
            if heat.entries_of(d) == entries:
                continue
            heat.remove(d)
            heat.add(d, entries, w, rows=info.rows, bits=_row_bits(info), epsilon=float(info.ext.get(ROW_EPSILON, 0.0)))

    # -- hooks ----------------------------------------------------------------------------------
    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._sync(ctx)
        self._sums, self._rows, self._folded, self._carriers, self._refused = (
            WeightedSums(ctx.global_state), {}, {}, {}, 0)
        candidates = [d for d, info in ctx.devices.items() if self.device_weight(info) > 0]
        chosen = ctx.sample(candidates, k=self.k) if self.k is not None else ctx.sample(candidates)
        out = []
        for d in chosen:  # Algorithm 1, line 3
            info = ctx.devices[d]
            split = self._split_of(info)
            rows = {e: info.rows.get(e, np.empty(0, np.int64)) for e, b in self._tables.items() if b >= split}
            # Lines 5 and 12-14: the device downloads exactly the rows of its index set S(i).
            out.append(Instruction(d, "train", Selection.of_rows(split, rows) if rows else Selection.tail(split)))
        return out

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None:
            raise RuntimeError("fedsubavg: report before configure")
        if report.phase != "train":
            self._refused += 1
            raise Refused(f"fedsubavg folds train reports only, not {report.phase!r}")
        info = ctx.devices.get(report.device_id)
        w = self.device_weight(info) if info is not None else 0.0
        if w <= 0:
            self._refused += 1
            raise Refused("the device is not counted in the heat (no samples, or not registered this round)")
        for name, delta in report.tensors.items():
            wn = report.weight_of(name, w)  # scaled by the block's direction trust (orchestrator.aggregation.trust)
            if wn <= 0 and ctx.global_state[name].dtype.kind == "f":
                continue
            if isinstance(delta, RowSparse):
                acc = self._rows.get(name)
                if acc is None:
                    old = ctx.global_state[name]
                    acc = self._rows[name] = RowSums(old.shape[0], old.shape[1:])
                acc.add(delta, wn)
                self._folded[name] = self._folded.get(name, 0.0) + wn
                self._carriers[name] = self._carriers.get(name, 0) + 1
            else:
                region = report.selection.region(name)
                self._sums.add(name, delta, wn, None if isinstance(region, np.ndarray) else region)
        self._sums.note(report)
        return ()

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        state = sums.new_state()  # dense entries: FedAvg (factor 1); tables: copies to update in place
        touched: dict[str, int] = {}
        for name, acc in self._rows.items():
            rows = acc.rows
            touched[name] = int(rows.size)
            if rows.size == 0:
                continue
            old = ctx.global_state[name]
            k_folded = self._folded[name]  # K, or sum_{i in C_r} w_i (weighted form)
            if self.correction and self.heat is not None and name in self.heat.tables:
                table = self.heat[name]
                # N / n_m, or sum_i w_i / sum_{j: m in S(j)} w_j (appendix D.4); clipped heat >= 1.
                factor = table.total / table.heat(rows)
            else:
                factor = np.ones(rows.size)
            step = (factor / k_folded).reshape(-1, *([1] * (old.ndim - 1)))
            # Algorithm 1, line 9: X_m <- X_m + N / (n_m K) * sum_{i in C_r} dx_{i,m}, touched rows only,
            # in blocks of rows so that the float64 temporaries stay small beside the table.
            new, sums_m = state[name], acc.sums
            for lo in range(0, rows.size, _BLOCK_ROWS):
                r, hi = rows[lo:lo + _BLOCK_ROWS], lo + _BLOCK_ROWS
                new[r] = (old[r].astype(np.float64) + step[lo:hi] * sums_m[lo:hi]).astype(old.dtype)
            sums.counts[name] = self._carriers[name]
        self._sums, self._rows = None, {}
        extra: dict[str, object] = {"touched_rows": touched, "weighting": self.weighting,
                                    "correction": self.correction}
        if self.heat is not None:
            extra["heat_devices"] = {e: t.devices for e, t in self.heat.tables.items()}
        return sums.result(ctx.round, self._refused, state=state, extra=extra)


def _block_of(entry: str, blocks: Sequence[str]) -> int:
    """Block index of a state entry named ``blocks.<block>.<rest>`` (0 when blocks are unknown)."""
    parts = entry.split(".", 2)
    if not blocks:
        return 0
    if len(parts) < 3 or parts[0] != "blocks" or parts[1] not in blocks:
        raise ValueError(f"cannot tell the block of {entry!r}")
    return list(blocks).index(parts[1])



def _row_bits(info: DeviceInfo) -> Mapping[str, bytes]:
    """The device's private row heat (table entry -> packed bits), empty when it sent exact rows."""
    bits = info.ext.get(ROW_BITS)
    return bits if isinstance(bits, Mapping) else {}
