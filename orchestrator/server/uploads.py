"""Uploads: the bytes of a report's tensors, from the transfer's first message to its last frame.

A report with tensors is followed by their transfer (docs/protocol.md, "Transfers"). Its size is
checked against a bound at its first message, before anything is allocated for it; its frames
arrive at a pace the device must keep (:class:`~edge_sdk.transport.Pace`), within the frame
limits. An upload that a dropped connection cuts short is kept until the round ends, so that the
device's reconnect continues it from the bytes held (docs/protocol.md, "Resume"). Report intake
(:mod:`orchestrator.aggregation.intake`) decides the bound and what the bytes mean; this is only the bytes.
"""

from __future__ import annotations

from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.transport import Pace, recv_msg, recv_payload
from orchestrator.parts import Emit, PartialUpload, Send, Session, Traffic
from orchestrator.rounds import RoundState

__all__ = ["Uploads"]


class Uploads:
    """Reports' uploads, received within a bound and a pace; the ones cut short, kept for a resume."""

    def __init__(self, limits: p.Limits, pace: Pace, traffic: Traffic, *, send: Send, emit: Emit) -> None:
        self.limits, self.pace, self.traffic, self.send, self.emit = limits, pace, traffic, send, emit
        self._cut: dict[str, PartialUpload] = {}  # by device

    async def receive(self, session: Session, msg: p.Report, bound: int, rs: RoundState | None) -> bytes:
        """The bytes of the transfer that follows ``msg``, refused (``too_large``) at its first
        message if it announces more than ``bound``. If the connection drops while ``rs`` still
        awaits the report, what arrived is kept for the device's reconnect (:meth:`resume`)."""
        begin = await recv_msg(session.channel)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != msg.transfer_id or begin.kind != "update":
            raise p.ProtocolError("unexpected", "a report with tensors must be followed by their transfer")
        if begin.total_size > bound:
            # Refused at its first message, before anything is allocated for it.
            raise p.ProtocolError("too_large", f"an update of {begin.total_size} bytes, but deltas of what this "
                                               f"device was sent take at most {bound}")
        incoming = p.IncomingTransfer(begin, self.limits, hash_in_feed=False)
        return await self._receive(session, msg, begin, incoming, rs)

    async def resume(self, session: Session, rs: RoundState) -> tuple[p.Report, bytes] | None:
        """Ask a device reconnecting in round ``rs`` for the rest of the update it was sending when
        its connection dropped: that report and all its bytes, or None if none was cut."""
        partial = self._cut.pop(session.device_id, None)
        if partial is None or partial.report.round != rs.round:
            return None
        transfer_id, offset = partial.report.transfer_id, partial.incoming.offset
        await self.send(session, p.Resume(transfer_id, offset))
        begin = await recv_msg(session.channel)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != transfer_id:
            raise p.ProtocolError("unexpected", f"resume of {transfer_id[:64]!r} must be answered by its transfer")
        self.emit("upload_resumed", {"device": session.device_id, "round": partial.report.round, "offset": offset,
                                     "total": partial.incoming.total_size})
        return partial.report, await self._receive(session, partial.report, begin, partial.incoming, rs)

    async def _receive(self, session: Session, msg: p.Report, begin: p.TransferBegin, incoming: p.IncomingTransfer,
                       rs: RoundState | None) -> bytes:
        try:
            payload = await recv_payload(session.channel, begin, self.limits, incoming=incoming, pace=self.pace)
        except ConnectionClosed:
            if rs is not None and msg.round == rs.round and rs.expects(session.device_id, msg.phase) \
                    and not session.revoked:
                self._cut[session.device_id] = PartialUpload(msg, incoming)
                self.emit("upload_cut", {"device": session.device_id, "round": msg.round,
                                         "offset": incoming.offset, "total": incoming.total_size})
            raise
        self.traffic.count_received(len(payload), session.device_id, begin.kind)
        return payload

    def holds(self, device_id: str) -> bool:
        """Whether an upload of ``device_id`` cut short is kept for its reconnect."""
        return device_id in self._cut

    def drop(self, device_id: str | None = None) -> None:
        """Forget the cut upload of ``device_id`` (it did not come back in time), or all of them
        (the round is over)."""
        if device_id is None:
            self._cut.clear()
        else:
            self._cut.pop(device_id, None)
