"""A strategy written outside the package, loaded as ``tests.weighted_mean_strategy:MeanOfMine``: it
declares that it combines by a weighted mean of whole blocks (``Strategy.combines``), so it runs under
secure aggregation and differential privacy though no list in the package names it."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.strategies import (Combines, DeviceReport, Instruction, Refused, RoundContext, RoundResult, Strategy,
                                     WeightedSums)

__all__ = ["MeanOfMine", "RuleOfMine"]


class MeanOfMine(Strategy):
    """Each entry's sample-weighted mean over the devices that trained it (EmbracingFL's rule, written anew)."""

    name = "mean_of_mine"
    combines = Combines.weighted_mean("samples")

    def __init__(self) -> None:
        self._sums: WeightedSums | None = None
        self.folded: list[str] = []

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._sums = WeightedSums(ctx.global_state)
        return super().configure(ctx)

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None or report.phase != "train":
            raise Refused("only train reports of a configured round")
        self._sums.add_report(report, float(report.num_samples))
        self.folded.append(report.device_id)
        return ()

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        self._sums = None
        return sums.result(ctx.round, 0)


class RuleOfMine(MeanOfMine):
    """The same rule, declared as a rule of its own: neither secure aggregation nor DP may run it."""

    name = "rule_of_mine"
    combines = Combines.own("a mean the package cannot tell is one")
