"""Connections are capped: beyond max_connections, or with too many still to say hello, a new one is
refused with HTTP 503 before the websocket upgrade (a device retries a failed handshake with backoff,
whereas it takes an error frame as final), and a silent connection is closed after hello_timeout_s."""

from __future__ import annotations

import asyncio
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from tests.factories import server_config


def _hello(device_id: str) -> p.Hello:
    return p.Hello(device_id=device_id, token="", budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


def test_connections_beyond_the_caps_are_refused(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "s", min_devices=9, max_connections=3, max_pending_hellos=2,
                               hello_timeout_s=1.0, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        opts = ws_options()
        silent1, silent2 = await connect(url, **opts), await connect(url, **opts)
        await asyncio.sleep(0.2)
        try:  # a third connection still to say hello: over 2 pending
            async with connect(url, **opts):
                pending_refusal = None
        except InvalidStatus as exc:
            pending_refusal = exc.response
        # The silent ones are closed after hello_timeout_s, making room.
        await asyncio.sleep(1.5)
        assert silent1.close_code is not None and silent2.close_code is not None
        devices = []
        for i in range(3):
            ws = await connect(url, **opts)
            await send_msg(ws, _hello(f"d{i}"))
            assert isinstance(await recv_msg(ws), p.Welcome)
            devices.append(ws)
        try:  # over max_connections
            async with connect(url, **opts):
                full_refusal = None
        except InvalidStatus as exc:
            full_refusal = exc.response
        for ws in (*devices, silent1, silent2):
            await ws.close()
        server.cancel()
        return pending_refusal, full_refusal

    pending_refusal, full_refusal = asyncio.run(main())
    assert pending_refusal is not None and pending_refusal.status_code == 503
    assert b"hello" in pending_refusal.body
    assert full_refusal is not None and full_refusal.status_code == 503
    assert b"maximum of 3 connections" in full_refusal.body
