"""Lossless codecs: the raw bytes (``none``), deflate (``zlib``), and deflate of byte planes (``shuffle``).

``zlib`` is RFC 1950 (deflate with the zlib header and Adler-32), what ``zlib.compress`` writes and
what the browser's ``DecompressionStream("deflate")`` and ``fflate``'s ``unzlibSync`` read.

``shuffle`` splits the bytes into ``stride`` planes before deflate (plane k holds byte k of every
element; bytes past the last whole element follow the planes as they are), as Blosc's and HDF5's
shuffle filters do: the sign-and-exponent bytes of float32 weights are few distinct values and
deflate well once they sit together, the low mantissa bytes are noise either way. For a tensor
payload (``encode_tensors``) or any other byte string given as uint8, ``stride`` defaults to 4: the
tensor format starts every tensor's data at a multiple of 64 bytes, so its float32 bytes fall into
the right planes.

Deflate streams are not the same bytes across implementations (Python's zlib and JavaScript's
fflate choose different matches): conformance for these codecs is that each SDK decodes the
other's records.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .base import Bound, Codec
from .record import CodecError, Header, dtype_code, pack_header, take

__all__ = ["NoneCodec", "ZlibCodec", "ShuffleCodec", "DEFAULT_LEVEL"]

#: Deflate level: 6 is zlib's default; bench/codecs.py measured levels 1, 6 and 9 on the zoo's payloads.
DEFAULT_LEVEL = 6
_SHUFFLE = struct.Struct("<B3x")


def _raw(array: np.ndarray) -> tuple[np.ndarray, memoryview]:
    if not isinstance(array, (np.ndarray, np.generic)):
        raise CodecError(f"a codec encodes a numpy array, got {type(array).__name__}")
    dtype_code(array.dtype)
    array = np.asarray(array, dtype=array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else None, order="C")
    return array, memoryview(array.reshape(-1).view(np.uint8))


def _array(header: Header, raw: bytes | memoryview) -> np.ndarray:
    if len(raw) != header.nbytes:
        raise CodecError(f"record holds {len(raw)} bytes of data, its shape needs {header.nbytes}")
    out = np.frombuffer(raw, dtype=header.dtype).reshape(header.shape).copy()
    if header.dtype == np.bool_ and (out.view(np.uint8) > 1).any():
        raise CodecError("a bool record holds bytes other than 0 and 1")
    return out


def _inflate(data: memoryview, limit: int) -> bytes:
    """Inflate at most ``limit`` bytes: a stream that would grow past it is refused, not unpacked."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit)
    except zlib.error as exc:
        raise CodecError(f"deflate body does not inflate: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        raise CodecError("deflate body inflates past the record's shape, is truncated or has trailing bytes")
    return out


class NoneCodec(Codec):
    name, codec_id, lossless, unbiased = "none", 1, True, True

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        array, raw = _raw(array)
        return pack_header(self.codec_id, array) + bytes(raw)

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        return _array(header, record[header.offset:])

    def bound(self, array: np.ndarray) -> Bound:
        return Bound(0.0, 0.0)


class ZlibCodec(NoneCodec):
    name, codec_id = "zlib", 2

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        if not 0 <= level <= 9:
            raise ValueError(f"zlib level is 0-9, got {level}")
        self.level = level

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        array, raw = _raw(array)
        return pack_header(self.codec_id, array) + zlib.compress(raw, self.level)

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        return _array(header, _inflate(record[header.offset:], header.nbytes))


def shuffle(raw: memoryview | bytes, stride: int) -> bytes:
    """Byte planes: byte k of every whole element, for k < ``stride``, then the remainder."""
    data = np.frombuffer(raw, dtype=np.uint8)
    whole = data.size // stride * stride
    return data[:whole].reshape(-1, stride).T.tobytes() + data[whole:].tobytes()


def unshuffle(planes: bytes, stride: int) -> bytes:
    data = np.frombuffer(planes, dtype=np.uint8)
    whole = data.size // stride * stride
    return data[:whole].reshape(stride, -1).T.tobytes() + data[whole:].tobytes()


class ShuffleCodec(ZlibCodec):
    name, codec_id = "shuffle", 3

    def __init__(self, level: int = DEFAULT_LEVEL, stride: int | None = None) -> None:
        super().__init__(level)
        if stride is not None and not 1 <= stride <= 255:
            raise ValueError(f"shuffle stride is 1-255, got {stride}")
        self.stride = stride

    def encode(self, array: np.ndarray, *, seed: int | None = None) -> bytes:
        array, raw = _raw(array)
        stride = self.stride or (array.dtype.itemsize if array.dtype.itemsize > 1 else 4)
        return pack_header(self.codec_id, array) + _SHUFFLE.pack(stride) + zlib.compress(shuffle(raw, stride),
                                                                                          self.level)

    def decode_body(self, header: Header, record: memoryview) -> np.ndarray:
        (stride,) = _SHUFFLE.unpack(take(record, header.offset, _SHUFFLE.size, "shuffle parameters"))
        if stride < 1:
            raise CodecError("shuffle stride 0")
        planes = _inflate(record[header.offset + _SHUFFLE.size:], header.nbytes)
        return _array(header, unshuffle(planes, stride) if len(planes) == header.nbytes else planes)
