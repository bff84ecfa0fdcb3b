"""Robust aggregation per layer group, and a cap on any one device's weight in an average.

Under partial training (EmbracingFL) every entry is averaged over its own contributors: strong
devices train the input-side blocks, every device the head. The statistics here therefore work
on **layer groups**: the entries trained by exactly the same set of devices in a round. A group's
contributors are compared among themselves only (their deltas at the group's entries, as one
vector), never with devices that did not train those entries.

- ``median``: coordinate-wise median (Yin et al., 2018, "Byzantine-robust distributed learning",
  Section 3, "median-based"). Per coordinate, any minority of outliers is ignored.
- ``trimmed_mean``: coordinate-wise beta-trimmed mean (Yin et al., 2018, Definition 2): drop the k
  largest and k smallest values of every coordinate, average the rest, with
  ``k = max(1, floor(trim * n))`` once n >= 3 contributors (:func:`trim_count`).
- ``krum`` / ``multi_krum``: Blanchard et al., 2017, "Machine learning with adversaries: Byzantine
  tolerant gradient descent", Section 4: the score of contributor i is the sum of squared
  distances to its n - f - 2 nearest other contributors; Krum keeps the best-scored delta,
  multi-Krum averages the n - f best-scored ones. Needs n > 2f + 2 (Proposition 1).
- ``centered_clip``: Karimireddy, He and Jaggi, 2021, "Learning from history for Byzantine robust
  optimization", Section 4 (centered clipping, CC): starting from the group's previous aggregate
  v (its history; zero before any), v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||).
  One device moves the result by at most tau / n.

Memory: these keep every contributor's delta until the round closes (O(devices x model)), unlike
the running sums of the mean. Each is unweighted: a robust statistic must not let one device's
sample claim decide; a report the server's direction trust gave 0 for a block is not among that
block's contributors (``WeightedSums.add_report``).

A layer group with fewer than 3 contributors (a partial-training split few devices share) gets the
statistic anyway, which is then their mean: the group's outcome says so in its ``note``, and the
server logs it once per run and statistic (only the server's own bounds hold such a group).

The weight cap (:func:`capped_weights`, :class:`WeightCap`) is for the weighted mean: after it, no
device holds more than ``max_share`` of an entry's total weight, whatever sample count it claims.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

log = logging.getLogger("edgetrain.server")

__all__ = [
    "AGGREGATIONS", "Aggregation", "GroupOutcome", "RobustHistory", "RobustRound", "WeightCap",
    "capped_weights", "centered_clip", "krum", "trim_count", "trimmed_mean",
]

#: How :class:`~orchestrator.strategies.base.AveragingStrategy` combines an entry's contributors.
Aggregation = Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "centered_clip"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

#: Centered-clipping iterations per round. Karimireddy et al. (2021) Section 4: with the previous
#: aggregate as the starting point, one iteration suffices (their experiments use l = 1).
CLIP_ITERATIONS = 1

#: Fewest contributors from which a radius is read off the contributors themselves (the median
#: of their distances to the center): with 3 or more, it is an honest one when most are honest.
MIN_ADAPTIVE = 3


def _too_few(n: int, what: str) -> str:
    """The note of a group too small for a robust statistic to mean anything (logged once per run
    and statistic): with one or two contributors it is their mean, and nothing bounds them but the
    server's norm bound and direction trust."""
    note = f"{what} of {n} is their mean: too few contributors to outvote one (the server's bounds hold them)"
    if what not in _WARNED:
        _WARNED.add(what)
        log.warning("robust aggregation: a layer group with %s", note)
    return note


_WARNED: set[str] = set()


