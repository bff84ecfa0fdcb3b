"""A goodbye that reaches a Python device in the middle of a round ends its run: the server finished
(a buffered run makes its last version while some devices still train), so the device returns its
reports instead of taking the closed connection for a drop and reconnecting to a server that is gone."""

from __future__ import annotations

import asyncio

import numpy as np
from websockets.asyncio.server import serve

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.transport import recv_msg, send_msg, ws_options

ROUND = p.Instruction(round=1, phase="train", model_version=0, split=1, chunk_ids=["chunk-0"], model_id="model-0",
                      selection="tail", broadcast_id="", local_steps=2, lr=0.1, deadline_s=60.0, config={})


def _run_device(handler, events: list[str]) -> list:
    """A device against a server of ``handler``: its reports. Reconnects are allowed, as a device run as
    a service has them: after the goodbye it must not use them."""
    async def main() -> list:
        async with serve(handler, "127.0.0.1", 0, **ws_options()) as server:
            port = server.sockets[0].getsockname()[1]
            config = DeviceSettings(f"ws://127.0.0.1:{port}", "dev-bye", 1 << 30, reconnect=True, reconnect_retries=3)
            client = DeviceClient(config, np.zeros((4, 3), dtype=np.float32), np.zeros(4, dtype=np.int64),
                                  on_event=lambda kind, data: events.append(kind))
            return await asyncio.wait_for(client.run(), timeout=60)

    return asyncio.run(main())


def test_a_goodbye_during_a_download_ends_the_run_instead_of_a_reconnect() -> None:
    seen: list[str] = []
    events: list[str] = []

    async def handler(ws) -> None:
        hello = await recv_msg(ws)
        seen.append(hello.TYPE)
        await send_msg(ws, p.Welcome(hello.device_id, "weak", 1, 3, [(0, 1)], "tiny", 0, 8, 2, {}))
        await send_msg(ws, ROUND)
        fetch = await recv_msg(ws)
        seen.append(fetch.TYPE)
        await send_msg(ws, p.Bye("training finished"))  # the run ended while this device was in its round
        await ws.close()

    reports = _run_device(handler, events)
    assert reports == [] and seen == ["hello", "fetch"]  # one connection: no second hello
    assert "aborted" in events and "reconnect" not in events


def test_a_goodbye_read_only_after_the_close_ends_the_run_instead_of_a_reconnect() -> None:
    """The server says goodbye and closes while the device is busy (here measuring its probe step
    before its hello: as a device training its round when a run ends): the device meets the closed
    connection on its next send, reads the goodbye the connection still holds, and ends its run."""
    connections: list[int] = []
    events: list[str] = []

    async def handler(ws) -> None:
        connections.append(1)
        await send_msg(ws, p.Bye("training finished"))
        await ws.close()

    assert _run_device(handler, events) == []
    assert connections == [1] and "reconnect" not in events, events
