"""The conversation of one connection as a state machine (docs/protocol.md, "Session").

Sans-I/O, in the style of the ``websockets`` library's protocol layer for RFC 6455: no sockets, no
asyncio. :class:`DeviceSession` is the device's view of a connection, :class:`ServerSession` the
server's view of the same connection. The I/O layer calls ``send(msg)`` just before it sends a
message and ``receive(msg)`` right after it decoded one; each checks that the message is allowed
now, advances the state, and otherwise raises :class:`~edge_sdk.protocol.ProtocolError` and
changes nothing (so ``send`` doubles as a check: a refused message was never sent).

Codes: a message that is not allowed at this point is ``unexpected``; inside a transfer, a frame
that does not start where the previous one ended or a ``transfer_end`` before the last byte is
``out_of_order`` and a frame past ``total_size`` or longer than ``frame_size`` is ``too_large``
(the codes :class:`~edge_sdk.protocol.IncomingTransfer` uses; the session counts bytes, it does not
hold them).

One connection is one session: after a dropped connection both ends start a new one (the device's
``Hello.resume_round`` says which round it was in; the server then sends that round's instruction
again, or a ``Resume`` for the rest of an update it was receiving).

Instructions: a server may send an instruction at any time after its ``Welcome`` (but not inside
one of its own transfers). The first one while the device is idle becomes current; any other is
queued in ``pending``. On the device side a queued instruction becomes current when the device
calls :meth:`DeviceSession.next_instruction` (in ``IDLE``); on the server side it becomes current
automatically as soon as the server sends the ``Ack`` that ends the previous one. Both sides
therefore agree on the device's current instruction once the device has popped it.
"""

from __future__ import annotations

import enum
from collections import deque

from .errors import ErrorCode, ProtocolError
from .messages import (
    Ack,
    Bye,
    Error,
    Fetch,
    Hello,
    Instruction,
    Message,
    PHASES,
    Report,
    Resume,
    SECAGG_KEY,
    SecAggInbox,
    SecAggKeys,
    SecAggPeers,
    SecAggReveal,
    SecAggShares,
    SecAggUnmask,
    TENSOR_PHASES,
    TRAIN_GRAPH_KEY,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    Welcome,
)

__all__ = ["SessionState", "DeviceSession", "ServerSession", "payload_kinds"]


class SessionState(enum.Enum):
    """Where a connection is (docs/protocol.md, "Session"). Both sides use the same states."""

    #: Connected; the ``Hello`` is not sent (device) or not received (server) yet.
    HELLO = "hello"
    #: ``Hello`` sent and the ``Welcome`` awaited (device); ``Hello`` received and the ``Welcome``
    #: not sent yet (server).
    WELCOMING = "welcoming"
    #: No instruction being worked on.
    IDLE = "idle"
    #: An instruction is being worked on: its fetches and their transfers.
    WORKING = "working"
    #: A ``Report`` with a ``transfer_id`` went out (or a ``Resume`` came in); the frames of its
    #: ``update`` transfer are in flight.
    UPLOADING = "uploading"
    #: The report is complete; its ``Ack`` is due.
    AWAITING_ACK = "awaiting_ack"
    #: After an ``Error`` or a ``Bye``, either way. Nothing more is allowed.
    CLOSED = "closed"


#: Phases whose report carries tensors (an ``update`` transfer), and phases whose report does not.
_PLAIN_PHASES = PHASES - TENSOR_PHASES
_AFTER_WELCOME = frozenset({SessionState.IDLE, SessionState.WORKING, SessionState.UPLOADING,
                            SessionState.AWAITING_ACK})


def payload_kinds(instruction: Instruction) -> dict[str, frozenset[str]]:
    """The payload ids a device may fetch for ``instruction``, each with the ``TransferBegin.kind``
    values that may answer it: ``chunk`` for ``chunk_ids``, ``model`` for ``model_id``,
    ``broadcast`` for ``broadcast_id`` (when not empty), ``train_graph`` for the training graph
    named by ``config["train_graph_id"]`` (when present)."""
    kinds: dict[str, set[str]] = {}
    for chunk_id in instruction.chunk_ids:
        kinds.setdefault(chunk_id, set()).add("chunk")
    kinds.setdefault(instruction.model_id, set()).add("model")
    if instruction.broadcast_id:
        kinds.setdefault(instruction.broadcast_id, set()).add("broadcast")
    graph = instruction.config.get(TRAIN_GRAPH_KEY)
    if isinstance(graph, str) and graph:
        kinds.setdefault(graph, set()).add("train_graph")
    return {payload_id: frozenset(k) for payload_id, k in kinds.items()}


