"""The protocol over a real websockets server on 127.0.0.1: streaming, resume, bad clients, and a
whole round through channels whose sessions check every message on both ends."""

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
    Ack,
    Bye,
    Error,
    ErrorCode,
    Fetch,
    Hello,
    IncomingTransfer,
    Instruction,
    Limits,
    ProtocolError,
    Report,
    RowSparse,
    TransferBegin,
    TransferFrame,
    Welcome,
    decode_tensors,
    encode,
    encode_tensors,
    frames,
)
from edge_sdk.protocol.codec import encode_parts
from edge_sdk.protocol.session import DeviceSession, ServerSession, SessionState
from edge_sdk.transport import Channel, recv_msg, recv_payload, send_error, send_msg, send_payload, ws_options

FRAME = 256 * 1024
LIMITS = Limits(max_frame_bytes=FRAME, max_transfer_bytes=64 << 20)
CHUNK = encode_tensors({"blocks.stage1.conv.weight": np.random.default_rng(0).standard_normal((64, 64, 3, 3, 8),
                                                                                             dtype=np.float32)})
assert len(CHUNK) > 4 * FRAME  # several frames
#: What the minimal server can stream, by payload id: a chunk and a model payload (the same bytes).
KINDS = {"chunk-0": "chunk", "chunk-1": "chunk", "model-0": "model"}


class Server:
    """A minimal orchestrator: Hello -> Welcome, Fetch -> the payload's transfer; protocol errors -> Error + close."""

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
                    if msg.payload_id not in KINDS:
                        raise ProtocolError(ErrorCode.UNEXPECTED, f"no payload {msg.payload_id!r}")
                    await send_payload(ws, CHUNK, transfer_id=f"r{msg.round}-{msg.payload_id}",
                                       kind=KINDS[msg.payload_id], meta={"payload": msg.payload_id, "round": msg.round},
                                       frame_size=FRAME, offset=msg.offset)
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
            await send_msg(ws, Fetch(round=0, payload_id="chunk-0"))
            begin = await recv_msg(ws, LIMITS)
            assert isinstance(begin, TransferBegin) and begin.total_size == len(CHUNK) and begin.kind == "chunk"
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
            await send_msg(ws, Fetch(round=4, payload_id="chunk-1"))
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
            await send_msg(ws, Fetch(round=4, payload_id="chunk-1", offset=held))
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
            await send_msg(ws, Fetch(round=0, payload_id="model-0"))
            begin = await recv_msg(ws, LIMITS)
            assert begin.kind == "model" and await recv_payload(ws, begin, LIMITS) == CHUNK
            await send_msg(ws, Bye())

    server = asyncio.run(_with_server(client))
    assert server.served == ["dev-3"] and len(server.errors) == 1


def test_recv_payload_raises_the_peers_error_and_refuses_interleaved_messages():
    async def handler(ws):
        fetch = await recv_msg(ws, LIMITS)
        stream = frames(CHUNK, transfer_id="t", kind=KINDS[fetch.payload_id], meta={}, frame_size=FRAME)
        for msg in itertools.islice(stream, 3):  # the begin and two frames, then trouble
            await send_msg(ws, msg)
        if fetch.payload_id == "chunk-0":
            await send_error(ws, ProtocolError(ErrorCode.REFUSED, "server draining"))
        else:
            await send_msg(ws, Bye("stopping"))

    async def main():
        async with serve(handler, "127.0.0.1", 0, **ws_options(LIMITS)) as ws_server:
            url = f"ws://127.0.0.1:{ws_server.sockets[0].getsockname()[1]}"
            for payload_id, code, remote in (("chunk-0", "refused", True), ("model-0", "unexpected", False)):
                async with connect(url, **ws_options(LIMITS)) as ws:
                    await send_msg(ws, Fetch(0, payload_id))
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
                await send_msg(ws, Fetch(0, "chunk-0"))
                payload = await recv_payload(ws, await recv_msg(ws, BIG), BIG)
                assert payload == CHUNK and decode_tensors(payload, BIG).keys() == {"blocks.stage1.conv.weight"}
                await send_msg(ws, Fetch(0, "chunk-1"))
                begin = await recv_msg(ws, BIG)
                incoming = IncomingTransfer(begin, BIG, hash_in_feed=False)
                with pytest.raises(ProtocolError) as info:
                    await recv_payload(ws, begin, BIG, incoming=incoming)
                assert info.value.code == ErrorCode.CHECKSUM and not info.value.remote
                assert incoming.complete and incoming.unhashed == 0  # every byte was hashed

    asyncio.run(asyncio.wait_for(main(), timeout=60))


