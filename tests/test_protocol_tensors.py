"""Tensors: every whitelisted dtype and shape round-trips without copies, dense or row-sparse; bad
payloads are refused."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge_sdk.protocol import (
    DTYPES,
    TENSOR_EXT,
    ErrorCode,
    Limits,
    ProtocolError,
    RowSparse,
    decode_tensors,
    encode_tensors,
)

WHITELIST = [np.dtype(d) for d in ("float32", "float16", "float64", "int64", "int32", "uint8", "bool")]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="@"), max_size=30)  # "@" is reserved


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


@st.composite
def row_sparse(draw) -> RowSparse:
    """Rows of a table: sorted distinct int64 indices below num_rows, one row of values each."""
    num_rows = draw(st.integers(0, 50))
    indices = np.array(sorted(draw(st.sets(st.integers(0, num_rows - 1), max_size=8))) if num_rows else [],
                       dtype=np.int64)
    dtype = draw(st.sampled_from(WHITELIST))
    row_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    elements = st.floats(width=8 * dtype.itemsize, allow_nan=False, allow_infinity=False) if dtype.kind == "f" else None
    values = draw(hnp.arrays(dtype, (len(indices), *row_shape), elements=elements))
    return RowSparse(indices, values, num_rows)


@st.composite
def mixed_tensor_dicts(draw) -> dict:
    """Dense and row-sparse entries (a row-sparse entry needs a non-empty name: its parts are ``name@...``)."""
    names = draw(st.lists(NAMES, max_size=6, unique=True))
    return {name: draw(st.one_of(arrays(), row_sparse()) if name else arrays()) for name in names}


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


def _inside(array: np.ndarray, payload: bytes) -> bool:
    """``array`` is a view of ``payload``'s bytes (no copy), aligned as documented."""
    if not array.size:
        return True
    start = _base_address(payload)
    address = array.__array_interface__["data"][0]
    return start <= address < start + len(payload) and (address - start) % 64 == 0


@settings(max_examples=300, deadline=None)
@given(tensors=mixed_tensor_dicts())
def test_round_trip_with_row_sparse_entries(tensors):
    payload = encode_tensors(tensors)
    back = decode_tensors(payload)
    assert set(back) == set(tensors)
    for name, original in tensors.items():
        got = back[name]
        if isinstance(original, RowSparse):
            assert isinstance(got, RowSparse) and got.num_rows == original.num_rows and type(got.num_rows) is int
            assert got.indices.dtype == np.int64 and got.values.dtype == original.values.dtype
            assert got.shape == original.shape and got.values.shape == original.values.shape
            np.testing.assert_array_equal(got.indices, original.indices)
            np.testing.assert_array_equal(got.values, original.values)
            np.testing.assert_array_equal(got.dense(), original.dense())
            assert _inside(got.indices, payload) and _inside(got.values, payload)
        else:
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, original)
            assert _inside(got, payload)


def test_row_sparse_wire_form():
    """Three plain tensors any msgpack reader sees: ``name@rows``, ``name@values``, ``name@num_rows``."""
    table = RowSparse(np.array([1, 4], np.int64), np.arange(6, dtype=np.float32).reshape(2, 3), 10)
    payload = encode_tensors({"emb.weight": table, "fc.bias": np.ones(2, np.float32)})
    raw = msgpack.unpackb(payload)
    assert set(raw) == {"fc.bias", "emb.weight@rows", "emb.weight@values", "emb.weight@num_rows"}
    head = struct.unpack_from("<BBB", raw["emb.weight@num_rows"].data)
    assert DTYPES[head[0]] == np.int64 and head[1] == 0  # an int64 scalar
    back = decode_tensors(payload)
    assert table.shape == back["emb.weight"].shape == (10, 3) and back["emb.weight"].dtype == np.float32
    np.testing.assert_array_equal(back["emb.weight"].dense()[4], [3, 4, 5])
    empty = decode_tensors(encode_tensors({"e": RowSparse(np.zeros(0, np.int64), np.zeros((0, 4), np.float16), 7)}))
    assert empty["e"].shape == (7, 4) and empty["e"].indices.size == 0


def _ext_of(array: np.ndarray) -> msgpack.ExtType:
    """A tensor extension value written by hand (any msgpack writer may do this)."""
    array = np.array(array, order="C")  # rank 0 stays rank 0
    code = next(c for c, d in DTYPES.items() if d == array.dtype)
    head = struct.pack("<BBB5x", code, array.ndim, 0) + struct.pack(f"<{array.ndim}Q", *array.shape)
    return msgpack.ExtType(TENSOR_EXT, head + array.tobytes())


def _raw(entries: dict[str, np.ndarray]) -> bytes:
    return msgpack.packb({name: _ext_of(array) for name, array in entries.items()})


def _triple(rows, values, num_rows, name: str = "w") -> dict[str, np.ndarray]:
    return {f"{name}@rows": np.asarray(rows), f"{name}@values": np.asarray(values),
            f"{name}@num_rows": np.asarray(num_rows)}


ROWS = np.array([0, 2], np.int64)
VALUES = np.ones((2, 3), np.float32)


def test_hand_written_triple_decodes():
    back = decode_tensors(_raw({**_triple(ROWS, VALUES, np.int64(5)), "b": np.zeros(1, np.float32)}))
    assert isinstance(back["w"], RowSparse) and back["w"].shape == (5, 3) and set(back) == {"w", "b"}


