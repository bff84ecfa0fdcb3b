"""The protocol over ``websockets`` (asyncio API): settings and send/receive helpers.

One protocol message is one binary websocket message. These helpers are the only place where
:mod:`edge_sdk.protocol` meets sockets; server and device code call them with a connection from
``websockets.asyncio.server.serve`` or ``websockets.asyncio.client.connect``, both opened with
:func:`ws_options`. Imports websockets, never torch.

Speed (bench/transport.py): a large ``TransferFrame`` goes out as two fragments of its websocket
message, its msgpack header then its data straight from the payload, so the data is not copied
into a joined buffer first; any receiver reassembles exactly ``encode(frame)``. A sender without
a precomputed digest hashes each frame as it goes and sends the digest last (``TransferEnd``).
The receiver hashes in a worker thread while the next frames arrive (``hashlib`` releases the
GIL) and hands out a view of its receive buffer instead of a copy.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.connection import Connection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from .protocol import (
    DEFAULT_FRAME_SIZE,
    DEFAULT_LIMITS,
    Bye,
    Error,
    ErrorCode,
    IncomingTransfer,
    Limits,
    Message,
    ProtocolError,
    Scalar,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    decode,
    encode,
    frames,
)
from .protocol.codec import BytesLike, encode_parts

__all__ = ["Channel", "Pace", "ws_options", "server_tls", "client_tls", "send_msg", "recv_msg", "send_payload",
           "recv_payload", "send_error", "close_code"]

#: Unhashed bytes worth handing to a worker thread (below that, the thread hop costs more).
_THREAD_HASH_BYTES = 256 << 10

#: Backlog of unhashed bytes that the event loop waits for, blocking, when the last frame is in
#: (about 0.5 ms of hashing), and the longest it blocks (then it awaits the worker instead).
_BLOCK_HASH_BYTES = 1 << 20
_BLOCK_TIMEOUT = 0.002

#: Frame data from which sending header and data as two fragments beats joining them: below it
#: the copy is cheap and two more websocket frames cost as much (bench/transport.py).
_FRAGMENT_BYTES = 512 << 10

#: Close codes (RFC 6455, section 7.4.1) used after an ``Error`` message.
_CLOSE_POLICY, _CLOSE_TOO_BIG = 1008, 1009


def ws_options(limits: Limits = DEFAULT_LIMITS, *, ping_interval: float | None = 20.0,
               ping_timeout: float | None = 60.0, max_queue: int = 4,
               write_limit: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ``serve(...)`` and ``connect(...)``; use the same limits on both sides.

    - ``compression=None``: permessage-deflate makes tensor traffic about 30x slower and shrinks
      float32 data by only ~5%.
    - ``max_size = limits.max_message_bytes``: one frame plus its header; payloads stream as frames,
      so this does not bound the model size (the websockets default of 1 MiB would).
    - ``max_queue``: received websocket frames buffered before reading pauses, so a receiver holds
      at most about ``max_queue * max_message_bytes`` bytes of unread data (4 MiB by default: weak
      devices count every MiB; a fragmented ``TransferFrame`` is three websocket frames, one of
      them with data); more does not speed up loopback transfers (bench/transport.py).
    - ``write_limit``: high-water mark of the send buffer; by default two frames, so that a sender
      keeps the socket busy instead of waking up for every 32 KiB (bench/transport.py).
    - ``ping_timeout`` is generous because a busy device (training, running chunks) may answer pings late.
    """
    if write_limit is None:
        write_limit = 2 * limits.max_frame_bytes
    return {
        "compression": None,
        "max_size": limits.max_message_bytes,
        "max_queue": max_queue,
        "write_limit": write_limit,
        "ping_interval": ping_interval,
        "ping_timeout": ping_timeout,
    }