# -- coordinate-wise statistics ------------------------------------------------------------------
def trim_count(n: int, trim: float) -> int:
    """Values dropped at each end of every coordinate among ``n`` contributors.

    ``max(1, floor(trim * n))`` once n >= 3 and trim > 0, so a small fleet (trim 0.1 and 4
    contributors) still drops its extremes; 0 below 3 contributors, where nothing can be dropped
    from both ends and leave a value (the result is then the mean of the one or two, which is also
    their median). Never more than (n - 1) // 2, so at least one value is averaged."""
    if trim <= 0 or n < 3:
        return 0
    return min(max(1, int(trim * n)), (n - 1) // 2)


def trimmed_mean(stack: np.ndarray, trim: float) -> np.ndarray:
    """Yin et al. (2018) Definition 2 over axis 0, with k = :func:`trim_count` (n, trim)."""
    n = stack.shape[0]
    k = trim_count(n, trim)
    if k == 0:
        return stack.mean(axis=0)
    return np.sort(stack, axis=0)[k:n - k].mean(axis=0)


# -- distances over a layer group ----------------------------------------------------------------
def _sq_distances(rows: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """n x n squared L2 distances between contributors, each given as its deltas at the group's
    entries (summed entry by entry: the group's vector is never concatenated)."""
    n = len(rows)
    dist = np.zeros((n, n), dtype=np.float64)
    for e in range(len(rows[0])):
        for i in range(n):
            xi = np.asarray(rows[i][e], dtype=np.float64)
            for j in range(i + 1, n):
                diff = xi - rows[j][e]
                d = float(np.vdot(diff, diff))
                dist[i, j] += d
                dist[j, i] += d
    return dist


def krum_scores(dist: np.ndarray, f: int) -> np.ndarray:
    """Blanchard et al. (2017) Section 4: s(i) = sum over the n - f - 2 closest j != i of ||V_i - V_j||^2."""
    n = dist.shape[0]
    closest = n - f - 2
    scores = np.empty(n)
    for i in range(n):
        others = np.delete(dist[i], i)
        scores[i] = np.sort(others)[:closest].sum()
    return scores


def krum(rows: Sequence[Sequence[np.ndarray]], f: int, m: int) -> tuple[list[np.ndarray], list[int]]:
    """Krum (m = 1) or multi-Krum (m > 1) over a group: the mean of the ``m`` best-scored
    contributors' deltas, and their indices. Requires n > 2f + 2 (Blanchard et al., Proposition 1)."""
    n = len(rows)
    if n <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} needs more than {2 * f + 2} contributors, got {n}")
    scores = krum_scores(_sq_distances(rows), f)
    chosen = sorted(np.argsort(scores, kind="stable")[:m].tolist())
    out = [np.mean([np.asarray(rows[i][e], np.float64) for i in chosen], axis=0) for e in range(len(rows[0]))]
    return out, chosen


def centered_clip(rows: Sequence[Sequence[np.ndarray]], center: Sequence[np.ndarray], radius: float | None,
                  iterations: int = CLIP_ITERATIONS) -> tuple[list[np.ndarray], float, list[int]]:
    """Karimireddy et al. (2021) Section 4, the CC rule, over a group:
    v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||), ``iterations`` times from ``center``.

    ``radius`` None: tau is the median of the contributors' distances to the center (read once,
    before the first iteration). Returns the new center, tau, and the indices of the clipped."""
    n = len(rows)
    v = [np.asarray(c, dtype=np.float64).copy() for c in center]
    tau = math.inf if radius is None else float(radius)
    clipped: set[int] = set()
    for it in range(iterations):
        dist = np.sqrt([sum(float(np.sum(np.square(np.asarray(x, np.float64) - c))) for x, c in zip(row, v))
                        for row in rows])
        if it == 0 and radius is None:
            tau = float(np.median(dist))
        scale = np.minimum(1.0, np.divide(tau, dist, out=np.full(n, np.inf), where=dist > 0))
        clipped.update(int(i) for i in np.flatnonzero(scale < 1.0))
        step = [sum(scale[i] * (np.asarray(rows[i][e], np.float64) - v[e]) for i in range(n)) / n
                for e in range(len(v))]
        v = [ve + se for ve, se in zip(v, step)]
    return v, tau, sorted(clipped)


# -- one round of a robust aggregation -----------------------------------------------------------
@dataclass
class RobustHistory:
    """What centered clipping carries from round to round: every entry's last aggregate (the
    center) and every entry's last radius, the median distance of its contributors to its center
    when it had 3 or more (so a group with too few contributors to read a radius off them is still
    clipped: at sqrt(sum of its entries' radii squared)). Held by the strategy, in memory: a
    restarted server starts afresh."""

    centers: dict[str, np.ndarray] = field(default_factory=dict)
    radii: dict[str, float] = field(default_factory=dict)

    def radius(self, entries: Sequence[str]) -> float | None:
        """The radius history gives a group of ``entries``, if every one of them has one."""
        if not all(e in self.radii for e in entries):
            return None
        return math.sqrt(sum(self.radii[e] ** 2 for e in entries))


@dataclass(frozen=True)
class GroupOutcome:
    """How one layer group was aggregated, for the round's journal entry."""

    entries: tuple[str, ...]
    devices: tuple[str, ...]
    method: str  # what ran: the configured statistic, or its fallback (say why in ``note``)
    kept: tuple[str, ...] = ()  # Krum: the selected devices
    clipped: tuple[str, ...] = ()  # centered clipping: the devices whose delta was clipped
    radius: float | None = None
    note: str = ""

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"entries": len(self.entries), "devices": len(self.devices), "method": self.method}
        if self.kept:
            out["kept"] = list(self.kept)
        if self.clipped:
            out["clipped"] = list(self.clipped)
        if self.radius is not None and math.isfinite(self.radius):
            out["radius"] = self.radius
        if self.note:
            out["note"] = self.note
        return out


