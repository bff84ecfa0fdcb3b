"""Randomness for the codecs: a seeded stream both SDKs compute bit for bit, or the system's.

The seeded stream is SHAKE128 (FIPS 202), an extendable-output function: ``SHAKE128(label || u64le(seed))``
read to the length needed. ``hashlib`` and ``@noble/hashes`` give the same bytes, so the JavaScript
device draws the rotation signs and rounding offsets this SDK draws; numpy's and JavaScript's own
generators are never used for anything that crosses the wire. Stochastic rounding in production
draws from ``os.urandom`` (``seed=None``): nobody needs to reproduce it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

__all__ = ["EDEN_LABEL", "SR_LABEL", "seeded_bytes", "uniform_u32", "new_seed"]

#: Domain labels: the same seed gives unrelated streams for different uses.
EDEN_LABEL = b"edgetrain.codecs.eden.v1"
SR_LABEL = b"edgetrain.codecs.sr.v1"
_U64 = (1 << 64) - 1


def check_seed(seed: int) -> int:
    if type(seed) is not int or not 0 <= seed <= _U64:
        raise ValueError(f"a seed is an integer in [0, 2^64), got {seed!r}")
    return seed


def seeded_bytes(label: bytes, seed: int, n: int) -> bytes:
    """``n`` bytes of SHAKE128(label || u64le(seed))."""
    return hashlib.shake_128(label + check_seed(seed).to_bytes(8, "little")).digest(n)


def uniform_u32(n: int, seed: int | None, label: bytes = SR_LABEL) -> np.ndarray:
    """``n`` uniform uint32: element i is bytes [4i, 4i + 4) of the stream, little-endian."""
    raw = os.urandom(4 * n) if seed is None else seeded_bytes(label, seed, 4 * n)
    return np.frombuffer(raw, dtype="<u4")


def new_seed() -> int:
    """A fresh 64-bit seed from the system's randomness."""
    return int.from_bytes(os.urandom(8), "little")
