"""Key agreement and key derivation: X25519 (RFC 7748) and HKDF-SHA256 (RFC 5869), from ``cryptography``.

Each device makes two X25519 key pairs per round (Bonawitz et al. 2017, round 0, AdvertiseKeys:
``c`` for encrypting shares, ``s`` for pairwise masks). Two devices agree on ``X25519(sk_u, pk_v)``
and never use it directly: HKDF-SHA256 (empty salt, i.e. 32 zero bytes) with one ``info`` per
purpose (:mod:`edge_sdk.secagg.labels`) turns it into

- the share-encryption key of a pair in a round (``share-key``),
- the pairwise mask seed of a pair for one block in a round (``pair-mask``): each block has its
  own masks, so a block's masks cancel over exactly the devices that trained it,
- a device's self-mask seed for one block (``self-mask``), from that block's 32-byte random seed
  ``b_u^k``: each trained block has its own seed, Shamir-shared on its own, so revealing one
  block's seed exposes no other block (docs/security.md, "Block thresholds");
- the commitment to a block's seed (``seed-commit``), signed in the key advertisement, against
  which a seed rebuilt from shares is checked (a wrong share is found, not combined).

The agreement refuses a public key of small order (a shared secret of all zeros), as WebCrypto
and ``@noble/curves`` do.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .labels import Scope, SecAggError, check_bytes, label, ordered

__all__ = ["KEY_BYTES", "KeyPair", "agree", "generate_keypair", "hkdf", "pair_mask_seed", "public_key",
           "seed_commitment", "self_mask_seed", "share_key"]

KEY_BYTES = 32  # X25519 private and public keys, shared secrets, derived keys and seeds


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair as raw bytes (32 each)."""

    private: bytes
    public: bytes


def generate_keypair() -> KeyPair:
    """A fresh X25519 key pair from the operating system's generator."""
    key = X25519PrivateKey.generate()
    return KeyPair(key.private_bytes_raw(), key.public_key().public_bytes_raw())


def public_key(private: bytes) -> bytes:
    """The public key of a raw 32-byte X25519 private key."""
    key = X25519PrivateKey.from_private_bytes(check_bytes("private key", private, KEY_BYTES))
    return key.public_key().public_bytes_raw()


def agree(private: bytes, peer_public: bytes) -> bytes:
    """X25519(private, peer_public): the 32-byte shared secret; refuses small-order public keys."""
    key = X25519PrivateKey.from_private_bytes(check_bytes("private key", private, KEY_BYTES))
    peer = X25519PublicKey.from_public_bytes(check_bytes("public key", peer_public, KEY_BYTES))
    try:
        return key.exchange(peer)
    except ValueError as exc:  # an all-zero shared secret: the peer's key has small order
        raise SecAggError("key agreement failed: the public key has small order") from exc


def hkdf(ikm: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``ikm`` with an empty salt and ``info`` (RFC 5869)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(ikm)


def share_key(shared: bytes, scope: Scope, a: str, b: str) -> bytes:
    """The AES-256-GCM key of devices ``a`` and ``b`` for ``scope``, from their ``c`` agreement."""
    low, high = ordered(a, b)
    info = label("share-key", scope.session, scope.round, low, high)
    return hkdf(check_bytes("shared secret", shared, KEY_BYTES), info)


def pair_mask_seed(shared: bytes, scope: Scope, block: int, a: str, b: str) -> bytes:
    """The seed of the pairwise mask of ``a`` and ``b`` on ``block``, from their ``s`` agreement."""
    low, high = ordered(a, b)
    info = label("pair-mask", scope.session, scope.round, block, low, high)
    return hkdf(check_bytes("shared secret", shared, KEY_BYTES), info)


def self_mask_seed(seed: bytes, scope: Scope, block: int, device_id: str) -> bytes:
    """The seed of ``device_id``'s self mask on ``block``, from its random 32-byte seed ``b_u``."""
    info = label("self-mask", scope.session, scope.round, block, device_id)
    return hkdf(check_bytes("self-mask seed", seed, KEY_BYTES), info)


def seed_commitment(seed: bytes, scope: Scope, block: int, device_id: str) -> bytes:
    """The commitment to ``device_id``'s seed ``b_u^k`` of ``block``: HKDF-SHA256 of the seed with its
    own ``info`` (HMAC-SHA256 keyed by a uniform 32-byte secret: hiding, and binding as far as
    HMAC-SHA256 is collision resistant)."""
    info = label("seed-commit", scope.session, scope.round, block, device_id)
    return hkdf(check_bytes("self-mask seed", seed, KEY_BYTES), info)
