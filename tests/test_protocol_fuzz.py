"""Fuzzing: whatever bytes arrive, decode and decode_tensors raise ProtocolError or return valid values.

Inputs: random bytes, and valid encodings mutated by bit flips, truncation, insertions, huge length
headers, field values swapped for other types, nested garbage, non-map top levels, NaN tensors, and
row-sparse triples with their parts dropped, renamed or corrupted.
"""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import (
    ErrorCode,
    Limits,
    Message,
    ProtocolError,
    RowSparse,
    decode,
    decode_tensors,
    encode,
    encode_tensors,
)
from test_protocol_messages import any_message
from test_protocol_tensors import ROWS, VALUES, _raw, mixed_tensor_dicts, tensor_dicts

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = Limits(max_frame_bytes=4096, max_transfer_bytes=1 << 20, max_tensor_bytes=1 << 16, max_items=64,
               max_str_len=256)

# Length-bearing msgpack headers with the largest lengths they can announce.
HUGE_HEADERS = [
    b"\xc6\xff\xff\xff\xff",  # bin 32
    b"\xc5\xff\xff",  # bin 16
    b"\xdb\xff\xff\xff\xff",  # str 32
    b"\xda\xff\xff",  # str 16
    b"\xdd\xff\xff\xff\xff",  # array 32
    b"\xdc\xff\xff",  # array 16
    b"\xdf\xff\xff\xff\xff",  # map 32
    b"\xde\xff\xff",  # map 16
    b"\xc9\xff\xff\xff\xff\x01",  # ext 32 (a tensor)
    b"\xc8\xff\xff\x01",  # ext 16
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint 64
]

garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def mutated(draw, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite", "huge"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[i:i + len(chunk)] = chunk
        else:
            header = draw(st.sampled_from(HUGE_HEADERS))
            data[i:i + len(header)] = header
    return bytes(data)


def _decode_or_refuse(data: bytes, limits: Limits = SMALL) -> Message | None:
    try:
        msg = decode(data, limits)
    except ProtocolError as exc:
        assert exc.code in {c.value for c in ErrorCode}
        return None
    assert decode(encode(msg), limits) == msg  # anything accepted is a valid message
    return msg


def _decode_tensors_or_refuse(data: bytes, limits: Limits = SMALL, **kwargs) -> dict | None:
    try:
        tensors = decode_tensors(data, limits, **kwargs)
    except ProtocolError as exc:
        assert exc.code in {c.value for c in ErrorCode}
        return None
    for name, value in tensors.items():
        assert type(name) is str
        if isinstance(value, RowSparse):  # a complete, checked triple
            assert "@" not in name and name
            value.check(name)
            assert value.indices.dtype == np.int64 and value.values.shape[0] == value.indices.shape[0]
            arrays = [value.indices, value.values]
        else:
            assert "@" not in name  # every "@" entry belongs to a triple
            arrays = [value]
        for array in arrays:
            assert isinstance(array, np.ndarray)
            assert array.nbytes <= limits.max_tensor_bytes and array.ndim <= limits.max_rank
            if array.dtype.kind == "f" and not kwargs.get("allow_non_finite"):
                assert np.isfinite(array).all()
    return tensors


@settings(FUZZ, max_examples=1000)
@given(data=st.binary(max_size=300))
def test_random_bytes(data):
    _decode_or_refuse(data)
    _decode_tensors_or_refuse(data)


@settings(FUZZ, max_examples=1500)
@given(data=st.data())
def test_mutated_messages(data):
    base = encode(data.draw(any_message))
    _decode_or_refuse(data.draw(mutated(base)))


@settings(FUZZ, max_examples=500)
@given(msg=any_message, data=st.data())
def test_field_values_of_the_wrong_type(msg, data):
    body = msgpack.unpackb(encode(msg), raw=False)
    key = data.draw(st.sampled_from(sorted(body)))
    body[key] = data.draw(garbage)
    try:
        wire = msgpack.packb(body, use_bin_type=True)
    except (OverflowError, ValueError):
        return  # garbage that msgpack itself cannot write
    _decode_or_refuse(wire)


@settings(FUZZ, max_examples=300)
@given(value=garbage)
def test_nested_garbage_and_non_map_top_levels(value):
    try:
        wire = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    _decode_or_refuse(wire)
    _decode_tensors_or_refuse(wire)


@pytest.mark.parametrize("wire", [
    b"\x91" * 100_000 + b"\xc0",  # deeply nested arrays
    b"\x81\xa1t" * 50_000 + b"\xc0",  # deeply nested maps
    b"\x85" + b"\xa1t\xaetransfer_frame\xa1v\x01",  # the frame fast path's prefix, then nothing
    b"",
])
def test_pathological_inputs(wire):
    assert _decode_or_refuse(wire) is None
    assert _decode_tensors_or_refuse(wire) is None


@settings(FUZZ, max_examples=1000)
@given(tensors=st.one_of(tensor_dicts, mixed_tensor_dicts()), data=st.data())
def test_mutated_tensor_payloads(tensors, data):
    base = encode_tensors(tensors)
    _decode_tensors_or_refuse(data.draw(mutated(base)))
    _decode_tensors_or_refuse(data.draw(mutated(base)), allow_non_finite=True)


@settings(FUZZ, max_examples=300)
@given(tensors=st.one_of(tensor_dicts, mixed_tensor_dicts()).filter(bool), data=st.data())
def test_tensor_headers_with_hostile_shapes(tensors, data):
    """Overwrite dtype, rank, pad or a dimension of one tensor with arbitrary values."""
    wire = bytearray(encode_tensors(tensors))
    starts = [i + 6 for i in range(len(wire) - 6) if wire[i] == 0xC9 and wire[i + 5] == 1]
    start = data.draw(st.sampled_from(starts))  # start of one tensor's header (may hit data bytes)
    field = data.draw(st.sampled_from(["dtype", "rank", "pad", "dim"]))
    if field == "dim" and start + 16 <= len(wire):
        wire[start + 8:start + 16] = struct.pack("<Q", data.draw(st.integers(0, (1 << 64) - 1)))
    elif field != "dim":
        wire[start + ["dtype", "rank", "pad"].index(field)] = data.draw(st.integers(0, 255))
    _decode_tensors_or_refuse(bytes(wire))


@settings(FUZZ, max_examples=200)
@given(shape=st.lists(st.integers(1, 8), min_size=1, max_size=3), where=st.integers(0, 10_000),
       value=st.sampled_from([np.nan, np.inf, -np.inf]), dtype=st.sampled_from(["float16", "float32", "float64"]))
def test_nan_tensors_are_refused(shape, where, value, dtype):
    array = np.zeros(shape, dtype)
    array.reshape(-1)[where % array.size] = value
    wire = encode_tensors({"w": array})
    assert _decode_tensors_or_refuse(wire) is None
    assert _decode_tensors_or_refuse(wire, allow_non_finite=True) is not None


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_row_sparse_triples_taken_apart(data):
    """A triple's parts dropped, renamed, duplicated under other names, or swapped for other arrays."""
    parts = {"rows": ROWS, "values": VALUES, "num_rows": np.array(5, np.int64)}
    some_array = st.sampled_from([ROWS, VALUES, np.array(5, np.int64), np.array(1, np.int64),
                                  np.array([3, 1], np.int64),
                                  np.zeros((2, 3), np.int32), np.zeros(0, np.int64), np.array(2, np.int32),
                                  np.array(-4, np.int64), np.array(1 << 40, np.int64)])
    entries = {}
    for part, array in parts.items():
        if data.draw(st.integers(0, 5)) == 0:
            continue  # dropped
        name = data.draw(st.sampled_from(["w", "v", "", "w@x", "a@b"])) + "@" + \
            data.draw(st.sampled_from([part, part, part, "rows", "values", "num_rows", "cols", ""]))
        entries[name] = data.draw(some_array) if data.draw(st.integers(0, 3)) == 0 else array
    for name in data.draw(st.lists(st.sampled_from(["w", "v", "w@", "@", "x"]), max_size=2)):
        entries[name] = data.draw(some_array)
    _decode_tensors_or_refuse(_raw(entries))