class RobustRound:
    """One round's contributions, aggregated per layer group when the round closes.

    ``add`` keeps each device's delta per entry; :meth:`aggregate` groups the entries by their
    exact set of contributors and applies the configured statistic to each group:

    - ``krum`` / ``multi_krum`` with fewer than 2f + 3 contributors (Krum's guarantee does not hold):
      the coordinate-wise median instead, which ignores any minority per coordinate; with one or
      two contributors that is their mean, and nothing bounds them (the server's norm bound must).
    - ``centered_clip`` with fewer than 3 contributors: the group's radius from an earlier round,
      if it had one; otherwise the group is not clipped (said in the outcome's note).
    """

    def __init__(self, method: str, *, trim: float = 0.1, byzantine: int = 1, clip_radius: float = 0.0,
                 history: RobustHistory | None = None) -> None:
        if method not in AGGREGATIONS or method == "mean":
            raise ValueError(f"not a robust aggregation: {method!r}")
        self.method, self.trim, self.byzantine, self.clip_radius = method, trim, byzantine, clip_radius
        self.history = history if history is not None else RobustHistory()
        self._deltas: dict[str, dict[str, np.ndarray]] = {}  # entry -> device -> delta
        self.outcomes: list[GroupOutcome] = []

    def add(self, device: str, name: str, delta: np.ndarray) -> None:
        by_device = self._deltas.setdefault(name, {})
        if device in by_device:
            raise ValueError(f"device {device!r} contributed {name!r} twice")
        by_device[device] = np.array(delta, copy=True)

    def groups(self) -> dict[tuple[str, ...], list[str]]:
        """Contributors (sorted ids) -> the entries they, and only they, trained."""
        out: dict[tuple[str, ...], list[str]] = {}
        for name, by_device in self._deltas.items():
            out.setdefault(tuple(sorted(by_device)), []).append(name)
        return out

    def aggregate(self) -> dict[str, np.ndarray]:
        """The aggregated delta (float64) of every entry that was contributed to."""
        result: dict[str, np.ndarray] = {}
        self.outcomes = []
        for devices, entries in self.groups().items():
            rows = [[self._deltas[e][d] for e in entries] for d in devices]
            aggregated, outcome = self._group(devices, tuple(entries), rows)
            result.update(zip(entries, aggregated))
            self.outcomes.append(outcome)
        if self.method == "centered_clip":
            self.history.centers.update(result)
        return result

    def _group(self, devices: tuple[str, ...], entries: tuple[str, ...],
               rows: list[list[np.ndarray]]) -> tuple[list[np.ndarray], GroupOutcome]:
        n, f = len(devices), self.byzantine

        def column(e: int) -> np.ndarray:  # contributors x entry e (one entry at a time: memory)
            return np.stack([np.asarray(row[e], np.float64) for row in rows])

        if self.method == "median" or (self.method in ("krum", "multi_krum") and n <= 2 * f + 2):
            note = "" if self.method == "median" else f"{n} contributors: Krum needs more than {2 * f + 2}"
            if n < MIN_ADAPTIVE:
                note = "; ".join(filter(None, (note, _too_few(n, "the median"))))
            return [np.median(column(e), axis=0) for e in range(len(entries))], GroupOutcome(entries, devices, "median", note=note)
        if self.method == "trimmed_mean":
            note = "" if trim_count(n, self.trim) else f"{n} contributors: nothing trimmed"
            if n < MIN_ADAPTIVE:
                note = f"{note}; {_too_few(n, 'the trimmed mean')}"
            return ([trimmed_mean(column(e), self.trim) for e in range(len(entries))],
                    GroupOutcome(entries, devices, "trimmed_mean", note=note))
        if self.method in ("krum", "multi_krum"):
            m = 1 if self.method == "krum" else n - f
            out, kept = krum(rows, f, m)
            return out, GroupOutcome(entries, devices, self.method, kept=tuple(devices[i] for i in kept))
        return self._clip(devices, entries, rows)

    def _clip(self, devices: tuple[str, ...], entries: tuple[str, ...],
              rows: list[list[np.ndarray]]) -> tuple[list[np.ndarray], GroupOutcome]:
        centers = self.history.centers
        center = [centers.get(e, np.zeros(np.shape(rows[0][i]))) for i, e in enumerate(entries)]
        radius: float | None = self.clip_radius if self.clip_radius > 0 else None
        note = ""
        if radius is None and len(devices) < MIN_ADAPTIVE:
            radius = self.history.radius(entries)
            note = (f"{len(devices)} contributors: radius from earlier rounds" if radius is not None
                    else f"{len(devices)} contributors and no earlier radius: not clipped")
            radius = math.inf if radius is None else radius
        elif len(devices) >= MIN_ADAPTIVE:
            for i, e in enumerate(entries):  # per entry, for groups of other shapes in later rounds
                c = np.asarray(center[i], np.float64)
                self.history.radii[e] = float(np.median([np.linalg.norm(np.asarray(row[i], np.float64) - c)
                                                         for row in rows]))
        out, tau, clipped = centered_clip(rows, center, radius)
        return out, GroupOutcome(entries, devices, "centered_clip", clipped=tuple(devices[i] for i in clipped),
                                 radius=tau, note=note)

    def summary(self) -> list[dict[str, object]]:
        return [o.summary() for o in self.outcomes]


