"""An update larger than what its device was sent is refused at its first message: nothing is
allocated for it, the device gets an error frame, and the model and the other devices are untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from tests.factories import server_config


def test_an_oversized_update_is_refused_before_it_is_received(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main():
        config = server_config(tmp_path / "store", deadline_s=20)
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        before = {k: v.copy() for k, v in orch.global_state.items()}
        rss_before = psutil.Process().memory_info().rss
        async with connect(f"ws://127.0.0.1:{orch.port}", **ws_options()) as ws:
            await send_msg(ws, p.Hello(device_id="big", token="", budget_bytes=512 << 20, cores=1,
                                       runtimes=["torch"], num_samples=100))
            welcome, task = await recv_msg(ws), await recv_msg(ws)
            assert isinstance(welcome, p.Welcome) and isinstance(task, p.Instruction)
            await send_msg(ws, p.Report(task.round, "train", 100, (0, welcome.num_blocks), "u-1", {}))
            await send_msg(ws, p.TransferBegin("u-1", "update", 1 << 30, "", 1 << 20, 0, {}))  # 1 GiB announced
            error = await recv_msg(ws)
        grown = psutil.Process().memory_info().rss - rss_before
        history = await server
        return error, grown, before, orch.global_state, history

    error, grown, before, after, history = asyncio.run(main())
    assert isinstance(error, p.Error) and error.code == "too_large" and "at most" in error.message
    assert grown < 50 << 20  # nothing of the announced gibibyte was allocated
    assert history[0]["reported"] == 0
    for name, value in before.items():
        assert (after[name] == value).all()


def test_an_upload_from_an_unselected_device_is_refused_at_its_first_message(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "store", min_devices=2, deadline_s=20, wait_devices_s=20)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        rss_before = psutil.Process().memory_info().rss
        async with connect(f"ws://127.0.0.1:{orch.port}", **ws_options()) as ws:
            await send_msg(ws, p.Hello(device_id="idle", token="", budget_bytes=512 << 20, cores=1,
                                       runtimes=["torch"], num_samples=100))
            assert isinstance(await recv_msg(ws), p.Welcome)  # no round runs: nobody asked it for anything
            await send_msg(ws, p.Report(1, "train", 100, (0, 2), "u-1", {}))
            await send_msg(ws, p.TransferBegin("u-1", "update", 1 << 30, "", 1 << 20, 0, {}))
            error = await recv_msg(ws)
        grown = psutil.Process().memory_info().rss - rss_before
        server.cancel()
        return error, grown, orch.store.reports.all()

    error, grown, journaled = asyncio.run(main())
    assert isinstance(error, p.Error) and error.code == "unexpected" and "report" in error.message
    assert grown < 50 << 20 and journaled == []
