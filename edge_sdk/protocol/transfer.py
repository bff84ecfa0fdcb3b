"""Payloads of any size as a stream of bounded frames, with a checksum and resume.

Sans-I/O: :func:`frames` turns a payload into messages to send, :class:`IncomingTransfer` turns
received messages back into the payload. The frame size bounds every websocket message; only
``Limits.max_transfer_bytes`` bounds the payload (docs/protocol.md, "Transfers").

Resume: a receiver that lost its connection keeps its :class:`IncomingTransfer`, reports
:attr:`IncomingTransfer.offset` to the sender (``Fetch.offset`` or ``Resume``), and hands the new
``TransferBegin`` (same id, size and sha256; ``offset`` equal to the bytes held) to
:meth:`IncomingTransfer.resume`.

Checksum: the sha256 of the whole payload travels in ``TransferBegin`` when the sender knows it
before streaming (a payload hashed once and sent many times), else in a ``TransferEnd`` after the
last frame: the sender hashes each frame as it goes instead of reading the whole payload before
its first frame. The receiver's sha256 runs over the bytes already held, incrementally. By default
:meth:`IncomingTransfer.feed` hashes each frame as it lands; an I/O layer that wants the hash off
its critical path passes ``hash_in_feed=False`` and calls :meth:`IncomingTransfer.hash_pending` from
a worker thread while it waits for the next frame (``hashlib`` releases the GIL), as
``edge_sdk.transport.recv_payload`` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

import numpy as np

from .codec import DEFAULT_LIMITS, BytesLike, Limits
from .errors import ErrorCode, ProtocolError
from .messages import Scalar, TransferBegin, TransferEnd, TransferFrame

__all__ = ["DEFAULT_FRAME_SIZE", "frames", "sha256_hex", "IncomingTransfer"]

#: Data bytes per frame when the sender does not choose. Frames smaller than the payload let the
#: receiver hash the first ones while the next are in flight: on loopback a 1 MiB payload arrives
#: about 20% sooner than with 1 MiB frames, larger ones as fast (bench/transport.py --frame-size).
DEFAULT_FRAME_SIZE = 256 << 10


def sha256_hex(payload: BytesLike) -> str:
    """The checksum of a transfer. Compute it once per payload and pass it to :func:`frames` when the
    same payload is sent many times (a chunk streamed to many devices): it then travels in
    ``TransferBegin`` and the sender does not hash the payload again."""
    return hashlib.sha256(payload).hexdigest()


def frames(payload: BytesLike, *, transfer_id: str, kind: str, meta: Mapping[str, Scalar],
           frame_size: int = DEFAULT_FRAME_SIZE, offset: int = 0,
           sha256: str | None = None) -> Iterator[TransferBegin | TransferFrame | TransferEnd]:
    """Yield the messages that carry ``payload[offset:]``: a ``TransferBegin``, the ``TransferFrame``
    messages, and, unless ``sha256`` is given, a ``TransferEnd`` with the digest.

    Without ``sha256`` each frame is hashed when the next message is asked for, that is once the
    caller has sent it (the bytes before ``offset`` first), so the first frame leaves at once and
    the sender hashes while the receiver does. Frames hold
    zero-copy ``memoryview`` slices of ``payload``: keep it unchanged while sending.
    """
    view = memoryview(payload)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    total = len(view)
    if type(frame_size) is not int or frame_size < 1:
        raise ValueError(f"frame_size must be a positive int, got {frame_size!r}")
    if type(offset) is not int or not 0 <= offset <= total:
        raise ValueError(f"offset {offset!r} is outside [0, {total}]")
    running = None if sha256 else hashlib.sha256(view[:offset])
    yield TransferBegin(transfer_id=transfer_id, kind=kind, total_size=total, sha256=sha256 or "",
                        frame_size=frame_size, offset=offset, meta=dict(meta))
    for start in range(offset, total, frame_size):
        data = view[start:start + frame_size]
        yield TransferFrame(transfer_id=transfer_id, offset=start, data=data)
        if running is not None:  # after the frame has gone out: the first one leaves at once
            running.update(data)
    if running is not None:
        yield TransferEnd(transfer_id=transfer_id, sha256=running.hexdigest())


class IncomingTransfer:
    """The receiving side of one transfer: checks every frame and assembles the payload in place.

    The buffer of ``total_size`` bytes is allocated once (uninitialised, so no pass over it before
    the data arrives) and each frame is copied into it once: no concatenation.
    """

    def __init__(self, begin: TransferBegin, limits: Limits = DEFAULT_LIMITS, *, hash_in_feed: bool = True) -> None:
        if not isinstance(begin, TransferBegin):
            raise ProtocolError(ErrorCode.UNEXPECTED,
                                f"a transfer starts with transfer_begin, got {type(begin).__name__}")
        if begin.total_size > limits.max_transfer_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"transfer of {begin.total_size} bytes exceeds "
                                                     f"{limits.max_transfer_bytes}")
        if begin.frame_size > limits.max_frame_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame size {begin.frame_size} exceeds {limits.max_frame_bytes}")
        if begin.offset != 0:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"a new transfer must start at offset 0, not {begin.offset}")
        self.begin = begin
        self.limits = limits
        try:
            self._buffer = np.empty(begin.total_size, dtype=np.uint8)
        except MemoryError:  # e.g. under an address-space limit: refuse the transfer, keep running
            raise ProtocolError(ErrorCode.TOO_LARGE,
                                f"cannot allocate {begin.total_size} bytes for the transfer") from None
        self._view = memoryview(self._buffer)
        self._offset = 0
        self._hash = hashlib.sha256()
        self._hashed = 0
        self._hash_in_feed = hash_in_feed
        self._digest = begin.sha256 or None  # else it comes in a TransferEnd
        self._verified = False

    @property
    def transfer_id(self) -> str:
        return self.begin.transfer_id

    @property
    def kind(self) -> str:
        return self.begin.kind

    @property
    def total_size(self) -> int:
        return self.begin.total_size

    @property
    def meta(self) -> dict[str, Scalar]:
        return self.begin.meta

    @property
    def offset(self) -> int:
        """Bytes held so far: where a resumed transfer continues."""
        return self._offset

    @property
    def complete(self) -> bool:
        """Every byte is held (the digest may still be due in a ``TransferEnd``)."""
        return self._offset == self.begin.total_size

    @property
    def finished(self) -> bool:
        """Every byte and the digest are here: :meth:`view` can check and return the payload."""
        return self._offset == self.begin.total_size and self._digest is not None

    @property
    def hash_in_feed(self) -> bool:
        """Whether :meth:`feed` hashes each frame itself (else call :meth:`hash_pending`)."""
        return self._hash_in_feed

    @property
    def unhashed(self) -> int:
        """Bytes held but not hashed yet."""
        return self._offset - self._hashed

    def feed(self, frame: TransferFrame) -> bool:
        """Take the next frame; return True once the payload is complete.

        Raises ``unexpected`` (not a frame of this transfer), ``out_of_order`` (does not start where
        the held bytes end), ``too_large`` (longer than the announced frame size or the payload).
        """
        if not isinstance(frame, TransferFrame):
            raise ProtocolError(ErrorCode.UNEXPECTED, f"expected transfer_frame, got {type(frame).__name__}")
        if frame.transfer_id != self.begin.transfer_id:
            raise ProtocolError(ErrorCode.UNEXPECTED, f"frame of transfer {frame.transfer_id[:64]!r} "
                                                      f"during transfer {self.begin.transfer_id[:64]!r}")
        if frame.offset != self._offset:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"frame at offset {frame.offset}, expected {self._offset}")
        data = frame.data
        if isinstance(data, memoryview) and (data.ndim != 1 or data.format != "B"):
            data = data.cast("B")
        size = len(data)
        if size > self.begin.frame_size or size > self.limits.max_frame_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {size} bytes exceeds the frame size "
                                                     f"{min(self.begin.frame_size, self.limits.max_frame_bytes)}")
        end = self._offset + size
        if end > self.begin.total_size:
            raise ProtocolError(ErrorCode.TOO_LARGE,
                                f"frame ends at {end}, past the payload's {self.begin.total_size} bytes")
        self._view[self._offset:end] = data
        self._offset = end
        if self._hash_in_feed:
            self.hash_pending()
        return end == self.begin.total_size

    def finish(self, end: TransferEnd) -> None:
        """Take the ``TransferEnd`` of a transfer announced without a digest, after its last frame.

        Raises ``unexpected`` (not this transfer's end, or its digest came in ``TransferBegin``, or
        a second end) and ``out_of_order`` (bytes are still missing).
        """
        if not isinstance(end, TransferEnd):
            raise ProtocolError(ErrorCode.UNEXPECTED, f"expected transfer_end, got {type(end).__name__}")
        if end.transfer_id != self.begin.transfer_id:
            raise ProtocolError(ErrorCode.UNEXPECTED, f"end of transfer {end.transfer_id[:64]!r} "
                                                      f"during transfer {self.begin.transfer_id[:64]!r}")
        if self.begin.sha256 or self._digest is not None:
            raise ProtocolError(ErrorCode.UNEXPECTED, f"transfer {self.begin.transfer_id[:64]!r} already has "
                                                      "its sha256: no transfer_end is due")
        if not self.complete:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER, f"transfer_end after {self._offset} of "
                                                        f"{self.begin.total_size} bytes")
        self._digest = end.sha256

    def hash_pending(self) -> int:
        """Fold the held bytes not hashed yet into the sha256; return how many.

        Safe to run in a worker thread while :meth:`feed` runs in another (it reads only bytes
        below the offset it saw on entry), but never twice at the same time.
        """
        start, end = self._hashed, self._offset
        if end > start:
            self._hash.update(self._view[start:end])
            self._hashed = end
        return end - start

    def resume(self, begin: TransferBegin) -> None:
        """Continue after a reconnect: ``begin`` must announce the same payload, from :attr:`offset`."""
        if not isinstance(begin, TransferBegin):
            raise ProtocolError(ErrorCode.UNEXPECTED, f"expected transfer_begin, got {type(begin).__name__}")
        old = self.begin
        if (begin.transfer_id, begin.total_size, begin.sha256) != (old.transfer_id, old.total_size, old.sha256):
            raise ProtocolError(ErrorCode.UNEXPECTED, f"transfer_begin for {begin.transfer_id[:64]!r} does not "
                                                      f"continue transfer {old.transfer_id[:64]!r}")
        if begin.frame_size > self.limits.max_frame_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE,
                                f"frame size {begin.frame_size} exceeds {self.limits.max_frame_bytes}")
        if begin.offset != self._offset:
            raise ProtocolError(ErrorCode.OUT_OF_ORDER,
                                f"resume from offset {begin.offset}, but {self._offset} bytes are held")
        self.begin = begin

    def view(self) -> memoryview:
        """The verified payload as a read-only view of the receive buffer (no copy)."""
        self._verify()
        return self._view.toreadonly()

    def result(self) -> bytes:
        """The verified payload, copied out as bytes (:meth:`view` avoids the copy). Raises
        ``unexpected`` if incomplete (bytes or a due ``TransferEnd`` missing), ``checksum`` if corrupted."""
        return self.view().tobytes()

    def _verify(self) -> None:
        if self._verified:
            return
        if not self.complete:
            raise ProtocolError(ErrorCode.UNEXPECTED, f"transfer incomplete: {self._offset} of "
                                                      f"{self.begin.total_size} bytes")
        if self._digest is None:
            raise ProtocolError(ErrorCode.UNEXPECTED, "transfer incomplete: its transfer_end has not arrived")
        self.hash_pending()
        digest = self._hash.hexdigest()
        if digest != self._digest:
            raise ProtocolError(ErrorCode.CHECKSUM, f"payload hashes to {digest}, expected {self._digest}")
        self._verified = True
