"""Named tensors <-> bytes: a msgpack map of name -> tensor extension value.

A tensor is the msgpack extension type :data:`TENSOR_EXT` whose payload is a little-endian header,
zero padding, then the raw C-order little-endian data (docs/protocol.md, "Tensors")::

    u8 dtype code | u8 rank | u8 pad | 5 zero bytes | rank x u64 dims | pad zero bytes | data

The encoder chooses ``pad`` (0-63) so that every tensor's data starts at a multiple of 64 bytes
from the start of the encoded payload: decoded arrays are aligned views of the input.

:func:`encode_tensors` writes the map around the arrays' own buffers and joins everything once (the
tensor data is copied exactly once). :func:`decode_tensors` parses that map itself instead of going
through ``msgpack.unpackb`` (whose extension hook would copy every tensor) and returns read-only
``numpy.frombuffer`` views of the input: no copy at all. It accepts every msgpack spelling of the
structure (fixmap/map 16/map 32, any str and ext format), so any msgpack encoder can produce payloads.
Format bytes follow the msgpack specification (github.com/msgpack/msgpack/blob/master/spec.md,
"map format family", "str format family", "ext format family").
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack
import numpy as np

from .codec import DEFAULT_LIMITS, BytesLike, Limits
from .errors import ErrorCode, ProtocolError

__all__ = ["TENSOR_EXT", "DTYPES", "RowSparse", "encode_tensors", "decode_tensors"]

#: msgpack extension type code of a tensor.
TENSOR_EXT = 1

#: Wire code -> dtype (always little-endian). Codes are part of the protocol: never reuse one.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f2"),
    3: np.dtype("<f8"),
    4: np.dtype("<i8"),
    5: np.dtype("<i4"),
    6: np.dtype("u1"),
    7: np.dtype("?"),
}
_CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}
_BOOL_CODE = 7

_HEAD = struct.Struct("<BBB5x")  # dtype code, rank, pad
_EXT32 = struct.Struct(">BIb")  # ext 32: 0xc9, payload length, type code
_ALIGN = 64
_FINITE_BLOCK = 1 << 18  # elements checked at a time: bounded scratch memory, cache-sized


#: Separator of the wire entries of a row-sparse tensor (``name@rows``, ``name@values``,
#: ``name@num_rows``); reserved: plain tensor names may not contain it.
SPARSE_SEP = "@"
_SPARSE_PARTS = ("rows", "values", "num_rows")


@dataclass(frozen=True, eq=False)
class RowSparse:
    """Rows ``indices`` of a table of ``num_rows`` rows (docs/protocol.md, "Row-sparse tensors").

    A submodel's embedding rows travel this way (FedSubAvg): the device receives and returns only
    the rows its data touches. ``indices`` is int64, strictly increasing, in ``[0, num_rows)``;
    ``values[i]`` is row ``indices[i]``.
    """

    indices: np.ndarray
    values: np.ndarray
    num_rows: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the whole table."""
        return (self.num_rows, *self.values.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def check(self, name: str = "") -> None:
        """Raise ``ProtocolError`` unless indices and values describe rows of the table."""
        where = f"row-sparse tensor {name[:64]!r}"
        if not isinstance(self.indices, np.ndarray) or not isinstance(self.values, np.ndarray):
            raise ProtocolError(ErrorCode.MALFORMED, f"{where}: indices and values must be numpy arrays")
        idx = self.indices
        if idx.dtype != np.dtype("<i8"):
            raise ProtocolError(ErrorCode.BAD_DTYPE, f"{where}: indices must be int64, got {idx.dtype}")
        if idx.ndim != 1:
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: indices must be 1-D")
        if self.values.ndim < 1 or self.values.shape[0] != idx.shape[0]:
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: {idx.shape[0]} indices but values of shape "
                                                     f"{list(self.values.shape)}")
        if type(self.num_rows) is not int or self.num_rows < 0:
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: num_rows {self.num_rows!r} is not a count")
        if idx.size and (idx[0] < 0 or idx[-1] >= self.num_rows or (idx.size > 1 and not (idx[1:] > idx[:-1]).all())):
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: indices must be strictly increasing rows in "
                                                     f"[0, {self.num_rows})")

    def dense(self) -> np.ndarray:
        """The whole table with zeros outside the rows (for tests and small tables)."""
        out = np.zeros(self.shape, dtype=self.values.dtype)
        out[self.indices] = self.values
        return out


