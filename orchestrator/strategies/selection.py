"""Payload selections: which part of the global state a device receives and may return.

A strategy picks one per instruction (docs/architecture.md, "Selections"; docs/protocol.md,
"Selections"). The server cuts the payload with :meth:`Selection.cut` and checks what comes back
with :meth:`Selection.check`, so a report can never touch state outside what the device was sent.

- ``tail``: the blocks ``[split, L)`` whole (FedAvg at split 0, EmbracingFL partial training).
- ``rows``: the tail, with each sparse table entry cut to chosen rows, sent and returned as
  :class:`~edge_sdk.protocol.RowSparse` (FedSubAvg submodels). Work is proportional to the rows.
- ``channels``: the tail, with each listed entry cut to a leading slice of every dimension
  (static width reduction: HeteroFL, FjORD's ordered dropout).
- ``adapters``: the tail whole, trained through its LoRA adapters: only the ``trained`` entries
  (adapters, and parameters outside adapted layers) come back (edge_sdk.models.adapters).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_sdk.protocol import RowSparse

__all__ = ["Selection", "Payload"]

Payload = Mapping[str, "np.ndarray | RowSparse"]


@dataclass(frozen=True, eq=False)
class Selection:
    """What a device gets of blocks ``[split, L)``. Build with :meth:`tail`, :meth:`rows`, :meth:`channels`
    or :meth:`of_adapters`."""

    kind: str
    split: int
    rows: Mapping[str, np.ndarray] = field(default_factory=dict)
    channels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    trained: frozenset[str] = field(default_factory=frozenset)  # ``adapters``: the entries that come back

    @classmethod
    def tail(cls, split: int) -> Selection:
        return cls("tail", int(split))

    @classmethod
    def of_rows(cls, split: int, rows: Mapping[str, Sequence[int] | np.ndarray]) -> Selection:
        """The tail with table entry ``name`` cut to ``rows[name]`` (any order; duplicates dropped)."""
        cut = {name: np.unique(np.asarray(r, dtype=np.int64)) for name, r in rows.items()}
        return cls("rows", int(split), rows=cut)

    @classmethod
    def of_channels(cls, split: int, shapes: Mapping[str, Sequence[int]]) -> Selection:
        """The tail with entry ``name`` cut to ``arr[:shapes[name][0], :shapes[name][1], ...]``."""
        return cls("channels", int(split), channels={k: tuple(int(d) for d in v) for k, v in shapes.items()})

    @classmethod
    def of_adapters(cls, split: int, trained: Sequence[str]) -> Selection:
        """The tail, sent whole, of which the device returns only ``trained`` (its adapters' entries)."""
        return cls("adapters", int(split), trained=frozenset(trained))

    # -- identity --------------------------------------------------------------------------------
    def key(self) -> str:
        """Cache key: equal selections share one encoded payload (one encode, one hash)."""
        if self.kind in ("tail", "adapters"):  # an adapters selection's entries follow from its split
            return f"{self.kind}-{self.split}"
        h = hashlib.sha256()
        if self.kind == "rows":
            for name in sorted(self.rows):
                h.update(name.encode() + b"\0")
                h.update(np.ascontiguousarray(self.rows[name]).tobytes())
        else:
            for name in sorted(self.channels):
                h.update(f"{name}={self.channels[name]};".encode())
        return f"{self.kind}-{self.split}-{h.hexdigest()[:16]}"

    def num_rows(self) -> int:
        return sum(len(r) for r in self.rows.values())

    # -- the payload -----------------------------------------------------------------------------
    def cut(self, state: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray | RowSparse]:
        """The tensors a device receives: entries ``names`` of ``state``, cut by this selection."""
        unknown = (set(self.rows) | set(self.channels)) - set(names)
        if unknown:
            raise ValueError(f"selection names entries outside the tail [{self.split}, L): {sorted(unknown)[:3]}")
        out: dict[str, np.ndarray | RowSparse] = {}
        for name in names:
            array = state[name]
            if name in self.rows:
                idx = self.rows[name]
                if idx.size and (idx[0] < 0 or idx[-1] >= array.shape[0]):
                    raise ValueError(f"rows of {name!r} outside [0, {array.shape[0]})")
                out[name] = RowSparse(idx, np.ascontiguousarray(array[idx]), int(array.shape[0]))
            elif name in self.channels:
                out[name] = np.ascontiguousarray(array[self._slices(name, array)])
            else:
                out[name] = array
        return out

    def _slices(self, name: str, array: np.ndarray) -> tuple[slice, ...]:
        shape = self.channels[name]
        if len(shape) != array.ndim or any(not 0 < s <= d for s, d in zip(shape, array.shape)):
            raise ValueError(f"channel slice {shape} does not fit {name!r} of shape {array.shape}")
        return tuple(slice(0, s) for s in shape)

    def region(self, name: str) -> tuple[slice, ...] | np.ndarray | None:
        """Where entry ``name`` of a report lands in the global tensor: None (whole), slices, or rows."""
        if name in self.channels:
            return tuple(slice(0, s) for s in self.channels[name])
        if name in self.rows:
            return self.rows[name]
        return None

    # -- what may come back ----------------------------------------------------------------------
    def check(self, tensors: Mapping[str, object], state: Mapping[str, np.ndarray], names: Sequence[str]) -> str | None:
        """None if ``tensors`` are deltas of exactly the entries ``names`` as this selection cut them,
        else why not. Shapes, dtypes and (for rows) that every row was one the device was sent."""
        got = set(tensors)
        if self.kind == "adapters":
            names = [n for n in names if n in self.trained]
        # Integer entries (BatchNorm's num_batches_tracked) are counters a device may leave out.
        expected = {n for n in names if n in got or state[n].dtype.kind == "f"}
        if got != expected:
            missing, extra = sorted(expected - got), sorted(got - expected)
            return (f"tensors do not match the selection of blocks [{self.split}, L): missing {missing[:5]}"
                    f"{'...' if len(missing) > 5 else ''}, not sent {extra[:5]}{'...' if len(extra) > 5 else ''}")
        for name in expected:
            reason = self._check_one(name, tensors[name], state[name])
            if reason is not None:
                return reason
        return None

    def _check_one(self, name: str, delta: object, reference: np.ndarray) -> str | None:
        if name in self.rows:
            if not isinstance(delta, RowSparse):
                return f"{name!r} must come back row-sparse: the device was sent rows of it"
            if delta.num_rows != reference.shape[0] or delta.values.shape[1:] != reference.shape[1:]:
                return f"{name!r}: row-sparse of table shape {delta.shape}, the model has {reference.shape}"
            if delta.values.dtype != reference.dtype:
                return f"{name!r} has dtype {delta.values.dtype}, the model has {reference.dtype}"
            sent = self.rows[name]
            if delta.indices.size and not np.isin(delta.indices, sent, assume_unique=True).all():
                return f"{name!r} holds rows the device was not sent"
            return None
        if not isinstance(delta, np.ndarray):
            return f"{name!r} is {type(delta).__name__}, not a dense tensor"
        shape = self.channels.get(name, reference.shape)
        if delta.shape != tuple(shape):
            return f"{name!r} has shape {delta.shape}, the selection sent {tuple(shape)}"
        if delta.dtype != reference.dtype:
            return f"{name!r} has dtype {delta.dtype}, the model has {reference.dtype}"
        return None