@pytest.mark.parametrize("entries, code", [
    ({"w@rows": ROWS, "w@values": VALUES}, ErrorCode.MALFORMED),  # incomplete triple
    ({"w@values": VALUES, "w@num_rows": np.int64(5)}, ErrorCode.MALFORMED),
    ({"w@num_rows": np.int64(5)}, ErrorCode.MALFORMED),
    ({**_triple(ROWS, VALUES, np.int64(5)), "w@cols": ROWS}, ErrorCode.MALFORMED),  # unknown @part
    ({"w@cols": ROWS}, ErrorCode.MALFORMED),
    ({**_triple(ROWS, VALUES, np.int64(5), name="")}, ErrorCode.MALFORMED),  # "@rows": no name
    ({**_triple(ROWS, VALUES, np.int64(5), name="a@b")}, ErrorCode.MALFORMED),  # "@" inside the name
    ({**_triple(ROWS, VALUES, np.int64(5)), "w": VALUES}, ErrorCode.MALFORMED),  # a plain "w" too
    (_triple(np.array([2, 0], np.int64), VALUES, np.int64(5)), ErrorCode.BAD_SHAPE),  # unsorted
    (_triple(np.array([2, 2], np.int64), VALUES, np.int64(5)), ErrorCode.BAD_SHAPE),  # repeated
    (_triple(np.array([0, 5], np.int64), VALUES, np.int64(5)), ErrorCode.BAD_SHAPE),  # past the table
    (_triple(np.array([-1, 2], np.int64), VALUES, np.int64(5)), ErrorCode.BAD_SHAPE),  # negative
    (_triple(ROWS, np.ones((3, 3), np.float32), np.int64(5)), ErrorCode.BAD_SHAPE),  # 2 rows, 3 values
    (_triple(ROWS, np.ones(3, np.float32), np.int64(5)), ErrorCode.BAD_SHAPE),
    (_triple(ROWS, np.float32(1), np.int64(5)), ErrorCode.BAD_SHAPE),  # values of rank 0
    (_triple(ROWS.astype(np.int32), VALUES, np.int64(5)), ErrorCode.BAD_DTYPE),  # indices not int64
    (_triple(ROWS.reshape(2, 1), VALUES, np.int64(5)), ErrorCode.BAD_SHAPE),  # indices not 1-D
    (_triple(ROWS, VALUES, np.array([5], np.int64)), ErrorCode.BAD_SHAPE),  # num_rows not a scalar
    (_triple(ROWS, VALUES, np.int32(5)), ErrorCode.BAD_SHAPE),  # num_rows not int64
    (_triple(ROWS, VALUES, np.int64(-1)), ErrorCode.BAD_SHAPE),
    (_triple(ROWS, np.array([[1, np.nan, 0]] * 2, np.float32), np.int64(5)), ErrorCode.NON_FINITE),
])
def test_bad_row_sparse_entries_are_refused(entries, code):
    assert _code(_raw(entries)) == code


def test_encode_refuses_reserved_names_and_bad_row_sparse():
    for name in ("w@rows", "w@", "@", "a@b"):
        with pytest.raises(ProtocolError) as info:
            encode_tensors({name: np.zeros(2, np.float32)})  # a plain name may not hold "@"
        assert info.value.code == ErrorCode.MALFORMED
        with pytest.raises(ProtocolError) as info:
            encode_tensors({name: RowSparse(ROWS, VALUES, 5)})
        assert info.value.code == ErrorCode.MALFORMED
    for bad in (RowSparse(np.array([2, 0], np.int64), VALUES, 5), RowSparse(ROWS, VALUES, 2),
                RowSparse(ROWS, VALUES[:1], 5),
                RowSparse(ROWS, VALUES, -1), RowSparse(ROWS, VALUES, 5.0)):
        with pytest.raises(ProtocolError) as info:
            encode_tensors({"w": bad})
        assert info.value.code == ErrorCode.BAD_SHAPE
    with pytest.raises(ProtocolError) as info:
        encode_tensors({"w": RowSparse(ROWS.astype(np.int32), VALUES, 5)})
    assert info.value.code == ErrorCode.BAD_DTYPE


def test_encode_refuses_row_sparse_of_non_arrays():
    for bad in (RowSparse([0, 2], VALUES, 5), RowSparse(ROWS, [[1.0, 2.0, 3.0]] * 2, 5)):  # type: ignore[arg-type]
        with pytest.raises(ProtocolError) as info:
            encode_tensors({"w": bad})
        assert info.value.code == ErrorCode.MALFORMED


def test_encode_refuses_a_row_sparse_entry_with_a_name_that_is_not_a_string():
    with pytest.raises(ProtocolError) as info:
        encode_tensors({1: RowSparse(ROWS, VALUES, 5)})  # type: ignore[dict-item]
    assert info.value.code == ErrorCode.MALFORMED


def test_encode_refuses_a_row_sparse_entry_without_a_name():
    with pytest.raises(ProtocolError) as info:
        encode_tensors({"": RowSparse(ROWS, VALUES, 5)})
    assert info.value.code == ErrorCode.MALFORMED


def test_num_rows_is_a_dimension_bounded_by_the_limits():
    payload = encode_tensors({"w": RowSparse(ROWS, VALUES, 1 << 62)})
    assert _code(payload) == ErrorCode.BAD_SHAPE


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
