"""``eden1``..``eden4``: a randomized Hadamard rotation, then b bits per coordinate with EDEN's unbiased scale.

EDEN (Vargaftik et al. 2022, "EDEN: Communication-Efficient and Robust Distributed Mean Estimation
for Federated Learning", Algorithm 1; b = 1 is DRIVE, Vargaftik et al. 2021, with its unbiased scale):
rotate ``x`` (d coordinates) to ``y = R x``; after the rotation each coordinate of ``sqrt(d) y / ||x||``
is close to a standard normal, so it goes to the nearest of the ``2^b`` Lloyd-Max centroids of N(0, 1)
(``q``, deterministic); the receiver returns ``x_hat = S R^T q`` with ``S = ||x||^2 / <y, q>``. That
scale makes ``x_hat`` unbiased over the rotation (EDEN Theorem 2.1, for a uniformly random rotation),
and its normalized error ``E ||x_hat - x||^2 / ||x||^2`` tends, as d grows, to
``sigma_b^2 / (1 - sigma_b^2)`` with ``sigma_b^2`` the quantizer's distortion on N(0, 1) (EDEN Section 4):
0.571 (b = 1), 0.133, 0.0358, 0.00959 (b = 4) -- the ``NMSE`` table below.

The rotation is two randomized Hadamard transforms, ``R = (H D2 / sqrt(d)) (H D1 / sqrt(d))``, with
independent random sign diagonals D1, D2. The papers' implementations use one (DRIVE Section 5, EDEN
Section 6), which is not a uniform rotation: on sparse inputs (10 non-zeros of 1024) one pass left a
bias of 0.20 of ``||x||`` at 1 bit in the mean of 3,000 draws (15 times the sampling noise), two
passes none beyond the noise; the error is then the table's on every input measured
(tests/test_codecs.py holds both).

Wire details (docs/protocol.md, "Codecs"): the flattened array is cut into segments of ``segment``
coordinates (a power of two, default 2^16), the last one zero-padded to the next power of two. The
signs are the bits of SHAKE128("edgetrain.codecs.eden.v1" || u64le(seed)), least significant bit
first, a set bit meaning -1: the first ``T`` bits (``T`` = all padded coordinates, in order) are D1,
the next ``T`` are D2. Each segment sends its float32 ``S`` and its padded coordinates' codes. Every
device draws its own seed (its errors are then independent and average out across devices, EDEN
Section 2) and the record carries it. Not linear: each record has its own rotation and scale.

Memory: every segment is rotated, quantized and restored on its own (Algorithm 1 works per vector),
so encoding and decoding walk the segments a bounded slice at a time (:data:`SLICE`, at least one
segment), and their workspace -- the rotation's float32 copies, the float64 norms and dot products,
the unpacked signs and codes, about :data:`WORKSPACE_PER_COORD` bytes a coordinate -- stays
``WORKSPACE_PER_COORD * max(SLICE, segment)`` (:func:`workspace_bytes`) whatever the tensor's size,
beside the record and the tensor themselves and the packed sign stream (2 bits a coordinate). The
output is bit-identical to rotating every segment at once: rows never mix.
"""

from __future__ import annotations

import struct

import numpy as np

from .base import Bound, Codec, float32_input
from .bits import pack, packed_size, unpack
from .hadamard import rotate, tree_sum, unrotate
from .record import CodecError, Header, pack_header, take
from .stream import EDEN_LABEL, check_seed, new_seed, seeded_bytes

__all__ = ["EdenCodec", "CENTROIDS", "NMSE", "DEFAULT_SEGMENT", "SLICE", "WORKSPACE_PER_COORD", "workspace_bytes"]

