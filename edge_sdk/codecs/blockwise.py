"""Scalar quantization on a grid: ``int8`` (nearest) for downloads, ``sr8``/``sr4``/``sr2`` (stochastic) for updates.

Per-block grid (``block`` > 0; default 256 elements): each block of the flattened array gets its
minimum ``lo`` and ``scale = (max - lo) / L`` with ``L = 2^bits - 1`` levels above ``lo``; an element
goes to ``q = round((x - lo) / scale)`` (``int8``: to nearest, ties to even) or ``q = floor((x - lo) /
scale + u)`` with ``u`` uniform in [0, 1) (stochastic rounding, Gupta et al. 2015; QSGD, Alistarh et
al. 2017): ``E[q] = (x - lo) / scale``, so ``E[decode] = x`` (unbiased), with variance at most
``scale^2 / 4`` per element. Nearest rounding errs by at most ``scale / 2``; stochastic by less than
``scale``.

Shared grid (``block = 0``, a ``scale`` every device is given): ``q = round(x / scale)`` clipped to
``[-M, M]``, ``M = 2^(bits-1) - 1``, stored as ``bits``-bit two's complement. Decoding is ``q * scale``
with the same scale for every device, so the sum of the devices' integer codes (lifted into secure
aggregation's ring, where masks cancel) decodes to the sum of their values: **linear**, the grid
codecs that compose with masking. It is unbiased only where ``|x| <= M * scale`` (clipping is not).

Every step is float32 arithmetic in a fixed order, ``u = r / 2^32`` for a uint32 ``r`` of the
randomness stream (:mod:`.stream`), and the floor in float64: the JavaScript SDK gives the same codes.
"""

from __future__ import annotations

import struct

import numpy as np

from .base import Bound, Codec, float32_input
from .bits import pack, packed_size, unpack
from .record import CodecError, Header, as_view, pack_header, parse_header, take
from .stream import uniform_u32

__all__ = ["BlockwiseCodec", "linear_codes", "DEFAULT_BLOCK"]

DEFAULT_BLOCK = 256
_PARAMS = struct.Struct("<BBHI")  # bits, rounding (0 nearest, 1 stochastic), zero, block (0: shared scale)
_SLACK = 2.0 ** -21  # float32 rounding of the steps, relative to the block's range and magnitude


def _round(t: np.ndarray, stochastic: bool, seed: int | None, n: int) -> np.ndarray:
    """Nearest (ties to even) or stochastic rounding of float32 ``t``, as float64 integers."""
    if not stochastic:
        return np.rint(t).astype(np.float64)
    u = np.zeros(t.size, dtype=np.float64)
    u[:n] = uniform_u32(n, seed) * 2.0 ** -32
    return np.floor(t.astype(np.float64) + u.reshape(t.shape))


