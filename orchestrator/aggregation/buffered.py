"""FedBuff's buffer (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, Algorithm 1, the server's loop): the combiner of buffered rounds (docs/buffered.md).

Each update arrives computed on the model version its instruction was sent (``Work``: the wire's
``model_version``); its staleness tau is the versions the model moved on since. The buffer folds it
with the staleness weight s(tau) = (1 + tau)^-a (``staleness_exponent`` a; 0.5 is the paper's
1/sqrt(1 + tau)), and when the round driver closes the buffer the model steps with the server
learning rate eta_g:

    x_{t+1}[k] = x_t[k] + eta_g * sum_{i in C_k} w_i s(tau_i) delta_i[k] / sum_{i in C_k} w_i

over C_k, the buffered updates that trained entry k (partial training: a weak device's update
counts only in the output-side blocks it trained, EmbracingFL's nested cohorts, Section 3.1), with
w_i the strategy's declared weighting (its sample count, or 1). With w_i = 1 and every update
training every entry this is Algorithm 1's ``x <- x - eta_g * (1/K) sum_i s(tau_i) Delta_i`` (the
paper's Delta is ``x_start - x_end``, ours ``x_end - x_start``). A stale update is not renormalised
away: the mean divides by the weights, not by the staleness-scaled weights, so a buffer of stale
updates moves the model less than a fresh one.

Every folded update is journaled as it is folded (``store.buffer``: its tensors as folded, its weight),
before its device's ack: a server killed mid-buffer refolds exactly those when ``--resume`` reopens the
buffer (:meth:`BufferedFold.begin_round`), and none of a completed round.

The strategy's rule is its declared weighted mean (``Strategy.combines``), applied here as the secure
block sums apply it; a strategy of another rule cannot run buffered (``check_capabilities``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from edge_sdk import protocol as p
from orchestrator.aggregation.combine import device_report
from orchestrator.aggregation.pipeline import Combiner, Pending, report_info
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Session, Work
from orchestrator.store import Store
from orchestrator.strategies import DeviceReport, RoundContext, RoundResult, Strategy, WeightedSums
from orchestrator.strategies.selection import Selection

__all__ = ["BufferedFold", "staleness_of", "staleness_weight"]

log = logging.getLogger("edgetrain.server")


def staleness_weight(staleness: int, exponent: float) -> float:
    """s(tau) = (1 + tau)^-a: FedBuff's 1/sqrt(1 + tau) at a = 0.5 (Section 5's polynomial weighting)."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} is negative")
    return float((1.0 + staleness) ** -exponent)


def staleness_of(work: Work, ctx: RoundContext) -> int:
    """Versions the model moved on since ``work`` was sent: buffer (round) r serves version r - 1."""
    return (ctx.round - 1) - work.wire.model_version


def _scaled(delta: object, factor: float) -> object:
    """``factor * delta`` for a float update (dense or rows); a counter (BatchNorm's batches) as it is."""
    if isinstance(delta, p.RowSparse):
        return p.RowSparse(delta.indices, np.multiply(delta.values, factor, dtype=delta.values.dtype), delta.num_rows)
    arr = np.asarray(delta)
    return arr * arr.dtype.type(factor) if arr.dtype.kind == "f" else arr


class BufferedFold(Combiner):
    """The buffer of one model version: updates folded with their staleness weight as they arrive,
    the model stepped with the server learning rate when the driver closes it."""

    def __init__(self, config: ServerConfig, strategy: Strategy, store: Store) -> None:
        self.exponent, self.max_staleness, self.server_lr = config.staleness_exponent, config.max_staleness, config.server_lr
        self.uniform = strategy.combines.weighting == "uniform"
        self.store = store
        self._sums: WeightedSums | None = None
        self._staleness: list[int] = []
        self._refused = 0
        self._opened = False  # whether this process opened a buffer yet (only the first refolds the journal's)

    def begin_round(self, state: MappingProxyType | dict, round: int) -> None:
        """A buffer opens on the model version ``round - 1``: sums around it. The first buffer a process
        opens holds the updates the journal kept of it (a run resumed mid-buffer), each folded once; a
        later one starts empty (a buffer run again after failing its checks drops its updates, as a
        synchronous round's retry does)."""
        self._sums, self._staleness, self._refused = WeightedSums(state), [], 0
        first, self._opened = not self._opened, True
        self.store.buffer.forget(round - 1 if first else round)
        for row in self.store.buffer.held(round) if first else ():
            info = row["info"]
            report = DeviceReport(
                device_id=row["device_id"], round=round, phase=row["phase"], role=info["role"],
                num_samples=int(info["num_samples"]), trained=tuple(info["trained"]),
                metrics=MappingProxyType(info["metrics"]), tensors=MappingProxyType(p.decode_tensors(row["tensors"])),
                selection=Selection.tail(int(info["split"])), entry_weights=MappingProxyType(info["entry_weights"]))
            self._sums.add_report(report, row["weight"])
            self._staleness.append(int(info["staleness"]))

    def take(self, session: Session, msg: p.Report, work: Work, pending: Pending, ctx: RoundContext) -> Folded:
        """Fold the update scaled by s(tau); refuse a bound's refusal, a phase other than train, or an
        update staler than ``max_staleness`` (wasted: counted in the journal)."""
        if self._sums is None:
            raise RuntimeError("BufferedFold: a report before the buffer opened")
        report = device_report(session, msg, work, pending, ctx)
        tau = staleness_of(work, ctx)
        weight = staleness_weight(max(tau, 0), self.exponent)
        seen = {"model_version": work.wire.model_version, "staleness": tau, "staleness_weight": weight}
        reason = pending.refusal or ("only train reports are folded" if msg.phase != "train" else None) or \
            (f"stale: trained on version {work.wire.model_version}, {tau} versions behind (max_staleness "
             f"{self.max_staleness})" if tau > self.max_staleness else None)
        if reason is not None:
            self._refused += 1
            log.info("refused %s's %s report (buffer %d): %s", session.device_id, msg.phase, ctx.round, reason)
            return Folded(False, reason, {**report_info(report), **pending.scored, **seen, "accepted": False,
                                          "reason": reason})
        if work.selection.kind != "tail":  # a weighted mean's selections are tails (Combines.weighted_mean)
            raise RuntimeError(f"buffered rounds fold tails, not a {work.selection.kind} selection")
        tensors = {name: _scaled(t, weight) for name, t in report.tensors.items()}
        w = 1.0 if self.uniform else float(report.num_samples)
        self._sums.add_report(replace(report, tensors=MappingProxyType(tensors)), w)
        self._staleness.append(tau)
        journal = {**report_info(report), **pending.scored, **seen, "accepted": True, "reason": "",
                   **({"bounded": pending.changed} if pending.changed else {})}
        self.store.buffer.record(ctx.round, session.device_id, msg.phase, p.encode_tensors(tensors), w, {
            "role": report.role, "num_samples": report.num_samples, "trained": list(report.trained),
            "metrics": dict(report.metrics), "split": work.selection.split, "staleness": tau,
            "entry_weights": dict(report.entry_weights), "journal": journal})
        return Folded(True, "", journal)

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The model stepped by eta_g times the buffer's staleness-weighted mean, per entry over its contributors."""
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        state = sums.new_state({name: self.server_lr for name in ctx.global_state})
        staleness = self._staleness
        return sums.result(ctx.round, self._refused, state, extra={
            "model_version": ctx.round, "buffered": len(staleness), "server_lr": self.server_lr,
            "staleness": sorted(staleness), "staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
            "staleness_max": max(staleness, default=0)})

    def end_round(self) -> None:
        self._sums, self._staleness = None, []