#: Lloyd-Max centroids of the standard normal (the positive half; the table is symmetric), computed by
#: Lloyd's iteration in float64 (tests/vectors/make_codec_vectors.py checks the centroid condition).
_HALF = {
    1: (0.7978845608028654,),
    2: (0.4527800346364921, 1.510417608499096),
    3: (0.24509417894422147, 0.7560052812058766, 1.3439092785049995, 2.1519457045369856),
    4: (0.12839502985114698, 0.388048299490291, 0.6567591185324643, 0.9423404564869607,
        1.2562311973471791, 1.6180463860218819, 2.069017226531385, 2.7325895709951578),
}
CENTROIDS: dict[int, np.ndarray] = {b: np.array([-c for c in reversed(h)] + list(h)) for b, h in _HALF.items()}
#: Decision thresholds: midpoints of neighbouring centroids, in float64.
_THRESHOLDS = {b: (c[1:] + c[:-1]) / 2 for b, c in CENTROIDS.items()}
#: The asymptotic normalized error sigma_b^2 / (1 - sigma_b^2) of unbiased EDEN at b bits.
NMSE = {1: 0.5707963267948963, 2: 0.13312116871518942, 3: 0.03578401849968207, 4: 0.00959214303599245}
DEFAULT_SEGMENT = 1 << 16
#: Coordinates encoded or decoded at once (whole segments; one segment where a segment is longer).
SLICE = 1 << 16
#: Peak bytes of workspace per coordinate of a slice: float32 copies of the rotation, float64 products,
#: codes, unpacked signs. tracemalloc measured 31-32 on encode and 29 on decode (tensors of 2^18 to 2^22
#: coordinates, 2 and 4 bits); tests/test_codecs.py holds the bound.
WORKSPACE_PER_COORD = 40


def workspace_bytes(segment: int = DEFAULT_SEGMENT) -> int:
    """The most workspace an EDEN encode or decode of segment ``segment`` takes at once (any tensor size)."""
    return WORKSPACE_PER_COORD * max(SLICE, segment)
_PARAMS = struct.Struct("<B3xIQ")  # bits, segment, seed


def segments(n: int, segment: int) -> tuple[int, int, int]:
    """(whole segments, length of the last partial one, its padded length) for ``n`` coordinates."""
    whole, rest = divmod(n, segment)
    return whole, rest, (1 << (rest - 1).bit_length()) if rest else 0


