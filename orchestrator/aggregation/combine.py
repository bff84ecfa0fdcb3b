"""The strategy's streaming fold: the combiner of updates the server sees (docs/architecture.md,
"Report intake").

Each checked, bounded report reaches the strategy's ``on_report`` as a
:class:`~orchestrator.strategies.DeviceReport` (its weight at most the device's registered sample
count, its tensors as the bounds left them, its per-entry trust); the round's result is the strategy's
``aggregate``. The other combiner, secure block sums that apply the strategy's declared mean rule
without seeing one update, is :class:`~orchestrator.aggregation.secure.sums.SecureSums`.
"""

from __future__ import annotations

import logging
from types import MappingProxyType

from edge_sdk import protocol as p
from orchestrator.aggregation.pipeline import Combiner, Pending, report_info
from orchestrator.parts import Folded, Session, Work
from orchestrator.store import Store
from orchestrator.strategies import DeviceReport, Refused, RoundContext, RoundResult, Strategy

__all__ = ["StrategyFold", "device_report"]

log = logging.getLogger("edgetrain.server")


def device_report(session: Session, msg: p.Report, work: Work, pending: Pending, ctx: RoundContext) -> DeviceReport:
    """The report as a strategy's rule sees it: its weight at most the registered sample count, its
    tensors as the bounds left them, its per-entry trust."""
    return DeviceReport(
        device_id=session.device_id, round=ctx.round, phase=msg.phase, role=session.plan.role,
        num_samples=pending.samples, trained=tuple(msg.trained), metrics=MappingProxyType(dict(msg.metrics)),
        tensors=MappingProxyType(pending.tensors), selection=work.selection,
        entry_weights=MappingProxyType(pending.entry_weights),
    )


class StrategyFold(Combiner):
    """Reports folded by the strategy as they arrive (O(model) running sums), its aggregate at the close."""

    def __init__(self, strategy: Strategy, store: Store) -> None:
        self.strategy, self.store = strategy, store

    def take(self, session: Session, msg: p.Report, work: Work, pending: Pending, ctx: RoundContext) -> Folded:
        """Hand the report to ``on_report`` (a bound's refusal is the strategy's ``Refused`` without
        asking it): its weight in each block's mean is scaled by the block's direction trust, and the
        journal keeps what the bounds changed and scored."""
        report = device_report(session, msg, work, pending, ctx)
        try:
            if pending.refusal is not None:
                raise Refused(pending.refusal)
            follow = tuple(self.strategy.on_report(report, ctx))
        except Refused as exc:
            log.info("refused %s's %s report of round %d: %s", session.device_id, msg.phase, ctx.round, exc.reason)
            return Folded(False, exc.reason, {**report_info(report), **pending.scored, "accepted": False,
                                              "reason": exc.reason})
        return Folded(True, "", {**report_info(report), **pending.scored, "accepted": True, "reason": "",
                                 **({"bounded": pending.changed} if pending.changed else {})}, follow)

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The strategy's aggregate; the reports its weight cap reduced are marked so in the journal."""
        result = self.strategy.aggregate(ctx)
        capped = result.extra.get("weight_capped")
        if isinstance(capped, dict) and capped:
            self.store.reports.mark_weight_capped(ctx.round, capped)
        return result
