"""Secure aggregation's building blocks (SecAgg+: Bell et al. 2020; SecAgg: Bonawitz et al. 2017).

Pure, sans-I/O functions that the round protocol composes; the JavaScript SDK has the same
functions with the same bytes (``edge_sdk_js/src/secagg``, checked by tests/vectors/secagg.json):

- :mod:`.labels`: the domain-separation layout of every derivation (:class:`Scope`, :func:`label`);
- :mod:`.keys`: X25519 key pairs and agreement, HKDF-SHA256 share keys and mask seeds;
- :mod:`.binding`: an Ed25519 identity key derived from the device's credential signs its round keys;
- :mod:`.masks`: seeds expanded by AES-256-CTR into ring elements, pairwise and self masks;
- :mod:`.shamir`: t-of-n shares of 32-byte secrets (GF(2^8), ``pyshamir``);
- :mod:`.sealing`: shares sealed with AES-256-GCM for one receiver, sender, session and round;
- :mod:`.fixedpoint`: clipping, weighting, stochastic rounding into Z_{2^b} that cannot wrap;
- :mod:`.graph`: the sparse neighbour graph from a public seed.

The round protocol composes them: :mod:`.round` (a device's steps, sans-I/O), :mod:`.layout` (a
block's coordinates), :mod:`.exchange` (the steps on the device's connection; imported on its own).

Needs the ``secure`` extra (``cryptography``, ``pyshamir``); ``import edge_sdk`` does not load it.
"""

from .binding import (SIGNATURE_BYTES, advertisement_message, identity_public_key, sign_advertisement, sign_survivors,
                      survivors_message, verify_advertisement, verify_survivors)
from .fixedpoint import Decoded, FixedPoint, ring_bits_for
from .graph import Graph, default_degree, neighbour_graph
from .keys import (KEY_BYTES, KeyPair, agree, generate_keypair, hkdf, pair_mask_seed, public_key, seed_commitment,
                   self_mask_seed, share_key)
from .labels import Scope, SecAggError, label, ordered
from .masks import (MAX_RING_BITS, add_mod, combined_mask, expand_mask, expand_words, pairwise_sign, remove_masks,
                    ring_mask, sub_mod)
from .sealing import SEALED_BYTES, open_shares, seal_shares, sealed_bytes
from .shamir import MAX_SHARES, SHARE_BYTES, combine_shares, split_secret

__all__ = [
    "KEY_BYTES", "MAX_RING_BITS", "MAX_SHARES", "SEALED_BYTES", "SHARE_BYTES", "SIGNATURE_BYTES", "Decoded",
    "FixedPoint", "Graph", "KeyPair", "Scope", "SecAggError", "add_mod", "advertisement_message", "agree",
    "combine_shares", "combined_mask", "default_degree", "expand_mask", "expand_words", "generate_keypair", "hkdf",
    "identity_public_key", "label", "neighbour_graph", "open_shares", "ordered", "pair_mask_seed", "pairwise_sign",
    "public_key", "remove_masks", "ring_bits_for", "ring_mask", "seal_shares", "sealed_bytes", "seed_commitment",
    "self_mask_seed", "share_key",
    "sign_advertisement", "sign_survivors", "split_secret", "sub_mod", "survivors_message", "verify_advertisement",
    "verify_survivors",
]
