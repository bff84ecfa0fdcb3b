"""``float16``: IEEE 754 binary16, round to nearest even: half the bytes of float32 for downloads.

Relative error at most 2^-11 for magnitudes of at least 2^-14 (binary16's smallest normal), absolute
error at most 2^-25 below it (subnormals). Magnitudes that would round to infinity (>= 65520) are
refused rather than sent as infinity. Decoding is exact (every binary16 value is a float32).
Deterministic, so biased in general; not linear (floating-point bits do not add in a ring).
"""

from __future__ import annotations

import numpy as np

from .base import Bound, Codec, float32_input
from .record import CodecError, Header, pack_header

__all__ = ["Float16Codec"]

_OVERFLOW = 65520.0  # the first magnitude that rounds to binary16 infinity


class Float16Codec(Codec):
    name, codec_id = "float16", 4
    bits = 16  # a coordinate's bits in the record

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        x = float32_input(array, self.name)
        if x.size and float(np.abs(x).max()) >= _OVERFLOW:
            raise CodecError(f"float16: a magnitude of {float(np.abs(x).max()):.6g} does not fit binary16 "
                             f"(< {_OVERFLOW})")
        return pack_header(self.codec_id, x) + x.astype("<f2").tobytes()

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        body = record[header.offset:]
        if header.dtype != np.float32 or len(body) != 2 * header.size:
            raise CodecError(f"float16 record of {header.dtype} {list(header.shape)} with {len(body)} body bytes")
        out = np.frombuffer(body, dtype="<f2").astype(np.float32).reshape(header.shape)
        if not np.isfinite(out).all():
            raise CodecError("float16 record holds NaN or infinity")
        return out

    def bound(self, array: np.ndarray) -> Bound:
        x = np.abs(np.asarray(array, dtype=np.float64))
        err = np.where(x >= 2.0 ** -14, x * 2.0 ** -11, 2.0 ** -25) if x.size else x
        return Bound(float(err.max()) if x.size else 0.0, float((err ** 2).sum()))
