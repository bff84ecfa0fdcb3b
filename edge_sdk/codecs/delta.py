"""Delta-coded downloads: a payload's float32 weights as a quantized difference from what the device holds.

A payload (an ONNX chunk, an ``encode_tensors`` tail) is bytes in which some ranges hold float32
weights: its **regions**, ``(offset, count)`` pairs in increasing order. Everything else (the ONNX
graph, the tensor headers, integer entries) is its **skeleton**. A delta payload is an
``encode_tensors`` payload of three entries (docs/protocol.md, "Delta downloads"):

- ``skeleton``: a ``zlib`` record of the skeleton bytes, the regions cut out (a few KiB for an ONNX
  chunk whose weights are megabytes);
- ``regions``: int64 ``(n, 2)``, each region's byte offset in the payload and its float32 count;
- ``weights``: a nearest-rounding ``int<bits>`` grid record (:class:`.blockwise.BlockwiseCodec`) of
  the regions' floats, concatenated: ``Q(current - base)`` against the base the device holds, or
  ``Q(current)`` against no base (a device holding nothing).

The skeleton travels every time (its integer entries may change); only the base's floats are used,
so a base fits a delta when it has the same regions. The receiver rebuilds the payload: skeleton pieces and regions in order, each region's floats
``base + decode(weights)`` in float32 (just ``decode(weights)`` without a base), the base's floats
read at the same offsets of the base's bytes. Nearest rounding uses no randomness, so the sender
computes the same reconstruction and knows its sha256 before sending; the next round's delta targets
the exact current weights from that reconstruction, so no error accumulates across rounds. The
error of every float is at most half a grid step of its block, ``(max - min) / (2 (2^bits - 1))``
over the block's 256 differences (:meth:`BlockwiseCodec.bound`).
"""

from __future__ import annotations

import numpy as np

from .blockwise import BlockwiseCodec
from .lossless import ZlibCodec
from .record import MAX_BYTES, CodecError
from .registry import decode

__all__ = ["DELTA_BITS", "apply_delta", "check_regions", "encode_delta", "region_floats", "skeleton"]

#: Bits per weight a delta download may use.
DELTA_BITS = (2, 4, 8)


def check_regions(regions: np.ndarray, size: int) -> np.ndarray:
    """``regions`` as int64 ``(n, 2)`` in increasing, non-overlapping order inside ``size`` bytes."""
    r = np.asarray(regions)
    if r.dtype.kind not in "iu" or r.ndim != 2 or r.shape[1] != 2:
        raise CodecError(f"delta regions are an (n, 2) integer array, got {r.dtype} {list(r.shape)}")
    r = r.astype(np.int64)
    if len(r):
        ends = r[:, 0] + 4 * r[:, 1]
        if (r < 0).any() or ends[-1] > size or (r[1:, 0] < ends[:-1]).any():
            raise CodecError(f"delta regions overlap, go backwards or leave the payload of {size} bytes")
    return r


