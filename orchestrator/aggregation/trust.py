"""Direction-aware trust per block: an update is normalised to the size of the server's own update
of the round and weighed by how far its direction agrees with it, block by block.

The norm bound (:mod:`orchestrator.aggregation.normbound`) limits how *large* an update may be; an update of
honest size pointing the wrong way (a sign-flipped one) passes it and cancels an honest device's
step. FLTrust (Cao et al., NDSS 2021, Section 4.2 and Algorithm 1) gives each update the trust score
``TS_i = ReLU(cos(g_i, g_0))`` against the server's update ``g_0`` on its root dataset, and
aggregates ``sum_i TS_i g_i / sum_i TS_j``: an update at 90 degrees or more from the server's
weighs nothing. FLTrust scores the whole update; under partial training a device trains only its
tail of blocks, so here each block (layer group) a device trained gets its own score from that
block's cosine with the same block of the reference update (:mod:`orchestrator.aggregation.reference`), and the
device's weight in that block's mean is multiplied by it (``DeviceReport.entry_weights``).

Magnitude. FLTrust normalises each update to the reference's norm before weighing it (Section 4.2,
Eq. 4: g_i <- (||g_0|| / ||g_i||) g_i), so that an update's leverage comes from its direction only:
here each block a device trained is scaled to the norm of the reference's same block, over the same
elements (:meth:`DirectionTrust.normalise`). Without it, size is an attacker's lever both ways: a
boosted update within the norm bound outweighs its peers, and a free rider (an update shrunk to
0.01 of an honest one, direction unchanged: trust about that of an honest device) takes its full
share of the weight while contributing nothing, shrinking the round's step (three such in the
demo's fleet cost 5.48 points before; BENCHMARKS.md, "Free riders"). The norm bound still clips
first, so the history of accepted norms it keeps is what devices sent.

A secure group's mean (:mod:`orchestrator.aggregation.secure.groups`) is an average of m updates,
and its norm already says how far its members agree: m updates of norm r with pairwise cosine c
average to r sqrt((1 + (m - 1) c) / m). Scaled up to the reference's norm, each group would step as
far as one whole update, and a round of k groups (each mean agreeing with the others more than single
updates do) would step further than the same devices' normalised updates in a plain round: measured
on the digits fleet cut in 12 (three groups of about 4), the groups' means were scaled up 1.03-1.55x
and the honest secure fleet ended below the plain one. ``secure_group_norm = "own"`` keeps a group's
mean at its own norm when that is below the reference's and scales it down to it otherwise
(``scales_up`` False), so a boosted group still has no leverage and a group an insider half cancels
steps less, not more; ``"reference"`` normalises it as a device's update (FLTrust, Eq. 4).

``trust_floor`` > 0 is a soft variant: ``max(floor, ReLU(cos))``, which keeps some weight on an
honest device whose non-IID data points away from the server's. A sign-flipped update then weighs
``floor`` of an aligned one; at 0 (the default) it weighs nothing.

A block every reporting device got zero trust for keeps its previous value (nothing folded into its
mean); the round's journal says which blocks and why (:meth:`DirectionTrust.untrusted`). Without a
reference update (no held-out data on the server, or its loss diverged this round) no direction can
be judged and every weight stays 1; the norm bound then falls back on the median of peers' norms,
which sees size but not direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from orchestrator.aggregation.normbound import scaled_delta
from orchestrator.strategies.selection import Selection

__all__ = ["DirectionTrust", "block_cosines", "norm_ratios"]


def _pair(delta: object, ref: np.ndarray, selection: Selection | None, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A delta's values and the reference's at the same elements (rows or a channel slice)."""
    if isinstance(delta, p.RowSparse):
        values, ref = np.asarray(delta.values), ref[delta.indices]
    else:
        region = None if selection is None else selection.region(name)
        values, ref = np.asarray(delta), (ref[region] if isinstance(region, tuple) else ref)
    # In the update's own float type (BLAS dot products, no float64 copy of a model-sized update): a
    # weight read off a cosine needs no more than float32's precision.
    return values.ravel(), np.asarray(ref, values.dtype).ravel()


def _block_dots(tensors: Mapping[str, object], reference: Mapping[str, np.ndarray], block_of: Mapping[str, int],
                selection: Selection | None) -> dict[int, tuple[float, float, float]]:
    """Per block: (update . reference, ||update||^2, ||reference||^2) over the float entries both
    have, the reference taken at the update's elements."""
    dots: dict[int, list[float]] = {}
    for name, delta in tensors.items():
        values = delta.values if isinstance(delta, p.RowSparse) else delta
        ref = reference.get(name)
        if ref is None or np.asarray(values).dtype.kind != "f":
            continue
        d, r = _pair(delta, np.asarray(ref), selection, name)
        acc = dots.setdefault(block_of[name], [0.0, 0.0, 0.0])
        acc[0] += float(d @ r)
        acc[1] += float(d @ d)
        acc[2] += float(r @ r)
    return {b: (dot, dd, rr) for b, (dot, dd, rr) in sorted(dots.items())}


