"""Clipping for differential privacy: the per-block rule, per-layer clips, adaptive clips, and the
server's clip-and-sum step (:class:`ClipAndSum`) of a report's bounds.

The rule is the device's (``edge_sdk.dp.clip_blocks``, re-exported here): in plain mode the server
applies it to each report, under secure aggregation the device applies it before masking; one
implementation, so both clip the same way.

Per-layer clips (McMahan et al., 2018, Section 3): an overall clip C shared equally by the L
blocks some device trains, C_b = C / sqrt(L), so that a device training every block is clipped to
C overall (:func:`equal_clips`).

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, 2021, "Differentially Private Learning with
Adaptive Clipping", Algorithm 1 with the geometric update), per block: each device in the round
contributes the centred bit b_i - 1/2, with b_i = 1[||Delta_i|| <= C]; the server adds
N(0, sigma_b^2) to their sum, estimates the unclipped fraction b~ = clamp(sum / m + 1/2, 0, 1) over
the expected cohort m, and moves the clip geometrically towards the target quantile gamma:
C <- C exp(-eta (b~ - gamma)). Centring halves the count's sensitivity to 1/2 (as in TensorFlow
Privacy's QuantileEstimatorQuery), so the count is a Gaussian of multiplier 2 sigma_b. The count
and the update sum are released about the same sample, so their privacy composes into one Gaussian
(Andrew et al., Section 3.1): to keep a block's overall multiplier at z, its sum gets the larger
multiplier z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 (:func:`sum_multiplier`), and the ledger records
both (``orchestrator.aggregation.privacy.accountant.BlockRelease``). The paper's defaults: gamma = 0.5 (the
median), eta = 0.2, sigma_b = m / 20.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edge_sdk.dp import Clipped, clip_blocks, clip_factor
from orchestrator.aggregation.pipeline import Bound, Pending
from orchestrator.aggregation.privacy.noise import gaussian

__all__ = [
    "AdaptiveClip",
    "AdaptiveClipping",
    "ClipAndSum",
    "Clipped",
    "clip_blocks",
    "clip_factor",
    "equal_clips",
    "sum_multiplier",
]


def equal_clips(clip: float, blocks: Iterable[str]) -> dict[str, float]:
    """C / sqrt(L) for each of the L blocks: a device training all of them is clipped to C."""
    names = list(blocks)
    if not names:
        raise ValueError("no blocks to clip")
    return {b: clip / math.sqrt(len(names)) for b in names}


def sum_multiplier(block_multiplier: float, count_stddev: float) -> float:
    """The multiplier a block's sum needs so that the sum and its adaptive-clipping count (noise
    ``count_stddev``, sensitivity 1/2) together release ``block_multiplier``:
    (z^-2 - (2 sigma_b)^-2)^-1/2 (Andrew et al., 2021, Section 3.1)."""
    if count_stddev <= 0:
        return block_multiplier
    rest = block_multiplier**-2 - (2.0 * count_stddev) ** -2
    if rest <= 0:
        raise ValueError(f"the count's noise {count_stddev:g} spends the whole budget of multiplier "
                         f"{block_multiplier:g}: it needs a standard deviation above {block_multiplier / 2:g}")
    return rest**-0.5


@dataclass
class AdaptiveClip:
    """One block's clip, tracking the ``target_quantile`` of its update norms (Andrew et al., 2021)."""

    clip: float
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float = 0.0

    def __post_init__(self) -> None:
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"the initial clip must be a finite number > 0, got {self.clip}")
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"the target quantile must be in (0, 1), got {self.target_quantile}")
        if not self.learning_rate > 0:
            raise ValueError(f"the clip's learning rate must be > 0, got {self.learning_rate}")
        if not self.count_stddev >= 0:
            raise ValueError(f"the count's noise must be >= 0, got {self.count_stddev}")

    def bit(self, norm: float) -> float:
        """A device's centred bit: +1/2 if its update's norm is within the clip, else -1/2."""
        return 0.5 if norm <= self.clip else -0.5

    def update(self, centred_sum: float, expected_cohort: float, *, noised: bool = False) -> float:
        """Move the clip after a round whose devices' centred bits summed to ``centred_sum`` (the
        count noise is added here unless ``noised``: the devices added it under secure aggregation);
        returns the estimated unclipped fraction b~."""
        if expected_cohort <= 0:
            raise ValueError(f"the expected cohort must be > 0, got {expected_cohort}")
        noisy = centred_sum
        if not noised and self.count_stddev > 0:
            noisy += float(gaussian(1, self.count_stddev)[0])
        below = min(1.0, max(0.0, noisy / expected_cohort + 0.5))
        self.clip *= math.exp(-self.learning_rate * (below - self.target_quantile))
        return below