def _expand(tensors: Mapping[str, np.ndarray | RowSparse]) -> dict[str, np.ndarray]:
    """Row-sparse entries as their three plain wire entries."""
    flat: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if isinstance(value, RowSparse) and (type(name) is not str or not name):
            raise ProtocolError(ErrorCode.MALFORMED, f"a row-sparse tensor needs a non-empty str name, got {name!r:.64}")
        if type(name) is str and SPARSE_SEP in name:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor name {name[:64]!r} contains the reserved "
                                                     f"{SPARSE_SEP!r}")
        if isinstance(value, RowSparse):
            value.check(name)
            flat[f"{name}{SPARSE_SEP}rows"] = value.indices
            flat[f"{name}{SPARSE_SEP}values"] = value.values
            flat[f"{name}{SPARSE_SEP}num_rows"] = np.array(value.num_rows, dtype=np.int64)
        else:
            flat[name] = value
    return flat


def _collapse(flat: dict[str, np.ndarray], limits: Limits) -> dict[str, np.ndarray | RowSparse]:
    """The inverse of :func:`_expand`: every ``@`` entry must belong to a complete row-sparse triple."""
    if not any(SPARSE_SEP in name for name in flat):
        return flat  # type: ignore[return-value]
    out: dict[str, np.ndarray | RowSparse] = {}
    parts: dict[str, dict[str, np.ndarray]] = {}
    for name, array in flat.items():
        base, sep, part = name.rpartition(SPARSE_SEP)
        if not sep:
            out[name] = array
            continue
        if part not in _SPARSE_PARTS or not base or SPARSE_SEP in base:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor name {name[:64]!r}: {SPARSE_SEP!r} is reserved for "
                                                     f"row-sparse parts {list(_SPARSE_PARTS)}")
        parts.setdefault(base, {})[part] = array
    for base, got in parts.items():
        if base in out or len(got) != len(_SPARSE_PARTS):
            raise ProtocolError(ErrorCode.MALFORMED, f"row-sparse tensor {base[:64]!r} needs exactly the parts "
                                                     f"{list(_SPARSE_PARTS)}, got {sorted(got)}")
        num_rows = got["num_rows"]
        if num_rows.shape != () or num_rows.dtype != np.dtype("<i8"):
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"row-sparse tensor {base[:64]!r}: num_rows must be an int64 scalar")
        if int(num_rows) > limits.max_dim:
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"row-sparse tensor {base[:64]!r}: {int(num_rows)} rows exceed "
                                                     f"{limits.max_dim}")
        sparse = RowSparse(got["rows"], got["values"], int(num_rows))
        sparse.check(base)
        out[base] = sparse
    return out


