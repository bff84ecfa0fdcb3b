"""What the server's parts hand each other: the records of a connected device, an instruction out,
a payload, a report's outcome, and the callables through which a part reaches a device.

The parts (docs/architecture.md, "The server") import these from here, not from each other: a
part that needs a ``Session`` does not import the part that admits devices, and a part that reads
``Work`` does not import the part that prepares it. Every part changes only its own state, through
its own methods; these records are built by one part and read by the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.server import ServerConnection

from edge_sdk import protocol as p
from edge_sdk.transport import Channel
from orchestrator.strategies import DeviceInfo, Instruction
from orchestrator.strategies.selection import Selection
from profiles.planner import Plan

__all__ = ["Emit", "Folded", "PartialUpload", "Payload", "Prepared", "Reference", "RunStart", "Send", "Session", "Traffic",
           "Work"]


@dataclass
class Session:
    """A connected device: its hello, its plan, what strategies see of it, and its channel."""

    device_id: str
    channel: Channel
    hello: p.Hello
    plan: Plan
    info: DeviceInfo
    enrolled_samples: int | None = None  # fixed at enrollment, when the device has a credential
    revoked: bool = False  # its credential was revoked while connected: nothing it sends is taken

    @property
    def ws(self) -> ServerConnection:
        return self.channel.ws

    def mark_revoked(self) -> None:
        """Its credential was revoked while it is connected: nothing it sends is taken any more."""
        self.revoked = True


@dataclass
class Work:
    """One instruction out in the current round: what the strategy asked and what went on the wire."""

    instruction: Instruction
    selection: Selection
    wire: p.Instruction
    names: tuple[str, ...]  # state entries of the selected tail
    model_bytes: int  # the size of the model payload it names: what bounds the update that answers it

    @property
    def payload_ids(self) -> tuple[str, ...]:
        """Every payload the instruction names: chunks, model, broadcast and training graph."""
        graph = self.wire.config.get(p.TRAIN_GRAPH_KEY)
        extra = tuple(str(i) for i in (self.wire.broadcast_id, graph) if i)
        return (*self.wire.chunk_ids, self.wire.model_id, *extra)


@dataclass(frozen=True)
class Payload:
    """One encoded payload of the round: sent to every device that fetches its id, hashed once."""

    kind: str  # chunk | model | broadcast | train_graph
    data: bytes
    sha256: str
    meta: dict[str, p.Scalar] = field(default_factory=dict)


#: One prepared instruction: ``(None, ins, None)`` for a device gone, ``(session, ins, None)`` for
#: one whose budget (or runtime) cannot take it, else the work to send.
Prepared = tuple[Session | None, Instruction, Work | None]


@dataclass
class PartialUpload:
    """An update whose transfer a dropped connection cut short. Kept until the round ends, so that
    the device's reconnect continues it from the bytes held (docs/protocol.md, "Resume")."""

    report: p.Report
    incoming: p.IncomingTransfer


@dataclass(frozen=True)
class Folded:
    """What report intake made of one report (``ReportIntake.fold``): accepted by the strategy or
    refused (and why), the row the journal keeps of it, and the strategy's follow-up instructions."""

    accepted: bool
    reason: str
    journal: dict[str, object]
    follow: tuple[Instruction, ...] = ()


@dataclass
class RunStart:
    """Where a run's rounds begin (``orchestrator.server.resume``): the first round to run, the state it
    starts from, and the metrics of the rounds a resumed store already completed."""

    round: int
    state: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)


class Traffic:
    """Bytes sent to and received from devices this round: counted by the part that moves them
    (fetches are sent by the server, updates received by report intake), read and started afresh
    by the round loop for each round's metrics and journal.

    Per device and payload kind: bytes down (``down``), up (``up``), and the bytes of payloads the
    device took from its own store or bundle instead (``held``: sent as zero bytes). ``transfers``
    lists each movement (device, payload id, kind, direction, bytes, whether it came from the
    device's store) for the journal (``store.transfers.record``)."""

    def __init__(self) -> None:
        self.restart()

    def count_sent(self, nbytes: int, device_id: str = "", kind: str = "", payload_id: str = "", *,
                   held: int = 0) -> None:
        """``nbytes`` of payload ``payload_id`` sent to ``device_id``; ``held``: bytes of it the
        device already held and was not sent (the whole payload when it came from its store)."""
        self.sent += nbytes
        if device_id:
            self._add(device_id, "down", kind, nbytes)
            if held:
                self._add(device_id, "held", kind, held)
            self.transfers.append((device_id, payload_id, kind, "down", nbytes, held))

    def count_received(self, nbytes: int, device_id: str = "", kind: str = "update") -> None:
        self.received += nbytes
        if device_id:
            self._add(device_id, "up", kind, nbytes)
            self.transfers.append((device_id, "", kind, "up", nbytes, 0))

    def _add(self, device_id: str, direction: str, kind: str, nbytes: int) -> None:
        by_kind = self.by_device.setdefault(device_id, {"down": {}, "up": {}, "held": {}})[direction]
        by_kind[kind] = by_kind.get(kind, 0) + nbytes

    def restart(self) -> None:
        self.sent = self.received = 0
        self.by_device: dict[str, dict[str, dict[str, int]]] = {}
        self.transfers: list[tuple[str, str, str, str, int, int]] = []


#: How a part sends a device a message (the server's send, under the connection's send lock).
Send = Callable[[Session, p.Message], Awaitable[None]]
#: The server's own update of the whole model from a round's state (``orchestrator.aggregation.reference``).
Reference = Callable[[Mapping[str, np.ndarray], int], dict[str, np.ndarray]]
#: How a part reports an event (the server's ``on_event``, as it is at the time).
Emit = Callable[[str, dict], None]
