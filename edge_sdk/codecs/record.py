"""The record every codec writes: a small fixed header, the tensor's shape, codec parameters, a body.

Layout (little-endian; docs/protocol.md, "Codecs")::

    "EC" | u8 format (1) | u8 codec id | u8 dtype code | u8 rank | u16 zero | rank x u64 dims
    | the codec's parameters (a fixed size per codec id) | body

The dtype codes are those of the tensor format (docs/protocol.md, "Tensors"). A decoder knows from
the header how many bytes the body must hold (or, for the compressed bodies, at most how many bytes
it may inflate to) before it allocates anything: a record from a device is never trusted.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["CodecError", "DTYPES", "Header", "MAGIC", "FORMAT", "pack_header", "parse_header", "MAX_BYTES"]

MAGIC = b"EC"
FORMAT = 1
#: The largest decoded tensor a record may describe by default (the protocol's ``max_tensor_bytes``).
MAX_BYTES = 1 << 30
#: Wire code -> dtype, the codes of the tensor format (docs/protocol.md, "Tensors").
DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f2"), 3: np.dtype("<f8"), 4: np.dtype("<i8"),
                               5: np.dtype("<i4"), 6: np.dtype("u1"), 7: np.dtype("?")}
_CODES = {dtype: code for code, dtype in DTYPES.items()}
_FIXED = struct.Struct("<2sBBBBH")
MAX_RANK = 8


class CodecError(ValueError):
    """A record that does not decode (malformed, truncated, oversize), or an array a codec refuses."""


@dataclass(frozen=True)
class Header:
    """What the fixed part of a record says; ``offset`` is where the codec's parameters start."""

    codec_id: int
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def dtype_code(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).byteorder == ">" else np.dtype(dtype)
    code = _CODES.get(dtype)
    if code is None:
        raise CodecError(f"dtype {dtype} has no wire code; codecs take {sorted(str(d) for d in DTYPES.values())}")
    return code


def pack_header(codec_id: int, array: np.ndarray) -> bytes:
    """The fixed header and dims of a record of ``array``."""
    if array.ndim > MAX_RANK:
        raise CodecError(f"rank {array.ndim} exceeds {MAX_RANK}")
    return _FIXED.pack(MAGIC, FORMAT, codec_id, dtype_code(array.dtype), array.ndim, 0) + \
        struct.pack(f"<{array.ndim}Q", *array.shape)


def parse_header(record: memoryview, max_bytes: int = MAX_BYTES) -> Header:
    """Read and check the fixed header; refuse a tensor above ``max_bytes`` before anything is allocated."""
    if len(record) < _FIXED.size:
        raise CodecError(f"a record needs at least {_FIXED.size} bytes, got {len(record)}")
    magic, fmt, codec_id, code, rank, zero = _FIXED.unpack_from(record, 0)
    if magic != MAGIC or fmt != FORMAT or zero != 0:
        raise CodecError(f"not a codec record of format {FORMAT} (starts {bytes(record[:4])!r})")
    if code not in DTYPES:
        raise CodecError(f"unknown dtype code {code}")
    if rank > MAX_RANK:
        raise CodecError(f"rank {rank} exceeds {MAX_RANK}")
    end = _FIXED.size + 8 * rank
    if len(record) < end:
        raise CodecError("record is truncated in its shape")
    shape = struct.unpack_from(f"<{rank}Q", record, _FIXED.size)
    header = Header(codec_id, DTYPES[code], tuple(int(d) for d in shape), end)
    size = 1
    for d in shape:  # in Python integers: no overflow before the check
        size *= d
    if size * header.dtype.itemsize > max_bytes:
        raise CodecError(f"a tensor of shape {list(shape)} ({header.dtype}) exceeds {max_bytes} bytes")
    return header


def take(record: memoryview, offset: int, length: int, what: str) -> memoryview:
    """``length`` bytes at ``offset``, or a CodecError naming ``what`` when the record is shorter."""
    if length < 0 or offset + length > len(record):
        raise CodecError(f"record is truncated in its {what}")
    return record[offset:offset + length]


def as_view(record: bytes | bytearray | memoryview) -> memoryview:
    if not isinstance(record, (bytes, bytearray, memoryview)):
        raise CodecError(f"a record is bytes, got {type(record).__name__}")
    view = memoryview(record)
    if not view.c_contiguous:
        raise CodecError("a record must be a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