def encode_tensors(tensors: Mapping[str, np.ndarray | RowSparse]) -> bytes:
    """Encode named arrays. Big-endian or non-contiguous arrays are converted first.

    Raises ``ProtocolError`` (``bad_dtype``, ``malformed``) for anything the decoder would refuse
    for its type; size bounds are the receiver's ``Limits`` to enforce.
    """
    if not isinstance(tensors, Mapping):
        raise ProtocolError(ErrorCode.MALFORMED, f"expected a mapping of str to ndarray, got {type(tensors).__name__}")
    tensors = _expand(tensors)
    count = len(tensors)
    if count < 16:
        parts: list[BytesLike] = [bytes((0x80 | count,))]  # fixmap
    elif count < 1 << 16:
        parts = [struct.pack(">BH", 0xDE, count)]  # map 16
    else:
        parts = [struct.pack(">BI", 0xDF, count)]  # map 32
    position = len(parts[0])  # bytes written so far, to align each tensor's data
    for name, array in tensors.items():
        if type(name) is not str:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor names must be str, got {type(name).__name__}")
        if not isinstance(array, np.ndarray):
            raise ProtocolError(ErrorCode.MALFORMED,
                                f"tensor {name!r}: expected numpy.ndarray, got {type(array).__name__}")
        code = _CODES.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
        if code is None:
            raise ProtocolError(ErrorCode.BAD_DTYPE, f"tensor {name!r}: dtype {array.dtype} is not one of "
                                                     f"{sorted(str(d) for d in DTYPES.values())}")
        dtype = DTYPES[code]
        if array.dtype != dtype or not array.flags.c_contiguous:
            array = np.asarray(array, dtype=dtype, order="C")  # little-endian, C order, rank kept
        try:
            key = msgpack.packb(name)
        except UnicodeEncodeError:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor name {name!r} is not valid Unicode") from None
        dims = struct.pack(f"<{array.ndim}Q", *array.shape)
        unpadded = position + len(key) + _EXT32.size + _HEAD.size + len(dims)
        pad = -unpadded % _ALIGN
        data = memoryview(array.reshape(-1).view(np.uint8))
        size = _HEAD.size + len(dims) + pad + data.nbytes
        if size >= 1 << 32:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"tensor {name!r} of {data.nbytes} bytes exceeds 4 GiB")
        parts += (key, _EXT32.pack(0xC9, size, TENSOR_EXT), _HEAD.pack(code, array.ndim, pad), dims,
                  bytes(pad), data)
        position = unpadded + pad + data.nbytes
    return b"".join(parts)


def decode_tensors(data: BytesLike, limits: Limits = DEFAULT_LIMITS, *,
                   allow_non_finite: bool = False) -> dict[str, np.ndarray | RowSparse]:
    """Decode named arrays, refusing unknown dtypes, bad shapes, oversize data and NaN/Inf.

    The arrays are read-only views of ``data`` (no copy), which they keep alive. Row-sparse
    entries come back as :class:`RowSparse`, checked (sorted rows inside the table).
    Raises only ``ProtocolError``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(ErrorCode.MALFORMED, f"expected bytes, got {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise ProtocolError(ErrorCode.MALFORMED, "tensor payload must be a contiguous buffer")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if len(view) > limits.max_transfer_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"tensor payload of {len(view)} bytes exceeds "
                                                 f"{limits.max_transfer_bytes}")
    reader = _Reader(view)
    try:
        count = reader.map_header()
        if count > limits.max_items:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{count} tensors exceed {limits.max_items}")
        tensors: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = reader.text(limits)
            if name in tensors:
                raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name[:64]!r} appears twice")
            code, start, length = reader.ext(name)
            if code != TENSOR_EXT:
                raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name[:64]!r}: unknown extension type {code}")
            array = _tensor(view, start, length, limits, name)
            if not allow_non_finite and array.dtype.kind == "f" and not _all_finite(array):
                raise ProtocolError(ErrorCode.NON_FINITE, f"tensor {name[:64]!r} holds NaN or infinity")
            tensors[name] = array
    except struct.error:
        raise ProtocolError(ErrorCode.MALFORMED, "tensor payload is truncated") from None
    if reader.pos != len(view):
        raise ProtocolError(ErrorCode.MALFORMED, f"{len(view) - reader.pos} bytes after the tensor map")
    return _collapse(tensors, limits)


class _Reader:
    """Just enough of msgpack to walk a map of str -> ext, with every length checked against the end."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.view, self.pos)  # struct.error past the end
        self.pos += struct.calcsize(fmt)
        return value

    def _skip(self, length: int) -> int:
        start = self.pos
        if start + length > len(self.view):
            raise ProtocolError(ErrorCode.MALFORMED, "tensor payload is truncated")
        self.pos = start + length
        return start

    def map_header(self) -> int:
        lead = self._take(">B")
        if 0x80 <= lead <= 0x8F:
            return lead & 0x0F
        if lead == 0xDE:
            return self._take(">H")
        if lead == 0xDF:
            return self._take(">I")
        raise ProtocolError(ErrorCode.MALFORMED, f"a tensor payload must be a msgpack map (first byte 0x{lead:02x})")

    def text(self, limits: Limits) -> str:
        lead = self._take(">B")
        if 0xA0 <= lead <= 0xBF:
            length = lead & 0x1F
        elif lead == 0xD9:
            length = self._take(">B")
        elif lead == 0xDA:
            length = self._take(">H")
        elif lead == 0xDB:
            length = self._take(">I")
        else:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor names must be msgpack str (byte 0x{lead:02x})")
        if length > 4 * limits.max_str_len:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"tensor name of {length} bytes exceeds the limit")
        start = self._skip(length)
        try:
            name = str(self.view[start:self.pos], "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.MALFORMED, "tensor name is not UTF-8") from None
        if len(name) > limits.max_str_len:
            raise ProtocolError(ErrorCode.TOO_LARGE,
                                f"tensor name of {len(name)} characters exceeds {limits.max_str_len}")
        return name

    def ext(self, name: str) -> tuple[int, int, int]:
        """Return (type code, payload start, payload length) of the extension value at the cursor."""
        lead = self._take(">B")
        if lead in _FIXEXT:
            length = _FIXEXT[lead]
        elif lead == 0xC7:
            length = self._take(">B")
        elif lead == 0xC8:
            length = self._take(">H")
        elif lead == 0xC9:
            length = self._take(">I")
        else:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name[:64]!r}: expected a tensor extension value "
                                                     f"(byte 0x{lead:02x})")
        code = self._take(">b")
        return code, self._skip(length), length


