"""Mask expansion: a 32-byte seed becomes a stream of ring elements, and masks that cancel in the sum.

A seed expands to the AES-256-CTR keystream with the seed as key and a zero initial counter block
(16 zero bytes, the counter in its last 8 bytes, big-endian), read as little-endian uint32 words;
an element of the ring Z_{2^b} (b <= 32) is the low b bits of a word. The keystream is a PRG
(Bonawitz et al. 2017, PRG(s_{u,v}) and PRG(b_u)); WebCrypto and ``@noble/ciphers`` produce the
same bytes.

A device u masks its encoded block y_u (one block, Bell et al. 2020 / Bonawitz et al. 2017):

    masked_u = y_u + PRG(self seed of u) + sum_{v neighbour of u} sign(u, v) PRG(pair seed of u, v)   (mod 2^b)

with sign(u, v) = +1 when u's id is lower than v's (UTF-8 bytes) and -1 otherwise, so that each
pair's two masks cancel in the sum. The server removes, from the sum of the masked blocks it
received, each survivor's self mask (its seed rebuilt from shares) and, for each device that
dropped after sharing keys, the masks its surviving neighbours added for it: a survivor v added
sign(v, u) PRG(s_{u,v}) = -sign(u, v) PRG(s_{u,v}), so the server adds what u would have added
(:func:`remove_masks`).

numpy arithmetic on uint32 wraps modulo 2^32, and 2^b divides 2^32: sums are taken on words and
reduced to b bits at the end.

A device reads its masks a slice at a time (:class:`MaskStream`), so that masking a block costs
the block's words plus a slice, never a second copy of the block per seed: a CTR keystream read
in consecutive slices is the same bytes as read at once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .keys import KEY_BYTES
from .labels import SecAggError, check_bytes

__all__ = ["MAX_RING_BITS", "MAX_WORDS", "KeyStream", "MaskStream", "add_mod", "combined_mask", "expand_mask",
           "expand_words", "pairwise_sign", "remove_masks", "ring_mask", "sub_mod"]

MAX_RING_BITS = 32
MAX_WORDS = 2**28  # a mask of at most 1 GiB
_ZERO_COUNTER = bytes(16)


def ring_mask(bits: int) -> int:
    """2^b - 1: the bits of a word that are a ring element of Z_{2^b}."""
    if not isinstance(bits, int) or not 1 <= bits <= MAX_RING_BITS:
        raise SecAggError(f"ring bits must be an integer in [1, {MAX_RING_BITS}], got {bits!r}")
    return (1 << bits) - 1


def _check_count(count: int) -> int:
    if not isinstance(count, (int, np.integer)) or not 0 <= count <= MAX_WORDS:
        raise SecAggError(f"a mask has between 0 and {MAX_WORDS} words, got {count!r}")
    return int(count)


class KeyStream:
    """The little-endian uint32 words of the AES-256-CTR keystream of ``seed``, read in order."""

    def __init__(self, seed: bytes) -> None:
        key = check_bytes("mask seed", seed, KEY_BYTES)
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_COUNTER)).encryptor()

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` words of the stream."""
        stream = self._encryptor.update(bytes(4 * _check_count(count)))
        return np.frombuffer(stream, dtype="<u4").astype(np.uint32, copy=False)


def expand_words(seed: bytes, count: int) -> np.ndarray:
    """The first ``count`` little-endian uint32 words of the AES-256-CTR keystream of ``seed``."""
    return KeyStream(seed).read(count)


def expand_mask(seed: bytes, count: int, bits: int) -> np.ndarray:
    """``count`` elements of Z_{2^bits} (as uint32) expanded from ``seed``."""
    mask = ring_mask(bits)
    words = expand_words(seed, count)
    return words if bits == MAX_RING_BITS else words & np.uint32(mask)


def pairwise_sign(me: str, other: str) -> int:
    """+1 if ``me`` sorts before ``other`` (UTF-8 bytes), -1 if after: the sign of their pair mask in me's upload."""
    if me == other:
        raise SecAggError(f"a device has no pair mask with itself ({me!r})")
    return 1 if me.encode() < other.encode() else -1


def add_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a + b in Z_{2^bits}, element-wise."""
    return (np.asarray(a, np.uint32) + np.asarray(b, np.uint32)) & np.uint32(ring_mask(bits))


def sub_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a - b in Z_{2^bits}, element-wise."""
    return (np.asarray(a, np.uint32) - np.asarray(b, np.uint32)) & np.uint32(ring_mask(bits))


class MaskStream:
    """The mask device ``me`` adds to one block, read a slice at a time: its self mask (if
    ``self_seed``) plus each neighbour's pair mask with :func:`pairwise_sign` (``pair_seeds``:
    neighbour id -> seed). Slices read in order are the words of :func:`combined_mask`."""

    def __init__(self, bits: int, me: str, *, self_seed: bytes | None = None,
                 pair_seeds: Mapping[str, bytes] | None = None) -> None:
        self._bits = np.uint32(ring_mask(bits))
        self._self = None if self_seed is None else KeyStream(self_seed)
        self._pairs = [(pairwise_sign(me, other) > 0, KeyStream(seed)) for other, seed in (pair_seeds or {}).items()]

    def read(self, count: int) -> np.ndarray:
        """The mask's next ``count`` words, elements of Z_{2^bits}."""
        total = np.zeros(_check_count(count), dtype=np.uint32)
        if self._self is not None:
            total += self._self.read(count)
        for plus, stream in self._pairs:
            if plus:
                total += stream.read(count)
            else:
                total -= stream.read(count)
        total &= self._bits
        return total


def combined_mask(count: int, bits: int, me: str, *, self_seed: bytes | None = None,
                  pair_seeds: Mapping[str, bytes] | None = None) -> np.ndarray:
    """The whole mask device ``me`` adds to one block of ``count`` words (:class:`MaskStream`)."""
    return MaskStream(bits, me, self_seed=self_seed, pair_seeds=pair_seeds).read(count)


def remove_masks(total: np.ndarray, bits: int, *, self_seeds: Mapping[str, bytes],
                 dropped: Mapping[str, Mapping[str, bytes]]) -> np.ndarray:
    """The server's unmasking of one block's sum of masked uploads: subtract each survivor's self
    mask (``self_seeds``: survivor -> self-mask seed of the block) and add, for each dropped
    device, the pair masks it shares with surviving neighbours (``dropped``: dropped id ->
    {survivor id -> pair seed}), which cancels what those survivors added for it."""
    out = np.array(total, dtype=np.uint32)
    for device, seed in self_seeds.items():
        out = sub_mod(out, combined_mask(out.size, bits, device, self_seed=seed), bits)
    for device, seeds in dropped.items():
        out = add_mod(out, combined_mask(out.size, bits, device, pair_seeds=seeds), bits)
    return out
