"""The protocol over a real websockets server on 127.0.0.1: streaming, resume, and bad clients."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from edge_sdk.protocol import (
    Bye,
    Error,
    ErrorCode,
    Fetch,
    Hello,
    IncomingTransfer,
    Limits,
    ProtocolError,
    TransferBegin,
    TransferFrame,
    Welcome,
    decode_tensors,
    encode,
    encode_tensors,
    frames,
)
from edge_sdk.protocol.codec import encode_parts
from edge_sdk.transport import recv_msg, recv_payload, send_error, send_msg, send_payload, ws_options

FRAME = 256 * 1024
LIMITS = Limits(max_frame_bytes=FRAME, max_transfer_bytes=64 << 20)
CHUNK = encode_tensors({"blocks.stage1.conv.weight": np.random.default_rng(0).standard_normal((64, 64, 3, 3, 8),
                                                                                             dtype=np.float32)})
assert len(CHUNK) > 4 * FRAME  # several frames


class Server:
    """A minimal orchestrator: Hello -> Welcome, Fetch -> chunk transfer; protocol errors -> Error + close."""

    def __init__(self) -> None:
        self.served: list[str] = []
        self.errors: list[str] = []

    async def handler(self, ws) -> None:
        try:
            hello = await recv_msg(ws, LIMITS)
            if not isinstance(hello, Hello):
                raise ProtocolError(ErrorCode.UNEXPECTED, f"expected hello, got {hello.TYPE}")
            await send_msg(ws, Welcome(hello.device_id, "weak", 2, 4, [(0, 2)], "resnet20", 1, 32, 1, {}))
            self.served.append(hello.device_id)
            while True:
                msg = await recv_msg(ws, LIMITS)
                if isinstance(msg, Fetch):
                    await send_payload(ws, CHUNK, transfer_id=f"r{msg.round}-{msg.kind}-{msg.index}", kind=msg.kind,
                                       meta={"index": msg.index, "round": msg.round}, frame_size=FRAME,
                                       offset=msg.offset)
                elif isinstance(msg, Bye):
                    return
                else:
                    raise ProtocolError(ErrorCode.UNEXPECTED, f"{msg.TYPE} is not expected here")
        except ProtocolError as exc:
            self.errors.append(exc.code)
            await send_error(ws, exc)
        except ConnectionClosed:
            pass


async def _with_server(client):
    server = Server()
    async with serve(server.handler, "127.0.0.1", 0, **ws_options(LIMITS)) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        await asyncio.wait_for(client(f"ws://127.0.0.1:{port}", server), timeout=60)
    return server


def _hello(device_id: str) -> Hello:
    return Hello(device_id=device_id, token="t", budget_bytes=256 << 20, cores=1, runtimes=["onnxruntime"],
                 num_samples=100)


def test_ws_options_turn_compression_off_and_bound_messages():
    options = ws_options(LIMITS)
    assert options["compression"] is None
    assert options["max_size"] == LIMITS.max_message_bytes >= FRAME
    assert options["ping_interval"] and options["ping_timeout"] and options["max_queue"]


def test_streams_a_multi_frame_payload():
    async def client(url, server):
        async with connect(url, **ws_options(LIMITS)) as ws:
            await send_msg(ws, _hello("dev-1"))
            welcome = await recv_msg(ws, LIMITS)
            assert isinstance(welcome, Welcome) and welcome.split == 2
            await send_msg(ws, Fetch(round=0, kind="chunk", index=0))
            begin = await recv_msg(ws, LIMITS)
            assert isinstance(begin, TransferBegin) and begin.total_size == len(CHUNK)
            assert begin.sha256 == ""  # send_payload hashes while it streams: a TransferEnd has the digest
            payload = await recv_payload(ws, begin, LIMITS)
            assert payload == CHUNK
            assert isinstance(payload, memoryview) and payload.readonly  # the receive buffer, not a copy
            arrays = decode_tensors(payload, LIMITS)
            assert arrays["blocks.stage1.conv.weight"].shape == (64, 64, 3, 3, 8)
            await send_msg(ws, Bye("done"))

    server = asyncio.run(_with_server(client))
    assert server.served == ["dev-1"] and server.errors == []


def test_a_dropped_download_resumes_on_a_new_connection():
    async def client(url, server):
        async with connect(url, **ws_options(LIMITS)) as ws:
            await send_msg(ws, _hello("dev-2"))
            await recv_msg(ws, LIMITS)
            await send_msg(ws, Fetch(round=4, kind="chunk", index=1))
            begin = await recv_msg(ws, LIMITS)
            incoming = IncomingTransfer(begin, LIMITS)
            while incoming.offset < len(CHUNK) // 2:
                incoming.feed(await recv_msg(ws, LIMITS))
        # The connection is gone mid-transfer; the device reconnects and asks for the rest.
        held = incoming.offset
        assert 0 < held < len(CHUNK)
        async with connect(url, **ws_options(LIMITS)) as ws:
            await send_msg(ws, _hello("dev-2"))
            await recv_msg(ws, LIMITS)
            await send_msg(ws, Fetch(round=4, kind="chunk", index=1, offset=held))
            begin2 = await recv_msg(ws, LIMITS)
            assert isinstance(begin2, TransferBegin) and begin2.offset == held
            payload = await recv_payload(ws, begin2, LIMITS, incoming=incoming)
            assert payload == CHUNK
            await send_msg(ws, Bye())

    server = asyncio.run(_with_server(client))
    assert server.served == ["dev-2", "dev-2"]


@pytest.mark.parametrize("bad", [
    b"\xc1" + os.urandom(63),  # not msgpack at all (0xc1 is never used)
    encode(TransferFrame("x", 0, b"data")),  # valid, but not a hello
    "a text frame",
], ids=["garbage", "unexpected", "text"])
def test_a_bad_client_gets_an_error_and_a_close_while_others_are_served(bad):
    async def client(url, server):
        async with connect(url, **ws_options(LIMITS)) as ws:
            await ws.send(bad)
            error = await recv_msg(ws, LIMITS)
            assert isinstance(error, Error)
            assert error.code == (ErrorCode.UNEXPECTED if isinstance(bad, bytes) and bad[0] == 0x85
                                  else ErrorCode.MALFORMED)
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        # The server survived: a second client is served normally.
        async with connect(url, **ws_options(LIMITS)) as ws:
            await send_msg(ws, _hello("dev-3"))
            assert isinstance(await recv_msg(ws, LIMITS), Welcome)
            await send_msg(ws, Fetch(round=0, kind="tail", index=0))
            begin = await recv_msg(ws, LIMITS)
            assert await recv_payload(ws, begin, LIMITS) == CHUNK
            await send_msg(ws, Bye())

    server = asyncio.run(_with_server(client))
    assert server.served == ["dev-3"] and len(server.errors) == 1


def test_recv_payload_raises_the_peers_error_and_refuses_interleaved_messages():
    async def handler(ws):
        fetch = await recv_msg(ws, LIMITS)
        stream = frames(CHUNK, transfer_id="t", kind=fetch.kind, meta={}, frame_size=FRAME)
        for msg in itertools.islice(stream, 3):  # the begin and two frames, then trouble
            await send_msg(ws, msg)
        if fetch.kind == "chunk":
            await send_error(ws, ProtocolError(ErrorCode.REFUSED, "server draining"))
        else:
            await send_msg(ws, Bye("stopping"))

    async def main():
        async with serve(handler, "127.0.0.1", 0, **ws_options(LIMITS)) as ws_server:
            url = f"ws://127.0.0.1:{ws_server.sockets[0].getsockname()[1]}"
            for kind, code, remote in (("chunk", "refused", True), ("tail", "unexpected", False)):
                async with connect(url, **ws_options(LIMITS)) as ws:
                    await send_msg(ws, Fetch(0, kind, 0))
                    begin = await recv_msg(ws, LIMITS)
                    with pytest.raises(ProtocolError) as info:
                        await recv_payload(ws, begin, LIMITS)
                    assert (info.value.code, info.value.remote) == (code, remote)

    asyncio.run(asyncio.wait_for(main(), timeout=60))


BIG = Limits(max_frame_bytes=1 << 20, max_transfer_bytes=64 << 20)


def test_a_large_frame_is_sent_as_fragments_that_reassemble_to_its_encoding():
    big = TransferFrame("t", 0, memoryview(CHUNK)[: 768 << 10])  # above the fragmenting threshold
    small = TransferFrame("t", 0, memoryview(CHUNK)[:FRAME])

    async def handler(ws):
        await send_msg(ws, big)
        await send_msg(ws, small)
        await send_msg(ws, big)
        await ws.wait_closed()

    async def main():
        async with serve(handler, "127.0.0.1", 0, **ws_options(BIG)) as ws_server:
            url = f"ws://127.0.0.1:{ws_server.sockets[0].getsockname()[1]}"
            async with connect(url, **ws_options(BIG)) as ws:
                parts = [part async for part in ws.recv_streaming()]
                header, data = encode_parts(big)
                assert parts == [header, bytes(data), b""]  # header, data as it is, end of message
                assert [part async for part in ws.recv_streaming()] == [encode(small)]  # small: joined
                assert await recv_msg(ws, BIG) == big  # a plain receiver sees one message

    asyncio.run(asyncio.wait_for(main(), timeout=60))


@pytest.mark.parametrize("digest_first", [True, False], ids=["digest-first", "digest-last"])
@pytest.mark.parametrize("frame_size", [FRAME, 768 << 10], ids=["joined", "fragmented"])
def test_a_corrupted_payload_is_refused_while_hashing_overlaps_the_transfer(frame_size, digest_first):
    corrupt_at = len(CHUNK) - 2 * FRAME  # late: the worker thread has hashed earlier frames by then

    async def handler(ws):
        await recv_msg(ws, BIG)
        await send_payload(ws, CHUNK, transfer_id="ok", kind="chunk", meta={}, frame_size=frame_size)
        await recv_msg(ws, BIG)
        sha256 = hashlib.sha256(CHUNK).hexdigest() if digest_first else None
        for msg in frames(CHUNK, transfer_id="bad", kind="chunk", meta={}, frame_size=frame_size, sha256=sha256):
            if isinstance(msg, TransferFrame) and msg.offset <= corrupt_at < msg.offset + len(msg.data):
                bad = bytearray(msg.data)  # one bit flipped in transit, after the sender hashed the frame
                bad[corrupt_at - msg.offset] ^= 0x01
                msg = TransferFrame(msg.transfer_id, msg.offset, bytes(bad))
            await send_msg(ws, msg)
        await ws.wait_closed()

    async def main():
        async with serve(handler, "127.0.0.1", 0, **ws_options(BIG)) as ws_server:
            url = f"ws://127.0.0.1:{ws_server.sockets[0].getsockname()[1]}"
            async with connect(url, **ws_options(BIG)) as ws:
                await send_msg(ws, Fetch(0, "chunk", 0))
                payload = await recv_payload(ws, await recv_msg(ws, BIG), BIG)
                assert payload == CHUNK and decode_tensors(payload, BIG).keys() == {"blocks.stage1.conv.weight"}
                await send_msg(ws, Fetch(0, "chunk", 1))
                begin = await recv_msg(ws, BIG)
                incoming = IncomingTransfer(begin, BIG, hash_in_feed=False)
                with pytest.raises(ProtocolError) as info:
                    await recv_payload(ws, begin, BIG, incoming=incoming)
                assert info.value.code == ErrorCode.CHECKSUM and not info.value.remote
                assert incoming.complete and incoming.unhashed == 0  # every byte was hashed

    asyncio.run(asyncio.wait_for(main(), timeout=60))
