"""A strategy written only against the public interface (orchestrator.strategies), for the tests.

Each round, on a model with embedding tables (the recommender):

1. every sampled device gets an ``evaluate`` instruction for a submodel of exactly the rows its
   data touches (row selection), and reports the loss of the received model;
2. when all losses are in, the devices whose loss is at least the median get a ``train``
   instruction for the same rows, and return row-sparse deltas, folded row by row;
3. when all updates are in, the trainers get a ``compare`` instruction that carries a broadcast
   tensor (the mean head update of the round) and report their distance to it.

So one round uses two phases whose reports decide who trains, per-device row selections, and a
follow-up instruction with a broadcast tensor: everything FedALIGN, VaRSeL and FedSubAvg need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.strategies import (
    Broadcast,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.selection import Selection

HEAD = ("blocks.head.weight", "blocks.head.bias")


class TwoPhaseRows(Strategy):
    name = "two-phase-rows"

    def __init__(self) -> None:
        self.losses: dict[str, float] = {}
        self.trainers: list[str] = []
        self.compared: dict[str, dict[str, float]] = {}
        self.broadcast: Broadcast | None = None
        self._sums: WeightedSums | None = None
        self._selection: dict[str, Selection] = {}

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self.losses, self.trainers, self.compared, self.broadcast = {}, [], {}, None
        self._sums = WeightedSums(ctx.global_state)
        self._selection = {d: Selection.of_rows(0, ctx.devices[d].rows) for d in ctx.sample()}
        return [Instruction(d, "evaluate", sel) for d, sel in self._selection.items()]

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        assert self._sums is not None
        if report.phase == "evaluate":
            self.losses[report.device_id] = report.metric("loss")
            if len(self.losses) < len(self._selection):
                return ()
            median = float(np.median(list(self.losses.values())))
            self.trainers = sorted(d for d, loss in self.losses.items() if loss >= median)
            return [Instruction(d, "train", self._selection[d]) for d in self.trainers]
        if report.phase == "train":
            self._sums.add_report(report, float(report.num_samples))
            if len(self._sums.devices) < len(self.trainers):
                return ()
            mean = self._sums.new_state()
            self.broadcast = Broadcast({n: (mean[n] - ctx.global_state[n]).astype(np.float32) for n in HEAD})
            return [Instruction(d, "compare", self._selection[d], broadcast=self.broadcast) for d in self.trainers]
        if report.phase == "compare":
            self.compared[report.device_id] = {k: report.metric(k) for k in ("sq_distance", "dot", "sq_norm")}
            return ()
        raise Refused(f"unexpected phase {report.phase!r}")

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        assert self._sums is not None
        return self._sums.result(ctx.round, 0, extra={"trainers": list(self.trainers),
                                                      "losses": dict(self.losses)})
