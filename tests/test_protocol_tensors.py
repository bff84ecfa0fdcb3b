"""Tensors: every whitelisted dtype and shape round-trips without copies; bad payloads are refused."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge_sdk.protocol import DTYPES, TENSOR_EXT, ErrorCode, Limits, ProtocolError, decode_tensors, encode_tensors

WHITELIST = [np.dtype(d) for d in ("float32", "float16", "float64", "int64", "int32", "uint8", "bool")]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
NAMES = st.text(min_size=0, max_size=30)


@st.composite
def arrays(draw, dtype=None, finite: bool = True) -> np.ndarray:
    dtype = dtype or draw(st.sampled_from(WHITELIST))
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=8 * dtype.itemsize, allow_nan=not finite, allow_infinity=not finite)
    array = draw(hnp.arrays(dtype, SHAPES, elements=elements))
    layout = draw(st.sampled_from(["c", "fortran", "strided", "big"]))
    if layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=0)[::2]  # same values, not contiguous
    elif layout == "big" and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder(">"))
    return array


tensor_dicts = st.dictionaries(NAMES, arrays(), max_size=6)


def _base_address(buffer: bytes) -> int:
    return np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]


@settings(max_examples=300, deadline=None)
@given(tensors=tensor_dicts)
def test_round_trip_every_dtype_and_shape(tensors):
    payload = encode_tensors(tensors)
    back = decode_tensors(payload)
    assert list(back) == list(tensors)
    start, end = _base_address(payload), _base_address(payload) + len(payload)
    for name, original in tensors.items():
        got = back[name]
        assert got.shape == original.shape
        assert got.dtype == original.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, original)
        assert not got.flags.writeable
        if got.size:
            address = got.__array_interface__["data"][0]
            assert start <= address < end  # a view of the payload: no copy
            assert (address - start) % 64 == 0  # aligned as documented


@pytest.mark.parametrize("dtype", WHITELIST)
def test_each_dtype_has_a_fixed_wire_code(dtype):
    array = np.arange(6).astype(dtype).reshape(2, 3)
    payload = encode_tensors({"w": array})
    ext = msgpack.unpackb(payload)["w"]  # plain msgpack sees an extension value
    assert ext.code == TENSOR_EXT
    code, rank, pad = struct.unpack_from("<BBB", ext.data)
    assert DTYPES[code] == dtype and rank == 2
    assert struct.unpack_from("<2Q", ext.data, 8) == (2, 3)
    assert ext.data[8 + 16 + pad:] == array.astype(dtype.newbyteorder("<")).tobytes()


def test_any_msgpack_spelling_decodes():
    header = struct.pack("<BBB5x", 1, 1, 0) + struct.pack("<Q", 2)
    data = np.array([1.5, -2.0], "<f4").tobytes()
    for packed in (
        msgpack.packb({"w": msgpack.ExtType(TENSOR_EXT, header + data)}),  # ext 8
        b"\xde\x00\x01" + b"\xda\x00\x01w" + b"\xc8\x00\x18\x01" + header + data,  # map 16, str 16, ext 16
    ):
        np.testing.assert_array_equal(decode_tensors(packed)["w"], [1.5, -2.0])
    scalar = struct.pack("<BBB5x", 4, 0, 0) + struct.pack("<q", -7)  # 16 bytes: fixext 16
    assert decode_tensors(b"\x81\xa1s\xd8\x01" + scalar)["s"] == -7
    assert decode_tensors(b"\x80") == {}


def _code(data, limits=Limits(), **kwargs) -> str:
    with pytest.raises(ProtocolError) as info:
        decode_tensors(data, limits, **kwargs)
    return info.value.code


def _ext(payload: bytes, name: bytes = b"w", code: int = TENSOR_EXT) -> bytes:
    return b"\x81" + msgpack.packb(name.decode()) + struct.pack(">BIb", 0xC9, len(payload), code) + payload


def _tensor_payload(code: int, shape: tuple[int, ...], data: bytes, pad: int = 0) -> bytes:
    return struct.pack("<BBB5x", code, len(shape), pad) + struct.pack(f"<{len(shape)}Q", *shape) + bytes(pad) + data


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_non_finite_is_refused_unless_allowed(value, dtype):
    array = np.zeros(1000, dtype)
    array[777] = value
    payload = encode_tensors({"w": array, "ok": np.ones(3, np.float32)})
    assert _code(payload) == ErrorCode.NON_FINITE
    back = decode_tensors(payload, allow_non_finite=True)
    assert np.isnan(back["w"][777]) if np.isnan(value) else back["w"][777] == value


def test_bad_dtype_shape_and_size():
    f32 = np.arange(6, dtype="<f4").tobytes()
    assert decode_tensors(_ext(_tensor_payload(1, (2, 3), f32)))["w"].shape == (2, 3)
    assert _code(_ext(_tensor_payload(99, (2, 3), f32))) == ErrorCode.BAD_DTYPE
    assert _code(_ext(_tensor_payload(1, (2, 4), f32))) == ErrorCode.BAD_SHAPE  # shape wants 32 bytes
    assert _code(_ext(_tensor_payload(1, (1,) * 9, f32[:4]))) == ErrorCode.BAD_SHAPE  # rank 9 > 8
    assert _code(_ext(_tensor_payload(1, (1 << 40, 0), b""))) == ErrorCode.BAD_SHAPE  # a dimension too big
    huge = (1 << 31, 1 << 31, 1 << 31)
    assert _code(_ext(_tensor_payload(1, huge, f32))) == ErrorCode.TOO_LARGE  # never multiplied into memory
    assert _code(_ext(_tensor_payload(1, (2, 3), f32, pad=64))) == ErrorCode.MALFORMED
    assert _code(_ext(_tensor_payload(7, (2,), b"\x01\x02"))) == ErrorCode.MALFORMED  # bool must be 0 or 1
    assert _code(_ext(_tensor_payload(1, (2, 3), f32), code=2)) == ErrorCode.MALFORMED
    assert _code(_ext(b"\x01\x00")) == ErrorCode.MALFORMED  # header truncated
    small = Limits(max_tensor_bytes=16)
    assert _code(_ext(_tensor_payload(1, (2, 3), f32)), small) == ErrorCode.TOO_LARGE
    assert _code(encode_tensors({"w": np.zeros(10, np.uint8)}), Limits(max_transfer_bytes=32)) == ErrorCode.TOO_LARGE
    assert _code(encode_tensors({"w": np.zeros(2, np.float32)}), Limits(max_rank=1, max_dim=1)) == ErrorCode.BAD_SHAPE


def test_structure_errors():
    ok = encode_tensors({"w": np.zeros(2, np.float32)})
    assert _code(msgpack.packb([1, 2])) == ErrorCode.MALFORMED  # not a map
    assert _code(msgpack.packb({1: msgpack.ExtType(1, b"")})) == ErrorCode.MALFORMED  # non-string key
    assert _code(msgpack.packb({b"w": 1})) == ErrorCode.MALFORMED  # bytes key
    assert _code(msgpack.packb({"w": [1.0, 2.0]})) == ErrorCode.MALFORMED  # not a tensor
    assert _code(msgpack.packb({"w": b"raw"})) == ErrorCode.MALFORMED
    assert _code(ok + b"\x00") == ErrorCode.MALFORMED  # trailing bytes
    assert _code(ok[:-1]) == ErrorCode.MALFORMED  # truncated
    assert _code(b"") == ErrorCode.MALFORMED
    twice = b"\x82" + ok[1:] + ok[1:]
    assert _code(twice) == ErrorCode.MALFORMED  # the same name twice
    assert _code(b"\x81\xa2\xff\xfe" + ok[3:]) == ErrorCode.MALFORMED  # name is not UTF-8
    assert _code(encode_tensors({"x" * 20: np.zeros(1)}), Limits(max_str_len=10)) == ErrorCode.TOO_LARGE
    assert _code(b"\xdf\xff\xff\xff\xff") == ErrorCode.TOO_LARGE  # 4 billion entries announced
    assert _code("text") == ErrorCode.MALFORMED  # type: ignore[arg-type]


def test_encode_refuses_what_decode_would():
    for bad in ({"w": np.zeros(2, np.complex64)}, {"w": np.array(["a"])}, {"w": np.zeros(2, np.int16)},
                {"w": np.zeros(2, object)}):
        with pytest.raises(ProtocolError) as info:
            encode_tensors(bad)
        assert info.value.code == ErrorCode.BAD_DTYPE
    for bad in ({1: np.zeros(2)}, {"w": [1.0, 2.0]}, [("w", np.zeros(2))], {"\ud800": np.zeros(1)}):
        with pytest.raises(ProtocolError) as info:
            encode_tensors(bad)  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.MALFORMED


def test_decoded_arrays_keep_their_buffer_alive_and_accept_bytes_like_input():
    payload = bytearray(encode_tensors({"w": np.arange(4, dtype=np.int64)}))
    arrays = decode_tensors(payload)
    assert not arrays["w"].flags.writeable  # even over a mutable buffer
    assert decode_tensors(memoryview(payload))["w"].tolist() == [0, 1, 2, 3]
    del payload
    assert arrays["w"].tolist() == [0, 1, 2, 3]


def test_many_tensors_use_wider_map_headers():
    many = {f"t{i}": np.full(2, i, np.int32) for i in range(70_000)}
    back = decode_tensors(encode_tensors(many))
    assert len(back) == 70_000 and back["t69999"].tolist() == [69999, 69999]
    assert _code(encode_tensors(many), Limits(max_items=1000)) == ErrorCode.TOO_LARGE


def test_empty_tensor_with_huge_other_dimensions_is_refused() -> None:
    """Found by the fuzz test: shape (0, 2**31, 2**31) holds no data, yet numpy cannot even make the
    view; the decoder must say so as a protocol error, not let numpy's ValueError escape."""
    payload = bytearray(encode_tensors({"t": np.zeros((0, 1, 1), dtype=np.float32)}))
    # The shape follows the 8-byte tensor header: three little-endian uint64 dimensions.
    at = payload.index(struct.pack("<3Q", 0, 1, 1))
    payload[at:at + 24] = struct.pack("<3Q", 0, 2**31, 2**31)
    with pytest.raises(ProtocolError) as err:
        decode_tensors(bytes(payload))
    assert err.value.code == ErrorCode.BAD_SHAPE
