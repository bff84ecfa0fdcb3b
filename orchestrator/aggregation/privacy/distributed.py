"""Distributed differential privacy: the devices add the noise, inside the secure round, and the
server accounts what survived (docs/security.md, "Distributed noise on secure aggregation").

With ``dp`` and ``secure_aggregation`` both on, :class:`DistributedDPIntake` replaces the secure
intake. The plan is central DP's (``orchestrator.aggregation.privacy.central.plan_central``: the same N, K,
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
   fixed denominator, :func:`~orchestrator.aggregation.privacy.intake.expected_cohorts`), and the round's release,
   each block at the multiplier its survivors gave, goes to the same ledger as central DP's, journaled
   with the round (``mode`` "distributed"), so that a resumed run continues it and
   ``dp_target_epsilon`` ends the run before the round that would pass it.

Adaptive clipping needs each update's norm in the clear and is refused with this mode
(``ServerConfig.secure_conflict``). What the server learns beyond the noised sums: which devices
survived (the protocol needs it) and each block's count of survivors (the unnoised weight coordinate).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edge_sdk.models import LayeredModel
from edge_sdk.secagg.layout import split_vector
from orchestrator.aggregation.privacy import PrivacyBudgetSpent
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent
from orchestrator.aggregation.privacy.central import CentralPlan, plan_central
from orchestrator.aggregation.privacy.intake import (DISTRIBUTED, expected_cohorts, next_stop, over_target,
                                                     resumed_ledger)
from orchestrator.aggregation.secure.intake import SecureIntake
from orchestrator.aggregation.secure.round import BlockOutcome, SecureRound
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.strategies import RoundContext, RoundResult, Strategy

__all__ = ["DistributedDPIntake"]

log = logging.getLogger("edgetrain.server")


class DistributedDPIntake(SecureIntake):
    """Secure rounds whose devices add discrete Gaussian noise; the server accounts the survivors'."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, store: Store,
                 **parts: Any) -> None:
        self.plan: CentralPlan = plan_central(config, len(template))
        super().__init__(replace(config, secure_clip=self.plan.block_clip), template, strategy, store, **parts)
        self.uniform = True  # every weight 1 (step 1)
        self.target = config.dp_target_epsilon
        self.poisson = config.dp_sampling == "poisson"
        self.ledger = PrivacyLedger(tuple(self.block_names), self.plan.delta, accountant=config.dp_accountant,
                                    sampling=config.dp_sampling)
        if config.resume:
            self.ledger = resumed_ledger(store.privacy.last(), store.rounds.completed(), self.ledger,
                                         DISTRIBUTED) or self.ledger
        self.stop_reason: str | None = None

    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        if self.stop_reason is not None:
            raise PrivacyBudgetSpent(self.stop_reason)
        super().begin_round(state, round)

    def plan_noise(self, secure: SecureRound) -> None:
        """Step 2: each block's n_min_b from the cohort that advertised keys, z_b, and the survivors
        n_exp_b the shares are sized for (``dp_expected_survivors``; by default n_min_b)."""
        splits = [device.split for device in secure.keys.values()]
        cohorts = {b: sum(s <= b for s in splits) for b in range(len(self.block_names))}
        share = self.config.dp_expected_survivors
        secure.noise_survivors = {b: _at_least(self.config.dp_min_survivors, n) for b, n in cohorts.items() if n > 0}
        secure.noise_multiplier = self.plan.block_multiplier if secure.noise_survivors else 0.0
        if share is not None:
            secure.noise_expected = {b: max(n_min, _at_least(share, cohorts[b]))
                                     for b, n_min in secure.noise_survivors.items()}

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """Steps 3-4: each revealed block's noised sum over its expected cohort, the release accounted."""
        result = super().aggregate(ctx)
        event, revealed, expected, fleet, cohort = self._release(ctx)
        if event is None:
            return replace(result, state=dict(ctx.global_state), extra={**result.extra, "privacy": self.summary_dp({})})
        blocks = event.blocks
        if self.target is not None and self.ledger.would_exceed(self.target, event):
            raise PrivacyBudgetSpent(over_target(self.ledger, self.target, ctx.round, event))
        state = {k: np.asarray(v) for k, v in ctx.global_state.items()}
        noise: dict[str, float] = {}
        for out in revealed:
            m = expected[out.block]
            for name, delta in split_vector(out.values / m, self.entries[out.block], self.shapes).items():
                state[name] = np.asarray(state[name] + delta, dtype=state[name].dtype)
            noise[self.block_names[out.block]] = out.multiplier * self.plan.block_clip / m
        self.ledger.record(event)
        self.store.privacy.record(ctx.round, {"ledger": self.ledger.to_json(), "mode": DISTRIBUTED})
        self.stop_reason = next_stop(self.ledger, self.target, ctx.round, self.config.rounds, event)
        return replace(result, state=state, extra={**result.extra, "privacy": self.summary_dp({
            "mode": DISTRIBUTED, "noise_stddev": noise, "fleet": fleet, "cohort": cohort,
            "multipliers": {name: b.noise_multiplier for name, b in blocks.items()},
            "expected_cohorts": {self.block_names[o.block]: expected[o.block] for o in revealed}})})

    def ends_run(self) -> bool:
        return self.stop_reason is not None

    def _release(self, ctx: RoundContext) -> tuple[RoundEvent | None, list[BlockOutcome], dict[int, float], int, int]:
        """The round's release as the accountant takes it (None: no block revealed), the revealed
        blocks' outcomes, each block's expected cohort, the fleet N and the cohort K."""
        fleet, cohort = max(len(ctx.devices), ctx.state.num_selected), ctx.state.num_selected
        rate = self.config.fraction if self.poisson else cohort / max(1, fleet)
        expected = expected_cohorts(ctx, rate, len(self.block_names))
        revealed = [o for o in self.outcomes if o.values is not None and o.block in expected and o.multiplier > 0]
        blocks = {self.block_names[o.block]: BlockRelease(o.multiplier) for o in revealed}
        if not blocks:
            return None, revealed, expected, fleet, cohort
        event = RoundEvent(rate, blocks) if self.poisson else RoundEvent.fixed(fleet, cohort, blocks)
        return event, revealed, expected, fleet, cohort

    async def settle(self, ctx: RoundContext) -> None:
        """After the unmasking: the accountant's answers for the release (as central DP's intake) in a
        worker thread, so that the server's loop keeps serving devices meanwhile."""
        await super().settle(ctx)
        event = self._release(ctx)[0]
        if event is not None:
            await asyncio.to_thread(self.ledger.look_ahead, event)

    def summary_dp(self, round_info: Mapping[str, object]) -> dict[str, object]:
        """The privacy spent so far (per block and for the model) and what this round released."""
        return {**self.ledger.spent().to_dict(), "noise_multiplier": self.plan.multiplier,
                "target_epsilon": self.target, "mode": DISTRIBUTED, **round_info}


def _at_least(share: float, cohort: int) -> int:
    """ceil(share x cohort), at least 1: the devices a block's noise is sized for."""
    return max(1, math.ceil(share * cohort - 1e-9))