# --- a round through channels: both ends' sessions check every message -------------------------------

TABLE = RowSparse(np.array([1, 5], np.int64), np.ones((2, 4), np.float32), 8)
MODEL = encode_tensors({"blocks.1.emb.weight": TABLE, "blocks.2.fc.bias": np.zeros(3, np.float32)})
ROUND = Instruction(round=0, phase="evaluate", model_version=0, split=1, chunk_ids=["chunk-0"], model_id="model-0",
                    selection="rows", broadcast_id="", local_steps=2, lr=0.1, deadline_s=60.0, config={})
FOLLOW_UP = Instruction(**{**ROUND.__dict__, "phase": "train"})


class ChannelServer:
    """Hello -> Welcome and an evaluate instruction; sends the train follow-up while the device
    fetches; streams payloads; takes reports and their updates; acks; says bye after the train ack."""

    def __init__(self) -> None:
        self.errors: list[ProtocolError] = []
        self.updates: list[dict] = []
        self.final: ServerSession | None = None
        self.hello: Hello | None = None

    async def handler(self, ws) -> None:
        ch = Channel(ws, ServerSession(), LIMITS)
        try:
            hello = self.hello = await recv_msg(ch)
            assert ch.session.state is SessionState.WELCOMING
            await send_msg(ch, Welcome(hello.device_id, "weak", 1, 3, [(0, 1)], "tiny", 0, 8, 2, {}))
            await send_msg(ch, ROUND)
            followed = False
            while True:
                msg = await recv_msg(ch)
                if isinstance(msg, Fetch):
                    if not followed:
                        await send_msg(ch, FOLLOW_UP)  # mid-fetch: the device queues it
                        followed = True
                    payload = CHUNK if msg.payload_id.startswith("chunk") else MODEL
                    await send_payload(ch, payload, transfer_id=f"{msg.payload_id}-r0", kind=KINDS[msg.payload_id],
                                       meta={}, frame_size=FRAME, offset=msg.offset)
                elif isinstance(msg, Report):
                    if msg.transfer_id:
                        begin = await recv_msg(ch)
                        self.updates.append(decode_tensors(await recv_payload(ch, begin, LIMITS), LIMITS))
                    assert ch.session.state is SessionState.AWAITING_ACK
                    await send_msg(ch, Ack(msg.round, True, "", msg.phase))
                    if msg.phase == "train":
                        assert ch.session.state is SessionState.IDLE and not ch.session.pending
                        await send_msg(ch, Bye("training finished"))
                        self.final = ch.session
                        return
                    assert ch.session.instruction == FOLLOW_UP  # the server moved on by itself
                else:
                    raise ProtocolError(ErrorCode.UNEXPECTED, f"{msg.TYPE} is not expected here")
        except ProtocolError as exc:
            self.errors.append(exc)
            await send_error(ch, exc)
        except ConnectionClosed:
            pass


async def _with_channel_server(client) -> ChannelServer:
    server = ChannelServer()
    async with serve(server.handler, "127.0.0.1", 0, **ws_options(LIMITS)) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        await asyncio.wait_for(client(f"ws://127.0.0.1:{port}"), timeout=60)
    return server