def server_tls(certfile: str | Path, keyfile: str | Path | None = None) -> ssl.SSLContext:
    """TLS for ``serve(..., ssl=...)``: devices then connect with ``wss://`` and their hello (its
    token included) and every payload are encrypted. ``certfile`` is the PEM certificate chain,
    ``keyfile`` its private key (omit it when the certificate file holds the key too)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(certfile), None if keyfile is None else str(keyfile))
    return context


def client_tls(cafile: str | Path | None = None) -> ssl.SSLContext:
    """TLS for ``connect("wss://...", ssl=...)``: the server's certificate is verified against the
    system's trusted authorities, or only against ``cafile`` (a PEM file: a private CA or a
    self-signed server certificate), and must name the host in the URL."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=None if cafile is None else str(cafile))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class Channel:
    """A connection and its session state machine (:mod:`edge_sdk.protocol.session`): every message
    sent or received through it is first checked against the session, so neither side can act out
    of turn (a fetch of a payload it was not given, a report of another phase...).

    ``send_msg``, ``recv_msg``, ``send_payload`` and ``recv_payload`` take a channel wherever they
    take a connection.
    """

    def __init__(self, ws: Connection, session: Any, limits: Limits = DEFAULT_LIMITS) -> None:
        self.ws = ws
        self.session = session
        self.limits = limits
        self.send_lock = asyncio.Lock()  # one sender at a time: a transfer's frames stay together

    async def send(self, msg: Message) -> None:
        self.session.send(msg)
        await _send_raw(self.ws, msg)

    async def recv(self) -> Message:
        while True:  # what crossed this side's own bye or error is dropped; the close follows it
            msg = await _recv_raw(self.ws, self.limits)
            if self.session.receive(msg) is not False:
                return msg

    async def farewell(self) -> bool:
        """Once the connection closed under this side's work (a send or a wait that failed): whether the
        server said goodbye before it closed, read from the messages the connection still holds and
        nothing more. A device busy training when the run ends reads the goodbye only here, as the
        JavaScript device's channel keeps the one it saw (``farewell``). Only on a connection that is
        closing or closed: an open one (a drop this side raised itself) holds no goodbye to read."""
        if self.ws.state not in (State.CLOSING, State.CLOSED):
            return False
        try:
            while True:
                if isinstance(await _recv_raw(self.ws, self.limits), Bye):
                    return True
        except (ConnectionClosed, ProtocolError):
            return False


async def send_msg(ws: Connection | Channel, msg: Message) -> None:
    """Send one message as one binary websocket message (through the channel's session, if a channel)."""
    if isinstance(ws, Channel):
        await ws.send(msg)
    else:
        await _send_raw(ws, msg)


