"""Transfers: framing, checksum, resume after an interruption, and refusal of bad frames."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import (
    ErrorCode,
    IncomingTransfer,
    Limits,
    ProtocolError,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    decode,
    encode,
    frames,
    sha256_hex,
)
from edge_sdk.protocol.codec import encode_parts

PAYLOAD = os.urandom(1_000_003)  # not a multiple of the frame size: the last frame is short
FRAME = 64 * 1024


def _stream(payload=PAYLOAD, frame_size=FRAME, offset=0, **kwargs):
    """``(begin, frames, end)``: ``end`` is the ``TransferEnd``, or None when ``begin`` has the digest."""
    out = list(frames(payload, transfer_id="chunk-0", kind="chunk", meta={"index": 0, "round": 3},
                      frame_size=frame_size, offset=offset, **kwargs))
    end = out.pop() if isinstance(out[-1], TransferEnd) else None
    assert all(type(m) is TransferFrame for m in out[1:])
    return out[0], out[1:], end


def _wire(msg):
    return decode(encode(msg))  # every test goes through the real codec


def _code(call) -> str:
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value.code


@settings(max_examples=40, deadline=None)
@given(payload=st.binary(max_size=5000), frame_size=st.integers(1, 1500), known_digest=st.booleans())
def test_any_payload_and_frame_size_round_trips(payload, frame_size, known_digest):
    digest = hashlib.sha256(payload).hexdigest()
    begin, rest, end = _stream(payload, frame_size, sha256=digest if known_digest else None)
    assert begin.total_size == len(payload) and len(rest) == -(-len(payload) // frame_size)
    if known_digest:  # the digest travels first, and no TransferEnd follows
        assert begin.sha256 == digest and end is None
    else:  # hashed while streaming: the digest comes last
        assert begin.sha256 == "" and end.sha256 == digest and end.transfer_id == begin.transfer_id
    incoming = IncomingTransfer(_wire(begin))
    assert incoming.complete == (len(payload) == 0)
    for i, frame in enumerate(rest):
        assert len(frame.data) <= frame_size
        assert incoming.feed(_wire(frame)) == (i == len(rest) - 1)
    assert incoming.complete and incoming.finished == known_digest
    if not known_digest:
        assert _code(incoming.result) == ErrorCode.UNEXPECTED  # the digest is still due
        incoming.finish(_wire(end))
        assert incoming.finished
    assert incoming.result() == payload


def test_frames_are_views_of_the_payload():
    begin, rest, _ = _stream()
    assert begin.meta == {"index": 0, "round": 3} and begin.frame_size == FRAME
    assert all(isinstance(f.data, memoryview) and f.data.obj is PAYLOAD for f in rest)
    assert [f.offset for f in rest] == list(range(0, len(PAYLOAD), FRAME))


def test_encode_parts_is_encode_without_copying_the_frame_data():
    begin, rest, _ = _stream()
    header, data = encode_parts(rest[1])
    assert data.obj is PAYLOAD  # the payload itself, not a copy
    assert header + bytes(data) == encode(rest[1]) and len(header) < 100
    assert decode(header + bytes(data)) == rest[1]
    assert encode_parts(begin) == (encode(begin),)  # other messages are one part
    # A frame over a typed buffer: the data part counts bytes, and the wire form is the same.
    floats = memoryview(bytearray(64)).cast("f")
    parts = encode_parts(TransferFrame("t", 0, floats))
    assert len(parts[1]) == 64 and b"".join(parts) == encode(TransferFrame("t", 0, bytes(64)))
    # encode_parts validates like encode.
    assert _code(lambda: encode_parts(TransferFrame("t", 0, b""))) == ErrorCode.MALFORMED
    assert _code(lambda: encode_parts(TransferFrame("", 0, b"x"))) == ErrorCode.MALFORMED


def test_known_digest_is_not_recomputed():
    begin, _, end = _stream(sha256="ab" * 32)
    assert begin.sha256 == "ab" * 32 and end is None


def test_transfer_end_is_checked():
    begin, rest, end = _stream()
    incoming = IncomingTransfer(begin)
    for frame in rest[:-1]:
        incoming.feed(frame)
    assert _code(lambda: incoming.finish(end)) == ErrorCode.OUT_OF_ORDER  # a byte is still missing
    incoming.feed(rest[-1])
    assert _code(lambda: incoming.finish(TransferEnd("chunk-9", end.sha256))) == ErrorCode.UNEXPECTED
    assert _code(lambda: incoming.finish(rest[0])) == ErrorCode.UNEXPECTED  # type: ignore[arg-type]
    incoming.finish(end)
    assert _code(lambda: incoming.finish(end)) == ErrorCode.UNEXPECTED  # a second end
    assert incoming.result() == PAYLOAD
    # A wrong digest in the end is a corrupted transfer.
    wrong = IncomingTransfer(begin)
    for frame in rest:
        wrong.feed(frame)
    wrong.finish(TransferEnd("chunk-0", "0" * 64))
    assert _code(wrong.view) == ErrorCode.CHECKSUM
    # No end is due when the digest came first.
    known, rest, _ = _stream(sha256=end.sha256)
    early = IncomingTransfer(known)
    for frame in rest:
        early.feed(frame)
    assert _code(lambda: early.finish(end)) == ErrorCode.UNEXPECTED
    assert early.result() == PAYLOAD


def test_resumed_sender_hashes_the_bytes_before_its_offset():
    _, _, end = _stream()
    _, rest, resumed_end = _stream(offset=3 * FRAME)
    assert rest[0].offset == 3 * FRAME and resumed_end == end  # the digest covers the whole payload


@pytest.mark.parametrize("known_digest", [True, False])
def test_interrupted_transfer_resumes_from_its_offset(known_digest):
    digest = sha256_hex(PAYLOAD) if known_digest else None
    begin, rest, _ = _stream(sha256=digest)
    incoming = IncomingTransfer(_wire(begin))
    half = len(rest) // 2
    for frame in rest[:half]:
        incoming.feed(_wire(frame))  # ... and then the connection drops
    held = incoming.offset
    assert held == half * FRAME and not incoming.complete
    with pytest.raises(ProtocolError):
        incoming.result()
    # The receiver reports `held`; the sender restarts the stream from there.
    begin2, rest2, end2 = _stream(offset=held, sha256=digest)
    assert begin2.offset == held and rest2[0].offset == held
    incoming.resume(_wire(begin2))
    for frame in rest2:
        incoming.feed(_wire(frame))
    assert incoming.complete
    if end2 is not None:
        incoming.finish(_wire(end2))
    assert incoming.result() == PAYLOAD


def test_resume_must_continue_the_same_payload_at_the_held_offset():
    begin, rest, _ = _stream()
    incoming = IncomingTransfer(begin)
    incoming.feed(rest[0])
    other = dataclasses.replace(begin, offset=FRAME, sha256="0" * 64)
    assert _code(lambda: incoming.resume(other)) == ErrorCode.UNEXPECTED
    assert _code(lambda: incoming.resume(dataclasses.replace(begin, offset=FRAME, transfer_id="x"))) == "unexpected"
    assert _code(lambda: incoming.resume(dataclasses.replace(begin, offset=0))) == ErrorCode.OUT_OF_ORDER
    assert _code(lambda: incoming.resume(dataclasses.replace(begin, offset=2 * FRAME))) == ErrorCode.OUT_OF_ORDER
    assert _code(lambda: IncomingTransfer(dataclasses.replace(begin, offset=FRAME))) == ErrorCode.OUT_OF_ORDER


@pytest.mark.parametrize("known_digest", [True, False])
def test_a_corrupted_frame_is_caught_by_the_checksum(known_digest):
    begin, rest, end = _stream(sha256=sha256_hex(PAYLOAD) if known_digest else None)
    incoming = IncomingTransfer(begin)
    for i, frame in enumerate(rest):
        if i == 5:
            data = bytearray(frame.data)
            data[100] ^= 0x01  # one flipped bit in transit
            frame = TransferFrame(frame.transfer_id, frame.offset, bytes(data))
        incoming.feed(_wire(frame))
    assert incoming.complete
    if end is not None:
        incoming.finish(_wire(end))
    assert _code(incoming.result) == ErrorCode.CHECKSUM
    assert _code(incoming.view) == ErrorCode.CHECKSUM


def test_out_of_order_oversized_and_foreign_frames_are_refused():
    begin, rest, _ = _stream()
    incoming = IncomingTransfer(begin)
    assert _code(lambda: incoming.feed(rest[1])) == ErrorCode.OUT_OF_ORDER  # skipped a frame
    incoming.feed(rest[0])
    assert _code(lambda: incoming.feed(rest[0])) == ErrorCode.OUT_OF_ORDER  # replayed
    assert _code(lambda: incoming.feed(TransferFrame("chunk-0", FRAME, b"x" * (FRAME + 1)))) == ErrorCode.TOO_LARGE
    assert _code(lambda: incoming.feed(TransferFrame("chunk-9", FRAME, b"x"))) == ErrorCode.UNEXPECTED
    assert _code(lambda: incoming.feed(begin)) == ErrorCode.UNEXPECTED  # type: ignore[arg-type]
    assert incoming.offset == FRAME  # nothing refused was written

    small = TransferBegin("t", "chunk", 10, sha256_hex(b"0123456789"), 8, 0, {})
    tail = IncomingTransfer(small)
    tail.feed(TransferFrame("t", 0, b"01234567"))
    assert _code(lambda: tail.feed(TransferFrame("t", 8, b"89X"))) == ErrorCode.TOO_LARGE  # past the end
    tail.feed(TransferFrame("t", 8, b"89"))
    assert tail.result() == b"0123456789"


def test_transfer_limits():
    begin, _, _ = _stream()
    assert _code(lambda: IncomingTransfer(begin, Limits(max_transfer_bytes=1000))) == ErrorCode.TOO_LARGE
    assert _code(lambda: IncomingTransfer(begin, Limits(max_frame_bytes=1000))) == ErrorCode.TOO_LARGE
    # The frame size bounds messages, not payloads: a payload 1000x the frame size is fine.
    limits = Limits(max_frame_bytes=1024)
    begin, rest, end = _stream(frame_size=1024)
    incoming = IncomingTransfer(_wire(begin), limits)
    for frame in rest:
        incoming.feed(decode(encode(frame), limits))
    incoming.finish(end)
    assert incoming.result() == PAYLOAD


def test_hashing_in_a_worker_thread_gives_the_same_result():
    begin, rest, _ = _stream(sha256=sha256_hex(PAYLOAD))
    incoming = IncomingTransfer(begin, hash_in_feed=False)
    for frame in rest:
        incoming.feed(frame)
        worker = threading.Thread(target=incoming.hash_pending)
        worker.start()
        worker.join()
    assert incoming.hash_pending() == 0
    assert incoming.result() == PAYLOAD

    lazy = IncomingTransfer(begin, hash_in_feed=False)
    for frame in rest:
        lazy.feed(frame)
    assert bytes(lazy.view()) == PAYLOAD  # the rest is hashed on demand


def test_frames_rejects_bad_arguments():
    with pytest.raises(ValueError):
        _stream(frame_size=0)
    with pytest.raises(ValueError):
        _stream(offset=len(PAYLOAD) + 1)
