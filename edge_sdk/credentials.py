"""Per-device credentials: a device proves it holds its secret without sending it.

The operator enrolls a device (``edgetrain device enroll``): the server stores the device's key,
``key = sha256(secret)``, never the secret, and the device keeps the secret. Wherever a device
proves itself (a door), it sends a proof bound to the door's purpose, its id, the time and a fresh
nonce (format 2):

    hmac2:<purpose>:<unix seconds>:<nonce hex>:<HMAC-SHA256(key, message) hex>
    message = "edgetrain-proof-v2" NUL <purpose> NUL <device id> NUL <seconds> NUL <nonce>

The fixed label separates these MACs from any other use of the key; NUL cannot occur in a device
id (``edge_sdk.settings.device_id_problem``), a purpose or the digits, so no two messages share
bytes. The purposes (:data:`PURPOSES`) are the doors: ``hello`` (``Hello.token``), ``upgrade``
(the websocket upgrade request's ``Authorization`` header), ``status`` (the status page's data)
and ``ticket`` (a browser page's upgrade ticket). The server recomputes the HMAC with the stored
key (constant-time comparison), takes a proof only at the door it names, only within ``max_skew_s``
of its own clock, and refuses a nonce it has seen in that window, so a proof captured on its way
to one door is no good at any other, and a captured proof cannot be replayed. A device id is bound
to its key: no other credential can produce a valid proof for it. Format 1 (``hmac1:``, no
purpose) is refused with a message naming both formats. Sans-I/O: pure functions plus a small
replay window.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["PROOF_SCHEME", "PURPOSES", "CredentialError", "Proof", "ReplayWindow", "derive_key", "make_proof",
           "new_secret", "parse_proof", "proof_message", "verify_proof"]

PROOF_SCHEME = "hmac2"
#: The label that opens every proof's message (domain separation).
PROOF_LABEL = "edgetrain-proof-v2"
#: The doors a proof can be made for.
PURPOSES = ("hello", "upgrade", "status", "ticket")
_OLD_SCHEMES = ("hmac1",)


class CredentialError(ValueError):
    """A proof that does not hold: malformed, for another door, too old or too new, replayed, or not made with the key."""


def new_secret() -> str:
    """A fresh device secret (256 random bits, URL-safe text) to hand to the device once."""
    return secrets.token_urlsafe(32)


def derive_key(secret: str) -> bytes:
    """What the server stores for a secret: its sha256 (the secret itself is never stored)."""
    return hashlib.sha256(secret.encode()).digest()


def proof_message(purpose: str, device_id: str, seconds: int, nonce: str) -> bytes:
    """The bytes a format-2 proof's HMAC signs (the module docstring's ``message``)."""
    return "\0".join((PROOF_LABEL, purpose, device_id, str(seconds), nonce)).encode()


def _mac(key: bytes, purpose: str, device_id: str, seconds: int, nonce: str) -> str:
    return hmac.new(key, proof_message(purpose, device_id, seconds, nonce), hashlib.sha256).hexdigest()


def _check_purpose(purpose: str) -> None:
    if purpose not in PURPOSES:
        raise ValueError(f"a proof's purpose is one of {', '.join(PURPOSES)}, not {purpose!r}")


def make_proof(device_id: str, secret: str, *, purpose: str = "hello", now: float | None = None,
               nonce: str | None = None) -> str:
    """A proof of credential ``secret`` for one use at the door ``purpose`` (default: the hello's token)."""
    _check_purpose(purpose)
    seconds = int(time.time() if now is None else now)
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return f"{PROOF_SCHEME}:{purpose}:{seconds}:{nonce}:{_mac(derive_key(secret), purpose, device_id, seconds, nonce)}"


@dataclass(frozen=True)
class Proof:
    purpose: str
    seconds: int
    nonce: str
    mac: str


def parse_proof(token: str) -> Proof:
    """The parts of a format-2 proof; a format-1 proof is refused naming the format this side takes."""
    parts = token.split(":")
    if parts[0] in _OLD_SCHEMES:
        raise CredentialError(f"credential proof format {parts[0]} is no longer accepted: this server takes "
                              f"{PROOF_SCHEME} proofs, which name their purpose (update the device's SDK)")
    if len(parts) != 5 or parts[0] != PROOF_SCHEME:
        raise CredentialError(f"a credential proof has the form {PROOF_SCHEME}:<purpose>:<seconds>:<nonce>:<mac>")
    _, purpose, seconds, nonce, mac = parts
    if (purpose not in PURPOSES or not seconds.isdigit() or not 16 <= len(nonce) <= 64
            or any(c not in "0123456789abcdef" for c in nonce) or len(mac) != 64):
        raise CredentialError("malformed credential proof")
    return Proof(purpose, int(seconds), nonce, mac)


class ReplayWindow:
    """Nonces seen in the last ``window_s`` seconds, bounded to ``max_entries`` (oldest dropped)."""

    def __init__(self, window_s: float = 300.0, max_entries: int = 100_000) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def check_and_add(self, device_id: str, nonce: str, now: float) -> None:
        while self._seen and (next(iter(self._seen.values())) < now - self.window_s
                              or len(self._seen) >= self.max_entries):
            self._seen.popitem(last=False)
        key = (device_id, nonce)
        if key in self._seen:
            raise CredentialError("credential proof replayed")
        self._seen[key] = now


def verify_proof(device_id: str, token: str, key: bytes, replay: ReplayWindow, *, purpose: str,
                 now: float | None = None, max_skew_s: float = 120.0) -> Proof:
    """Raise :class:`CredentialError` unless ``token`` proves, at the door ``purpose``, that the
    device holds the secret of ``key``; the proof's nonce is then spent in ``replay``."""
    _check_purpose(purpose)
    now = time.time() if now is None else now
    proof = parse_proof(token)
    if proof.purpose != purpose:
        raise CredentialError(f"a credential proof made for {proof.purpose!r} is no good for {purpose!r}")
    if abs(now - proof.seconds) > max_skew_s:
        raise CredentialError(f"credential proof is {now - proof.seconds:+.0f} s from the server's clock "
                              f"(at most {max_skew_s:.0f} s)")
    if not hmac.compare_digest(_mac(key, purpose, device_id, proof.seconds, proof.nonce), proof.mac):
        raise CredentialError("credential proof does not match the device's credential")
    replay.check_and_add(device_id, proof.nonce, now)
    return proof