class AdaptiveClipping:
    """Adaptive clips for every block, with a JSON state for a resumed run."""

    def __init__(self, clips: Mapping[str, AdaptiveClip]) -> None:
        self.blocks = dict(clips)

    @classmethod
    def start(cls, initial: Mapping[str, float], expected_cohorts: Mapping[str, float], *,
              target_quantile: float = 0.5, learning_rate: float = 0.2) -> AdaptiveClipping:
        """Clips from ``initial`` per block, with the paper's count noise sigma_b = m_b / 20."""
        return cls({b: AdaptiveClip(c, target_quantile, learning_rate, expected_cohorts[b] / 20.0)
                    for b, c in initial.items()})

    @property
    def clips(self) -> dict[str, float]:
        return {b: a.clip for b, a in self.blocks.items()}

    def bits(self, norms: Mapping[str, float]) -> dict[str, float]:
        """One device's centred bits, per block it trained (its norms before clipping)."""
        return {b: self.blocks[b].bit(n) for b, n in norms.items()}

    def update(self, centred_sums: Mapping[str, float], expected_cohorts: Mapping[str, float], *,
               noised: bool = False) -> dict[str, float]:
        """Move every block's clip after a round; the estimated unclipped fraction per block."""
        return {b: self.blocks[b].update(s, expected_cohorts[b], noised=noised) for b, s in centred_sums.items()}

    def to_json(self) -> dict[str, Any]:
        return {b: asdict(a) for b, a in self.blocks.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdaptiveClipping:
        if not isinstance(data, Mapping):
            raise ValueError("adaptive clipping state must be an object of blocks")
        out = {}
        for b, a in data.items():
            if not isinstance(a, Mapping):
                raise ValueError(f"adaptive clip of block {b!r} must be an object, got {a!r}")
            out[str(b)] = AdaptiveClip(float(a["clip"]), float(a["target_quantile"]), float(a["learning_rate"]),
                                       float(a["count_stddev"]))
        return cls(out)


class ClipAndSum(Bound):
    """The server's DP clip, a step of a report's bounds on plain uploads (McMahan et al., 2018,
    Algorithm 1, per layer as in its Section 3): each update clipped per block to the block's clip
    (:func:`clip_blocks`, the devices' rule), and the clipped updates the combiner took summed per
    block, with each block's count and, for adaptive clipping, its devices' centred bits (from their
    norms before clipping). The clips are its own: fixed, or moved after each round by
    :meth:`adapt` (Andrew et al., 2021)."""

    name = "dp_clip"

    def __init__(self, block_of: Mapping[str, int], clipping: AdaptiveClipping) -> None:
        self.block_of, self.clipping = dict(block_of), clipping
        self._begin()

    def _begin(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[int, int] = {}
        self.bits: dict[int, float] = {}
        self._norms: dict[str, dict[int, float]] = {}

    def apply(self, pending: Pending) -> Pending:
        """The update clipped per block to its clip; its norms wait for :meth:`taken`."""
        if not pending.tensors:
            return pending
        clipped = clip_blocks(pending.tensors, self.block_of, self.clipping.clips)
        self._norms[pending.device_id] = clipped.norms
        return pending.with_(tensors=clipped.tensors)

    def taken(self, pending: Pending) -> None:
        """Add a taken report's clipped update to its blocks' sums."""
        norms = self._norms.pop(pending.device_id, {})
        for name, delta in pending.tensors.items():
            a = np.asarray(delta)
            if a.dtype.kind != "f":
                continue
            if pending.selection.region(name) is not None:
                raise ValueError(f"a DP clip sums whole-entry updates; {name!r} came as a slice or rows")
            acc = self.sums.get(name)
            if acc is None:
                self.sums[name] = a.astype(np.float64)
            else:
                np.add(acc, a, out=acc)
        for block, norm in norms.items():
            self.counts[block] = self.counts.get(block, 0) + 1
            self.bits[block] = self.bits.get(block, 0.0) + self.clipping.blocks[block].bit(norm)

    def discard(self, device_id: str) -> None:
        self._norms.pop(device_id, None)

    def adapt(self, expected: Mapping[int, float]) -> None:
        """Move each released block's clip towards its target quantile from the noised count of this
        round's unclipped updates (over its expected cohort)."""
        self.clipping.update({b: self.bits.get(b, 0.0) for b in expected}, expected)

    def restore(self, clipping: AdaptiveClipping) -> None:
        """Continue with a resumed run's clips."""
        self.clipping = clipping

    def end_round(self) -> None:
        self._begin()
