"""Domain separation: the one byte layout every derivation, signature and associated data uses.

Each purpose has its own label and a fixed list of fields, so that no two purposes can produce
the same input bytes (a pairwise mask seed can never equal a share key, a signature on one
round's keys never verifies for another round)::

    label(purpose, *fields) = b"edgetrain/secagg/v1" 0x00 purpose 0x00 (u16be(len(f)) f)*

A text field is its UTF-8; an integer field is 8 bytes big-endian (0 <= value < 2**53, the
integers JavaScript holds exactly); a bytes field is itself. The purposes and their fields:

=================  ============================================  ==========================
purpose            fields                                        used as
=================  ============================================  ==========================
``identity``       device id                                     HKDF info (Ed25519 seed)
``advertise``      session, round, device id, cipher pk, mask pk Ed25519 signed message
``share-key``      session, round, low id, high id               HKDF info (AES-GCM key)
``share-ad``       session, round, sender id, receiver id        AES-GCM associated data
``pair-mask``      session, round, block, low id, high id        HKDF info (mask seed)
``self-mask``      session, round, block, device id              HKDF info (mask seed)
``graph``          session, round, block                         HKDF info (graph stream)
=================  ============================================  ==========================

"low id" and "high id" are the pair's two device ids ordered by their UTF-8 bytes
(:func:`ordered`), so both ends derive the same value. A :class:`Scope` names what a round's
values belong to: the server's ``session`` (a job id with the attempt, chosen by the protocol)
and the round number.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_INT", "PREFIX", "Scope", "SecAggError", "check_bytes", "label", "ordered"]

PREFIX = b"edgetrain/secagg/v1"
MAX_INT = 2**53  # integer fields stay below this: JavaScript numbers hold them exactly
MAX_FIELD_BYTES = 0xFFFF


class SecAggError(ValueError):
    """A secure-aggregation value that does not hold: wrong size, a forged signature, a share that
    does not decrypt or does not combine, parameters that could overflow the ring."""


@dataclass(frozen=True)
class Scope:
    """What a round's keys, masks and shares are bound to: ``session`` (the server's job and
    attempt, any text) and ``round`` (0 <= round < 2**53)."""

    session: str
    round: int

    def __post_init__(self) -> None:
        if not isinstance(self.round, int) or not 0 <= self.round < MAX_INT:
            raise SecAggError(f"round must be an integer in [0, 2**53), got {self.round!r}")
        if not isinstance(self.session, str):
            raise SecAggError(f"session must be text, got {type(self.session).__name__}")
        if len(self.session.encode()) > MAX_FIELD_BYTES:
            raise SecAggError("session is longer than 65535 bytes")


def _field(value: str | int | bytes) -> bytes:
    if isinstance(value, bool):
        raise SecAggError("a label field is text, bytes or an integer, not a bool")
    if isinstance(value, int):
        if not 0 <= value < MAX_INT:
            raise SecAggError(f"integer label field {value} is outside [0, 2**53)")
        data = value.to_bytes(8, "big")
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = bytes(value)
    if len(data) > MAX_FIELD_BYTES:
        raise SecAggError("a label field is longer than 65535 bytes")
    return len(data).to_bytes(2, "big") + data


def label(purpose: str, *fields: str | int | bytes) -> bytes:
    """The bytes of ``purpose`` with ``fields`` in the layout above."""
    return PREFIX + b"\x00" + purpose.encode() + b"\x00" + b"".join(_field(f) for f in fields)


def ordered(a: str, b: str) -> tuple[str, str]:
    """The two ids lowest first, by their UTF-8 bytes (the order both SDKs use)."""
    if a == b:
        raise SecAggError(f"a pair needs two different devices, got {a!r} twice")
    return (a, b) if a.encode() < b.encode() else (b, a)


def check_bytes(name: str, value: object, size: int) -> bytes:
    """``value`` as bytes, refused unless it is bytes of exactly ``size``."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise SecAggError(f"{name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if len(data) != size:
        raise SecAggError(f"{name} must be {size} bytes, got {len(data)}")
    return data