def block_cosines(tensors: Mapping[str, object], reference: Mapping[str, np.ndarray], block_of: Mapping[str, int],
                  selection: Selection | None = None) -> dict[int, float]:
    """cos(update, reference) per block, over the float entries both have. A block whose reference
    has no length gets nan (no direction to judge by); an update of no length, 0."""
    out: dict[int, float] = {}
    for b, (dot, dd, rr) in _block_dots(tensors, reference, block_of, selection).items():
        if rr <= 0:
            out[b] = math.nan
        else:
            out[b] = 0.0 if dd <= 0 else dot / math.sqrt(dd * rr)
    return out


def norm_ratios(tensors: Mapping[str, object], reference: Mapping[str, np.ndarray], block_of: Mapping[str, int],
                selection: Selection | None = None) -> dict[int, float]:
    """||reference|| / ||update|| per block, over the same elements (FLTrust, Eq. 4); only blocks
    where both have a length."""
    return {b: math.sqrt(rr / dd) for b, (_, dd, rr) in _block_dots(tensors, reference, block_of, selection).items()
            if dd > 0 and rr > 0}


class DirectionTrust:
    """Per-block trust scores of a round's reports against the round's reference update."""

    def __init__(self, template: LayeredModel, floor: float = 0.0, enabled: bool = True, *,
                 scales_up: bool = True) -> None:
        self.enabled, self.floor, self.scales_up = enabled, float(floor), scales_up
        self.blocks = tuple(template.block_names)
        self.block_of = {name: template.block_of(name) for name in template.state_dict()}
        self._reference: Mapping[str, np.ndarray] | None = None
        self._scores: dict[int, dict[str, float]] = {}  # block -> device -> this round's trust

    def begin_round(self, reference: Mapping[str, np.ndarray] | None) -> None:
        """A round opens with the server's reference update (None: none this round, weights stay 1)."""
        self._reference, self._scores = reference, {}

    def normalise(self, tensors: Mapping[str, object], selection: Selection | None
                  ) -> tuple[Mapping[str, object], dict[int, float]]:
        """Each block of the update scaled to the reference's norm over the same elements (FLTrust,
        Eq. 4), and the factor of each block; unchanged when trust is off or there is no reference.
        Without ``scales_up`` a block is only scaled down to the reference's norm (a secure group's
        mean: see the module docstring)."""
        if not self.enabled or not self._reference or not tensors:
            return tensors, {}
        factors = norm_ratios(tensors, self._reference, self.block_of, selection)
        if not self.scales_up:
            factors = {b: f for b, f in factors.items() if f < 1.0}
        scaled = {n: scaled_delta(t, factors[self.block_of[n]]) if self.block_of[n] in factors else t
                  for n, t in tensors.items()}
        return scaled, factors

    def score(self, device: str, tensors: Mapping[str, object], selection: Selection | None) -> dict[int, float]:
        """Block -> trust in [floor, 1] of a device's (bounded) update; empty when trust is off or
        there is no reference this round. A block with no reference direction is trusted (1)."""
        if not self.enabled or not self._reference or not tensors:
            return {}
        scores: dict[int, float] = {}
        for b, cos in block_cosines(tensors, self._reference, self.block_of, selection).items():
            scores[b] = 1.0 if math.isnan(cos) else max(self.floor, cos, 0.0)
            self._scores.setdefault(b, {})[device] = scores[b]
        return scores

    def entry_weights(self, tensors: Mapping[str, object], scores: Mapping[int, float]) -> dict[str, float]:
        """Entry name -> its block's trust, for the entries whose block's trust is below 1."""
        return {n: scores[self.block_of[n]] for n in tensors if scores.get(self.block_of[n], 1.0) < 1.0}

    def named(self, scores: Mapping[int, float]) -> dict[str, float]:
        """Scores by block name, rounded for the journal."""
        return {self.blocks[b]: round(s, 4) for b, s in scores.items()}

    def discard(self, device: str) -> None:
        """A scored report was not folded after all: its scores do not count."""
        for by_device in self._scores.values():
            by_device.pop(device, None)

    def untrusted(self) -> dict[str, str]:
        """Blocks whose every folded report got zero trust this round, with why they keep their value."""
        return {self.blocks[b]: f"all {len(s)} reports pointed away from the server's reference update "
                                "(trust 0): the block keeps its previous value"
                for b, s in sorted(self._scores.items()) if s and max(s.values()) <= 0.0}
