"""Per-device credentials: a device proves it holds its secret without sending it.

The operator enrolls a device (``edgetrain device enroll``): the server stores the device's key,
``key = sha256(secret)``, never the secret, and the device keeps the secret. On every connection
the device sends, in ``Hello.token``, a proof bound to its id, the time and a fresh nonce:

    hmac1:<unix seconds>:<nonce hex>:<HMAC-SHA256(key, "<device id>|<seconds>|<nonce>") hex>

The server recomputes the HMAC with the stored key (constant-time comparison), accepts a proof
only within ``max_skew_s`` of its own clock, and refuses a nonce it has seen in that window, so a
captured hello cannot be replayed. A device id is bound to its key: no other credential can
produce a valid proof for it. Sans-I/O: pure functions plus a small replay window.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["PROOF_SCHEME", "CredentialError", "ReplayWindow", "derive_key", "make_proof", "new_secret",
           "verify_proof"]

PROOF_SCHEME = "hmac1"


class CredentialError(ValueError):
    """A proof that does not hold: malformed, too old or too new, replayed, or not made with the key."""


def new_secret() -> str:
    """A fresh device secret (256 random bits, URL-safe text) to hand to the device once."""
    return secrets.token_urlsafe(32)


def derive_key(secret: str) -> bytes:
    """What the server stores for a secret: its sha256 (the secret itself is never stored)."""
    return hashlib.sha256(secret.encode()).digest()


def _mac(key: bytes, device_id: str, seconds: int, nonce: str) -> str:
    return hmac.new(key, f"{device_id}|{seconds}|{nonce}".encode(), hashlib.sha256).hexdigest()


def make_proof(device_id: str, secret: str, *, now: float | None = None, nonce: str | None = None) -> str:
    """The ``Hello.token`` of a device with credential ``secret``, for one connection."""
    seconds = int(time.time() if now is None else now)
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return f"{PROOF_SCHEME}:{seconds}:{nonce}:{_mac(derive_key(secret), device_id, seconds, nonce)}"


def is_proof(token: str) -> bool:
    return token.startswith(PROOF_SCHEME + ":")


@dataclass(frozen=True)
class Proof:
    seconds: int
    nonce: str
    mac: str


def parse_proof(token: str) -> Proof:
    parts = token.split(":")
    if len(parts) != 4 or parts[0] != PROOF_SCHEME:
        raise CredentialError(f"a credential proof has the form {PROOF_SCHEME}:<seconds>:<nonce>:<mac>")
    _, seconds, nonce, mac = parts
    if not seconds.isdigit() or not 16 <= len(nonce) <= 64 or len(mac) != 64:
        raise CredentialError("malformed credential proof")
    return Proof(int(seconds), nonce, mac)


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


def verify_proof(device_id: str, token: str, key: bytes, replay: ReplayWindow, *, now: float | None = None,
                 max_skew_s: float = 120.0) -> None:
    """Raise :class:`CredentialError` unless ``token`` proves the device holds the secret of ``key``."""
    now = time.time() if now is None else now
    proof = parse_proof(token)
    if abs(now - proof.seconds) > max_skew_s:
        raise CredentialError(f"credential proof is {now - proof.seconds:+.0f} s from the server's clock "
                              f"(at most {max_skew_s:.0f} s)")
    if not hmac.compare_digest(_mac(key, device_id, proof.seconds, proof.nonce), proof.mac):
        raise CredentialError("credential proof does not match the device's credential")
    replay.check_and_add(device_id, proof.nonce, now)
