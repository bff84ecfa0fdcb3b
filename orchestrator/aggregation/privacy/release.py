"""A private release: the one owner of a run's privacy ledger, asking its mechanism each round
(docs/security.md, "Differential privacy"; docs/architecture.md, "Report intake").

:class:`PrivateRelease` is report intake's release step when ``dp`` is on. It creates the run's
:class:`~orchestrator.aggregation.privacy.accountant.PrivacyLedger` (or continues the one journaled with
a resumed run's last completed round, refusing one kept at other settings), and each round:

1. refuses to open a round once the next one would pass ``dp_target_epsilon`` (:class:`PrivacyBudgetSpent`);
2. builds the round's event for the accountant: the sampling (fixed-size: K of the N idle devices;
   or Poisson at rate q = fraction), each block's expected cohort m_b = q N_b
   (:func:`expected_cohorts`), and what the mechanism releases of each block at what multiplier
   (:meth:`~orchestrator.aggregation.privacy.mechanism.PrivacyMechanism.releases`); it asks the
   accountant ahead, in a worker thread, while the server keeps serving (:meth:`settle`);
3. never releases a round that would take the model past the target: the run ends before it, with the
   round named; else, journal first, the ledger records the event and is journaled, synced to disk,
   before the mechanism draws the noise (``store.privacy.record``), then the mechanism's state after
   the release is journaled beside it. A release cut short by a crash is therefore accounted: a
   resumed run continues the last journaled ledger (``store.privacy.accounted``), which counts it,
   with the mechanism's state of the last completed round, and accounts the round's rerun again
   (a release that may have left the server is never taken back);
4. says in the round's metrics what was spent so far (per block and for the model) and what the round
   released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.aggregation.pipeline import BlockSums, Release
from orchestrator.aggregation.privacy import PrivacyBudgetSpent
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["PrivateRelease", "expected_cohorts", "next_stop", "over_target", "resumed_ledger"]

log = logging.getLogger("edgetrain.server")


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
    kept = (ledger.delta, ledger.accountant, ledger.sampling, ledger.blocks, saved.get("mode", "central"))
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


@dataclass(frozen=True)
class _Round:
    """One round as the release sees it: its event for the accountant (None: nothing released), each
    block's expected cohort, what the mechanism releases of each, the fleet N and the cohort K."""

    event: RoundEvent | None
    expected: dict[int, float]
    released: dict[int, BlockRelease]
    fleet: int
    cohort: int


class PrivateRelease(Release):
    """The run's ledger and its mechanism: each round's sums noised, accounted and journaled."""

    def __init__(self, mechanism: PrivacyMechanism, config: ServerConfig, store: Store) -> None:
        self.mechanism, self.config, self.store = mechanism, config, store
        self.target, self.poisson = config.dp_target_epsilon, config.dp_sampling == "poisson"
        self.ledger = PrivacyLedger(mechanism.blocks, mechanism.plan.delta, accountant=config.dp_accountant,
                                    sampling=mechanism.sampling)
        if config.resume:
            saved, accounted = store.privacy.last(), store.privacy.accounted()
            ledger = resumed_ledger(accounted, store.rounds.completed(), self.ledger, mechanism.journal_mode)
            if ledger is not None:
                self.ledger = ledger
            if saved is not None:
                mechanism.restore(saved)
        self.stop_reason: str | None = None

    def begin_round(self) -> None:
        if self.stop_reason is not None:
            raise PrivacyBudgetSpent(self.stop_reason)

    def _round(self, ctx: RoundContext, sums: BlockSums | None) -> _Round:
        fleet, cohort = max(len(ctx.devices), ctx.state.num_selected), ctx.state.num_selected
        rate = self.config.fraction if self.poisson else cohort / max(1, fleet)
        expected = expected_cohorts(ctx, rate, len(self.mechanism.blocks))
        released = self.mechanism.releases(sums, expected) if expected and rate > 0 else {}
        if not released:
            return _Round(None, expected, released, fleet, cohort)
        blocks = {self.mechanism.blocks[b]: r for b, r in released.items()}
        event = self.mechanism.event(rate, fleet, cohort, blocks)
        return _Round(event, expected, released, fleet, cohort)

    async def settle(self, ctx: RoundContext, sums: BlockSums | None) -> None:
        """Before the aggregate: the accountant's answers for this round's release (what it would
        spend, and whether the next like it would pass the target) in a worker thread, so that the
        server's loop keeps serving devices while they are computed (0.3-2 s a round)."""
        event = self._round(ctx, sums).event
        if event is not None:
            await asyncio.to_thread(self.ledger.look_ahead, event)

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None) -> RoundResult:
        """The mechanism's noised release of the round, recorded and journaled; the run's end named
        before a round that would pass the target."""
        r = self._round(ctx, sums)
        if r.event is None:
            return replace(result, state=self.mechanism.withheld(ctx, result),
                           extra={**result.extra, "privacy": self.summary({})})
        if self.target is not None and self.ledger.would_exceed(self.target, r.event):
            raise PrivacyBudgetSpent(over_target(self.ledger, self.target, ctx.round, r.event))
        self.ledger.record(r.event)  # journal first: accounted before the noise is drawn
        self._journal(ctx.round, durable=True)
        state, said = self.mechanism.release(ctx, result, sums, r.expected, r.released)
        log.info("round %d: noised release of %d blocks, accounted as release %d", ctx.round, len(r.released),
                 len(self.ledger.rounds))
        self._journal(ctx.round)
        following = self.mechanism.event(r.event.q, r.fleet, r.cohort, r.event.blocks)  # DP-FTRL: its next step
        self.stop_reason = next_stop(self.ledger, self.target, ctx.round, self.config.rounds, following) \
            or self.stop_reason
        return replace(result, state=state, extra={**result.extra, "privacy": self.summary(
            {**said, "fleet": r.fleet, "cohort": r.cohort})})

    def _journal(self, round: int, *, durable: bool = False) -> None:
        self.store.privacy.record(round, {"ledger": self.ledger.to_json(), **self.mechanism.state(),
                                          "mode": self.mechanism.journal_mode}, durable=durable)

    def summary(self, round_info: Mapping[str, object]) -> dict[str, object]:
        """The privacy spent so far (per block and for the model) and what this round released."""
        return {**self.ledger.spent().to_dict(), "noise_multiplier": self.mechanism.plan.multiplier,
                "target_epsilon": self.target, "mode": self.mechanism.journal_mode, **round_info}

    def ends_run(self) -> bool:
        return self.stop_reason is not None

    def excluded(self) -> frozenset[str]:
        return self.mechanism.excluded()

    def end_round(self) -> None:
        self.mechanism.end_round()