_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _tensor(view: memoryview, start: int, length: int, limits: Limits, name: str) -> np.ndarray:
    where = f"tensor {name[:64]!r}"
    if length < _HEAD.size:
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: header is truncated")
    code, rank, pad = _HEAD.unpack_from(view, start)
    dtype = DTYPES.get(code)
    if dtype is None:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"{where}: unknown dtype code {code}")
    if rank > limits.max_rank:
        raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: rank {rank} exceeds {limits.max_rank}")
    if pad >= _ALIGN:
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: padding of {pad} bytes exceeds {_ALIGN - 1}")
    offset = _HEAD.size + 8 * rank + pad
    if length < offset:
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: shape is truncated")
    shape = struct.unpack_from(f"<{rank}Q", view, start + _HEAD.size)
    count = span = 1
    for dim in shape:
        if dim > limits.max_dim:
            raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: dimension {dim} exceeds {limits.max_dim}")
        count *= dim
        span *= max(dim, 1)
    # An empty tensor's other dimensions are bounded too: numpy refuses shapes whose product of the
    # non-zero dimensions overflows, empty or not.
    if count == 0 and span * dtype.itemsize > limits.max_tensor_bytes:
        raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: shape {list(shape)} spans more than "
                                                 f"{limits.max_tensor_bytes} bytes")
    nbytes = count * dtype.itemsize
    if nbytes > limits.max_tensor_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}: {nbytes} bytes exceed {limits.max_tensor_bytes}")
    if length - offset != nbytes:
        raise ProtocolError(ErrorCode.BAD_SHAPE, f"{where}: shape {list(shape)} needs {nbytes} bytes of {dtype}, "
                                                 f"got {length - offset}")
    array = np.frombuffer(view, dtype, count, start + offset) if count else np.empty(0, dtype)
    if code == _BOOL_CODE and (array.view(np.uint8) > 1).any():
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: bool tensor holds bytes other than 0 and 1")
    array = array.reshape(shape)
    array.flags.writeable = False  # a view of the caller's buffer: never write through it
    return array


def _all_finite(array: np.ndarray) -> bool:
    flat = array.reshape(-1)
    for i in range(0, flat.size, _FINITE_BLOCK):
        if not np.isfinite(flat[i:i + _FINITE_BLOCK]).all():
            return False
    return True
