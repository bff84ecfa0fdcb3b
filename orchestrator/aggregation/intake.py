"""Report intake: everything a report goes through from the first byte of its upload to the fold.

One owner, behind one interface (:class:`ReportIntake`), so that another way of taking reports
replaces it whole. The server chooses the implementation once (``Orchestrator.intake``); the round
loop is its only caller (docs/architecture.md, "The server", "Report intake"):

1. :meth:`~ReportIntake.begin_round` when a round opens, then :meth:`~ReportIntake.prepare` in a
   worker thread while the devices train (the plain intake computes the server's reference update
   for the norm bound and direction trust there: the round's instructions do not wait for it);
2. :meth:`~ReportIntake.receive` for each report, before anything of the round is looked at: the
   update's size bound before a byte of it is received, the bytes at a pace, decoded within the
   limits (NaN and infinity refused), a revoked device's report refused (or
   :meth:`~ReportIntake.resume` for a device reconnecting with an upload cut short);
3. :meth:`~ReportIntake.fold` for each report the round awaits: the checks against the instruction
   it answers, the bounds on its influence, then the strategy's ``on_report``;
4. :meth:`~ReportIntake.aggregate` when the round closes, :meth:`~ReportIntake.end_round` once it is
   over, and :meth:`~ReportIntake.commit` if its model was committed.

:class:`PlainIntake` sees each update: it checks it against the instruction (:meth:`Selection.check`:
the names, shapes, dtypes and rows the device was sent), weighs it by the sample count registered for
the device, never the one it claims, and bounds its norm per layer group (:mod:`orchestrator.aggregation.normbound`)
before the strategy folds it; the strategy's weight cap is journaled with the report it reduced.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from edge_sdk.wire_codecs import decode_state
from orchestrator.aggregation.normbound import NormBound
from orchestrator.aggregation.trust import DirectionTrust
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Reference, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.server.uploads import Uploads
from orchestrator.store import Store
from orchestrator.strategies import DeviceReport, Refused, RoundContext, RoundResult, Strategy

__all__ = ["PlainIntake", "ReportIntake", "TENSOR_PHASES", "report_info"]

log = logging.getLogger("edgetrain.server")

#: Phases whose reports must carry tensors (deltas of the state the selection sent).
TENSOR_PHASES = frozenset({"train"})

Tensors = Mapping[str, object]


def report_info(r: DeviceReport) -> dict[str, object]:
    """What the journal keeps of a folded or refused report."""
    return {"phase": r.phase, "role": r.role, "trained": list(r.trained), "num_samples": r.num_samples,
            "loss_before": r.metrics.get("loss_before"), "loss_after": r.metrics.get("loss_after"),
            "selection": r.selection.kind, "metrics": dict(r.metrics)}


class ReportIntake(ABC):
    """What a way of taking reports does, from an upload's first byte to the strategy's fold.

    Every failure of a report the device is to blame for is a :class:`~edge_sdk.protocol.ProtocolError`
    (the round loop journals it, the device gets an ``Error`` frame and is disconnected); a report
    refused on its merits is ``Folded(accepted=False)``: the device gets a negative ``Ack`` and stays.
    """

    @abstractmethod
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """Round ``round`` opens from ``state``: what its instructions need (a secure round's scope) or
        what stops it (a spent privacy budget). Quick: the round loop calls it on its event loop."""

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """Round ``round``'s costly preparation, which no instruction waits for (the plain intake's
        reference update). Blocking: the round loop runs it in a worker thread once the round's
        instructions are out, so it overlaps the devices' training, and folds no report and
        prepares no other payload before it is done. Nothing here."""

    @abstractmethod
    async def receive(self, session: Session, msg: p.Report, work: Work | None, rs: RoundState | None) -> Tensors:
        """The tensors of report ``msg`` (``{}`` for a report without any), whose upload follows it
        on the device's channel: bounded before it is received (``work``: the instruction it answers
        this round, if any), decoded and checked as values. ``rs``: the open round, which keeps an
        upload a dropped connection cuts while it awaits the report (for :meth:`resume`)."""

    @abstractmethod
    async def resume(self, session: Session, rs: RoundState) -> tuple[p.Report, Tensors] | None:
        """For a device reconnecting in round ``rs``: the report whose upload was cut, and its
        tensors, once the device has sent the rest; None if none was cut."""

    @abstractmethod
    def holds_upload(self, device_id: str) -> bool:
        """Whether an upload of ``device_id`` cut short waits for its reconnect."""

    @abstractmethod
    def drop_upload(self, device_id: str) -> None:
        """The device whose upload was cut did not come back in time: forget it."""

    @abstractmethod
    def fold(self, session: Session, msg: p.Report, work: Work, tensors: Tensors, ctx: RoundContext) -> Folded:
        """Check a report the round awaits against ``work``, the instruction it answers, bound it,
        and hand it to the strategy. Raises ``ProtocolError`` for a report that breaks the protocol."""

    @abstractmethod
    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The round's result, once it has stopped taking reports."""

    def instruction_config(self, work: Work) -> Mapping[str, p.Scalar]:
        """What this way of taking reports adds to an instruction's config (a secure round's scope); none here."""
        return {}

    async def settle(self, ctx: RoundContext) -> None:
        """The round stopped taking reports; anything it needs from the devices before its
        aggregate (a secure round's unmasking) happens here. Nothing here."""

    @abstractmethod
    def end_round(self) -> None:
        """The round is over, committed or not: nothing of it is resumed."""

    @abstractmethod
    def commit(self, round: int) -> None:
        """Round ``round``'s model was committed: what intake learnt of its reports may be kept."""

    def ends_run(self) -> bool:
        """Whether the round just aggregated is the run's last, before its planned rounds (a DP run
        whose next round would pass its target epsilon): the round loop then evaluates it as the
        final model. Never here."""
        return False


