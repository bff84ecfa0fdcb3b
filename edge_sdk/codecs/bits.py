"""b-bit codes <-> bytes: element i takes bits [i*b, (i+1)*b) of the body, least significant bit first.

This is numpy's ``packbits(..., bitorder="little")`` order for b = 1, and for b = 8 the codes are the
bytes themselves. The JavaScript SDK packs the same way (``src/codecs/bits.ts``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "unpack", "packed_size"]


def packed_size(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def pack(codes: np.ndarray, bits: int) -> bytes:
    """Pack unsigned codes below ``2**bits`` (1 <= bits <= 8)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return codes.tobytes()
    if 8 % bits == 0:
        per = 8 // bits
        padded = np.zeros(-(-codes.size // per) * per, dtype=np.uint8)
        padded[:codes.size] = codes
        shifts = (np.arange(per, dtype=np.uint8) * bits)
        return np.bitwise_or.reduce(padded.reshape(-1, per) << shifts, axis=1).astype(np.uint8).tobytes()
    planes = (codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def unpack(body: memoryview | bytes, count: int, bits: int) -> np.ndarray:
    """The first ``count`` codes of ``body`` (which holds exactly ``packed_size(count, bits)`` bytes)."""
    raw = np.frombuffer(body, dtype=np.uint8)
    if bits == 8:
        return raw[:count].copy()
    mask = np.uint8((1 << bits) - 1)
    if 8 % bits == 0:
        shifts = (np.arange(8 // bits, dtype=np.uint8) * bits)
        return ((raw[:, None] >> shifts) & mask).reshape(-1)[:count]
    planes = np.unpackbits(raw, bitorder="little", count=count * bits).reshape(count, bits)
    return (planes << np.arange(bits, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)