def _unexpected(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNEXPECTED, message)


def _short(text: str) -> str:
    return repr(text[:64])


class _Flow:
    """Byte accounting of one transfer in flight: where the next frame starts, whether a
    ``TransferEnd`` is still due."""

    __slots__ = ("begin", "offset", "end_due")

    def __init__(self, begin: TransferBegin) -> None:
        self.begin = begin
        self.offset = begin.offset
        self.end_due = begin.sha256 == ""

    @property
    def done(self) -> bool:
        return self.offset == self.begin.total_size and not self.end_due

    def check_frame(self, frame: TransferFrame) -> int:
        """The offset after ``frame``; raises without changing anything if it does not fit."""
        begin = self.begin
        if frame.transfer_id != begin.transfer_id:
            raise _unexpected(f"frame of transfer {_short(frame.transfer_id)} during transfer "
                              f"{_short(begin.transfer_id)}")
        if frame.offset != self.offset:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"frame at offset {frame.offset} of transfer "
                                                        f"{_short(begin.transfer_id)}, expected {self.offset}")
        size = memoryview(frame.data).nbytes
        if size > begin.frame_size:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {size} bytes exceeds the transfer's frame size "
                                                     f"{begin.frame_size}")
        if self.offset + size > begin.total_size:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame ends at {self.offset + size}, past the transfer's "
                                                     f"{begin.total_size} bytes")
        return self.offset + size

    def check_end(self, end: TransferEnd) -> None:
        begin = self.begin
        if end.transfer_id != begin.transfer_id:
            raise _unexpected(f"transfer_end of {_short(end.transfer_id)} during transfer "
                              f"{_short(begin.transfer_id)}")
        if not self.end_due:
            raise _unexpected(f"transfer {_short(begin.transfer_id)} had its sha256 in transfer_begin: "
                              "no transfer_end is due")
        if self.offset != begin.total_size:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"transfer_end after {self.offset} of "
                                                        f"{begin.total_size} bytes")


