"""Distributed differential privacy: the devices add the noise, inside the secure round, and the
server accounts what survived (docs/security.md, "Distributed noise on secure aggregation").

With ``dp`` and ``secure_aggregation`` both on, :class:`DistributedDiscreteGaussian` (the
``discrete_gaussian`` privacy mechanism) releases the secure round's block sums. The plan is central DP's (``orchestrator.aggregation.privacy.central.plan_central``: the same N, K,
sampling, delta, multiplier z, per-block clip C_b = C / sqrt(L) and multiplier z_b = z sqrt(L)), and
the mechanism is Kairouz, Liu and Steinke's (2021, "The Distributed Discrete Gaussian Mechanism
for Federated Learning with Secure Aggregation", Algorithm 1) on EmbracingFL's block cohorts:

1. every device clips each block it trained to C_b (``edge_sdk.secagg.fixedpoint``), with weight 1
   (an unweighted mean, as central DP: a weight per sample count would let sensitivity grow);
2. when the key stage closes the server knows block b's cohort m'_b (the devices that advertised
   keys and trained it) and asks each device for the noise of n_min_b = ceil(``dp_min_survivors`` x
   m'_b) devices: N_Z(0, sigma_b^2 / n_min_b) per coordinate, sigma_b = z_b C_b in ring units, added
   to its words before the masks (:meth:`edge_sdk.secagg.round.DeviceRound.mask`); with
   ``dp_expected_survivors`` the shares are sized for n_exp_b = ceil(that share x m'_b) survivors
   instead (N_Z(0, sigma_b^2 / n_exp_b)), so a round in which they survive spends what the plan says;
3. a block with s_b >= n_min_b survivors is revealed with noise of multiplier z_b sqrt(s_b / n_exp_b)
   (n_exp_b = n_min_b by default: never less than z_b), one with fewer is not revealed
   (``SecureRound.finish``): the honest server never releases a sum under-noised for its floor;
4. each revealed block's mean is its noised sum over its *expected* cohort m_b = q N_b (central DP's
   fixed denominator, :func:`~orchestrator.aggregation.privacy.release.expected_cohorts`), and the round's release,
   each block at the multiplier its survivors gave, goes to the same ledger as central DP's, journaled
   with the round (``mode`` "distributed"), so that a resumed run continues it and
   ``dp_target_epsilon`` ends the run before the round that would pass it.

Adaptive clipping needs each update's norm in the clear and is refused with this mode
(``ServerConfig.secure_conflict``). What the server learns beyond the noised sums: which devices
survived (the protocol needs it) and each block's count of survivors (the unnoised weight coordinate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator.aggregation.pipeline import BlockSums
from orchestrator.aggregation.privacy.accountant import BlockRelease
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism
from orchestrator.aggregation.secure.round import NoisePlan
from orchestrator.config import ServerConfig
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["DISTRIBUTED", "DistributedDiscreteGaussian"]

#: Where this mechanism's noise is added, as a run's journaled ledger says.
DISTRIBUTED = "distributed"


class DistributedDiscreteGaussian(PrivacyMechanism):
    """Secure rounds whose devices add discrete Gaussian noise; the server accounts the survivors'."""

    name = "discrete_gaussian"
    mode = DISTRIBUTED
    formats = frozenset({"masked"})

    def __init__(self, config: ServerConfig, blocks: Sequence[str], block_of: Mapping[str, int]) -> None:
        if config.dp_allocation != "uniform":
            raise PrivacyPlanError("dp_allocation utility: the devices' noise shares are sized for one multiplier "
                                   "per round (z sqrt(L)); per-block shares are not built")
        super().__init__(config, blocks, block_of)

    def noise_shares(self, cohorts: Mapping[int, int]) -> NoisePlan:
        """Step 2: each block's n_min_b from the cohort that advertised keys, z_b, and the survivors
        n_exp_b the shares are sized for (``dp_expected_survivors``; by default n_min_b)."""
        config = self.config
        survivors = {b: _at_least(config.dp_min_survivors, n) for b, n in cohorts.items() if n > 0}
        share = config.dp_expected_survivors
        expected = {} if share is None else {b: max(n_min, _at_least(share, cohorts[b]))
                                             for b, n_min in survivors.items()}
        return NoisePlan(self.plan.block_multiplier if survivors else 0.0, survivors, expected)

    def releases(self, sums: BlockSums | None, expected: Mapping[int, float]) -> dict[int, BlockRelease]:
        """Step 3: each revealed block the round expected, at the multiplier its survivors' shares gave."""
        if sums is None:
            return {}
        return {b: BlockRelease(sums.multipliers[b]) for b in sums.values if b in expected and sums.multipliers[b] > 0}

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None, expected: Mapping[int, float],
                released: Mapping[int, BlockRelease]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        """Step 4: each released block's noised sum over its expected cohort; the others keep their value."""
        assert sums is not None
        state = {k: np.asarray(v) for k, v in ctx.global_state.items()}
        noise: dict[str, float] = {}
        for b in released:
            m = expected[b]
            for name, delta in sums.split(b, m).items():
                state[name] = np.asarray(state[name] + delta, dtype=state[name].dtype)
            noise[self.blocks[b]] = sums.multipliers[b] * self.plan.block_clip / m
        return state, {"mode": DISTRIBUTED, "noise_stddev": noise,
                       "multipliers": {self.blocks[b]: r.noise_multiplier for b, r in released.items()},
                       "expected_cohorts": {self.blocks[b]: expected[b] for b in released}}

    def withheld(self, ctx: RoundContext, result: RoundResult) -> dict[str, np.ndarray]:
        """No block released: the model keeps its value (the weighted mean of unnoised sums is never used)."""
        return dict(ctx.global_state)


def _at_least(share: float, cohort: int) -> int:
    """ceil(share x cohort), at least 1: the devices a block's noise is sized for."""
    return max(1, math.ceil(share * cohort - 1e-9))