# -- the weight cap ------------------------------------------------------------------------------
def capped_weights(weights: Sequence[float] | np.ndarray, share: float) -> np.ndarray:
    """The largest weights ``w'_i = min(w_i, c)`` with ``max_i w'_i <= share * sum_j w'_j``.

    Water filling: with the k largest capped at c, c = share * (k c + R_k), R_k the sum of the
    rest, so c = share R_k / (1 - k share); the first k whose (k+1)-th weight is at most that c
    is the answer. Fewer than 1 / share contributors cannot meet the cap: they get equal weights
    (each 1/n of the average, the least any one of them can have)."""
    w = np.asarray(weights, dtype=np.float64)
    if share >= 1 or w.size == 0:
        return w.copy()
    order = np.sort(w)[::-1]
    rest = np.cumsum(order[::-1])[::-1]  # rest[k] = sum of order[k:]
    for k in range(order.size):
        if k * share >= 1:
            break
        c = share * rest[k] / (1 - k * share)
        if order[k] <= c:
            return np.minimum(w, c)
    return np.full_like(w, order[-1])


def max_capped(share: float) -> int:
    """How many contributors :func:`capped_weights` can cap below their weight: the largest k with
    k * share < 1 (also the most that can fall short of 1 / share and all be equalised)."""
    if share >= 1:
        return 0
    k = 0
    while (k + 1) * share < 1:
        k += 1
    return k


class WeightCap:
    """Per entry, the cap of :func:`capped_weights` applied to a running weighted sum.

    The running sum folds ``w_i delta_i`` as reports arrive; the cap c is known only when the
    round closes. Only the contributors with weight above c change, and there are at most
    K = :func:`max_capped` (share) of them, all among the K heaviest, so each entry keeps the
    deltas of its K heaviest contributors (O(K x model): 2 copies at share 1/3) and every weight;
    :meth:`correction` then takes ``(w_i - c) delta_i`` back out of the sum."""

    def __init__(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"max_weight_share must be in (0, 1], got {share}")
        self.share = share
        self._k = max_capped(share)
        self._weights: dict[str, list[float]] = {}
        self._heavy: dict[str, list[tuple[float, int, str, np.ndarray]]] = {}  # min-heaps of the K heaviest
        self._seq = 0
        self.capped: dict[str, float] = {}  # device -> the smallest fraction of its weight it kept

    def track(self, name: str, weight: float, delta: np.ndarray, device: str = "") -> None:
        self._weights.setdefault(name, []).append(float(weight))
        heap = self._heavy.setdefault(name, [])
        self._seq += 1
        item = (float(weight), self._seq, device, delta)
        if len(heap) < self._k:
            heapq.heappush(heap, item)
        elif heap and item[0] > heap[0][0]:
            heapq.heapreplace(heap, item)

    def correction(self, name: str) -> tuple[np.ndarray | None, float]:
        """``(sum_i (w_i - c) delta_i, sum_i (w_i - c))`` over the capped contributors of ``name``."""
        weights = self._weights.get(name)
        if not weights:
            return None, 0.0
        c = float(capped_weights(weights, self.share).max())
        acc: np.ndarray | None = None
        removed = 0.0
        for w, _, device, delta in self._heavy.get(name, []):
            if w <= c:
                continue
            excess = w - c
            part = np.multiply(delta, excess, dtype=np.float64)
            acc = part if acc is None else acc + part
            removed += excess
            if device:
                self.capped[device] = min(self.capped.get(device, 1.0), c / w)
        return acc, removed

    def summary(self) -> dict[str, float]:
        return {d: round(kept, 6) for d, kept in sorted(self.capped.items())}
