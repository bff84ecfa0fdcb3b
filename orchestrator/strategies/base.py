"""What every aggregation strategy shares: the update message, the round result, the interface.

A strategy sees a round as ``begin_round`` (the global state devices trained from), then
``accept``/``fold`` once per arriving update, then ``finish`` (the new global state). Updates are
folded into running sums as they arrive, so the server holds O(model) memory however many devices
report. :class:`WeightedSums` is that running sum, shared by the averaging strategies.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

ROLES: tuple[str, ...] = ("strong", "moderate", "weak")
WEIGHTINGS: tuple[str, ...] = ("samples", "uniform")


class UpdateRejected(ValueError):
    """A device update that must not reach the global model (wrong names, shapes, dtypes, NaN...)."""

    def __init__(self, device_id: str, reason: str) -> None:
        super().__init__(f"update from {device_id!r} rejected: {reason}")
        self.device_id = device_id
        self.reason = reason


@dataclass(frozen=True)
class DeviceUpdate:
    """What a device sends back after local training.

    ``deltas`` holds ``new - old`` for every state entry of the blocks in ``trained`` (blocks
    ``[split, L)``); entries of frozen blocks are absent.
    """

    device_id: str
    role: str  # strong | moderate | weak
    trained: tuple[int, int]  # block range the device trained, [split, L)
    num_samples: int
    deltas: dict[str, np.ndarray]
    loss_before: float
    loss_after: float
    metrics: Mapping[str, float | int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundResult:
    """The new global state and what went into it."""

    round: int
    state: dict[str, np.ndarray]
    devices: tuple[str, ...]  # folded, in arrival order
    num_samples: int  # over folded devices
    contributors: dict[str, int]  # state entry -> devices that trained it this round
    roles: dict[str, int]  # role -> devices folded
    rejected: int  # updates that fold refused
    mean_loss_before: float | None  # sample-weighted over folded devices
    mean_loss_after: float | None

    @property
    def untouched(self) -> list[str]:
        """Entries nobody trained this round (they kept their old value)."""
        return [name for name, n in self.contributors.items() if n == 0]

    def summary(self) -> dict[str, object]:
        """A JSON-ready digest for the journal and the metrics files."""
        return {
            "round": self.round,
            "devices": len(self.devices),
            "num_samples": self.num_samples,
            "roles": dict(self.roles),
            "rejected": self.rejected,
            "untouched": len(self.untouched),
            "loss_before": self.mean_loss_before,
            "loss_after": self.mean_loss_after,
        }


class Strategy(ABC):
    """One aggregation algorithm. Subclasses set ``name`` and implement ``fold`` and ``finish``.

    The base class owns the round bookkeeping and the validation every strategy needs; a
    strategy with its own admission test (FedALIGN's loss test) extends :meth:`accept`.

    ``blocks`` (the model's ordered block names, ``LayeredModel.block_names``) is optional; with
    it, an update's ``trained`` range is checked against its delta names exactly. Without it,
    only the names themselves are checked (blocks without state are invisible in a state dict,
    so block indices cannot be recovered from names alone).
    """

    name: ClassVar[str]

    def __init__(self, *, blocks: Sequence[str] | None = None) -> None:
        self._blocks = tuple(blocks) if blocks is not None else None
        self._round: int | None = None
        self._global: dict[str, np.ndarray] = {}
        self._block_entries: dict[str, list[str]] = {}
        self._seen: set[str] = set()
        self._rejected = 0

    # -- round lifecycle -------------------------------------------------------------------
    def begin_round(self, round: int, global_state: Mapping[str, np.ndarray]) -> None:
        """Start a round from ``global_state`` (not modified; ``finish`` returns new arrays)."""
        state: dict[str, np.ndarray] = {}
        for key, value in global_state.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"global state entry {key!r} is {type(value).__name__}, not numpy.ndarray")
            if value.dtype.kind not in "fbiu":
                raise TypeError(f"global state entry {key!r} has unsupported dtype {value.dtype}")
            state[key] = value
        if not state:
            raise ValueError("global state is empty")
        self._round = round
        self._global = state
        self._block_entries = self._group_by_block(state) if self._blocks is not None else {}
        self._seen = set()
        self._rejected = 0
        self._begin(state)

    def accept(self, update: DeviceUpdate) -> str | None:
        """None if ``update`` may be folded, else why not. Never changes the running sums."""
        self._require_round()
        return self._validate(update)

    def fold(self, update: DeviceUpdate) -> None:
        """Add an accepted update to the running sums; raise :class:`UpdateRejected` otherwise.

        Validation runs completely before anything is added, so a rejected update leaves the
        round exactly as it was.
        """
        reason = self.accept(update)
        if reason is not None:
            self._rejected += 1
            raise UpdateRejected(update.device_id, reason)
        self._seen.add(update.device_id)
        self._fold(update)

    def finish(self) -> RoundResult:
        """Close the round: the new global state and its summary. The strategy is then idle."""
        round = self._require_round()
        result = self._finish(round)
        self._round = None
        self._global = {}
        self._seen = set()
        return result

    @property
    def round(self) -> int | None:
        """The open round, or None between rounds."""
        return self._round

    @property
    def global_state(self) -> Mapping[str, np.ndarray]:
        return self._global

    # -- what subclasses implement -----------------------------------------------------------
    def _begin(self, global_state: dict[str, np.ndarray]) -> None:
        """Reset per-round sums (called at the end of ``begin_round``)."""

    @abstractmethod
    def _fold(self, update: DeviceUpdate) -> None:
        """Add a validated update to the running sums."""

    @abstractmethod
    def _finish(self, round: int) -> RoundResult:
        """Build the new global state from the running sums."""

    def _check(self, update: DeviceUpdate) -> str | None:
        """Strategy-specific admission test, run after the common validation."""
        return None

    # -- validation ------------------------------------------------------------------------
    def _require_round(self) -> int:
        if self._round is None:
            raise RuntimeError(f"{type(self).__name__}: no round open; call begin_round first")
        return self._round

    def _group_by_block(self, state: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
        assert self._blocks is not None
        known = set(self._blocks)
        groups: dict[str, list[str]] = {b: [] for b in self._blocks}
        for key in state:
            block = _block_name(key)
            if block not in known:
                raise ValueError(f"global state entry {key!r} belongs to no block of {list(self._blocks)}")
            groups[block].append(key)
        return groups

    def _validate(self, update: DeviceUpdate) -> str | None:
        if not isinstance(update, DeviceUpdate):
            return f"expected a DeviceUpdate, got {type(update).__name__}"
        if not isinstance(update.device_id, str) or not update.device_id:
            return "device_id must be a non-empty string"
        if update.device_id in self._seen:
            return f"device {update.device_id!r} was already folded in round {self._round}"
        if update.role not in ROLES:
            return f"unknown role {update.role!r}; roles are {', '.join(ROLES)}"
        if isinstance(update.num_samples, bool) or not isinstance(update.num_samples, (int, np.integer)):
            return f"num_samples must be an integer, got {type(update.num_samples).__name__}"
        if update.num_samples < 1:
            return f"num_samples must be at least 1, got {update.num_samples}"
        for label, loss in (("loss_before", update.loss_before), ("loss_after", update.loss_after)):
            if not isinstance(loss, (int, float, np.floating, np.integer)) or not math.isfinite(loss):
                return f"{label} must be a finite number, got {loss!r}"
        reason = self._validate_range(update)
        if reason is not None:
            return reason
        if not isinstance(update.deltas, Mapping) or not update.deltas:
            return "deltas are empty"
        for key, delta in update.deltas.items():
            reference = self._global.get(key)
            if reference is None:
                return f"unknown state entry {key!r}"
            if not isinstance(delta, np.ndarray):
                return f"delta {key!r} is {type(delta).__name__}, not numpy.ndarray"
            if delta.shape != reference.shape:
                return f"delta {key!r} has shape {delta.shape}, the model has {reference.shape}"
            if delta.dtype != reference.dtype:
                return f"delta {key!r} has dtype {delta.dtype}, the model has {reference.dtype}"
            if delta.dtype.kind not in "fbiu":
                return f"delta {key!r} has unsupported dtype {delta.dtype}"
            if delta.dtype.kind == "f" and not np.isfinite(delta).all():
                return f"delta {key!r} contains NaN or Inf"
        return self._check(update)

    def _validate_range(self, update: DeviceUpdate) -> str | None:
        trained = update.trained
        if (
            not isinstance(trained, (tuple, list))
            or len(trained) != 2
            or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in trained)
        ):
            return f"trained must be a (start, stop) pair of block indices, got {trained!r}"
        start, stop = int(trained[0]), int(trained[1])
        if not 0 <= start < stop:
            return f"trained range [{start}, {stop}) is empty or negative"
        if self._blocks is None:
            return None
        if stop != len(self._blocks):
            return f"trained range [{start}, {stop}) must end at the last block ({len(self._blocks)})"
        expected = {k for b in self._blocks[start:stop] for k in self._block_entries[b]}
        got = set(update.deltas) if isinstance(update.deltas, Mapping) else set()
        if got != expected:
            missing = sorted(expected - got)
            extra = sorted(got - expected)
            return (
                f"deltas do not match trained blocks [{start}, {stop}): "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"outside the range {extra[:5]}{'...' if len(extra) > 5 else ''}"
            )
        return None


def _block_name(state_name: str) -> str:
    """Block of a state entry: ``blocks.<block>.<rest>`` (LayeredModel) or the first component."""
    parts = state_name.split(".")
    if len(parts) >= 3 and parts[0] == "blocks":
        return parts[1]
    return parts[0]


class WeightedSums:
    """Per-entry running sums ``sum_i w_i * delta_i`` and ``sum_i w_i`` over contributing devices.

    Float entries accumulate in float64 and are cast back to the global dtype at the end. Integer
    and boolean entries (BatchNorm ``num_batches_tracked``) are counters, not parameters: they take
    the largest value any contributor reached (old + max delta), so averaging cannot make them
    fractional or move them backwards.
    """

    def __init__(self, global_state: Mapping[str, np.ndarray]) -> None:
        self._global = global_state
        self._sums: dict[str, np.ndarray] = {}
        self._weights: dict[str, float] = {}
        self._counts: dict[str, int] = dict.fromkeys(global_state, 0)
        self._roles: Counter[str] = Counter()
        self._devices: list[str] = []
        self._samples = 0
        self._loss_sums = [0.0, 0.0]

    def add(self, update: DeviceUpdate, weight: float) -> None:
        """Add ``weight * delta`` for every entry of a validated update."""
        for key, delta in update.deltas.items():
            if delta.dtype.kind == "f":
                acc = self._sums.get(key)
                if acc is None:
                    acc = self._sums[key] = np.zeros(delta.shape, dtype=np.float64)
                # acc += weight * delta, computed in float64 without a float32 intermediate.
                np.add(acc, np.multiply(delta, weight, dtype=acc.dtype), out=acc)
            else:
                acc = self._sums.get(key)
                self._sums[key] = delta.copy() if acc is None else np.maximum(acc, delta)
            self._weights[key] = self._weights.get(key, 0.0) + weight
            self._counts[key] += 1
        self._roles[update.role] += 1
        self._devices.append(update.device_id)
        self._samples += int(update.num_samples)
        self._loss_sums[0] += float(update.loss_before) * int(update.num_samples)
        self._loss_sums[1] += float(update.loss_after) * int(update.num_samples)

    def result(self, round: int, rejected: int) -> RoundResult:
        """New state: ``old + sum_i w_i delta_i / sum_i w_i`` per entry; untouched entries copied."""
        state: dict[str, np.ndarray] = {}
        for key, old in self._global.items():
            acc = self._sums.get(key)
            if acc is None:
                state[key] = old.copy()
            elif old.dtype.kind == "f":
                mean = acc / self._weights[key]
                state[key] = np.asarray(old.astype(np.float64) + mean, dtype=old.dtype)
            else:
                state[key] = np.asarray(old + acc, dtype=old.dtype)
        n = self._samples
        return RoundResult(
            round=round,
            state=state,
            devices=tuple(self._devices),
            num_samples=n,
            contributors=dict(self._counts),
            roles=dict(self._roles),
            rejected=rejected,
            mean_loss_before=self._loss_sums[0] / n if n else None,
            mean_loss_after=self._loss_sums[1] / n if n else None,
        )


class AveragingStrategy(Strategy):
    """A strategy whose new state is the per-entry weighted mean of the folded deltas.

    w_i is the device's sample count (``weighting="samples"``) or 1 (``weighting="uniform"``).
    Subclasses add admission rules (:meth:`_check`) or override :meth:`weight`.
    """

    def __init__(self, weighting: str = "samples", *, blocks: Sequence[str] | None = None) -> None:
        super().__init__(blocks=blocks)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
        self.weighting = weighting
        self._sums: WeightedSums | None = None

    def weight(self, update: DeviceUpdate) -> float:
        """w_i for a validated update."""
        return float(update.num_samples) if self.weighting == "samples" else 1.0

    def _begin(self, global_state: dict[str, np.ndarray]) -> None:
        self._sums = WeightedSums(global_state)

    def _fold(self, update: DeviceUpdate) -> None:
        assert self._sums is not None
        self._sums.add(update, self.weight(update))

    def _finish(self, round: int) -> RoundResult:
        assert self._sums is not None
        result = self._sums.result(round, self._rejected)
        self._sums = None
        return result