class BlockwiseCodec(Codec):
    codec_id = 5

    def __init__(self, bits: int, stochastic: bool, block: int = DEFAULT_BLOCK, scale: float | None = None,
                 name: str = "") -> None:
        if bits not in (1, 2, 4, 8) or (scale is not None and bits == 1):
            raise ValueError(f"grid bits are 1, 2, 4 or 8 (2, 4 or 8 with a shared scale), got {bits}")
        if scale is not None and not (np.isfinite(scale) and np.float32(scale) > 0):
            raise ValueError(f"a shared scale is a positive float32, got {scale}")
        if scale is None and not 1 <= block < 1 << 32:
            raise ValueError(f"block is 1 to 2^32 - 1 elements, got {block}")
        self.bits, self.stochastic = bits, stochastic
        self.block, self.scale = (0, np.float32(scale)) if scale is not None else (block, None)
        self.name = name or f"{'sr' if stochastic else 'int'}{bits}{'' if scale is None else '-shared'}"
        self.unbiased = stochastic and scale is None
        self.linear = scale is not None

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        x = float32_input(array, self.name)
        head = pack_header(self.codec_id, x) + _PARAMS.pack(self.bits, int(self.stochastic), 0, self.block)
        flat = x.reshape(-1)
        if self.scale is not None:
            m = float(2 ** (self.bits - 1) - 1)
            q = _round(np.clip(flat / self.scale, -m, m), self.stochastic, seed, flat.size)
            codes = np.clip(q, -m, m).astype(np.int64) & ((1 << self.bits) - 1)
            return head + struct.pack("<f", self.scale) + pack(codes, self.bits)
        lo, scale, t = self._grid(flat)
        levels = float(2 ** self.bits - 1)
        q = np.clip(_round(t, self.stochastic, seed, flat.size), 0.0, levels).reshape(-1)[:flat.size]
        scales = np.stack((lo, scale), axis=1).astype("<f4").tobytes()
        return head + scales + pack(q.astype(np.uint8), self.bits)

    def _grid(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per block: ``lo``, ``scale`` and ``t = (x - lo) / scale`` (float32; 0 where the block is constant)."""
        blocks = -(-flat.size // self.block)
        width = self.block if blocks > 1 else flat.size
        padded = np.pad(flat, (0, blocks * width - flat.size), mode="edge")
        grid = padded.reshape(blocks, width)
        if not flat.size:
            return np.zeros(0, np.float32), np.zeros(0, np.float32), grid
        lo, hi = grid.min(axis=1), grid.max(axis=1)
        scale = (hi - lo) / np.float32(2 ** self.bits - 1)
        if not np.isfinite(scale).all():
            raise CodecError(f"{self.name}: a block's range overflows float32")
        safe = np.where(scale > 0, scale, np.float32(1))
        t = np.where(scale[:, None] > 0, (grid - lo[:, None]) / safe[:, None], np.float32(0))
        return lo, scale, t

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        bits, _, zero, block = _PARAMS.unpack(take(record, header.offset, _PARAMS.size, "grid parameters"))
        if bits not in (1, 2, 4, 8) or zero or header.dtype != np.float32:
            raise CodecError(f"grid record with {bits} bits of {header.dtype}")
        n, at = header.size, header.offset + _PARAMS.size
        blocks = -(-n // block) if block else 1
        body = take(record, at, 8 * blocks if block else 4, "scales")
        codes = record[at + len(body):]
        if len(codes) != packed_size(n, bits):
            raise CodecError(f"grid record holds {len(codes)} code bytes, {n} codes of {bits} bits need "
                             f"{packed_size(n, bits)}")
        q = unpack(codes, n, bits)
        if not block:
            (scale,) = struct.unpack("<f", body)
            signed = q.astype(np.int64) - ((q >> (bits - 1)) & 1).astype(np.int64) * (1 << bits)
            out = signed.astype(np.float32) * np.float32(scale)
        else:
            pairs = np.frombuffer(body, dtype="<f4").reshape(blocks, 2)
            counts = np.full(blocks, block, dtype=np.int64)
            counts[-1:] = n - (blocks - 1) * block
            out = q.astype(np.float32) * np.repeat(pairs[:, 1], counts) + np.repeat(pairs[:, 0], counts)
        if not np.isfinite(out).all():
            raise CodecError("grid record decodes to NaN or infinity")
        return out.reshape(header.shape)

    def bound(self, array: np.ndarray) -> Bound:
        flat = np.asarray(array, dtype=np.float32).reshape(-1)
        if self.scale is not None:
            m = float(2 ** (self.bits - 1) - 1) * float(self.scale)
            step = float(self.scale) * (1.0 if self.stochastic else 0.5) + _SLACK * m
            over = float(np.maximum(np.abs(flat.astype(np.float64)) - m, 0).max()) if flat.size else 0.0
            var = float(self.scale) ** 2 / 4 if self.stochastic else step ** 2
            return Bound(max(step, over + step), flat.size * var if over == 0 else None)
        lo, scale, _ = self._grid(flat)
        span = np.maximum(np.abs(lo), np.abs(lo + scale * np.float32(2 ** self.bits - 1))).astype(np.float64)
        slack = _SLACK * (span + scale.astype(np.float64) * (2 ** self.bits - 1))
        step = scale.astype(np.float64) * (1.0 if self.stochastic else 0.5) + slack
        counts = np.diff(np.minimum(np.arange(len(scale) + 1) * self.block, flat.size))
        var = scale.astype(np.float64) ** 2 / 4 + slack ** 2 if self.stochastic else step ** 2
        return Bound(float(step.max()) if flat.size else 0.0, float((counts * var).sum()))


def linear_codes(record: bytes | memoryview) -> tuple[np.ndarray, float]:
    """The signed integer codes (int64, the record's shape) and shared scale of a shared-grid record:
    what secure aggregation masks and sums; ``sum_of_codes * scale`` is the sum of the values."""
    view = as_view(record)
    header = parse_header(view)
    if header.codec_id != BlockwiseCodec.codec_id:
        raise CodecError("not a grid record")
    bits, _, _, block = _PARAMS.unpack(take(view, header.offset, _PARAMS.size, "grid parameters"))
    if block or bits not in (2, 4, 8):
        raise CodecError("not a shared-grid record: per-block scales do not add across devices")
    (scale,) = struct.unpack("<f", take(view, header.offset + _PARAMS.size, 4, "scale"))
    codes = view[header.offset + _PARAMS.size + 4:]
    if len(codes) != packed_size(header.size, bits):
        raise CodecError("grid record's codes do not match its shape")
    q = unpack(codes, header.size, bits).astype(np.int64)
    return (q - ((q >> (bits - 1)) & 1) * (1 << bits)).reshape(header.shape), float(scale)
