"""Fixed point: a block's float update becomes ring elements whose sum over the cohort cannot wrap.

A device encodes one block x (a float vector) with its aggregation weight w in [0, 1]:

1. clip to the L2 bound C: x' = x * min(1, C / ||x||_2), so every coordinate |x'_j| <= C;
2. scale by the weight and by 2^f: y_j = (x'_j * w) * 2^f, and append the weight coordinate
   y_d = (w * C) * 2^f (the weight travels as one more masked value, scaled by C so that every
   coordinate has the same bound);
3. round stochastically: q_j = floor(y_j) + [u_j < y_j - floor(y_j)], with u_j uniform in [0, 1)
   from an AES-256-CTR stream keyed by 32 fresh random bytes (``os.urandom``; never numpy's
   generator). Then E[q_j] = y_j and |q_j - y_j| < 1;
4. reduce modulo 2^b: the word is q_j mod 2^b (two's complement for q_j < 0).

Ring size: every device's |q_j| <= Q = ceil(C * 2^f), so the sum over at most n devices lies in
[-n Q, n Q]. With b = bit_length(n Q) + 1 we have n Q <= 2^(b-1) - 1, and the centered lift of
the sum mod 2^b (a word >= 2^(b-1) stands for word - 2^b) is the exact integer sum: no wrap.
b <= 32 (uint32 words in both SDKs); :meth:`FixedPoint.plan` picks the largest f that fits.

Distributed noise (Kairouz, Liu, Steinke 2021, Algorithm 1, and Section 4's modular clipping): with
distributed DP the devices' discrete Gaussian shares are added to the value coordinates too, so the
ring also holds the noise of the sum, whose standard deviation over the whole cohort is ``noise``
(update units; ``noise * 2^f`` ring units). The ring leaves TAIL = 10 such standard deviations
beside n Q: b = bit_length(n Q + ceil(10 noise 2^f)) + 1. A sum of discrete Gaussians is
sub-Gaussian with the same variance proxy (Kairouz et al., Lemma 17 / Proposition 14), so a
coordinate's noise exceeds 10 standard deviations with probability at most 2 exp(-50) < 4e-22;
over a model of d coordinates the sum wraps with probability at most d * 4e-22.

Error bound: for each coordinate the decoded sum (lifted sum / 2^f) differs from the float sum
of the devices' w_i x'_i by less than n * 2^-f (each rounding moves less than one unit of
2^-f), plus float64 rounding of the scaling (below C * 2^-50 per device); the rounding is
unbiased, with standard deviation at most sqrt(n) / 2 * 2^-f. The weight sum's bound is the same
divided by C. Docs line: "decode(sum of encodes) is within n 2^-f of the sum of the clipped,
weighted updates, per coordinate; the ring is Z_{2^b} with b = bit_length(n ceil(C 2^f)) + 1".

Compressed rounds (:class:`Compression`, docs/security.md "Compressed secure uploads"): the ring
above fits 32-bit words and the sum of float updates to within n 2^-f, so a masked upload is as large
as the float32 update. A compressed round bounds each coordinate by B instead of C (the block's
vector is clipped to L2 norm C first, as above) and rounds it to q-bit values: a device's coordinate
becomes an integer of [-M, M], M = 2^(q-1) - 1, so the cohort's sum fits b = bit_length(n M) + 1
bits (the same no-wrap argument with Q = M), and the words travel packed at b bits
(:func:`pack_words`). B is k C / sqrt(d) rounded up to M 2^-f (f the largest with M 2^-f >= k C /
sqrt(d), so the step is 2^-f, a power of two, as in the float ring): a block whose norm C is spread
evenly over its d coordinates has coordinates of magnitude C / sqrt(d), and k = :data:`SPREAD`
standard deviations of them stay unclamped. Clamping a larger coordinate to B biases it (the
error bound above then holds for the clamped values); the stochastic rounding stays unbiased, with
standard deviation at most 2^-f / 2 per coordinate and device. The weight coordinate is w B 2^f
(w M levels). Both sides compute B and f from (n, q, k, C, d) with exact operations only (a
square root, a division and products by powers of two), so the SDKs agree on them.

A device encodes a block a slice at a time (:class:`BlockEncoder`, after one pass for the norm,
:func:`l2_norm`): each coordinate's word depends only on its value, the block's clip factor and its
place in the rounding stream, so the slices' words are :meth:`FixedPoint.encode`'s, and the float64
temporaries are a slice's, not the block's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .keys import KEY_BYTES
from .labels import SecAggError
from .masks import MAX_RING_BITS, MAX_WORDS, KeyStream, ring_mask

__all__ = ["SLICE_WORDS", "SPREAD", "BlockEncoder", "Compression", "Decoded", "FixedPoint", "l2_norm", "pack_words",
           "packed_bytes", "ring_bits_for", "slices", "unpack_words"]

MAX_FRAC_BITS = 60
MAX_COHORT = 2**20
#: Standard deviations of the summed noise the ring holds beside the values (module docstring).
NOISE_TAIL = 10.0
#: Coordinates a device encodes and masks at once: its float64 temporaries are 512 KiB each.
SLICE_WORDS = 1 << 16
#: A compressed round's per-coordinate bound in standard deviations of an evenly spread block, k in
#: B = k C / sqrt(d) (module docstring; bench/secure_bytes.py measured the default).
SPREAD = 4.0
#: The most bits a compressed round's devices quantise a coordinate to (q).
MAX_VALUE_BITS = 24


def slices(parts: Sequence[np.ndarray], size: int = SLICE_WORDS) -> Iterator[np.ndarray]:
    """The concatenation of the flat arrays ``parts``, in views of at most ``size`` values (no copy)."""
    for part in parts:
        flat = np.asarray(part).ravel()
        for at in range(0, flat.size, size):
            yield flat[at:at + size]


def l2_norm(parts: Iterable[np.ndarray]) -> float:
    """The L2 norm, in float64, of the concatenation of ``parts`` (refused with NaN or infinite values)."""
    total = 0.0
    for piece in parts:
        x = np.asarray(piece, dtype=np.float64)
        if not np.isfinite(x).all():
            raise SecAggError("the update has NaN or infinite values")
        total += float(np.dot(x, x))
    return math.sqrt(total)


def ring_bits_for(cohort: int, clip: float, frac_bits: int, noise: float = 0.0) -> int:
    """The smallest b such that the sum of ``cohort`` encoded values, each coordinate at most ``clip``
    (or a compressed round's bound B), plus noise of standard deviation ``noise`` (update units) up
    to :data:`NOISE_TAIL` deviations, cannot wrap in Z_{2^b}."""
    room = math.ceil(NOISE_TAIL * noise * 2.0**frac_bits)
    return (cohort * math.ceil(clip * 2.0**frac_bits) + room).bit_length() + 1


def packed_bytes(count: int, bits: int) -> int:
    """The bytes of ``count`` words packed at ``bits`` bits each (the last byte's high bits zero)."""
    return (count * bits + 7) // 8


def pack_words(words: np.ndarray, bits: int) -> np.ndarray:
    """``words`` (uint32, each below 2^bits) as a little-endian bit stream: word i holds bits
    [i b, (i + 1) b) of the stream, and stream bit j is bit j mod 8 of byte j // 8 (uint8 array of
    :func:`packed_bytes`). Done a slice at a time: a slice of :data:`SLICE_WORDS` words is whole bytes."""
    ring_mask(bits)
    flat = np.asarray(words, dtype=np.uint32).ravel()
    shifts = np.arange(bits, dtype=np.uint32)
    out = np.empty(packed_bytes(flat.size, bits), dtype=np.uint8)
    step = SLICE_WORDS * bits // 8
    for i, at in enumerate(range(0, flat.size, SLICE_WORDS)):
        piece = flat[at:at + SLICE_WORDS]
        stream = ((piece[:, None] >> shifts) & np.uint32(1)).astype(np.uint8)
        packed = np.packbits(stream.ravel(), bitorder="little")
        out[i * step:i * step + packed.size] = packed
    return out


def unpack_words(data: np.ndarray, count: int, bits: int) -> np.ndarray:
    """The ``count`` words of :func:`pack_words`'s stream ``data`` (uint32); refused unless ``data`` is
    exactly :func:`packed_bytes` long with its padding bits zero."""
    ring_mask(bits)
    raw = np.asarray(data)
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != packed_bytes(count, bits):
        raise SecAggError(f"{count} words packed at {bits} bits are {packed_bytes(count, bits)} bytes (uint8), "
                          f"got {raw.size} of {raw.dtype}")
    tail = count * bits % 8
    if tail and int(raw[-1]) >> tail:
        raise SecAggError("the packed words' padding bits are not zero")
    weights = (np.uint32(1) << np.arange(bits, dtype=np.uint32))
    out = np.empty(count, dtype=np.uint32)
    step = SLICE_WORDS * bits // 8
    for i, at in enumerate(range(0, count, SLICE_WORDS)):
        n = min(SLICE_WORDS, count - at)
        stream = np.unpackbits(raw[i * step:i * step + packed_bytes(n, bits)], count=n * bits, bitorder="little")
        out[at:at + n] = stream.reshape(n, bits).astype(np.uint32) @ weights
    return out


@dataclass(frozen=True)
class Compression:
    """A compressed round (module docstring): each device rounds a coordinate to ``value_bits`` (q)
    bits, M = 2^(q-1) - 1 levels a side, within the bound B = k C / sqrt(d) rounded up to M 2^-f,
    ``spread`` k; the ring is b = bit_length(n M) + 1 bits and the upload is packed at b bits."""

    value_bits: int
    spread: float = SPREAD

    def __post_init__(self) -> None:
        if type(self.value_bits) is not int or not 2 <= self.value_bits <= MAX_VALUE_BITS:
            raise SecAggError(f"value bits must be an integer in [2, {MAX_VALUE_BITS}], got {self.value_bits!r}")
        if not (isinstance(self.spread, (int, float)) and math.isfinite(self.spread) and self.spread > 0):
            raise SecAggError(f"the spread must be finite and > 0, got {self.spread!r}")

    def fields(self) -> dict[str, int | float]:
        """The fields of ``SecAggPeers`` that tell the devices this compression."""
        return {"value_bits": self.value_bits, "value_spread": float(self.spread)}

    @property
    def levels(self) -> int:
        """M: a device's coordinate is an integer of [-M, M]."""
        return 2 ** (self.value_bits - 1) - 1

    def ring_bits(self, cohort: int) -> int:
        """b: the sum of ``cohort`` devices' values cannot wrap in Z_{2^b}."""
        return (cohort * self.levels).bit_length() + 1

    def fitting(self, cohort: int) -> Compression:
        """This compression, or for a cohort whose sum of q-bit values would not fit 32-bit words the
        largest q that does (the server sends the devices the q it chose)."""
        q = self.value_bits
        while q > 2 and self.__class__(q, self.spread).ring_bits(cohort) > MAX_RING_BITS:
            q -= 1
        return self if q == self.value_bits else self.__class__(q, self.spread)

    def fixed(self, cohort: int, clip: float, dimension: int) -> FixedPoint:
        """The fixed point of a block of ``dimension`` coordinates: the largest f (at most
        :data:`MAX_FRAC_BITS`) with M 2^-f >= k C / sqrt(d), and B = min(C, M 2^-f)."""
        if type(dimension) is not int or dimension < 1:
            raise SecAggError(f"a block has at least one coordinate, got {dimension!r}")
        if self.ring_bits(cohort) > MAX_RING_BITS:
            raise SecAggError(f"{cohort} devices' {self.value_bits}-bit values need a ring of "
                              f"{self.ring_bits(cohort)} bits, more than {MAX_RING_BITS}")
        target = self.spread * clip / math.sqrt(dimension)
        f = 0
        while f < MAX_FRAC_BITS and self.levels * 2.0 ** -(f + 1) >= target:
            f += 1
        bound = min(clip, self.levels * 2.0**-f)
        return FixedPoint(clip, f, self.ring_bits(cohort), cohort, bound=bound)


class Decoded(NamedTuple):
    """A block's decoded sum: ``values`` (sum of w_i x'_i, float64) and ``weight`` (sum of w_i)."""

    values: np.ndarray
    weight: float


@dataclass(frozen=True)
class FixedPoint:
    """The round's encoding: L2 bound ``clip`` (C), ``frac_bits`` (f), ``ring_bits`` (b) and the
    largest number of devices whose blocks are summed, ``cohort`` (n); ``noise``: the standard
    deviation (update units) of the distributed noise the ring must hold, summed over the cohort;
    ``bound``: a compressed round's per-coordinate bound B (:class:`Compression`; 0: C)."""

    clip: float
    frac_bits: int
    ring_bits: int
    cohort: int
    noise: float = 0.0
    bound: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise SecAggError(f"clip must be finite and > 0, got {self.clip!r}")
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= MAX_FRAC_BITS:
            raise SecAggError(f"frac_bits must be an integer in [0, {MAX_FRAC_BITS}], got {self.frac_bits!r}")
        if not isinstance(self.cohort, int) or not 1 <= self.cohort <= MAX_COHORT:
            raise SecAggError(f"cohort must be an integer in [1, {MAX_COHORT}], got {self.cohort!r}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise SecAggError(f"noise must be finite and >= 0, got {self.noise!r}")
        if not (math.isfinite(self.bound) and 0 <= self.bound <= self.clip):
            raise SecAggError(f"a coordinate bound must be in [0, clip], got {self.bound!r}")
        if self.bound and self.noise:
            raise SecAggError("distributed noise needs the float ring: a compressed round's ring has no room "
                              "for the noise's tail")
        needed = ring_bits_for(self.cohort, self.limit, self.frac_bits, self.noise)
        if needed > MAX_RING_BITS:
            raise SecAggError(f"{self.cohort} devices at clip {self.clip} and 2^{self.frac_bits} need a ring of "
                              f"{needed} bits, more than {MAX_RING_BITS}: lower frac_bits")
        ring_mask(self.ring_bits)
        if self.ring_bits < needed:
            raise SecAggError(f"{self.cohort} devices at clip {self.clip} and 2^{self.frac_bits} need a ring of "
                              f"{needed} bits, not {self.ring_bits}: the sum could wrap")

    @classmethod
    def plan(cls, cohort: int, clip: float, frac_bits: int | None = None, noise: float = 0.0) -> FixedPoint:
        """The smallest ring for ``frac_bits``, or (None) the largest f whose ring fits 32 bits,
        with room for summed noise of standard deviation ``noise`` (update units)."""
        if frac_bits is None:
            fitting = [f for f in range(MAX_FRAC_BITS + 1)
                       if ring_bits_for(cohort, clip, f, noise) <= MAX_RING_BITS]
            if not fitting:
                raise SecAggError(f"{cohort} devices at clip {clip} do not fit a 32-bit ring even at 2^0")
            frac_bits = fitting[-1]
        return cls(clip, frac_bits, ring_bits_for(cohort, clip, frac_bits, noise), cohort, noise)

    @property
    def limit(self) -> float:
        """The bound of every coordinate, B (a compressed round's) or C."""
        return self.bound or self.clip

    @property
    def packed(self) -> bool:
        """Whether the round's words travel packed at b bits (a compressed round's) or as int32 words."""
        return self.bound > 0

    @property
    def error_bound(self) -> float:
        """The most a decoded coordinate of a sum of ``cohort`` blocks differs from the float sum."""
        return self.cohort * (2.0**-self.frac_bits + self.clip * 2.0**-50)

    @property
    def weight_error_bound(self) -> float:
        """The most the decoded weight sum differs from the sum of the weights."""
        return self.error_bound / self.limit

    def encode(self, update: np.ndarray, weight: float, rounding_seed: bytes | None = None) -> np.ndarray:
        """One block's words (uint32, values in [0, 2^b)): ``update`` clipped, weighted, scaled and
        rounded, then the weight coordinate. ``rounding_seed`` is for test vectors only."""
        x = np.asarray(update, dtype=np.float64).ravel()
        if x.size + 1 > MAX_WORDS:
            raise SecAggError(f"a block has at most {MAX_WORDS - 1} coordinates")
        encoder = BlockEncoder(self, l2_norm([x]), weight, rounding_seed)
        return np.concatenate([encoder.values(x), encoder.weight_word()])

    def decode(self, total: np.ndarray) -> Decoded:
        """The unmasked sum of encoded blocks (words mod 2^b) back to floats, by the centered lift."""
        words = np.asarray(total)
        if words.dtype != np.uint32 or words.ndim != 1 or words.size < 1:
            raise SecAggError("a sum to decode is a non-empty 1-d uint32 array")
        v = (words & np.uint32(ring_mask(self.ring_bits))).astype(np.int64)
        v[v >= 2 ** (self.ring_bits - 1)] -= 2**self.ring_bits
        scale = 2.0**-self.frac_bits
        return Decoded(v[:-1] * scale, float(v[-1]) * scale / self.limit)


class BlockEncoder:
    """One block's encoding under ``fixed``, a slice at a time: :meth:`values` for consecutive
    slices of the block's vector, whose L2 norm is ``norm``, then :meth:`weight_word` once. The
    words are those :meth:`FixedPoint.encode` gives for the whole vector (steps 1-4 of the module
    docstring, the rounding stream read in the same order). ``rounding_seed`` is for test vectors."""

    def __init__(self, fixed: FixedPoint, norm: float, weight: float, rounding_seed: bytes | None = None) -> None:
        weight = float(weight)
        if not 0.0 <= weight <= 1.0:  # NaN fails too
            raise SecAggError(f"the weight must be in [0, 1], got {weight!r}")
        if not (math.isfinite(norm) and norm >= 0):
            raise SecAggError(f"the update's norm must be finite, got {norm!r}")
        self.fixed, self.weight = fixed, weight
        factor = 1.0 if norm <= fixed.clip else fixed.clip / norm
        self._factor = factor * weight
        self._scale = 2.0**fixed.frac_bits
        self._limit = fixed.limit * self._scale
        self._ring = ring_mask(fixed.ring_bits)
        self._stream = KeyStream(os.urandom(KEY_BYTES) if rounding_seed is None else rounding_seed)
        self._done = False

    def values(self, piece: np.ndarray) -> np.ndarray:
        """The words of the next ``piece`` of the block's vector (steps 1-4)."""
        if self._done:
            raise SecAggError("a block's values come before its weight word")
        x = np.asarray(piece, dtype=np.float64).ravel()
        if not np.isfinite(x).all():
            raise SecAggError("the update has NaN or infinite values")
        y = x * self._factor
        y *= self._scale
        return self._round(y)

    def weight_word(self) -> np.ndarray:
        """The weight coordinate's word, last (step 2's y_d)."""
        if self._done:
            raise SecAggError("a block has one weight word")
        y = np.array([self.weight * self.fixed.limit], dtype=np.float64)
        y *= self._scale
        words = self._round(y)
        self._done = True
        return words

    def _round(self, y: np.ndarray) -> np.ndarray:
        np.clip(y, -self._limit, self._limit, out=y)
        uniform = self._stream.read(y.size) * 2.0**-32
        low = np.floor(y)
        y -= low  # the fraction
        q = low.astype(np.int64)
        q += uniform < y
        q &= self._ring
        return q.astype(np.uint32)