class PlainIntake(ReportIntake):
    """Reports whose updates the server sees: checked, weighed, bounded, then folded by the strategy."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, store: Store, *,
                 reference: Reference, uploads: Uploads, check_revoked: Callable[[Session], None],
                 limits: p.Limits) -> None:
        self.config, self.template, self.strategy, self.store = config, template, strategy, store
        self.uploads, self.check_revoked, self.limits = uploads, check_revoked, limits
        self.norms = NormBound(config, template, store, reference)
        self.trust = DirectionTrust(template, config.trust_floor, config.direction_trust)
        self.num_blocks = len(template)
        self._entry_bytes = {k: v.numel() * v.element_size() for k, v in template.state_dict().items()}

    # -- a round's life -------------------------------------------------------------------------
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """Nothing the instructions need: the reference update is :meth:`prepare`'s."""

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """The server's reference update for the norm bound and direction trust (trained on its data)."""
        self.norms.begin_round(state, round)
        self.trust.begin_round(self.norms.update)

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The strategy's aggregate; the reports its weight cap reduced are marked so in the journal,
        and the blocks no report was trusted for are named in the round's (``untrusted``)."""
        result = self.strategy.aggregate(ctx)
        capped = result.extra.get("weight_capped")
        if isinstance(capped, dict) and capped:
            self.store.reports.mark_weight_capped(ctx.round, capped)
        untrusted = self.trust.untrusted()
        if untrusted:
            log.warning("round %d: %s", ctx.round, "; ".join(f"{b}: {why}" for b, why in untrusted.items()))
            result.extra["untrusted"] = untrusted
        return result

    def end_round(self) -> None:
        self.uploads.drop()

    def commit(self, round: int) -> None:
        self.norms.commit(round)

    # -- the bytes ------------------------------------------------------------------------------
    def update_bound(self, session: Session, work: Work | None) -> int:
        """The largest update a device may send for an instruction: its deltas have the names, shapes
        and rows of the model payload it was sent, so they encode to at most that payload's size
        (plus headers); nothing larger is ever received. A late report (no work: its round
        closed) is bounded by the device's planned tail, so that it can still be read and answered."""
        if work is not None:
            return work.model_bytes + (64 << 10)
        names = self.template.state_names(session.plan.split)
        return sum(self._entry_bytes[n] for n in names) + 256 * len(names) + (64 << 10)

    async def receive(self, session: Session, msg: p.Report, work: Work | None, rs: RoundState | None) -> Tensors:
        if not msg.transfer_id:
            self.check_revoked(session)
            return {}
        return self._decoded(session, await self.uploads.receive(session, msg, self.update_bound(session, work), rs))

    async def resume(self, session: Session, rs: RoundState) -> tuple[p.Report, Tensors] | None:
        resumed = await self.uploads.resume(session, rs)
        return None if resumed is None else (resumed[0], self._decoded(session, resumed[1]))

    def _decoded(self, session: Session, data: bytes) -> Tensors:
        """A revoked device's upload is refused once received; anyone else's is decoded (through
        the configured update codec's records, edge_sdk.wire_codecs), its values checked (NaN,
        infinity, sizes over the limits, a record that does not decode are refused)."""
        self.check_revoked(session)
        if self.config.update_codec == "none":
            return p.decode_tensors(data, self.limits)
        return decode_state(data, self.limits)

    def holds_upload(self, device_id: str) -> bool:
        return self.uploads.holds(device_id)

    def drop_upload(self, device_id: str) -> None:
        self.uploads.drop(device_id)

    # -- the report -----------------------------------------------------------------------------
    def check(self, msg: p.Report, work: Work, tensors: Tensors, state: Mapping[str, np.ndarray]) -> None:
        """The tensors are deltas of exactly what was sent (finite: checked on decode), with a
        positive sample count (whose weight is capped by :meth:`registered_samples`)."""
        if msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"implausible sample count {msg.num_samples}")
        if msg.phase in TENSOR_PHASES or tensors:
            expected = (work.selection.split, self.num_blocks)
            if tuple(msg.trained) != expected:
                raise p.ProtocolError("malformed", f"trained {tuple(msg.trained)} but the instruction sent {expected}")
            reason = work.selection.check(tensors, state, work.names)
            if reason is not None:
                raise p.ProtocolError("malformed", f"report rejected: {reason}")

    def registered_samples(self, session: Session) -> int:
        """The sample count a device's reports may weigh: what it declared when it registered,
        capped by the operator's policy (``max_device_samples``, and the count fixed at its
        enrollment), never what an update claims."""
        limit = self.config.max_device_samples
        if session.enrolled_samples is not None:
            limit = min(limit, session.enrolled_samples)
        return min(session.hello.num_samples, limit)

    def bounded(self, device_id: str, tensors: Tensors) -> Tensors:
        """What the strategy folds of an update within the norm bound: the update itself here (the DP
        intake clips it)."""
        return tensors

    def taken(self, report: DeviceReport) -> None:
        """A hook on a report the strategy folded. None here."""

    def fold(self, session: Session, msg: p.Report, work: Work, tensors: Tensors, ctx: RoundContext) -> Folded:
        """Check, weigh and bound a report, then hand it to the strategy's ``on_report``: its weight
        in each block's mean scaled by the block's direction trust (:mod:`orchestrator.aggregation.trust`),
        journaled per block as ``trust``."""
        self.check(msg, work, tensors, ctx.global_state)
        # Bounded influence: the weight is at most the sample count registered for the device.
        samples = min(msg.num_samples, self.registered_samples(session))
        bound = self.norms.bound(session.device_id, work.selection.split, tensors)
        trust = self.trust.score(session.device_id, bound.tensors, work.selection)
        changed: dict[str, object] = {}
        if bound.clipped:
            changed["clipped"] = bound.clipped
        if samples < msg.num_samples:
            changed["samples"] = {"claimed": msg.num_samples, "weighed": samples}
        report = DeviceReport(
            device_id=session.device_id, round=ctx.round, phase=msg.phase, role=session.plan.role,
            num_samples=samples, trained=tuple(msg.trained), metrics=MappingProxyType(dict(msg.metrics)),
            tensors=MappingProxyType(self.bounded(session.device_id, bound.tensors)), selection=work.selection,
            entry_weights=MappingProxyType(self.trust.entry_weights(bound.tensors, trust)),
        )
        scored = {"trust": self.trust.named(trust)} if trust else {}
        try:
            if bound.refusal is not None:
                raise Refused(bound.refusal)
            follow = tuple(self.strategy.on_report(report, ctx))
            self.taken(report)
        except Refused as exc:
            self.norms.discard(session.device_id)
            self.trust.discard(session.device_id)
            log.info("refused %s's %s report of round %d: %s", session.device_id, msg.phase, ctx.round, exc.reason)
            return Folded(False, exc.reason, {**report_info(report), **scored, "accepted": False,
                                              "reason": exc.reason})
        return Folded(True, "", {**report_info(report), **scored, "accepted": True, "reason": "",
                                 **({"bounded": changed} if changed else {})}, follow)