def test_a_round_with_a_follow_up_through_checked_channels():
    async def client(url):
        async with connect(url, **ws_options(LIMITS)) as ws:
            ch = Channel(ws, DeviceSession(), LIMITS)
            session = ch.session
            await send_msg(ch, Hello("dev-ch", "t", 256 << 20, 1, ["onnxruntime"], 100, rows={"0": [1, 5]}))
            await recv_msg(ch)
            instruction = await recv_msg(ch)
            phases = []
            while instruction is not None:
                for payload_id in (*instruction.chunk_ids, instruction.model_id):
                    await send_msg(ch, Fetch(instruction.round, payload_id))
                    begin = await recv_msg(ch)
                    while isinstance(begin, Instruction):  # a follow-up waits in the session's queue
                        begin = await recv_msg(ch)
                    data = await recv_payload(ch, begin, LIMITS)
                    assert data == (CHUNK if payload_id.startswith("chunk") else MODEL)
                model = decode_tensors(MODEL, LIMITS)
                if instruction.phase == "evaluate":
                    assert list(session.pending) == [FOLLOW_UP]
                    await send_msg(ch, Report(0, "evaluate", 100, (0, 0), "", {"loss": 0.5}))
                else:
                    deltas = {"blocks.1.emb.weight": RowSparse(TABLE.indices, TABLE.values * 0.5, 8),
                              "blocks.2.fc.bias": np.ones(3, np.float32)}
                    await send_msg(ch, Report(0, "train", 100, (1, 3), "upd-1",
                                              {"loss_before": 1.0, "loss_after": 0.5}))
                    assert session.state is SessionState.UPLOADING
                    await send_payload(ch, encode_tensors(deltas), transfer_id="upd-1", kind="update", meta={},
                                       frame_size=FRAME)
                assert isinstance(model["blocks.1.emb.weight"], RowSparse)
                ack = await recv_msg(ch)
                assert ack == Ack(0, True, "", instruction.phase) and session.state is SessionState.IDLE
                phases.append(instruction.phase)
                instruction = session.next_instruction()
            assert phases == ["evaluate", "train"]
            assert isinstance(await recv_msg(ch), Bye) and session.closed

    server = asyncio.run(_with_channel_server(client))
    assert server.errors == [] and server.final is not None and server.final.closed
    assert server.hello.rows == {"0": [1, 5]}
    (update,) = server.updates
    np.testing.assert_array_equal(update["blocks.1.emb.weight"].dense()[5], np.full(4, 0.5, np.float32))


def test_a_device_fetching_what_it_was_not_given_is_refused_by_the_servers_session():
    async def client(url):
        async with connect(url, **ws_options(LIMITS)) as ws:
            ch = Channel(ws, DeviceSession(), LIMITS)
            await send_msg(ch, _hello("dev-rogue"))
            await recv_msg(ch)
            await recv_msg(ch)  # the instruction
            with pytest.raises(ProtocolError) as info:  # its own session will not send it ...
                await send_msg(ch, Fetch(0, "model-9"))
            assert info.value.code == ErrorCode.UNEXPECTED and "'model-9'" in info.value.message
            await send_msg(ws, Fetch(0, "model-9"))  # ... so it goes around it
            error = await recv_msg(ws, LIMITS)
            assert isinstance(error, Error) and error.code == ErrorCode.UNEXPECTED and "'model-9'" in error.message
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

    server = asyncio.run(_with_channel_server(client))
    assert [e.code for e in server.errors] == [ErrorCode.UNEXPECTED]


def test_a_report_that_crosses_the_servers_bye_is_dropped_and_the_connection_ends_cleanly():
    # The run ends as a device reports: the server's bye and the device's report pass each other on the
    # wire. The server drops the report (it sent its close first); the device reads the bye, not an error.
    outcome: dict[str, object] = {}

    async def handler(ws) -> None:
        ch = Channel(ws, ServerSession(), LIMITS)
        try:
            hello = await recv_msg(ch)
            await send_msg(ch, Welcome(hello.device_id, "weak", 1, 3, [(0, 1)], "tiny", 0, 8, 2, {}))
            await send_msg(ch, ROUND)
            outcome["reported"] = asyncio.get_running_loop().create_future()
            await outcome["reported"]  # the device's report is on the wire before the bye is sent
            await send_msg(ch, Bye("training finished"))
            await recv_msg(ch)  # the report: dropped by the channel, which then meets the close
            outcome["server"] = "read a message after its bye"
        except ProtocolError as exc:
            outcome["server"] = exc
        except ConnectionClosed:
            outcome["server"] = "closed"

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, **ws_options(LIMITS)) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}", **ws_options(LIMITS)) as ws:
                ch = Channel(ws, DeviceSession(), LIMITS)
                await send_msg(ch, _hello("dev-late"))
                await recv_msg(ch)
                instruction = await recv_msg(ch)
                await send_msg(ch, Report(instruction.round, instruction.phase, 100, (0, 0), "", {"loss": 0.5}))
                await asyncio.sleep(0.2)  # the report reaches the server's socket before it says bye
                outcome["reported"].set_result(None)
                outcome["device"] = await recv_msg(ch)
            await asyncio.sleep(0.1)

    asyncio.run(asyncio.wait_for(main(), timeout=30))
    assert outcome["device"] == Bye("training finished")
    assert outcome["server"] == "closed"
