"""Where a frozen chunk's float32 weights sit in its ONNX bytes: the regions a delta download rewrites.

A chunk's ONNX file keeps each initializer's values as ``TensorProto.raw_data`` (field 9, bytes:
tag ``0x4a``, a varint length, then little-endian float32). Delta downloads
(:mod:`edge_sdk.codecs.delta`) send the graph once per payload as a small skeleton and the weights
quantized against the version the device holds; the device writes the floats back at these offsets
into bytes that ONNX Runtime (Python, onnxruntime-node or -web) loads as any other chunk, so no
runtime needs external-data support. Each region is found by its field's exact bytes (tag, length,
values), searched in the initializers' serialized order, so a region cannot land in the graph's
nodes or in another tensor's header.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MIN_REGION", "onnx_regions"]

#: Initializers of fewer floats (shape constants, epsilons) stay exact in the skeleton.
MIN_REGION = 64
_RAW_DATA_TAG = b"\x4a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def onnx_regions(data: bytes) -> np.ndarray:
    """The ``(offset, count)`` int64 regions of ``data``'s float32 initializers of at least
    :data:`MIN_REGION` values, in increasing order. Raises ValueError if one is not found."""
    import onnx

    model = onnx.load_from_string(bytes(data))
    out, at = [], 0
    for init in model.graph.initializer:
        raw = init.raw_data
        if init.data_type != onnx.TensorProto.FLOAT or len(raw) < 4 * MIN_REGION:
            continue
        key = _RAW_DATA_TAG + _varint(len(raw)) + raw
        found = data.find(key, at)
        if found < 0:
            raise ValueError(f"initializer {init.name!r}: its raw data is not where the ONNX bytes keep it")
        offset = found + len(key) - len(raw)
        out.append((offset, len(raw) // 4))
        at = offset + len(raw)
    return np.array(out, dtype=np.int64).reshape(-1, 2)
