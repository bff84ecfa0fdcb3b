"""What can go wrong on the wire, as stable machine-readable codes.

Every check in the protocol raises :class:`ProtocolError` and nothing else, so a server can wrap
a connection in one ``except ProtocolError`` clause, send an :class:`~edge_sdk.protocol.Error`
message carrying ``exc.code`` and close, without ever crashing on hostile input.
"""

from __future__ import annotations

import enum

__all__ = ["ErrorCode", "ProtocolError"]


class ErrorCode(str, enum.Enum):
    """Codes carried by :class:`ProtocolError` and by the ``Error`` message (docs/protocol.md, "Errors").

    The values are part of the protocol: never rename one, only add new ones.
    """

    #: Not msgpack, not a map, a missing, extra or ill-typed field, a text websocket frame.
    MALFORMED = "malformed"
    #: The ``"t"`` field names no known message.
    UNKNOWN_TYPE = "unknown_type"
    #: The ``"v"`` field is not :data:`~edge_sdk.protocol.PROTOCOL_VERSION`.
    BAD_VERSION = "bad_version"
    #: A message, frame, tensor or transfer exceeds a :class:`~edge_sdk.protocol.Limits` bound.
    TOO_LARGE = "too_large"
    #: A tensor's dtype is not on the whitelist.
    BAD_DTYPE = "bad_dtype"
    #: A tensor's rank or a dimension is out of bounds, or the shape disagrees with the data size.
    BAD_SHAPE = "bad_shape"
    #: A tensor or a float field holds NaN or infinity.
    NON_FINITE = "non_finite"
    #: A transfer frame does not start where the previous one ended.
    OUT_OF_ORDER = "out_of_order"
    #: A completed transfer does not hash to the announced sha256.
    CHECKSUM = "checksum"
    #: A valid message that is not allowed at this point of the conversation.
    UNEXPECTED = "unexpected"
    #: The device's credentials were rejected.
    UNAUTHORIZED = "unauthorized"
    #: The server will not serve this device now (full, draining, incompatible).
    REFUSED = "refused"
    #: A transfer stopped moving, or moved slower than the receiver's minimum rate.
    TIMEOUT = "timeout"
    #: The receiver failed handling a message (its fault, logged there): this connection ends, no other.
    INTERNAL = "internal"

    def __str__(self) -> str:
        return self.value


class ProtocolError(Exception):
    """A message or transfer broke the protocol.

    ``code`` is one of the :class:`ErrorCode` values (a plain ``str``, so that a code received from
    a newer peer survives); ``message`` is a human-readable explanation. ``remote`` is true when the
    error was reported by the peer in an ``Error`` message rather than detected locally.
    """

    code: str
    message: str
    remote: bool

    def __init__(self, code: str | ErrorCode, message: str, *, remote: bool = False) -> None:
        self.code = code.value if isinstance(code, ErrorCode) else str(code)
        self.message = message
        self.remote = remote
        super().__init__(f"{self.code}: {message}")

    def __reduce__(self):  # keep it picklable across processes (the signature has a keyword)
        return (_rebuild, (self.code, self.message, self.remote))


def _rebuild(code: str, message: str, remote: bool) -> ProtocolError:
    return ProtocolError(code, message, remote=remote)