class _SessionRecord:
    """What both sides of a connection track (its state, the current instruction, the messages that
    shaped them), and the read-only view of it; :class:`_Session` makes the transitions."""

    _SIDE = ""

    def __init__(self) -> None:
        self._state = SessionState.HELLO
        self._instruction: Instruction | None = None
        self._pending: deque[Instruction] = deque()
        self._round = -1
        self._last_round = -1  # the latest round of an instruction or resume of this session
        self._hello: Hello | None = None
        self._welcome: Welcome | None = None
        self._fetch: Fetch | None = None  # sent, not yet answered by a TransferBegin or an Ack
        self._flow: _Flow | None = None  # the transfer in flight (a download, or the upload)
        self._report: Report | None = None  # the report being uploaded or awaiting its ack
        self._upload: tuple[str, int] | None = None  # (transfer_id, offset) the upload's begin must have
        self._resumed = False
        self._close: Error | Bye | None = None
        self._closed_here = False  # this side sent the close: what crosses it in flight is dropped
        self._secagg_due: type[Message] | None = None  # the server's answer a secure round's step awaits
        self._secagg_next: type[Message] | None = None  # the device's next step of a secure round
        self._unmask_due = -1  # the round whose SecAggUnmask awaits the device's SecAggReveal

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def round(self) -> int:
        """Round of the current instruction (or of a resumed upload), else -1."""
        return self._round

    @property
    def instruction(self) -> Instruction | None:
        """The instruction the device is working on, or None."""
        return self._instruction

    @property
    def pending(self) -> deque[Instruction]:
        """Instructions that came while another one was being worked on, oldest first. Read it;
        the session alone changes it."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._state is SessionState.CLOSED

    @property
    def hello(self) -> Hello | None:
        return self._hello

    @property
    def welcome(self) -> Welcome | None:
        return self._welcome

    @property
    def fetch(self) -> Fetch | None:
        """The fetch awaiting its ``TransferBegin`` (or its ``Ack``), or None."""
        return self._fetch

    @property
    def transfer(self) -> TransferBegin | None:
        """The ``TransferBegin`` of the transfer in flight (a download or the upload), or None."""
        return self._flow.begin if self._flow is not None else None

    @property
    def report(self) -> Report | None:
        """The report being uploaded or acknowledged (None when a ``Resume`` started the upload)."""
        return self._report

    @property
    def close_message(self) -> Error | Bye | None:
        """The ``Error`` or ``Bye`` that closed the session, either way."""
        return self._close

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(state={self._state.name}, round={self._round}, "
                f"pending={len(self._pending)})")


class _Session(_SessionRecord):
    """The transitions both sides share; subclasses map ``send``/``receive`` to the two directions."""

    def _not_allowed(self, msg: Message, why: str = "") -> ProtocolError:
        text = f"{self._SIDE}: {msg.TYPE} is not allowed in state {self._state.name}"
        return _unexpected(f"{text}: {why}" if why else text)

    def _dispatch(self, msg: object, handlers: dict, direction: str) -> None:
        if not isinstance(msg, Message):
            raise ProtocolError(ErrorCode.MALFORMED, f"{type(msg).__name__} is not a protocol message")
        if self._state is SessionState.CLOSED:
            closer = self._close.TYPE if self._close is not None else "a close"
            raise _unexpected(f"{self._SIDE}: {msg.TYPE} after the session was closed by {closer}")
        handler = handlers.get(type(msg))
        if handler is None:
            raise _unexpected(f"{msg.TYPE} does not travel {direction}")
        handler(self, msg)

    def _sent(self, msg: Message) -> None:
        if isinstance(msg, (Error, Bye)):
            self._closed_here = True

    def _crossed(self, msg: object) -> bool:
        """A message received after this side sent its ``bye`` or ``error``: the peer sent it before
        that close reached it (a device's report as the server says the training is over), so it is
        dropped, not refused. After the peer's own close, a message is still refused: the peer broke
        the protocol."""
        return self._closed_here and isinstance(msg, Message)

    def _on_close(self, msg: Error | Bye) -> None:
        self._state = SessionState.CLOSED
        self._close = msg

    # device -> server
    def _on_hello(self, msg: Hello) -> None:
        if self._state is not SessionState.HELLO:
            raise self._not_allowed(msg, "a connection has one hello, its first message")
        self._hello = msg
        self._state = SessionState.WELCOMING

    def _on_fetch(self, msg: Fetch) -> None:
        if self._state is not SessionState.WORKING:
            raise self._not_allowed(msg, "a fetch belongs to an instruction being worked on")
        if self._flow is not None:
            raise self._not_allowed(msg, f"transfer {_short(self._flow.begin.transfer_id)} is still in flight")
        if self._fetch is not None:
            raise self._not_allowed(msg, f"the fetch of {_short(self._fetch.payload_id)} is not answered yet "
                                         "(one fetch at a time)")
        instruction = self._instruction
        assert instruction is not None
        if msg.payload_id not in payload_kinds(instruction):
            raise _unexpected(f"fetch of payload {_short(msg.payload_id)}, which the current instruction (round "
                              f"{instruction.round}, phase {instruction.phase!r}) does not name")
        if msg.round != instruction.round:
            raise _unexpected(f"fetch for round {msg.round} while the current instruction is of round "
                              f"{instruction.round}")
        self._fetch = msg

    def _on_report(self, msg: Report) -> None:
        if self._state is not SessionState.WORKING:
            raise self._not_allowed(msg, "a report answers an instruction being worked on")
        if self._flow is not None:
            raise self._not_allowed(msg, f"transfer {_short(self._flow.begin.transfer_id)} is still in flight")
        if self._fetch is not None:
            raise self._not_allowed(msg, f"the fetch of {_short(self._fetch.payload_id)} is not answered yet")
        if self._secagg_due is not None:
            raise self._not_allowed(msg, f"the secure round's {self._secagg_due.TYPE} is awaited first")
        instruction = self._instruction
        assert instruction is not None
        if (msg.round, msg.phase) != (instruction.round, instruction.phase):
            raise _unexpected(f"report of round {msg.round}, phase {msg.phase!r} answers no instruction: the "
                              f"current one is of round {instruction.round}, phase {instruction.phase!r}")
        if msg.phase in TENSOR_PHASES and not msg.transfer_id:
            raise _unexpected(f"a report of phase {msg.phase!r} carries tensors: its transfer_id is empty")
        if msg.phase in _PLAIN_PHASES and msg.transfer_id:
            raise _unexpected(f"a report of phase {msg.phase!r} carries no tensors, but names transfer "
                              f"{_short(msg.transfer_id)}")
        self._report = msg
        if msg.transfer_id:
            self._upload = (msg.transfer_id, 0)
            self._state = SessionState.UPLOADING
        else:
            self._state = SessionState.AWAITING_ACK

    # server -> device
    def _on_welcome(self, msg: Welcome) -> None:
        if self._state is not SessionState.WELCOMING:
            raise self._not_allowed(msg, "a welcome answers the hello")
        self._welcome = msg
        self._state = SessionState.IDLE

    def _on_instruction(self, msg: Instruction) -> None:
        if self._state not in _AFTER_WELCOME:
            raise self._not_allowed(msg, "instructions come after the welcome")
        if self._state is SessionState.WORKING and self._flow is not None:
            raise self._not_allowed(msg, f"inside transfer {_short(self._flow.begin.transfer_id)}: only its "
                                         "frames may come until it is complete")
        if msg.round < self._last_round:
            raise _unexpected(f"instruction for round {msg.round} after one for round {self._last_round}")
        self._last_round = msg.round
        if self._state is SessionState.IDLE and not self._pending:
            self._start(msg)
        else:
            self._pending.append(msg)

    def _on_resume(self, msg: Resume) -> None:
        if self._state is not SessionState.IDLE or self._pending:
            raise self._not_allowed(msg, "a resume comes right after the welcome")
        hello = self._hello
        assert hello is not None
        if hello.resume_round < 0:
            raise _unexpected(f"resume of transfer {_short(msg.transfer_id)}, but the hello resumed no round")
        if self._resumed or self._last_round >= 0:
            raise self._not_allowed(msg, "a resume comes right after the welcome, before any instruction, once")
        self._resumed = True
        self._round = self._last_round = hello.resume_round
        self._upload = (msg.transfer_id, msg.offset)
        self._state = SessionState.UPLOADING

    def _on_ack(self, msg: Ack) -> None:
        if self._state is SessionState.WORKING and self._secagg_due is not None:
            # The server turns the device away from a secure round's cohort (late, or presumed dropped).
            if msg.accepted or msg.round != self._round:
                raise self._not_allowed(msg, "only ack(accepted=false) of the round answers a secure round's step")
            self._secagg_due = None
            self._finish_instruction()
            return
        if self._state is SessionState.WORKING and self._fetch is not None:
            fetch, instruction = self._fetch, self._instruction
            assert instruction is not None
            if msg.accepted:
                raise self._not_allowed(msg, "only ack(accepted=false) answers a fetch (the round is closed)")
            if msg.round != fetch.round:
                raise _unexpected(f"ack of round {msg.round} answers the fetch of round {fetch.round}")
            if msg.phase not in ("", instruction.phase):
                raise _unexpected(f"ack of phase {msg.phase!r} answers a fetch for phase {instruction.phase!r}")
            self._fetch = None
            self._finish_instruction()
            return
        if self._state is not SessionState.AWAITING_ACK:
            raise self._not_allowed(msg, "an ack answers a complete report or an outstanding fetch")
        if msg.round != self._round:
            raise _unexpected(f"ack of round {msg.round} answers the report of round {self._round}")
        if self._report is not None and msg.phase != self._report.phase:
            raise _unexpected(f"ack of phase {msg.phase!r} answers the report of phase {self._report.phase!r}")
        self._report = None
        self._finish_instruction()

    # secure aggregation (docs/protocol.md, "Secure aggregation")
    def _secagg_step(self, msg: SecAggKeys | SecAggShares) -> None:
        """A device's key advertisement or shares: within a secure train instruction, one step at a time."""
        instruction = self._instruction
        if self._state is not SessionState.WORKING or self._flow is not None or self._fetch is not None:
            raise self._not_allowed(msg, "a secure round's step belongs to a train instruction between transfers")
        assert instruction is not None
        if instruction.phase != "train" or not instruction.config.get(SECAGG_KEY):
            raise self._not_allowed(msg, "the current instruction is not a secure round's training")
        if msg.round != instruction.round:
            raise _unexpected(f"{msg.TYPE} of round {msg.round} during the instruction of round {instruction.round}")
        if self._secagg_due is not None:
            raise self._not_allowed(msg, f"the server's {self._secagg_due.TYPE} is awaited first")
        if type(msg) is not self._secagg_next:
            step = self._secagg_next.TYPE if self._secagg_next is not None else "the report"
            raise self._not_allowed(msg, f"the secure round's next step is {step}")
        self._secagg_due = SecAggPeers if isinstance(msg, SecAggKeys) else SecAggInbox
        self._secagg_next = None

    def _secagg_answer(self, msg: SecAggPeers | SecAggInbox) -> None:
        if self._state is not SessionState.WORKING or self._secagg_due is not type(msg) or msg.round != self._round:
            raise self._not_allowed(msg, "it answers the device's step of the current secure round")
        self._secagg_due = None
        self._secagg_next = SecAggShares if isinstance(msg, SecAggPeers) else None

    def _on_unmask(self, msg: SecAggUnmask) -> None:
        if self._state not in _AFTER_WELCOME or self._flow is not None:
            raise self._not_allowed(msg, "an unmasking request comes after the welcome, between transfers")
        self._unmask_due = msg.round

    def _on_reveal(self, msg: SecAggReveal) -> None:
        if self._unmask_due != msg.round or (self._state is SessionState.UPLOADING and self._flow is not None):
            raise self._not_allowed(msg, f"no unmasking request of round {msg.round} is open")
        self._unmask_due = -1

    # either way: transfers
    def _on_download_begin(self, msg: TransferBegin) -> None:
        if self._state is not SessionState.WORKING or self._fetch is None or self._flow is not None:
            raise self._not_allowed(msg, "a download answers an outstanding fetch")
        fetch, instruction = self._fetch, self._instruction
        assert instruction is not None
        kinds = payload_kinds(instruction)[fetch.payload_id]
        if msg.kind not in kinds:
            raise _unexpected(f"transfer of kind {msg.kind!r} answers the fetch of {_short(fetch.payload_id)}, "
                              f"a payload of kind {'/'.join(sorted(kinds))}")
        # A held payload (Fetch.held) is answered at its end, no frame following; a delta-coded one is
        # held by the digest of its rebuilt bytes (meta "recon", edge_sdk.wire_codecs.RECON_META).
        held = fetch.held != "" and msg.offset == msg.total_size and fetch.held in (msg.sha256, msg.meta.get("recon"))
        if msg.offset not in (0, fetch.offset) and not held:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"transfer starts at offset {msg.offset}, but the fetch "
                                                        f"asked for {fetch.offset}")
        self._fetch = None
        flow = _Flow(msg)
        self._flow = None if flow.done else flow

    def _on_upload_begin(self, msg: TransferBegin) -> None:
        if self._state is not SessionState.UPLOADING or self._flow is not None:
            raise self._not_allowed(msg, "an upload follows its report (or a resume)")
        assert self._upload is not None
        transfer_id, offset = self._upload
        if msg.transfer_id != transfer_id:
            raise _unexpected(f"upload of transfer {_short(msg.transfer_id)}, but the report names "
                              f"{_short(transfer_id)}")
        if msg.kind != "update":
            raise _unexpected(f"upload of kind {msg.kind!r}, not 'update'")
        if msg.offset != offset:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"upload starts at offset {msg.offset}, expected {offset}")
        self._upload = None
        flow = _Flow(msg)
        if flow.done:
            self._state = SessionState.AWAITING_ACK
        else:
            self._flow = flow

    def _on_frame(self, msg: TransferFrame, uploading: bool) -> None:
        flow = self._flow
        state = SessionState.UPLOADING if uploading else SessionState.WORKING
        if self._state is not state or flow is None:
            raise self._not_allowed(msg, "no transfer is in flight this way")
        flow.offset = flow.check_frame(msg)
        if flow.done:
            self._flow_done(uploading)

    def _on_end(self, msg: TransferEnd, uploading: bool) -> None:
        flow = self._flow
        state = SessionState.UPLOADING if uploading else SessionState.WORKING
        if self._state is not state or flow is None:
            raise self._not_allowed(msg, "no transfer is in flight this way")
        flow.check_end(msg)
        flow.end_due = False
        self._flow_done(uploading)

    def _flow_done(self, uploading: bool) -> None:
        self._flow = None
        if uploading:
            self._state = SessionState.AWAITING_ACK

    # instructions
    def _start(self, instruction: Instruction) -> None:
        self._instruction = instruction
        self._secagg_next = SecAggKeys  # checked against the instruction when a step comes
        self._round = instruction.round
        self._state = SessionState.WORKING

    def _finish_instruction(self) -> None:
        """The current instruction (or resumed upload) is over: the device is idle."""
        self._instruction = None
        self._round = -1
        self._state = SessionState.IDLE

    # the two directions, as the device sends them and the server receives them, and back
    def _from_device(self, msg: Message) -> None:
        self._dispatch(msg, _FROM_DEVICE, "from a device to the server")

    def _from_server(self, msg: Message) -> None:
        self._dispatch(msg, _FROM_SERVER, "from the server to a device")