def region_floats(data: bytes | memoryview, regions: np.ndarray) -> np.ndarray:
    """The float32 values of ``data``'s regions, concatenated (a copy)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    parts = [buf[o:o + 4 * n] for o, n in regions]
    return np.concatenate(parts).view("<f4") if parts else np.zeros(0, "<f4")


def skeleton(data: bytes | memoryview, regions: np.ndarray) -> bytes:
    """``data`` with its regions cut out."""
    buf = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([0], regions[:, 0] + 4 * regions[:, 1]))
    stops = np.concatenate((regions[:, 0], [len(buf)]))
    return b"".join(buf[a:b].tobytes() for a, b in zip(starts, stops))


def _rebuild(skel: bytes, regions: np.ndarray, floats: np.ndarray,
             base: bytes | memoryview | None = None) -> bytearray:
    """The payload of skeleton ``skel`` with ``floats`` written into ``regions`` (``base``'s floats at the
    same offsets added, when given). Written in place into one buffer of the payload's size, a region at a
    time: a device rebuilding a chunk holds the base, the decoded step and the result (three copies of the
    payload, as :class:`profiles.accounting.TrainingMemory` counts a delta download), never a fourth."""
    out = bytearray(len(skel) + 4 * int(regions[:, 1].sum()))
    held = None if base is None else np.frombuffer(base, dtype=np.uint8)
    at, used = 0, 0
    for (offset, count), start in zip(regions, np.concatenate(([0], np.cumsum(regions[:, 1])))[:-1]):
        offset, count, gap = int(offset), int(count), int(offset) - at
        out[at:offset] = skel[used:used + gap]
        region = np.frombuffer(out, dtype="<f4", count=count, offset=offset)
        region[:] = floats[start:start + count]
        if held is not None:
            region += held[offset:offset + 4 * count].view("<f4")
        used, at = used + gap, offset + 4 * count
    out[at:] = skel[used:]
    return out


def encode_delta(data: bytes | memoryview, regions: np.ndarray, base: bytes | memoryview | None,
                 bits: int) -> tuple[bytes, bytes]:
    """The delta payload taking ``base`` (None: nothing held) to ``data``'s weights, and the bytes the
    receiver rebuilds from it (what its sha256 names). ``base`` must have ``data``'s regions."""
    from edge_sdk import protocol as p

    if bits not in DELTA_BITS:
        raise ValueError(f"delta downloads use {DELTA_BITS} bits, got {bits}")
    regions = check_regions(regions, len(data))
    current = region_floats(data, regions)
    held = None if base is None else region_floats(base, regions)
    if held is not None and (len(base) != len(data) or not np.isfinite(held).all()):  # type: ignore[arg-type]
        raise ValueError("the base does not have the payload's regions")
    record = BlockwiseCodec(bits, False).encode(current if held is None else current - held)
    step = decode(record)
    floats = step if held is None else held + step
    skel = skeleton(data, regions)
    payload = p.encode_tensors({"skeleton": np.frombuffer(ZlibCodec(6).encode(np.frombuffer(skel, np.uint8)), np.uint8),
                                "regions": regions, "weights": np.frombuffer(record, np.uint8)})
    return payload, bytes(_rebuild(skel, regions, floats))


def apply_delta(payload: bytes | memoryview, base: bytes | memoryview | None, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes a delta payload rebuilds on ``base`` (None: the payload was encoded against nothing).
    Raises :class:`CodecError` for a payload that does not decode or does not fit the base."""
    from edge_sdk import protocol as p

    try:
        entries = p.decode_tensors(payload)
    except p.ProtocolError as exc:
        raise CodecError(f"delta payload: {exc}") from None
    if set(entries) != {"skeleton", "regions", "weights"}:
        raise CodecError(f"a delta payload holds skeleton, regions and weights, got {sorted(entries)[:8]}")
    skel_array = decode(memoryview(entries["skeleton"]), max_bytes=max_bytes)  # type: ignore[arg-type]
    if skel_array.dtype != np.uint8 or skel_array.ndim != 1:
        raise CodecError("a delta payload's skeleton is not bytes")
    skel = skel_array.tobytes()
    step = decode(memoryview(entries["weights"]), max_bytes=max_bytes).reshape(-1)  # type: ignore[arg-type]
    raw = np.asarray(entries["regions"])
    size = len(skel) + 4 * int(raw[:, 1].sum()) if raw.ndim == 2 and raw.shape[1:] == (2,) and len(raw) else len(skel)
    regions = check_regions(raw, size)
    if step.dtype != np.float32 or step.size != int(regions[:, 1].sum()):
        raise CodecError(f"a delta payload's weights hold {step.size} values, its regions {int(regions[:, 1].sum())}")
    if base is not None and len(base) != size:
        raise CodecError(f"a delta of a {size}-byte payload applied to a {len(base)}-byte base")
    out = _rebuild(skel, regions, step, base)
    del step, entries  # the decoded step goes before the result's bytes are made: still three copies at most
    return bytes(out)
