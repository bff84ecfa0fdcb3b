"""Share encryption: the two shares a device sends a neighbour travel through the server sealed
with AES-256-GCM (Bonawitz et al. 2017, round 1, ShareKeys: AE.enc).

The key is the pair's share key for the round (:func:`edge_sdk.secagg.keys.share_key`); the
associated data is ``label("share-ad", session, round, sender, receiver)``, so a sealed message
opens only for the receiver it was made for, from the sender it claims, in its session and round:
the server cannot replay it to another peer, turn it around, or carry it into another round. The
nonce is 12 random bytes (both directions of a pair share the key, and a device that shares
again must never repeat a nonce). Layout, 28 + 33 (m + 1) bytes for a sender that trained m blocks::

    nonce (12) | AES-GCM(seed share of each trained block (33 each, in block order) | mask-key share (33)) | tag (16)

(94 bytes for one block.) The receiver knows m from the sender's signed split, and the size is
checked before anything is decrypted.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .keys import KEY_BYTES
from .labels import Scope, SecAggError, check_bytes, label
from .shamir import SHARE_BYTES

__all__ = ["NONCE_BYTES", "SEALED_BYTES", "open_shares", "seal_shares", "sealed_bytes"]

NONCE_BYTES = 12
TAG_BYTES = 16
SEALED_BYTES = NONCE_BYTES + 2 * SHARE_BYTES + TAG_BYTES  # a sender that trained one block


def sealed_bytes(blocks: int) -> int:
    """The size of the sealed shares of a sender that trained ``blocks`` blocks."""
    return NONCE_BYTES + (blocks + 1) * SHARE_BYTES + TAG_BYTES


def _associated(scope: Scope, sender: str, receiver: str) -> bytes:
    if sender == receiver:
        raise SecAggError("a device does not seal shares for itself")
    return label("share-ad", scope.session, scope.round, sender, receiver)


def seal_shares(key: bytes, scope: Scope, sender: str, receiver: str, seed_shares: list[bytes],
                mask_key_share: bytes, *, nonce: bytes | None = None) -> bytes:
    """``sender``'s shares of its blocks' self-mask seeds (in block order) and of its mask private key
    for ``receiver``, sealed. ``nonce`` is for test vectors only; leave it out (a fresh random nonce)."""
    if not seed_shares:
        raise SecAggError("a sender seals the share of at least one block's seed")
    plaintext = b"".join(check_bytes("seed share", s, SHARE_BYTES) for s in seed_shares) + check_bytes(
        "mask key share", mask_key_share, SHARE_BYTES)
    nonce = os.urandom(NONCE_BYTES) if nonce is None else check_bytes("nonce", nonce, NONCE_BYTES)
    aead = AESGCM(check_bytes("share key", key, KEY_BYTES))
    return nonce + aead.encrypt(nonce, plaintext, _associated(scope, sender, receiver))


def open_shares(key: bytes, scope: Scope, sender: str, receiver: str, sealed: bytes,
                blocks: int = 1) -> tuple[list[bytes], bytes]:
    """(seed share of each of the sender's ``blocks`` trained blocks, mask-key share) from ``sealed``;
    raises :class:`SecAggError` if it is not exactly what ``sender`` sealed for ``receiver`` in ``scope``."""
    sealed = check_bytes("sealed shares", sealed, sealed_bytes(blocks))
    aead = AESGCM(check_bytes("share key", key, KEY_BYTES))
    try:
        plaintext = aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _associated(scope, sender, receiver))
    except InvalidTag as exc:
        raise SecAggError(f"the shares from {sender!r} to {receiver!r} do not open: altered, or not for this "
                          "pair, session and round") from exc
    shares = [plaintext[i:i + SHARE_BYTES] for i in range(0, len(plaintext), SHARE_BYTES)]
    return shares[:-1], shares[-1]
