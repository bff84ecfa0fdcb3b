"""The codecs by name, and the one decoder: a record names its codec, so ``decode`` needs nothing else."""

from __future__ import annotations

import numpy as np

from .base import Codec
from .blockwise import DEFAULT_BLOCK, BlockwiseCodec
from .eden import DEFAULT_SEGMENT, EdenCodec
from .half import Float16Codec
from .lossless import DEFAULT_LEVEL, NoneCodec, ShuffleCodec, ZlibCodec
from .record import MAX_BYTES, CodecError, as_view, parse_header

__all__ = ["CODECS", "codec", "decode", "encode_bytes", "decode_bytes"]


def _builders() -> dict[str, object]:
    grid = {f"sr{b}": (lambda b=b, block=DEFAULT_BLOCK, scale=None: BlockwiseCodec(b, True, block, scale))
            for b in (1, 2, 4, 8)}
    eden = {f"eden{b}": (lambda b=b, segment=DEFAULT_SEGMENT: EdenCodec(b, segment)) for b in (1, 2, 3, 4)}
    return {
        "none": NoneCodec,
        "zlib": lambda level=DEFAULT_LEVEL: ZlibCodec(level),
        "shuffle": lambda level=DEFAULT_LEVEL, stride=None: ShuffleCodec(level, stride),
        "float16": Float16Codec,
        "int8": lambda block=DEFAULT_BLOCK, scale=None: BlockwiseCodec(8, False, block, scale),
        **grid,
        **eden,
    }


_BUILD = _builders()
#: Every codec in its default setting, by name.
CODECS: dict[str, Codec] = {name: build() for name, build in _BUILD.items()}  # type: ignore[operator]
_BY_ID = {c.codec_id: c for c in CODECS.values()}


def codec(name: str, **params: object) -> Codec:
    """The codec ``name`` with ``params`` (``level`` for zlib/shuffle, ``stride``; ``block`` or a shared
    ``scale`` for int8/sr*; ``segment`` for eden*). Raises ValueError for an unknown name or setting."""
    if name not in _BUILD:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(_BUILD)}")
    return _BUILD[name](**params) if params else CODECS[name]  # type: ignore[operator]


def decode(record: bytes | bytearray | memoryview, *, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """The array of any codec's record (a new array, its dtype and shape as encoded). Raises
    :class:`CodecError` for a record that is malformed, truncated, or describes more than ``max_bytes``."""
    view = as_view(record)
    header = parse_header(view, max_bytes)
    reader = _BY_ID.get(header.codec_id)
    if reader is None:
        raise CodecError(f"unknown codec id {header.codec_id}")
    return reader.decode_body(header, view)


def encode_bytes(name: str, data: bytes | memoryview, **params: object) -> bytes:
    """A byte payload (an ONNX chunk, a training graph, an ``encode_tensors`` payload) through a
    lossless codec: its record holds a uint8 vector."""
    chosen = codec(name, **params)
    if not chosen.lossless:
        raise ValueError(f"codec {name!r} is lossy: byte payloads take none, zlib or shuffle")
    return chosen.encode(np.frombuffer(data, dtype=np.uint8))


def decode_bytes(record: bytes | memoryview, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The payload of :func:`encode_bytes`'s record."""
    out = decode(record, max_bytes=max_bytes)
    if out.dtype != np.uint8 or out.ndim != 1:
        raise CodecError(f"a byte record holds a uint8 vector, got {out.dtype} {list(out.shape)}")
    return out.tobytes()
