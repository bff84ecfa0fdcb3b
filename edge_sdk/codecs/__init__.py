"""Transfer codecs: fewer bytes per payload, the same numbers in every SDK (docs/protocol.md, "Codecs").

Sans-I/O and numpy only (not imported by ``import edge_sdk``). Every codec turns an array into a
self-describing record and :func:`decode` turns any record back::

    from edge_sdk.codecs import codec, decode, CODECS

    record = codec("eden2").encode(delta, seed=seed)   # bytes
    approx = decode(record)                            # float32, delta's shape

Lossless: ``none``, ``zlib``, ``shuffle`` (byte planes, then deflate). Lossy, float32 only: ``float16``,
``int8`` (per-block min/max grid, nearest), ``sr1``/``sr2``/``sr4``/``sr8`` (the same grid,
stochastic rounding: unbiased), ``eden1``..``eden4`` (randomized Hadamard rotation, Lloyd-Max
levels and EDEN's unbiased scale). :class:`ErrorFeedback` keeps a device's residuals.
"""

from .base import Bound, Codec
from .blockwise import linear_codes
from .feedback import ErrorFeedback
from .record import CodecError
from .registry import CODECS, codec, decode, decode_bytes, encode_bytes

__all__ = ["Bound", "Codec", "CodecError", "CODECS", "ErrorFeedback", "codec", "decode", "decode_bytes",
           "encode_bytes", "linear_codes"]
