"""Report intake: everything a report goes through from the first byte of its upload to the fold.

One owner, behind one interface (:class:`ReportIntake`), so that another way of taking reports
replaces it whole. The server builds it once (``Orchestrator.intake``, by
:func:`~orchestrator.aggregation.assembly.assemble_intake`); the round loop is its only caller for
reports, and the server hands it what a device says beyond them (docs/architecture.md, "The server",
"Report intake"):

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

5. the connection hooks: :meth:`~ReportIntake.on_message` for a message that is neither a fetch nor a
   report (a secure round's), :meth:`~ReportIntake.returned`, :meth:`~ReportIntake.dropped` and
   :meth:`~ReportIntake.refused_frame` for a device coming back, gone, or cut off by the codec.

:class:`Intake` is the one implementation, assembled from parts (:mod:`orchestrator.aggregation.pipeline`):
an upload format, a chain of bounds, a combiner and a release. Plain uploads are checked against the
instruction (:meth:`Selection.check`: the names, shapes, dtypes and rows the device was sent), weighed
by the sample count registered for the device, never the one it claims, and bounded (the norm bound
and direction trust, or a privacy mechanism's clip) before the strategy folds them; masked uploads are
summed per block and unmasked as sums; a private release noises and accounts what leaves the round.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edge_sdk import protocol as p
from orchestrator.aggregation.pipeline import Bound, Combiner, Pending, Release, Tensors, UploadFormat, registered_samples
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.server.uploads import Uploads
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["Intake", "ReportIntake"]


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

    def excluded(self) -> frozenset[str]:
        """Devices a new round may not select (a DP-FTRL tree's participants); none here."""
        return frozenset()

    # -- what a device says beyond its reports (the server hands it over; defaults for none) -----
    async def on_message(self, session: Session, msg: p.Message) -> None:
        """A message that is neither a fetch nor a report (a secure round's SecAgg*): refused here."""
        raise p.ProtocolError("unexpected", f"a device may not send {msg.TYPE} here")

    def returned(self, session: Session) -> None:
        """A device was welcomed again, before the round it was in resumes. Nothing here."""

    def dropped(self, device_id: str) -> None:
        """A device's connection ended. Nothing here."""

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        """A frame of the device failed the codec's checks before any part saw it (the server closes
        the connection with ``exc``). Nothing here."""


class Intake(ReportIntake):
    """Report intake assembled from parts: ``format`` (the upload), ``bounds`` (the chain, in order),
    ``combiner`` and ``release`` (:mod:`orchestrator.aggregation.pipeline`). It owns the sequence
    every report goes through; each part owns its own state."""

    def __init__(self, config: ServerConfig, format: UploadFormat, bounds: Sequence[Bound], combiner: Combiner,
                 release: Release, *, uploads: Uploads, check_revoked: Callable[[Session], None],
                 sum_bounds: Sequence[Bound] = ()) -> None:
        self.config, self.format, self.bounds = config, format, tuple(bounds)
        self.sum_bounds = tuple(sum_bounds)  # the chain the combiner's revealed sums go through (secure groups)
        self.combiner, self.release = combiner, release
        self.uploads, self.check_revoked = uploads, check_revoked

    # -- a round's life -------------------------------------------------------------------------
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        self.release.begin_round()
        self.combiner.begin_round(state, round)

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """The bounds' references for the round (the server's reference update, trained on its data)."""
        for bound in (*self.bounds, *self.sum_bounds):
            bound.prepare(state, round)

    def instruction_config(self, work: Work) -> Mapping[str, p.Scalar]:
        extra: dict[str, p.Scalar] = dict(self.combiner.instruction_config(work))
        for bound in self.bounds:
            extra.update(bound.instruction_config(work))
        return extra

    async def settle(self, ctx: RoundContext) -> None:
        """The combiner's conversation (a secure round's unmasking), then each sum it reveals through the
        sums' chain of bounds as one update (a secure group's mean: norm bound, direction trust)."""
        await self.combiner.settle(ctx)
        for pending in self.combiner.sum_updates():
            for bound in self.sum_bounds:
                pending = bound.apply(pending)
            self.combiner.take_sum(pending)
            for bound in self.sum_bounds:
                bound.taken(pending)
        await self.release.settle(ctx, self.combiner.block_sums())

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The combiner's result, as each bound leaves it (blocks no report was trusted for are named),
        then as it is released (noised and accounted under a privacy mechanism)."""
        result = self.combiner.aggregate(ctx)
        for bound in (*self.bounds, *self.sum_bounds):
            result = bound.finish(ctx, result)
        return self.release.release(ctx, result, self.combiner.block_sums())

    def end_round(self) -> None:
        self.uploads.drop()
        for bound in (*self.bounds, *self.sum_bounds):
            bound.end_round()
        self.combiner.end_round()
        self.release.end_round()

    def commit(self, round: int) -> None:
        for bound in (*self.bounds, *self.sum_bounds):
            bound.commit(round)

    def ends_run(self) -> bool:
        return self.release.ends_run()

    def excluded(self) -> frozenset[str]:
        return self.release.excluded()

    # -- the bytes ------------------------------------------------------------------------------
    async def receive(self, session: Session, msg: p.Report, work: Work | None, rs: RoundState | None) -> Tensors:
        if not msg.transfer_id:
            self.check_revoked(session)
            return {}
        return self._decoded(session, await self.uploads.receive(session, msg, self.format.bound(session, work), rs))

    async def resume(self, session: Session, rs: RoundState) -> tuple[p.Report, Tensors] | None:
        if not self.format.resumable:  # a cut upload was a dropout
            self.uploads.drop(session.device_id)
            return None
        resumed = await self.uploads.resume(session, rs)
        return None if resumed is None else (resumed[0], self._decoded(session, resumed[1]))

    def _decoded(self, session: Session, data: bytes) -> Tensors:
        """A revoked device's upload is refused once received; anyone else's is decoded, its values checked."""
        self.check_revoked(session)
        return self.format.decode(data)

    def holds_upload(self, device_id: str) -> bool:
        return self.format.resumable and self.uploads.holds(device_id)

    def drop_upload(self, device_id: str) -> None:
        self.uploads.drop(device_id)

    # -- the report -----------------------------------------------------------------------------
    def fold(self, session: Session, msg: p.Report, work: Work, tensors: Tensors, ctx: RoundContext) -> Folded:
        """Unless the combiner turns it away (a secure round's late upload), check a report against
        ``work`` (the format's check), weigh it (at most the sample count registered for the device),
        bound it (the chain, in order), and hand it to the combiner; the bounds hear whether it was taken."""
        turned = self.combiner.turned_away(session, msg)
        if turned is not None:
            return turned
        self.format.check(msg, work, tensors, ctx.global_state)
        # Bounded influence: the weight is at most the sample count registered for the device.
        samples = min(msg.num_samples, registered_samples(self.config, session))
        weighed = {"samples": {"claimed": msg.num_samples, "weighed": samples}} if samples < msg.num_samples else {}
        pending = Pending(session.device_id, work.selection, tensors, samples, changed=weighed)
        for bound in self.bounds:
            pending = bound.apply(pending)
        folded = self.combiner.take(session, msg, work, pending, ctx)
        for bound in self.bounds:
            if folded.accepted:
                bound.taken(pending)
            else:
                bound.discard(session.device_id)
        return folded

    # -- what a device says beyond its reports --------------------------------------------------
    async def on_message(self, session: Session, msg: p.Message) -> None:
        await self.combiner.on_message(session, msg)

    def returned(self, session: Session) -> None:
        self.combiner.returned(session)

    def dropped(self, device_id: str) -> None:
        self.combiner.dropped(device_id)

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        self.combiner.refused_frame(device_id, exc)
