"""Central Gaussian noise: the server clips each update, sums, noises and releases (docs/security.md,
"Differential privacy"; the ``gaussian`` privacy mechanism).

Each round (McMahan et al., 2018, "Learning Differentially Private Recurrent Language Models",
Algorithm 1, per layer as in its Section 3):

1. each folded report's update is clipped per block to the block's clip C_b (the chain's ``dp_clip``,
   :class:`~orchestrator.aggregation.privacy.clipping.ClipAndSum`, the devices' rule), and the strategy
   folds the clipped update (its checks, refusals, roles and losses stay its own);
2. the clipped updates are summed per block over the block's cohort: under EmbracingFL's partial
   training the devices that trained it;
3. when the round closes, N(0, (z_sum_b C_b)^2) is added to every coordinate of each block's sum
   (:mod:`orchestrator.aggregation.privacy.noise`) and the mean update is the noised sum over the
   block's expected cohort m_b (:func:`~orchestrator.aggregation.privacy.release.expected_cohorts`),
   unweighted: the strategies DP allows declare a weighted mean of whole blocks
   (``Strategy.combines``), and a weight per sample count would let one device's weight, and so its
   sensitivity, grow;
4. with adaptive clipping, each block's clip moves towards the target quantile of its norms
   (Andrew et al., 2021, Algorithm 1) from the noised count of unclipped updates;
5. the round's release goes to the run's ledger (:class:`~orchestrator.aggregation.privacy.release.PrivateRelease`),
   which journals it with the clips, so that a resumed run continues both.

The fleet's composition (N, and N_b: the devices able to train block b, by their planned roles,
fixed by their memory, not their data) and the sample size K are public, as the accountant assumes;
who was sampled, how many of them trained a block and who dropped out are not released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.aggregation.pipeline import BlockSums, Bound
from orchestrator.aggregation.privacy.accountant import BlockRelease
from orchestrator.aggregation.privacy.clipping import AdaptiveClip, AdaptiveClipping, ClipAndSum
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism
from orchestrator.aggregation.privacy.noise import gaussian
from orchestrator.config import ServerConfig
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["CENTRAL", "CentralGaussian"]

#: Where this mechanism's noise is added, as a run's journaled ledger says.
CENTRAL = "central"


class CentralGaussian(PrivacyMechanism):
    """Per-block clipping on the server, Gaussian noise on each block's sum (see the module docstring)."""

    name = "gaussian"
    mode = CENTRAL
    formats = frozenset({"plain"})

    def __init__(self, config: ServerConfig, blocks: Sequence[str], block_of: Mapping[str, int]) -> None:
        super().__init__(config, blocks, block_of)
        plan, count = self.plan, 0.0
        if config.dp_adaptive_clip:
            count = plan.count_noise(plan.cohort)
        self.count_stddev = count
        self.sum_multiplier = plan.sum_multiplier(count)
        self.clip = ClipAndSum(self.block_of, AdaptiveClipping({
            i: AdaptiveClip(plan.block_clip, config.dp_target_quantile, config.dp_clip_lr, count)
            for i in range(len(self.blocks))}))

    def server_clip(self) -> Bound:
        return self.clip

    def releases(self, sums: BlockSums | None, expected: Mapping[int, float]) -> dict[int, BlockRelease]:
        """Every block some idle device can train, noised whether or not a sampled device trained it
        this round: the accountant's mechanism is the sum plus noise, a zero sum included (an untouched
        block would tell that none of its devices was sampled)."""
        if self.config.dp_allocation == "utility":  # no count: adaptive clipping keeps uniform noise
            return {b: BlockRelease(z) for b, z in self.block_multipliers(expected).items()}
        return {b: BlockRelease(self.sum_multiplier, self.count_stddev) for b in expected}

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None, expected: Mapping[int, float],
                released: Mapping[int, BlockRelease]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        """The strategy's round with each block's mean replaced by its noised clipped sum over its
        expected cohort (step 3), then the clips moved (step 4)."""
        clip = self.clip
        state, noise = dict(result.state), {}
        for name, old in ctx.global_state.items():
            block = self.block_of[name]
            if old.dtype.kind != "f" or block not in expected:
                continue
            m, sigma = expected[block], released[block].noise_multiplier * clip.clipping.blocks[block].clip
            total = gaussian(old.shape, sigma)
            if name in clip.sums:
                total += clip.sums[name]
            state[name] = np.asarray(old.astype(np.float64) + total / m, dtype=old.dtype)
            noise[self.blocks[block]] = sigma / m
        clips_used = {self.blocks[b]: clip.clipping.blocks[b].clip for b in expected}
        if self.config.dp_adaptive_clip:
            clip.adapt(expected)
        return state, {"clips": clips_used, "cohorts": {self.blocks[b]: clip.counts.get(b, 0) for b in expected},
                       "expected_cohorts": {self.blocks[b]: m for b, m in expected.items()}, "noise_stddev": noise}

    def state(self) -> dict[str, Any]:
        return {"clips": self.clip.clipping.to_json()}

    def restore(self, saved: Mapping[str, Any]) -> None:
        clips = AdaptiveClipping.from_json(saved["clips"])
        self.clip.restore(AdaptiveClipping({int(b): a for b, a in clips.blocks.items()}))
