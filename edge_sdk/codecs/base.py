"""What every codec is: a name, its properties, ``encode`` to a record (``registry.decode`` reads it back).

Properties a caller chooses by (docs/protocol.md, "Codecs"):

- ``lossless``: ``decode(encode(x))`` is ``x``, bit for bit;
- ``unbiased``: ``E[decode(encode(x))] = x`` over the codec's randomness (stochastic rounding's
  offsets, EDEN's rotation): what averaging many devices' updates needs;
- ``linear``: the record's integer codes, summed over devices in secure aggregation's ring, decode to
  the sum of the decoded values (one scale shared by every device): the codecs that compose with
  masking;
- ``bound(x)``: the error it promises on ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .record import CodecError, Header

__all__ = ["Bound", "Codec", "float32_input"]


@dataclass(frozen=True)
class Bound:
    """The error a codec promises for one array.

    ``max_abs``: every element of ``decode(encode(x)) - x`` is within it (None: no elementwise
    guarantee). ``sq_l2``: ``E ||decode(encode(x)) - x||^2`` is at most it (None: not stated).
    """

    max_abs: float | None
    sq_l2: float | None


class Codec:
    """One configured codec. Subclasses set the class attributes and implement the two methods."""

    name: str = ""
    codec_id: int = 0
    lossless: bool = False
    unbiased: bool = False
    linear: bool = False

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        """``array`` as a record. ``seed``: the randomness of a randomized codec (a SHAKE128 stream both
        SDKs reproduce); None draws from the system (production). Deterministic codecs ignore it."""
        raise NotImplementedError

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        """The array of a record whose fixed header (``header``) is already checked."""
        raise NotImplementedError

    def bound(self, array: np.ndarray) -> Bound:
        raise NotImplementedError

    def workspace(self) -> tuple[int, int]:
        """What an encode holds beside the tensor and its record, for a device's memory plan
        (profiles.accounting.TrainingMemory.with_update_codec): fixed bytes, and bits per value of
        the tensor. ``(0, 0)``: nothing this codec declares."""
        return 0, 0

    def __repr__(self) -> str:
        return f"<codec {self.name}>"


def float32_input(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` as contiguous little-endian float32; a lossy codec refuses other dtypes and NaN/Inf
    (the protocol refuses them on the wire anyway)."""
    if not isinstance(array, (np.ndarray, np.generic)):
        raise CodecError(f"{name} encodes a numpy array, got {type(array).__name__}")
    if array.dtype.kind != "f" or array.dtype.itemsize != 4:
        raise CodecError(f"{name} encodes float32 arrays, got {array.dtype}")
    out = np.asarray(array, dtype="<f4", order="C")
    if not np.isfinite(out).all():
        raise CodecError(f"{name}: the array holds NaN or infinity")
    return out