def signs(seed: int, whole: int, segment: int, padded: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The +-1 float32 signs of the two rotation passes: for each, (whole segments as rows, padded last one)."""
    total = whole * segment + padded
    bits = np.unpackbits(np.frombuffer(seeded_bytes(EDEN_LABEL, seed, (2 * total + 7) // 8), np.uint8),
                         bitorder="little", count=2 * total)
    s = np.float32(1) - np.float32(2) * bits.astype(np.float32)
    return tuple((p[:whole * segment].reshape(whole, segment), p[whole * segment:].reshape(1, padded))
                 for p in (s[:total], s[total:]))


def _quantize(x: np.ndarray, sg: tuple[np.ndarray, np.ndarray], bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes (uint8, per row) and float32 scales ``S`` of rows ``x`` (float32, zero-padded); ``sg``: the
    two passes' signs."""
    d = x.shape[1]
    y = rotate(rotate(x, sg[0]), sg[1])
    norm2 = tree_sum(x.astype(np.float64) ** 2)
    live = norm2 > 0
    inv = np.sqrt(np.float64(d)) / np.sqrt(np.where(live, norm2, 1.0))
    codes = np.searchsorted(_THRESHOLDS[bits], y.astype(np.float64) * inv[:, None], side="right").astype(np.uint8)
    dot = tree_sum(y.astype(np.float64) * CENTROIDS[bits][codes])
    scale = np.where(live & (dot > 0), norm2 / np.where(dot > 0, dot, 1.0), 0.0).astype(np.float32)
    return codes, scale


def _restore(codes: np.ndarray, scale: np.ndarray, sg: tuple[np.ndarray, np.ndarray], bits: int) -> np.ndarray:
    table = (scale.astype(np.float64)[:, None] * CENTROIDS[bits][None, :]).astype(np.float32)
    values = np.take_along_axis(table, codes.astype(np.intp), axis=1)
    return unrotate(unrotate(values, sg[1]), sg[0])


def _slices(whole: int, segment: int) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) of the whole segments, :data:`SLICE` coordinates (at least one row) each.
    Rows per slice are a power of two; with segments under 8 coordinates they are a multiple of 8,
    so that every slice's codes start on a byte of the packed body."""
    rows = max(1, SLICE // segment)
    return [(r0, min(r0 + rows, whole)) for r0 in range(0, whole, rows)]


class _SignStream:
    """The two passes' signs of a record, read a slice at a time from the packed seeded stream
    (``2 T`` bits: D1 for the ``T`` padded coordinates, then D2), as :func:`signs` gives them whole."""

    def __init__(self, seed: int, total: int) -> None:
        self.total = total
        self.bits = np.frombuffer(seeded_bytes(EDEN_LABEL, seed, (2 * total + 7) // 8), np.uint8)

    def _signs(self, start: int, count: int) -> np.ndarray:
        first, skip = divmod(start, 8)
        raw = self.bits[first:(start + count + 7) // 8]
        bits = np.unpackbits(raw, bitorder="little", count=skip + count)[skip:]
        return np.float32(1) - np.float32(2) * bits.astype(np.float32)

    def rows(self, start: int, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The signs of ``rows`` rows of ``width`` padded coordinates from coordinate ``start``, per pass."""
        n = rows * width
        return (self._signs(start, n).reshape(rows, width), self._signs(self.total + start, n).reshape(rows, width))


def _codes(body: memoryview, start: int, count: int, bits: int) -> np.ndarray:
    """Codes [start, start + count) of a packed body: unpacked from the byte that code ``8 * (start // 8)``
    begins (every eighth code starts on a byte whatever ``bits``)."""
    aligned = start - start % 8
    first = aligned * bits // 8
    n = start + count - aligned
    return unpack(body[first:first + packed_size(n, bits)], n, bits)[start - aligned:]


class _Packer:
    """Codes packed as they come, a slice at a time, into ``body``, as :func:`pack` packs all of them:
    whole groups of 8 codes (``bits`` bytes each) are packed, the few left over wait for the next slice."""

    def __init__(self, bits: int, body: memoryview) -> None:
        self.bits, self.body, self.at, self.pending = bits, body, 0, np.zeros(0, dtype=np.uint8)

    def _write(self, codes: np.ndarray) -> None:
        packed = pack(codes, self.bits)
        self.body[self.at:self.at + len(packed)] = packed
        self.at += len(packed)

    def add(self, codes: np.ndarray) -> None:
        codes = np.concatenate((self.pending, codes.reshape(-1))) if self.pending.size else codes.reshape(-1)
        cut = codes.size - codes.size % 8
        self._write(codes[:cut])
        self.pending = codes[cut:].copy()

    def done(self) -> None:
        self._write(self.pending)
        if self.at != len(self.body):
            raise AssertionError(f"eden packed {self.at} code bytes into a body of {len(self.body)}")
        self.body.release()


class EdenCodec(Codec):
    codec_id, unbiased = 6, True

    def __init__(self, bits: int, segment: int = DEFAULT_SEGMENT) -> None:
        if bits not in CENTROIDS:
            raise ValueError(f"eden bits are 1-4, got {bits}")
        if segment < 1 or segment & (segment - 1) or segment > 1 << 24:
            raise ValueError(f"eden segment is a power of two up to 2^24, got {segment}")
        self.bits, self.segment, self.name = bits, segment, f"eden{bits}"

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        x = float32_input(array, self.name).reshape(-1)
        seed = new_seed() if seed is None else check_seed(seed)
        seg = self.segment
        whole, rest, padded = segments(x.size, seg)
        count, total = whole + (1 if rest else 0), whole * seg + padded
        head = pack_header(self.codec_id, array) + _PARAMS.pack(self.bits, seg, seed)
        out = bytearray(len(head) + 4 * count + packed_size(total, self.bits))  # the record, filled a slice at a time
        out[:len(head)] = head
        scales = np.frombuffer(out, dtype="<f4", count=count, offset=len(head))
        stream, packer = _SignStream(seed, total), _Packer(self.bits, memoryview(out)[len(head) + 4 * count:])
        for r0, r1 in _slices(whole, seg):
            codes, scales[r0:r1] = _quantize(x[r0 * seg:r1 * seg].reshape(r1 - r0, seg),
                                             stream.rows(r0 * seg, r1 - r0, seg), self.bits)
            packer.add(codes)
        if rest:
            last = np.zeros((1, padded), dtype=np.float32)
            last[0, :rest] = x[whole * seg:]
            codes, scales[whole:] = _quantize(last, stream.rows(whole * seg, 1, padded), self.bits)
            packer.add(codes)
        packer.done()
        del scales  # the buffer's only export: bytes() may copy it now
        return bytes(out)

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        bits, segment, seed = _PARAMS.unpack(take(record, header.offset, _PARAMS.size, "eden parameters"))
        if bits not in CENTROIDS or segment < 1 or segment & (segment - 1) or segment > 1 << 24 \
                or header.dtype != np.float32:
            raise CodecError(f"eden record with {bits} bits, segment {segment}, dtype {header.dtype}")
        whole, rest, padded = segments(header.size, segment)
        count, at = whole + (1 if rest else 0), header.offset + _PARAMS.size
        scales = np.frombuffer(take(record, at, 4 * count, "scales"), dtype="<f4")
        total = whole * segment + padded
        body = record[at + 4 * count:]
        if len(body) != packed_size(total, bits):
            raise CodecError(f"eden record holds {len(body)} code bytes, {total} codes need {packed_size(total, bits)}")
        if not np.isfinite(scales).all():
            raise CodecError("eden record holds a non-finite scale")
        stream, out = _SignStream(seed, total), np.empty(header.size, dtype=np.float32)
        for r0, r1 in _slices(whole, segment):
            codes = _codes(body, r0 * segment, (r1 - r0) * segment, bits).reshape(r1 - r0, segment)
            out[r0 * segment:r1 * segment] = _restore(codes, scales[r0:r1], stream.rows(r0 * segment, r1 - r0, segment),
                                                      bits).reshape(-1)
            if not np.isfinite(out[r0 * segment:r1 * segment]).all():
                raise CodecError("eden record decodes to NaN or infinity")
        if rest:
            codes = _codes(body, whole * segment, padded, bits).reshape(1, padded)
            out[whole * segment:] = _restore(codes, scales[whole:], stream.rows(whole * segment, 1, padded),
                                             bits).reshape(-1)[:rest]
            if not np.isfinite(out[whole * segment:]).all():
                raise CodecError("eden record decodes to NaN or infinity")
        return out.reshape(header.shape)

    def workspace(self) -> tuple[int, int]:
        """One slice's rotation (:func:`workspace_bytes`), and the packed signs: 2 bits a value."""
        return workspace_bytes(self.segment), 2

    def bound(self, array: np.ndarray) -> Bound:
        """No elementwise guarantee; ``E ||x_hat - x||^2`` is ``NMSE`` times each segment's ``||x_j||^2 n_j / d_j``
        (the error spreads evenly over a segment's ``d_j`` padded coordinates, of which ``n_j`` are kept).
        A statement about large segments: the tests hold it within 10% on segments of 2^10 and more."""
        x = np.asarray(array, dtype=np.float64).reshape(-1)
        whole, rest, padded = segments(x.size, self.segment)
        energy = float((x[:whole * self.segment] ** 2).sum())
        if rest:
            energy += float((x[whole * self.segment:] ** 2).sum()) * rest / padded
        return Bound(None, NMSE[self.bits] * energy)
