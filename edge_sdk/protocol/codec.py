"""Bytes <-> messages: msgpack maps with ``"t"`` (type) and ``"v"`` (version) plus the fields.

Sans-I/O: :func:`encode` and :func:`decode` are pure functions over bytes. :func:`decode` trusts
nothing: the size is checked before parsing, msgpack runs with tight length limits, and every field
is checked for presence, exact type (a ``bool`` is not an ``int``), bounds and value constraints.
Any failure raises :class:`~edge_sdk.protocol.ProtocolError`; no other exception escapes.

``TransferFrame`` has a fast path in both directions: the header is written by hand, so that
:func:`encode_parts` returns it beside the untouched data (no copy at all; :func:`encode` joins the
two, one copy), and on decode the data is a ``memoryview`` into the input (no copy).
The fast decoder accepts only the exact layout the encoder writes and falls back to the general
decoder for anything else, so both paths accept the same inputs. Format bytes (0xcf uint 64,
0xc6 bin 32, ...) are those of the msgpack specification (github.com/msgpack/msgpack/blob/master/spec.md).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import ErrorCode, ProtocolError
from .messages import (
    BOOL,
    BYTES,
    DICT_BYTES,
    DICT_INTS,
    DICT_SCALAR,
    DICT_STR,
    EXT,
    EXT_KEY,
    EXT_MAX_BYTES,
    EXT_MAX_DEPTH,
    EXT_MAX_KEY_CHARS,
    EXT_MAX_KEYS,
    FLOAT,
    INT,
    LIST_PAIR,
    LIST_INT,
    LIST_STR,
    MESSAGE_TYPES,
    PAIR,
    PROTOCOL_VERSION,
    STR,
    Message,
    TransferFrame,
    schema,
)

__all__ = ["Limits", "DEFAULT_LIMITS", "encode", "encode_parts", "decode", "BytesLike"]

BytesLike = bytes | bytearray | memoryview

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class Limits:
    """Bounds that every decoder enforces; the receiver's limits decide (docs/protocol.md, "Limits").

    ``max_message_bytes`` bounds one encoded message, hence one websocket message; 0 means
    ``max_frame_bytes`` plus 64 KiB for the frame header. Large payloads are never one message:
    they stream as frames of at most ``max_frame_bytes``, so only ``max_transfer_bytes`` bounds a
    payload (it is preallocated by the receiver, so keep it within the receiver's memory).
    """

    #: Data bytes in one ``TransferFrame``.
    max_frame_bytes: int = 1 << 20
    #: One encoded message (0: ``max_frame_bytes + 64 KiB``).
    max_message_bytes: int = 0
    #: One transfer's payload (``TransferBegin.total_size``) and one ``decode_tensors`` input.
    max_transfer_bytes: int = 1 << 30
    #: Data bytes of one tensor.
    max_tensor_bytes: int = 1 << 30
    #: Dimensions of one tensor.
    max_rank: int = 8
    #: Size of one tensor dimension.
    max_dim: int = 1 << 31
    #: Entries in one list or map (including the tensors of one ``encode_tensors`` payload).
    max_items: int = 100_000
    #: Characters of one string (ids, names, keys, messages).
    max_str_len: int = 4096

    def __post_init__(self) -> None:
        if self.max_message_bytes == 0:
            object.__setattr__(self, "max_message_bytes", self.max_frame_bytes + (64 << 10))
        for name in ("max_frame_bytes", "max_message_bytes", "max_transfer_bytes", "max_tensor_bytes",
                     "max_rank", "max_dim", "max_items", "max_str_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if self.max_message_bytes < self.max_frame_bytes + 4 * self.max_str_len + 256:
            raise ValueError(
                "Limits.max_message_bytes must leave room for a frame header: at least "
                f"max_frame_bytes + 4 * max_str_len + 256 = {self.max_frame_bytes + 4 * self.max_str_len + 256}"
            )


DEFAULT_LIMITS = Limits()
_HUGE = 1 << 62
_UNBOUNDED = Limits(max_frame_bytes=_HUGE, max_message_bytes=2 * _HUGE, max_transfer_bytes=_HUGE,
                    max_tensor_bytes=_HUGE, max_rank=_HUGE, max_dim=_HUGE, max_items=_HUGE, max_str_len=1 << 40)


# --- encoding ----------------------------------------------------------------------------------------


def encode(msg: Message) -> bytes:
    """Encode a message as one msgpack map. Raises ``ProtocolError`` if the message is not valid,
    so that nothing is sent that the peer would have to reject."""
    return b"".join(encode_parts(msg))


def encode_parts(msg: Message) -> tuple[BytesLike, ...]:
    """Encode a message as buffers whose concatenation is ``encode(msg)``, without copying its data.

    A ``TransferFrame`` gives two parts, its msgpack header (a few dozen bytes) and its ``data``
    as it is: sent as the fragments of one websocket message (``ws.send(parts)``), the data is not
    joined to the header in a new buffer first, and the peer still receives exactly
    ``encode(msg)``. Any other message gives one part. Raises like :func:`encode`.
    """
    cls = type(msg)
    if cls not in _SCHEMA_BY_CLASS:
        raise ProtocolError(ErrorCode.MALFORMED, f"cannot encode {cls.__name__}: not a protocol message")
    _validate(msg, _UNBOUNDED)  # types and values; size bounds are the receiver's to enforce
    try:
        if cls is TransferFrame:
            return _encode_frame(msg)  # type: ignore[arg-type]
        body: dict[str, Any] = {"t": cls.TYPE, "v": PROTOCOL_VERSION}
        for name, _ in _SCHEMA_BY_CLASS[cls]:
            value = getattr(msg, name)
            if name not in cls.OPTIONAL or value != _DEFAULTS[cls][name]:
                body[name] = value
        return (msgpack.packb(body, use_bin_type=True),)
    except UnicodeEncodeError as exc:  # a str holding lone surrogates has no UTF-8 form
        raise ProtocolError(ErrorCode.MALFORMED, f"{cls.TYPE}: a string is not valid Unicode: {exc.reason}") from None


# The fixed start of an encoded TransferFrame: fixmap of 5, "t": "transfer_frame", "v": 1, "transfer_id".
_FRAME_PREFIX = b"".join((b"\x85", *(msgpack.packb(x) for x in ("t", TransferFrame.TYPE, "v", PROTOCOL_VERSION,
                                                                   "transfer_id"))))
_OFFSET_KEY = msgpack.packb("offset")
_DATA_KEY = msgpack.packb("data")
_U64 = struct.Struct(">BQ")
_BIN32 = struct.Struct(">BI")


def _encode_frame(frame: TransferFrame) -> tuple[bytes, BytesLike]:
    """Write the map's header by hand; the data follows it unchanged (``bin 32``, always)."""
    data = _byte_view(frame.data)
    header = b"".join((
        _FRAME_PREFIX,
        msgpack.packb(frame.transfer_id),
        _OFFSET_KEY,
        _U64.pack(0xCF, frame.offset),  # uint 64
        _DATA_KEY,
        _BIN32.pack(0xC6, len(data)),  # bin 32
    ))
    return header, data


def _byte_view(data: BytesLike) -> BytesLike:
    """``data`` as a sequence of bytes (a memoryview of floats has len() in floats, not bytes)."""
    if isinstance(data, memoryview) and (data.ndim != 1 or data.format != "B"):
        return data.cast("B")
    return data


# --- decoding ----------------------------------------------------------------------------------------


def decode(data: BytesLike, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and validate one message (see the module docstring for what is checked)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(ErrorCode.MALFORMED, f"expected bytes, got {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > limits.max_message_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {size} bytes exceeds {limits.max_message_bytes}")
    frame = _decode_frame_fast(data, limits)
    if frame is not None:
        return frame
    obj = _unpack(data, limits, max_bin_len=limits.max_frame_bytes, max_ext_len=limits.max_str_len)
    if type(obj) is not dict:
        raise ProtocolError(ErrorCode.MALFORMED, f"a message must be a msgpack map, got {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.BAD_VERSION, f"protocol version {version!r} is not {PROTOCOL_VERSION}")
    name = obj.get("t")
    cls = MESSAGE_TYPES.get(name) if type(name) is str else None
    if cls is None:
        shown = name[:64] if type(name) is str else repr(name)[:64]
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {shown!r}")
    fields = _SCHEMA_BY_CLASS[cls]
    expected = _FIELD_NAMES[cls]
    if not expected - cls.OPTIONAL <= obj.keys() <= expected:
        missing = sorted(expected - cls.OPTIONAL - obj.keys())
        extra = sorted(repr(k)[:40] for k in obj.keys() - expected)
        raise ProtocolError(ErrorCode.MALFORMED, f"{cls.TYPE}: missing fields {missing}, unexpected fields {extra}")
    kwargs = {name: _check_kind(cls.TYPE, name, kind, obj[name], limits) for name, kind in fields if name in obj}
    msg = cls(**kwargs)
    msg.check()
    return msg


def _unpack(data: BytesLike, limits: Limits, *, max_bin_len: int, max_ext_len: int) -> Any:
    """``msgpack.unpackb`` with every length bounded; any failure becomes ``ProtocolError``."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_str_len * 4,  # bytes of UTF-8; characters are checked after
            max_bin_len=max_bin_len,
            max_array_len=max(limits.max_items, 2),  # pairs are arrays of 2
            max_map_len=max(limits.max_items, 32),  # a message's own map has up to 11 fields
            max_ext_len=max_ext_len,  # no field is an extension: refused by type afterwards
        )
    except Exception as exc:  # msgpack raises ValueError, TypeError, UnicodeDecodeError, StackError, ...
        text = str(exc)[:200]
        code = ErrorCode.TOO_LARGE if "exceeds max" in text else ErrorCode.MALFORMED
        raise ProtocolError(code, f"not valid msgpack: {type(exc).__name__}: {text}") from None


def _decode_frame_fast(data: BytesLike, limits: Limits) -> TransferFrame | None:
    """Parse the exact layout of :func:`_encode_frame` without copying the data, or return None."""
    view = memoryview(data)
    if not view.c_contiguous:
        return None
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    n = len(_FRAME_PREFIX)
    if view[:n] != _FRAME_PREFIX:
        return None
    # transfer_id: fixstr or str 8 (ids are short).
    if len(view) <= n:
        return None
    lead = view[n]
    if 0xA0 <= lead <= 0xBF:
        id_len, pos = lead & 0x1F, n + 1
    elif lead == 0xD9 and len(view) > n + 1:
        id_len, pos = view[n + 1], n + 2
    else:
        return None
    id_end = pos + id_len
    tail = id_end + len(_OFFSET_KEY) + _U64.size + len(_DATA_KEY) + _BIN32.size
    if len(view) < tail:
        return None
    try:
        transfer_id = str(view[pos:id_end], "utf-8")
    except UnicodeDecodeError:
        return None
    pos = id_end
    if view[pos:pos + len(_OFFSET_KEY)] != _OFFSET_KEY:
        return None
    pos += len(_OFFSET_KEY)
    tag, offset = _U64.unpack_from(view, pos)
    pos += _U64.size
    if tag != 0xCF or view[pos:pos + len(_DATA_KEY)] != _DATA_KEY:
        return None
    pos += len(_DATA_KEY)
    tag, length = _BIN32.unpack_from(view, pos)
    pos += _BIN32.size
    if tag != 0xC6 or pos + length != len(view):
        return None
    fields = {"transfer_id": transfer_id, "offset": offset, "data": view[pos:].toreadonly()}
    kwargs = {name: _check_kind(TransferFrame.TYPE, name, kind, fields[name], limits)
              for name, kind in _SCHEMA_BY_CLASS[TransferFrame]}
    frame = TransferFrame(**kwargs)
    frame.check()
    return frame


def _validate(msg: Message, limits: Limits) -> None:
    where = msg.TYPE
    for name, kind in _SCHEMA_BY_CLASS[type(msg)]:
        _check_kind(where, name, kind, getattr(msg, name), limits)
    msg.check()


def _bad(where: str, name: str, what: str) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"{where}.{name}: {what}")


def _check_str(where: str, name: str, value: Any, limits: Limits) -> str:
    if type(value) is not str:
        raise _bad(where, name, f"expected str, got {type(value).__name__}")
    if len(value) > limits.max_str_len:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}.{name}: string of {len(value)} characters "
                                                 f"exceeds {limits.max_str_len}")
    return value


def _check_int(where: str, name: str, value: Any) -> int:
    if type(value) is not int:  # bool is a subclass of int: refuse it here
        raise _bad(where, name, f"expected int, got {type(value).__name__}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _bad(where, name, "integer outside the int64 range")
    return value


def _check_float(where: str, name: str, value: Any) -> float:
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        value = float(value)  # msgpack peers may write 1.0 as 1
    if type(value) is not float:
        raise _bad(where, name, f"expected float, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ProtocolError(ErrorCode.NON_FINITE, f"{where}.{name}: {value} is not finite")
    return value


def _check_scalar(where: str, name: str, value: Any, limits: Limits) -> Any:
    kind = type(value)
    if kind is str:
        return _check_str(where, name, value, limits)
    if kind is bool:
        return value
    if kind is int:
        return _check_int(where, name, value)
    if kind is float:
        return _check_float(where, name, value)
    raise _bad(where, name, f"expected str, int, float or bool, got {kind.__name__}")


def _check_items(where: str, name: str, value: Any, limits: Limits, container: type) -> None:
    if type(value) is not container:
        raise _bad(where, name, f"expected {container.__name__}, got {type(value).__name__}")
    if len(value) > limits.max_items:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}.{name}: {len(value)} entries exceed {limits.max_items}")


def _check_kind(where: str, name: str, kind: str, value: Any, limits: Limits) -> Any:
    """Check one field against its kind and return it in canonical form (tuples for pairs)."""
    if kind == STR:
        return _check_str(where, name, value, limits)
    if kind == INT:
        return _check_int(where, name, value)
    if kind == FLOAT:
        return _check_float(where, name, value)
    if kind == BOOL:
        if type(value) is not bool:
            raise _bad(where, name, f"expected bool, got {type(value).__name__}")
        return value
    if kind == BYTES:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _bad(where, name, f"expected bytes, got {type(value).__name__}")
        if isinstance(value, memoryview) and not value.c_contiguous:
            raise _bad(where, name, "a memoryview must be contiguous")
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        if size > limits.max_frame_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}.{name}: {size} bytes exceed {limits.max_frame_bytes}")
        return value
    if kind == LIST_STR:
        _check_items(where, name, value, limits, list)
        return [_check_str(where, name, item, limits) for item in value]
    if kind == LIST_INT:
        _check_items(where, name, value, limits, list)
        return [_check_int(where, name, item) for item in value]
    if kind == PAIR:
        if type(value) not in (list, tuple) or len(value) != 2:
            raise _bad(where, name, "expected a pair of ints")
        return (_check_int(where, name, value[0]), _check_int(where, name, value[1]))
    if kind == LIST_PAIR:
        _check_items(where, name, value, limits, list)
        return [_check_kind(where, name, PAIR, item, limits) for item in value]
    if kind in (DICT_STR, DICT_SCALAR):
        _check_items(where, name, value, limits, dict)
        out = {}
        for key, item in value.items():
            _check_str(where, name, key, limits)
            if kind == DICT_STR:
                out[key] = _check_str(where, f"{name}[{key[:40]!r}]", item, limits)
            else:
                out[key] = _check_scalar(where, f"{name}[{key[:40]!r}]", item, limits)
        return out
    if kind == DICT_BYTES:
        _check_items(where, name, value, limits, dict)
        out = {}
        for key, item in value.items():
            _check_str(where, name, key, limits)
            out[key] = bytes(_check_kind(where, f"{name}[{key[:40]!r}]", BYTES, item, limits))
        return out
    if kind == DICT_INTS:
        _check_items(where, name, value, limits, dict)
        out = {}
        for key, items in value.items():
            _check_str(where, name, key, limits)
            _check_items(where, f"{name}[{key[:40]!r}]", items, limits, list)
            out[key] = [_check_int(where, f"{name}[{key[:40]!r}]", item) for item in items]
        return out
    if kind == EXT:
        return _check_ext(where, name, value, limits)
    raise AssertionError(f"unknown field kind {kind}")  # pragma: no cover - schemas are fixed


def _check_ext(where: str, name: str, value: Any, limits: Limits) -> dict[str, Any]:
    """Extension fields: at most ``EXT_MAX_KEYS`` keys ``namespace.name`` of at most
    ``EXT_MAX_KEY_CHARS`` characters; values scalars, bytes, lists and maps (string keys) nested at
    most ``EXT_MAX_DEPTH`` deep, of at most ``EXT_MAX_BYTES`` together."""
    if type(value) is not dict:
        raise _bad(where, name, f"expected a map, got {type(value).__name__}")
    if len(value) > EXT_MAX_KEYS:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}.{name}: {len(value)} keys exceed {EXT_MAX_KEYS}")
    size = 0
    for key, item in value.items():
        if type(key) is not str or len(key) > EXT_MAX_KEY_CHARS or EXT_KEY.fullmatch(key) is None:
            raise _bad(where, name, f"key {str(key)[:80]!r} is not namespace.name (a-z, 0-9, _, -; at most "
                                    f"{EXT_MAX_KEY_CHARS} characters)")
        size += len(key) + _ext_size(where, f"{name}[{key!r}]", item, limits, EXT_MAX_DEPTH)
    if size > EXT_MAX_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{where}.{name}: {size} bytes exceed {EXT_MAX_BYTES}")
    return value


def _ext_size(where: str, name: str, value: Any, limits: Limits, depth: int) -> int:
    """Check one extension value and return about how many bytes msgpack takes for it."""
    kind = type(value)
    if kind in (bytes, bytearray, memoryview):
        return 5 + len(_check_kind(where, name, BYTES, value, limits))
    if kind in (list, dict):
        if depth <= 1:
            raise _bad(where, name, f"nested deeper than {EXT_MAX_DEPTH} levels")
        _check_items(where, name, value, limits, kind)
        if kind is list:
            return 5 + sum(_ext_size(where, name, v, limits, depth - 1) for v in value)
        return 5 + sum(len(_check_str(where, name, k, limits)) + 5 + _ext_size(where, f"{name}[{k[:40]!r}]", v, limits,
                                                                               depth - 1) for k, v in value.items())
    scalar = _check_scalar(where, name, value, limits)
    return 5 + len(scalar) if type(scalar) is str else 9


_SCHEMA_BY_CLASS = {cls: schema(cls) for cls in MESSAGE_TYPES.values()}
_DEFAULTS = {cls: {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                   for f in dataclasses.fields(cls) if f.name in cls.OPTIONAL} for cls in MESSAGE_TYPES.values()}
_FIELD_NAMES = {cls: frozenset({"t", "v"} | {name for name, _ in fields}) for cls, fields in _SCHEMA_BY_CLASS.items()}
