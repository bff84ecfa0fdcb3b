"""The norm bound: every update's L2 norm, per layer group, bounded from round 1 and across restarts.

A device's update is split by block (the model's layer groups: what partial training hands out
whole). Each block's norm is bounded by ``norm_bound`` times a reference for that block, the larger of:

- the norm of the server's own reference update of that block (:mod:`orchestrator.aggregation.reference`),
  computed every round: the global model trained from the round's state on the server's held-out
  data with the round's learning rate, local steps and batch size (Cao et al., 2021, "FLTrust",
  Section 4.2: client updates are normalised to the magnitude of an update the server computes on
  a small root dataset it holds).
  It exists before any history, so round 1, and blocks only one device trains, are bounded too,
  and it follows the norms' change from round to round (they grow early in training);
- the median norm of earlier rounds' accepted updates at the same block **and split**, once they
  came from at least :data:`MIN_PEERS` different devices (a weak device's head update is compared
  with other weak devices' head updates); else the median at the same block over every split, once
  :data:`MIN_PEERS` devices trained it (a device alone at its split is bounded by its layer
  group's peers, however its split was chosen). History covers devices whose data makes larger
  honest updates than the server's; one hostile device is a minority of it.

An update over its bound is clipped block by block to the limit (``norm_bound_action="clip"``:
g <- g * limit / ||g||, per block) or refused (``"reject"``). The norms accepted in a committed
round (after clipping) become history, kept in the store (``store.norms.record``), so a
resumed server bounds its first round as the interrupted one would have. History only counts
rounds before the current one, so a round's bounds never depend on its reports' arrival order.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from orchestrator.config import ServerConfig
from orchestrator.parts import Reference
from orchestrator.store import Store

__all__ = ["HISTORY", "MIN_PEERS", "Bounded", "NormBound", "block_norms", "scaled_delta", "update_norm"]

log = logging.getLogger("edgetrain.server")

#: Norms kept per block (the most recent accepted updates).
HISTORY = 200
#: Distinct devices whose norms a history median needs: with 3, one hostile device is a minority.
MIN_PEERS = 3

def update_norm(tensors: Mapping[str, object]) -> float:
    """L2 norm of an update's float tensors (row-sparse ones over their rows)."""
    total = 0.0
    for t in tensors.values():
        values = t.values if isinstance(t, p.RowSparse) else t
        if values.dtype.kind == "f":
            total += float(np.sum(np.square(np.asarray(values, dtype=np.float64))))
    return math.sqrt(total)


def block_norms(tensors: Mapping[str, object], block_of: Mapping[str, int]) -> dict[int, float]:
    """The update's L2 norm per block (float entries only; counters are not parameters)."""
    by_block: dict[int, dict[str, object]] = {}
    for name, t in tensors.items():
        by_block.setdefault(block_of[name], {})[name] = t
    return {b: update_norm(ts) for b, ts in sorted(by_block.items())}


def scaled_delta(t: object, scale: float) -> object:
    """A delta (dense or row-sparse) times ``scale``; counters (non-float entries) are left alone."""
    if isinstance(t, p.RowSparse):
        return p.RowSparse(t.indices, t.values * np.asarray(scale, t.values.dtype), t.num_rows)
    return t * np.asarray(scale, t.dtype) if t.dtype.kind == "f" else t


@dataclass
class Bounded:
    """What the bound did to one update: the tensors to fold, the blocks it clipped (block name ->
    the factor its delta was multiplied by) and, with ``reject``, why it is refused."""

    tensors: Mapping[str, object]
    clipped: dict[str, float] = field(default_factory=dict)
    refusal: str | None = None


class NormBound:
    """Per-block norm bounds against history, peers or the server's reference update."""

    def __init__(self, config: ServerConfig, template: LayeredModel, store: Store, reference: Reference) -> None:
        self.factor, self.action = config.norm_bound, config.norm_bound_action
        self.store, self._reference_of = store, reference
        self.blocks = tuple(template.block_names)
        self.block_of = {name: template.block_of(name) for name in template.state_dict()}
        self._history: dict[int, deque[tuple[str, int, float]]] = {}
        self._pending: list[tuple[str, int, int, float]] = []  # this round's (device, block, split, norm)
        self._reference: dict[int, float] | None = None
        #: The round's reference update itself, also computed for direction trust alone
        #: (orchestrator.aggregation.trust).
        self.direction = config.direction_trust
        self.update: dict[str, np.ndarray] | None = None
        for row in store.norms.history(HISTORY):
            self._remember(row["device_id"], row["block"], row["split"], row["norm"])

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def _remember(self, device: str, block: int, split: int, norm: float) -> None:
        self._history.setdefault(block, deque(maxlen=HISTORY)).append((device, split, norm))

    def _peer_median(self, block: int, split: int | None) -> float | None:
        rows = [(d, n) for d, s, n in self._history.get(block, ()) if split is None or s == split]
        if len({d for d, _ in rows}) < MIN_PEERS:
            return None
        return float(np.median([n for _, n in rows]))

    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """Start a round from ``state``: compute the server's reference update (blocking: run it in
        a worker thread), kept whole in :attr:`update` for direction trust. If it cannot be computed
        (the local loss diverged on the server's data), the previous round's reference stays, and
        the failure is logged."""
        self._pending = []
        if not (self.enabled or self.direction):
            return
        try:
            self.update = self._reference_of(state, round)
            self._reference = block_norms(self.update, self.block_of)
        except (ValueError, FloatingPointError, RuntimeError) as exc:
            log.warning("round %d: no reference update (%s); the norm bound and direction trust keep the last one",
                        round, exc)

    def reference(self, block: int, split: int) -> tuple[float, str]:
        """The norm a block's update is bounded against, and where it comes from."""
        server = (self._reference or {}).get(block, 0.0)
        best, which = (server, "server reference update") if server > 0 else (0.0, "")
        for source, s in (("peers at this split", split), ("peers at this layer group", None)):
            median = self._peer_median(block, s)
            if median is not None:
                if median > best:
                    best, which = median, source
                break
        return (best, which) if best > 0 else (math.inf, "no reference")

    def bound(self, device: str, split: int, tensors: Mapping[str, object]) -> Bounded:
        """Clip (or refuse) ``tensors`` block by block against :meth:`reference` x ``norm_bound``."""
        if not self.enabled or not tensors:
            return Bounded(tensors)
        norms = block_norms(tensors, self.block_of)
        over: dict[int, float] = {}
        for b, norm in norms.items():
            ref, which = self.reference(b, split)
            limit = self.factor * ref
            if norm > limit:
                if self.action == "reject":
                    return Bounded(tensors, refusal=f"update norm {norm:.3g} at {self.blocks[b]} exceeds "
                                                    f"{self.factor:g} x the {which} ({limit:.3g})")
                over[b] = limit / norm
        if over:
            tensors = {n: scaled_delta(t, over[self.block_of[n]]) if self.block_of[n] in over else t
                       for n, t in tensors.items()}
        for b, norm in norms.items():
            self._pending.append((device, b, split, norm * over.get(b, 1.0)))
        return Bounded(tensors, {self.blocks[b]: round(s, 6) for b, s in over.items()})

    def commit(self, round: int) -> None:
        """The round is committed: its accepted norms become history, in memory and in the store."""
        if not self._pending:
            return
        self.store.norms.record(round, self._pending)
        for device, block, split, norm in self._pending:
            self._remember(device, block, split, norm)
        self._pending = []

    def discard(self, device: str) -> None:
        """A bounded update was not folded after all (the strategy refused it): not history."""
        self._pending = [row for row in self._pending if row[0] != device]
