"""Hellos that no device sends are refused with a clear error before they are planned or journaled,
and the server goes on serving honest devices."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config

GOOD = dict(device_id="d", token="", budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


@pytest.mark.parametrize("changes, code, fragment", [
    ({"budget_bytes": 0}, "refused", "budget of 0 bytes"),
    ({"budget_bytes": 1 << 50}, "refused", "outside"),
    ({"num_samples": 0}, "refused", "without local samples"),
    ({"labels": {f"k{i}": "v" for i in range(33)}}, "malformed", "labels"),
    ({"labels": {"note": "x" * 300}}, "malformed", "labels"),
    ({"runtimes": ["r"] * 9}, "malformed", "runtimes"),
])
def test_an_implausible_hello_is_refused(tmp_path: Path, changes, code, fragment) -> None:
    async def main():
        config = server_config(tmp_path / "s", deadline_s=10, wait_devices_s=10)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        async with connect(url, **ws_options()) as ws:
            await send_msg(ws, p.Hello(**{**GOOD, "device_id": "bad", **changes}))
            error = await recv_msg(ws)
        async with connect(url, **ws_options()) as ws:  # an honest device is still served
            await send_msg(ws, p.Hello(**GOOD))
            welcome = await recv_msg(ws)
        server.cancel()
        return error, welcome

    error, welcome = asyncio.run(main())
    assert isinstance(error, p.Error) and error.code == code and fragment in error.message
    assert isinstance(welcome, p.Welcome)
    store = Store(tmp_path / "s")
    assert [d["device_id"] for d in store.devices.all()] == ["d"]  # the refused hello was never journaled
    store.close()
