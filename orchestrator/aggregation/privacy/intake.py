"""Central differential privacy in a running server: the report intake that clips, sums, noises and
accounts (docs/security.md, "Differential privacy"; docs/architecture.md, "Report intake").

:class:`CentralDPIntake` is :class:`~orchestrator.aggregation.intake.PlainIntake` with the norm bound replaced by
the DP clip (the bound's reference is the median of earlier devices' norms: data that no accountant
covers). Each round (McMahan et al., 2018, "Learning Differentially Private Recurrent Language
Models", Algorithm 1, per layer as in its Section 3):

1. each folded report's update is clipped per block to the block's clip C_b
   (``orchestrator.aggregation.privacy.clipping.clip_blocks``, the devices' rule), and the strategy folds the
   clipped update (its checks, refusals, roles and losses stay its own);
2. the clipped updates are summed per block over the block's cohort: under EmbracingFL's partial
   training the devices that trained it;
3. when the round closes, N(0, (z_sum_b C_b)^2) is added to every coordinate of each block's sum
   (``orchestrator.aggregation.privacy.noise``) and the mean update is the noised sum over the block's expected
   cohort m_b (:meth:`CentralDPIntake.expected_cohorts`), unweighted: the strategies DP allows
   (FedAvg, EmbracingFL) average each entry over its contributors, and a weight per sample count
   would let one device's weight, and so its sensitivity, grow;
4. with adaptive clipping, each block's clip moves towards the target quantile of its norms
   (Andrew et al., 2021, Algorithm 1) from the noised count of unclipped updates;
5. the round's release goes to the :class:`~orchestrator.aggregation.privacy.accountant.PrivacyLedger` (fixed-size
   sampling: K of the N idle devices; or Poisson sampling at rate q = fraction), whose (epsilon, delta), per block and for the model, goes into
   the round's metrics; the ledger and the clips are journaled (``store.privacy.record``) so that a
   resumed run continues them.

The fleet's composition (N, and N_b: the devices able to train block b, by their planned roles,
fixed by their memory, not their data) and the sample size K are public, as the accountant assumes;
who was sampled, how many of them trained a block and who dropped out are not released. A round that would
take the model past ``dp_target_epsilon`` is never released: the run ends before it
(:class:`PrivacyBudgetSpent`), with the round that would have passed it named.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edge_sdk.models import LayeredModel
from orchestrator.aggregation.intake import PlainIntake
from orchestrator.aggregation.privacy import PrivacyBudgetSpent
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.central import CentralPlan, plan_central
from orchestrator.aggregation.privacy.clipping import AdaptiveClip, AdaptiveClipping, clip_blocks
from orchestrator.aggregation.privacy.noise import gaussian
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.strategies import DeviceReport, RoundContext, RoundResult, Strategy

__all__ = ["CENTRAL", "CentralDPIntake", "DISTRIBUTED", "PrivacyBudgetSpent", "expected_cohorts", "next_stop",
           "over_target", "resumed_ledger"]

log = logging.getLogger("edgetrain.server")

#: Where a run's noise is added, as its journaled ledger says: by the server, or by the devices.
CENTRAL, DISTRIBUTED = "central", "distributed"


def resumed_ledger(saved: Mapping[str, Any] | None, completed: int, fresh: PrivacyLedger,
                   mode: str) -> PrivacyLedger | None:
    """The ledger journaled with a resumed run's last completed round (None: nothing to continue),
    checked against the one this run would keep (``fresh``) and its ``mode``; refuses a run whose
    rounds were not accounted, or were accounted at other settings."""
    if saved is None:
        if completed:
            raise PrivacyPlanError(f"--resume with dp: the run's {completed} completed rounds kept no privacy "
                                   f"ledger (they ran without dp), so no epsilon covers its model")
        return None
    ledger = PrivacyLedger.from_json(saved["ledger"])
    kept = (ledger.delta, ledger.accountant, ledger.sampling, ledger.blocks, saved.get("mode", CENTRAL))
    if kept != (fresh.delta, fresh.accountant, fresh.sampling, fresh.blocks, mode):
        raise PrivacyPlanError(f"--resume with dp: the run's ledger was kept at delta {ledger.delta:g}, accountant "
                               f"{ledger.accountant}, sampling {ledger.sampling}, {kept[-1]} noise; resume it with "
                               f"those settings")
    log.info("privacy ledger resumed after %d rounds: epsilon %.4g", len(ledger.rounds), ledger.spent().epsilon)
    return ledger


def expected_cohorts(ctx: RoundContext, rate: float, num_blocks: int) -> dict[int, float]:
    """m_b = q N_b for each block some idle device can train: N_b of the idle devices can train
    it (their planned split is at most b), each sampled with probability q (K / N for K of N).
    The mean's fixed denominator (McMahan et al., 2018, estimator f~_f): how many sampled devices
    trained a block, and who dropped out, stay unsaid."""
    splits = [info.split for info in ctx.devices.values()]
    able = {b: sum(s <= b for s in splits) for b in range(num_blocks)}
    return {b: rate * n for b, n in able.items() if n > 0}


def over_target(ledger: PrivacyLedger, target: float | None, round: int, event: RoundEvent) -> str:
    """The message of a run that stops before round ``round``, which would pass ``target``."""
    after = ledger.spent_after(event).epsilon
    return (f"privacy budget spent: round {round} would take epsilon from {ledger.spent().epsilon:.4g} "
            f"to {after:.4g}, over the target {target:g} (delta {ledger.delta:g}); the run ends here")


def next_stop(ledger: PrivacyLedger, target: float | None, round: int, rounds: int, event: RoundEvent) -> str | None:
    """After round ``round`` of ``rounds``: why the run stops before the next (a round like ``event``
    would pass ``target``), or None."""
    if target is not None and round < rounds and ledger.would_exceed(target, event):
        return over_target(ledger, target, round + 1, event)
    return None


class CentralDPIntake(PlainIntake):
    """Plain intake with per-block clipping, Gaussian noise on each block's sum and a privacy ledger."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, store: Store,
                 **parts: Any) -> None:
        self.plan: CentralPlan = plan_central(config, len(template))
        super().__init__(replace(config, norm_bound=0.0, direction_trust=False), template, strategy, store, **parts)
        self.target = config.dp_target_epsilon
        self.blocks = tuple(template.block_names)
        self.block_of = {name: template.block_of(name) for name in template.state_dict()}
        count = self.plan.count_noise(self.plan.cohort) if config.dp_adaptive_clip else 0.0
        self.count_stddev = count
        self.sum_multiplier = self.plan.sum_multiplier(count)
        self.clipping = AdaptiveClipping({i: AdaptiveClip(self.plan.block_clip, config.dp_target_quantile,
                                                          config.dp_clip_lr, count) for i in range(len(self.blocks))})
        self.poisson = config.dp_sampling == "poisson"
        self.ledger = PrivacyLedger(self.blocks, self.plan.delta, accountant=config.dp_accountant,
                                    sampling=config.dp_sampling)
        if config.resume:
            self._restore(store.privacy.last(), store.rounds.completed())
        self.stop_reason: str | None = None
        self._begin_sums()

    def _restore(self, saved: Mapping[str, Any] | None, completed: int) -> None:
        """Continue the ledger and the clips of the run's last completed round."""
        ledger = resumed_ledger(saved, completed, self.ledger, CENTRAL)
        if ledger is not None:
            self.ledger = ledger
            clips = AdaptiveClipping.from_json(saved["clips"])  # type: ignore[index]
            self.clipping = AdaptiveClipping({int(b): a for b, a in clips.blocks.items()})

    def _begin_sums(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._counts: dict[int, int] = {}
        self._bits: dict[int, float] = {}
        self._norms: dict[str, dict[int, float]] = {}

    # -- a round's life -------------------------------------------------------------------------
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        if self.stop_reason is not None:
            raise PrivacyBudgetSpent(self.stop_reason)
        self._begin_sums()
        super().begin_round(state, round)

    def bounded(self, device_id: str, tensors: Mapping[str, Any]) -> Mapping[str, Any]:
        """The update clipped per block to its clip (step 1); its norms wait for :meth:`taken`."""
        if not tensors:
            return tensors
        clipped = clip_blocks(tensors, self.block_of, self.clipping.clips)
        self._norms[device_id] = clipped.norms
        return clipped.tensors

    def taken(self, report: DeviceReport) -> None:
        """Add a folded report's clipped update to its blocks' sums (step 2)."""
        norms = self._norms.pop(report.device_id, {})
        for name, delta in report.tensors.items():
            a = np.asarray(delta)
            if a.dtype.kind != "f":
                continue
            if report.selection.region(name) is not None:
                raise ValueError(f"central DP sums whole-entry updates; {name!r} came as a slice or rows")
            acc = self._sums.get(name)
            if acc is None:
                self._sums[name] = a.astype(np.float64)
            else:
                np.add(acc, a, out=acc)
        for block, norm in norms.items():
            self._counts[block] = self._counts.get(block, 0) + 1
            self._bits[block] = self._bits.get(block, 0.0) + self.clipping.blocks[block].bit(norm)

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The strategy's round with each block's mean replaced by its noised clipped sum over its
        expected cohort (step 3), the clips moved (step 4) and the round accounted (step 5). Every
        block some idle device can train is released, noised, whether or not a sampled device
        trained it this round: the accountant's mechanism is the sum plus noise, a zero sum included
        (an untouched block would tell that none of its devices was sampled)."""
        result = super().aggregate(ctx)
        event, expected, fleet, cohort = self._release(ctx)
        if event is None:
            return replace(result, extra={**result.extra, "privacy": self.summary({})})
        if self.target is not None and self.ledger.would_exceed(self.target, event):
            raise PrivacyBudgetSpent(self._over_target(ctx.round, event))
        state, noise = dict(result.state), {}
        for name, old in ctx.global_state.items():
            block = self.block_of[name]
            if old.dtype.kind != "f" or block not in expected:
                continue
            m, sigma = expected[block], self.sum_multiplier * self.clipping.blocks[block].clip
            total = gaussian(old.shape, sigma)
            if name in self._sums:
                total += self._sums[name]
            state[name] = np.asarray(old.astype(np.float64) + total / m, dtype=old.dtype)
            noise[self.blocks[block]] = sigma / m
        clips_used = {self.blocks[b]: self.clipping.blocks[b].clip for b in expected}
        if self.config.dp_adaptive_clip:
            self.clipping.update({b: self._bits.get(b, 0.0) for b in expected}, expected)
        self.ledger.record(event)
        self.store.privacy.record(ctx.round, {"ledger": self.ledger.to_json(), "clips": self.clipping.to_json(),
                                              "mode": CENTRAL})
        self._check_next(ctx.round, event)
        return replace(result, state=state, extra={**result.extra, "privacy": self.summary(
            {"clips": clips_used, "cohorts": {self.blocks[b]: self._counts.get(b, 0) for b in expected},
             "expected_cohorts": {self.blocks[b]: m for b, m in expected.items()}, "noise_stddev": noise,
             "fleet": fleet, "cohort": cohort})})

    def _release(self, ctx: RoundContext) -> tuple[RoundEvent | None, dict[int, float], int, int]:
        """The round's release as the accountant takes it (None: no block to release), each block's
        expected cohort, the fleet N and the cohort K."""
        fleet, cohort = max(len(ctx.devices), ctx.state.num_selected), ctx.state.num_selected
        rate = self.config.fraction if self.poisson else cohort / fleet
        expected = self.expected_cohorts(ctx, rate)
        if not expected or rate <= 0:
            return None, expected, fleet, cohort
        blocks = {self.blocks[b]: BlockRelease(self.sum_multiplier, self.count_stddev) for b in expected}
        return (RoundEvent(rate, blocks) if self.poisson else RoundEvent.fixed(fleet, cohort, blocks)), expected, fleet, cohort

    async def settle(self, ctx: RoundContext) -> None:
        """Before the aggregate: the accountant's answers for this round's release (what it would
        spend, and whether the next like it would pass the target) in a worker thread, so that the
        server's loop keeps serving devices while they are computed (0.3-2 s a round)."""
        await super().settle(ctx)
        event = self._release(ctx)[0]
        if event is not None:
            await asyncio.to_thread(self.ledger.look_ahead, event)

    def expected_cohorts(self, ctx: RoundContext, rate: float) -> dict[int, float]:
        """:func:`expected_cohorts` of this model's blocks."""
        return expected_cohorts(ctx, rate, len(self.blocks))

    def summary(self, round_info: Mapping[str, object]) -> dict[str, object]:
        """The privacy spent so far (per block and for the model) and what this round released."""
        return {**self.ledger.spent().to_dict(), "noise_multiplier": self.plan.multiplier,
                "target_epsilon": self.target, "mode": CENTRAL, **round_info}

    def ends_run(self) -> bool:
        return self.stop_reason is not None

    def _check_next(self, round: int, event: RoundEvent) -> None:
        """Before another round: would one like this one take the model past the target?"""
        self.stop_reason = next_stop(self.ledger, self.target, round, self.config.rounds, event) or self.stop_reason

    def _over_target(self, round: int, event: RoundEvent) -> str:
        return over_target(self.ledger, self.target, round, event)

    def end_round(self) -> None:
        super().end_round()
        self._begin_sums()