_FROM_DEVICE = {
    Hello: _Session._on_hello,
    Fetch: _Session._on_fetch,
    Report: _Session._on_report,
    TransferBegin: _Session._on_upload_begin,
    TransferFrame: lambda s, m: s._on_frame(m, uploading=True),
    TransferEnd: lambda s, m: s._on_end(m, uploading=True),
    SecAggKeys: _Session._secagg_step,
    SecAggShares: _Session._secagg_step,
    SecAggReveal: _Session._on_reveal,
    Error: _Session._on_close,
    Bye: _Session._on_close,
}

_FROM_SERVER = {
    Welcome: _Session._on_welcome,
    Instruction: _Session._on_instruction,
    Resume: _Session._on_resume,
    Ack: _Session._on_ack,
    TransferBegin: _Session._on_download_begin,
    TransferFrame: lambda s, m: s._on_frame(m, uploading=False),
    TransferEnd: lambda s, m: s._on_end(m, uploading=False),
    SecAggPeers: _Session._secagg_answer,
    SecAggInbox: _Session._secagg_answer,
    SecAggUnmask: _Session._on_unmask,
    Error: _Session._on_close,
    Bye: _Session._on_close,
}


class DeviceSession(_Session):
    """A device's side of one connection.

    ``send(msg)`` before sending, ``receive(msg)`` after decoding; when :attr:`state` is ``IDLE``
    and :attr:`pending` is not empty, :meth:`next_instruction` makes the oldest queued
    instruction current.
    """

    _SIDE = "device"

    def send(self, msg: Message) -> None:
        """Check that the device may send ``msg`` now and advance; raises ``ProtocolError``."""
        self._from_device(msg)
        self._sent(msg)

    def receive(self, msg: Message) -> bool:
        """Check that the server may send ``msg`` now and advance; raises ``ProtocolError``.

        False, and nothing changes, for a message that crossed the device's own ``bye`` or
        ``error`` on the wire: the caller drops it (:meth:`_Session._crossed`)."""
        if self._crossed(msg):
            return False
        self._from_server(msg)
        return True

    def next_instruction(self) -> Instruction | None:
        """Make the oldest pending instruction current (``IDLE`` -> ``WORKING``) and return it.

        Returns None when there is nothing to take: none pending, or the session is not past its
        welcome or is closed. Raises ``unexpected`` while an instruction is still being worked on
        (``WORKING``, ``UPLOADING``, ``AWAITING_ACK``): it ends with its ``Ack``.
        """
        if self._state in (SessionState.WORKING, SessionState.UPLOADING, SessionState.AWAITING_ACK):
            raise _unexpected(f"device: next_instruction() in state {self._state.name}: the current instruction "
                              "is not finished")
        if self._state is not SessionState.IDLE or not self._pending:
            return None
        instruction = self._pending.popleft()
        self._start(instruction)
        return instruction


class ServerSession(_Session):
    """The server's side of one connection: the mirror of :class:`DeviceSession`.

    The server's view of the device's current instruction advances by itself: when the server
    sends the ``Ack`` that ends an instruction (answering its report, or a fetch of a closed
    round), the oldest pending instruction becomes current at once (state ``WORKING``).
    """

    _SIDE = "server"

    def send(self, msg: Message) -> None:
        """Check that the server may send ``msg`` now and advance; raises ``ProtocolError``."""
        self._from_server(msg)
        self._sent(msg)

    def receive(self, msg: Message) -> bool:
        """Check that the device may send ``msg`` now and advance; raises ``ProtocolError``.

        False, and nothing changes, for a message that crossed the server's own ``bye`` or
        ``error`` on the wire (a report sent as the training finished): the caller drops it."""
        if self._crossed(msg):
            return False
        self._from_device(msg)
        return True

    def _finish_instruction(self) -> None:
        super()._finish_instruction()
        if self._pending:
            self._start(self._pending.popleft())