async def recv_msg(ws: Connection | Channel, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Receive and decode one message (checked by the channel's session, if a channel).

    Raises ``ProtocolError`` for bad input and ``websockets.exceptions.ConnectionClosed`` when the
    connection ends.
    """
    if isinstance(ws, Channel):
        return await ws.recv()
    return await _recv_raw(ws, limits)


async def _send_raw(ws: Connection, msg: Message) -> None:
    """Send one message as one binary websocket message.

    A ``TransferFrame`` of at least 512 KiB is sent as the fragments of that message (header, then
    data): the data then reaches the socket without first being copied into a joined buffer.
    """
    parts = encode_parts(msg)
    if len(parts) == 1:
        await ws.send(parts[0])
    elif len(parts[1]) >= _FRAGMENT_BYTES:
        await ws.send(parts)
    else:
        await ws.send(b"".join(parts))


async def _recv_raw(ws: Connection, limits: Limits) -> Message:
    """Receive and decode one message. A text websocket message is ``malformed``."""
    data = await ws.recv()
    if isinstance(data, str):
        raise ProtocolError(ErrorCode.MALFORMED, "text websocket message: the protocol uses binary messages only")
    return decode(data, limits)


async def send_payload(ws: Connection | Channel, payload: BytesLike, *, transfer_id: str, kind: str,
                       meta: Mapping[str, Scalar], frame_size: int = DEFAULT_FRAME_SIZE, offset: int = 0,
                       sha256: str | None = None) -> None:
    """Stream ``payload[offset:]`` as a ``TransferBegin``, its frames and, without ``sha256``, a
    ``TransferEnd`` (see ``protocol.frames``).

    Each ``send`` waits while the socket's buffer is above ``write_limit``, so memory stays bounded
    whatever the payload size. Pass ``sha256`` (``protocol.sha256_hex(payload)``) when the same
    payload is sent more than once, so that it is hashed once; otherwise each frame is hashed right
    after it is sent (~0.13 ms per 256 KiB, short enough for the event loop to keep serving other
    connections in between) and the digest follows the last frame.
    """
    for msg in frames(payload, transfer_id=transfer_id, kind=kind, meta=meta, frame_size=frame_size,
                      offset=offset, sha256=sha256):
        await send_msg(ws, msg)


@dataclass(frozen=True)
class Pace:
    """How slow a transfer may be before the receiver gives up on it: no frame for ``stall_s``
    seconds, or fewer than ``min_rate`` bytes per second on average, from the first frame, once ``grace_s`` have passed
    (a peer that trickles a byte every few seconds must not hold a server's round or memory)."""

    stall_s: float = 30.0
    min_rate: float = 16 << 10
    grace_s: float = 10.0


def _check_rate(begin: TransferBegin, pace: Pace, moved: int, elapsed: float) -> None:
    """``timeout`` when, past ``pace.grace_s``, the transfer has averaged under ``pace.min_rate``."""
    if elapsed > pace.grace_s and moved / elapsed < pace.min_rate:
        raise ProtocolError(ErrorCode.TIMEOUT, f"transfer {begin.transfer_id[:64]!r} moves at "
                                               f"{moved / elapsed:.0f} B/s, below {pace.min_rate:.0f}")


async def recv_payload(ws: Connection | Channel, begin: TransferBegin, limits: Limits = DEFAULT_LIMITS, *,
                       incoming: IncomingTransfer | None = None, pace: Pace | None = None) -> memoryview:
    """Receive the frames announced by ``begin`` (and its ``TransferEnd`` if the digest was not in
    ``begin``) and return the verified payload.

    The payload is a read-only view of the receive buffer (``IncomingTransfer.view``), not a copy:
    ``decode_tensors`` takes it as it is; call ``bytes()`` on it if you need bytes.

    To survive a dropped connection, create the ``IncomingTransfer`` yourself and pass it as
    ``incoming``: after a reconnect, call again with the new ``begin`` and the same ``incoming``,
    which then continues from ``incoming.offset``. An ``Error`` from the peer is raised as a
    ``ProtocolError`` with ``remote=True``; any other message is ``unexpected``. With ``pace``, a
    transfer slower than it allows raises ``timeout``.
    """
    if incoming is None:
        incoming = IncomingTransfer(begin, limits, hash_in_feed=False)
    elif incoming.begin is not begin:
        incoming.resume(begin)
    loop = asyncio.get_running_loop()
    hashing: asyncio.Future[int] | None = None  # the worker's job, if one was started
    caught_up = threading.Event()  # set by that job when it has hashed all it saw: it is done
    started: float | None = None
    first = incoming.offset
    try:
        while not incoming.finished:
            if pace is None:
                msg = await recv_msg(ws, limits)
            else:
                try:
                    msg = await asyncio.wait_for(recv_msg(ws, limits), timeout=pace.stall_s)
                except asyncio.TimeoutError:
                    raise ProtocolError(ErrorCode.TIMEOUT, f"transfer {begin.transfer_id[:64]!r} made no progress "
                                                           f"for {pace.stall_s:g} s") from None
            if type(msg) is TransferFrame:
                if started is None:  # the average runs from the first frame: a sender busy (or starved
                    started = loop.time()  # of CPU) before it is slow to start, not a trickle; stall_s bounds it
                incoming.feed(msg)
                if pace is not None:
                    _check_rate(begin, pace, incoming.offset - first, loop.time() - started)
            elif type(msg) is TransferEnd:
                incoming.finish(msg)
            elif type(msg) is Error:
                raise ProtocolError(msg.code, msg.message, remote=True)
            else:
                detail = f" ({msg.reason})" if type(msg) is Bye and msg.reason else ""
                raise ProtocolError(ErrorCode.UNEXPECTED,
                                    f"{msg.TYPE}{detail} during transfer {begin.transfer_id[:64]!r}")
            # Hash what arrived in a worker thread while the next frames come in (hashlib releases
            # the GIL). Not when little is left to come: there would be nothing to overlap with,
            # and the thread hop would cost more than it hides (view() hashes the rest).
            if (not incoming.hash_in_feed and not incoming.complete
                    and (hashing is None or caught_up.is_set())
                    and incoming.unhashed >= _THREAD_HASH_BYTES
                    and incoming.total_size - incoming.offset >= _THREAD_HASH_BYTES):
                caught_up = threading.Event()
                hashing = loop.run_in_executor(None, _hash_arrived, incoming, caught_up)
        if hashing is not None and incoming.unhashed <= _BLOCK_HASH_BYTES:
            # The worker is finishing the last bytes. Its event wakes this thread as soon as it is
            # done; its future would take a trip through the event loop, ~0.1 ms more.
            caught_up.wait(_BLOCK_TIMEOUT)
    finally:
        if hashing is not None and not caught_up.is_set():
            await asyncio.wait([hashing])  # never leave a thread hashing a buffer we hand out
    return incoming.view()


def _hash_arrived(incoming: IncomingTransfer, caught_up: threading.Event) -> int:
    """Hash until caught up with the bytes held, those fed meanwhile included (while frames arrive
    faster than they hash, the worker keeps going instead of waiting to be handed each one), then
    set ``caught_up``: from then on this job touches nothing."""
    total = 0
    while done := incoming.hash_pending():
        total += done
    caught_up.set()
    return total


def close_code(error: ProtocolError) -> int:
    """The websocket close code that goes with an error: 1009 for ``too_large``, else 1008."""
    return _CLOSE_TOO_BIG if error.code == ErrorCode.TOO_LARGE else _CLOSE_POLICY


async def send_error(ws: Connection | Channel, error: ProtocolError, *, close: bool = True) -> None:
    """Tell the peer what went wrong (an ``Error`` message), then close the connection.

    Never raises when the connection is already gone: this is the last thing a handler does.
    """
    if isinstance(ws, Channel):
        ws = ws.ws
    try:
        await ws.send(encode(Error(code=error.code, message=error.message[:1024])))
        if close:
            await ws.close(code=close_code(error), reason=error.code[:100])
    except ConnectionClosed:
        pass
