"""Key binding: a device signs its round keys with an identity key only its credential can make.

Why not an HMAC with the credential: the server stores ``sha256(secret)`` (edge_sdk/credentials.py),
which is exactly the key of the hello's HMAC, so the server could compute any such MAC and
substitute its own X25519 keys for a device's (a man in the middle of the share exchange).

Instead each device has an Ed25519 identity key (RFC 8032) derived from its secret:

    identity seed = HKDF-SHA256(ikm = UTF-8 of the secret, salt = empty, info = label("identity", device id))

HKDF keys HMAC with the secret itself; ``sha256(secret)`` says nothing about that output unless
SHA-256 is broken, so the holder of the server's store cannot derive the seed. The identity
public key is recorded when the device is enrolled (the enrolment tool holds the secret at that
moment). In every round the device signs

    label("advertise", session, round, device id, cipher public key, mask public key, split, commitments)

``split`` is the first block it trained (its block cohorts are public to its peers through it, and a
server cannot move a device into or out of a block's cohort without breaking the signature) and
``commitments`` the 32-byte commitment to the self-mask seed of each block it trained, in block
order (:func:`edge_sdk.secagg.keys.seed_commitment`): a seed rebuilt from shares is checked against
it, so a wrong share cannot go unnoticed (Bonawitz et al. 2017 check rebuilt keys the same way
against the advertised public keys).

and every peer verifies the signature against the identity public key it has for that device
before using the keys. A signature binds the keys to one session and round: keys of another round
or another device do not verify.

Trust model, honestly:

- Against a server that follows the protocol but reads everything (honest but curious), the
  binding is not needed; it costs one signature and one verification per peer.
- Against a server that changes messages, the binding holds only as far as the identity public
  keys reach a device through something the server cannot rewrite: a roster the operator hands to
  devices out of band, pinned keys, or a log that devices can audit. If devices take the peers'
  identity keys from the server itself, a malicious server can substitute identity keys and round
  keys together, and the binding proves nothing (Bonawitz et al. 2017 assume a PKI for their
  actively secure variant for this reason).
- A leaked store (the ``sha256(secret)`` keys and the identity public keys) lets its reader make
  hello proofs, not advertisement signatures. A leaked device secret gives both.
- The server still chooses who is in a round and the public graph seed; it can drop devices
  or claim they dropped. Bonawitz et al.'s ConsistencyCheck round and a threshold
  over half the neighbourhood limit what that reveals; the round protocol owns those checks.

Ed25519 is deterministic: the same secret, id and message give the same signature in both SDKs.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .keys import KEY_BYTES, hkdf
from .labels import Scope, SecAggError, check_bytes, label

__all__ = ["SIGNATURE_BYTES", "advertisement_message", "identity_public_key", "sign_advertisement", "sign_survivors",
           "survivors_message", "verify_advertisement", "verify_survivors"]

SIGNATURE_BYTES = 64


def _identity(secret: str, device_id: str) -> Ed25519PrivateKey:
    if not secret:
        raise SecAggError("an identity key needs the device's secret")
    return Ed25519PrivateKey.from_private_bytes(hkdf(secret.encode(), label("identity", device_id)))


def identity_public_key(secret: str, device_id: str) -> bytes:
    """The 32-byte Ed25519 public key of the device with credential ``secret`` (recorded at enrolment)."""
    return _identity(secret, device_id).public_key().public_bytes_raw()


def advertisement_message(scope: Scope, device_id: str, cipher_public: bytes, mask_public: bytes, split: int,
                          commitments: bytes) -> bytes:
    """The bytes a device signs to advertise its two X25519 public keys, its split and its seed
    commitments (32 bytes per trained block) for ``scope``."""
    if type(split) is not int or split < 0 or not commitments or len(commitments) % KEY_BYTES:
        raise SecAggError(f"an advertisement needs a split >= 0 and 32-byte commitments, got {split!r}, "
                          f"{len(commitments)} bytes")
    return label("advertise", scope.session, scope.round, device_id,
                 check_bytes("cipher public key", cipher_public, KEY_BYTES),
                 check_bytes("mask public key", mask_public, KEY_BYTES), split, bytes(commitments))


def sign_advertisement(secret: str, device_id: str, scope: Scope, cipher_public: bytes,
                       mask_public: bytes, split: int, commitments: bytes) -> bytes:
    """The 64-byte Ed25519 signature binding the round keys, split and commitments to the device's credential."""
    message = advertisement_message(scope, device_id, cipher_public, mask_public, split, commitments)
    return _identity(secret, device_id).sign(message)


def verify_advertisement(identity_public: bytes, device_id: str, scope: Scope, cipher_public: bytes,
                         mask_public: bytes, split: int, commitments: bytes, signature: bytes) -> None:
    """Raise :class:`SecAggError` unless ``signature`` is the device's signature on this advertisement for ``scope``."""
    key = Ed25519PublicKey.from_public_bytes(check_bytes("identity public key", identity_public, KEY_BYTES))
    message = advertisement_message(scope, device_id, cipher_public, mask_public, split, commitments)
    try:
        key.verify(check_bytes("signature", signature, SIGNATURE_BYTES), message)
    except InvalidSignature as exc:
        raise SecAggError(f"the key advertisement of {device_id!r} is not signed by its identity key") from exc


def survivors_message(scope: Scope, survivors: list[str]) -> bytes:
    """The bytes a device signs in the consistency round (Bonawitz et al. 2017, ConsistencyCheck): the
    survivor set it was given, its ids sorted by UTF-8 bytes, each a field of the label."""
    ids = sorted(survivors, key=str.encode)
    if len(set(ids)) != len(ids):
        raise SecAggError("a survivor set names a device twice")
    return label("survivors", scope.session, scope.round, len(ids), *ids)


def sign_survivors(secret: str, device_id: str, scope: Scope, survivors: list[str]) -> bytes:
    """The device's Ed25519 signature on the survivor set of ``scope``."""
    return _identity(secret, device_id).sign(survivors_message(scope, survivors))


def verify_survivors(identity_public: bytes, device_id: str, scope: Scope, survivors: list[str],
                     signature: bytes) -> None:
    """Raise :class:`SecAggError` unless ``signature`` is ``device_id``'s on this survivor set of ``scope``."""
    key = Ed25519PublicKey.from_public_bytes(check_bytes("identity public key", identity_public, KEY_BYTES))
    try:
        key.verify(check_bytes("signature", signature, SIGNATURE_BYTES), survivors_message(scope, survivors))
    except InvalidSignature as exc:
        raise SecAggError(f"{device_id!r} did not sign this survivor set") from exc
