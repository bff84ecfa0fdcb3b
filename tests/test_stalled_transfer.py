"""A transfer that stalls or trickles is dropped with a timeout frame: the round closes without the
device long before its deadline, and the other devices are served."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from edge_sdk import protocol as p
from edge_sdk.transport import Pace, recv_msg, recv_payload, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from tests.factories import server_config
from tests.scripted import scripted_device


async def _trickler(url: str, orch) -> p.Message:
    """Announces its update, then sends one byte every 0.2 s."""
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id="slow", token="", budget_bytes=8 << 30, cores=1, runtimes=["torch"],
                                   num_samples=50))
        welcome, task = await recv_msg(ws), await recv_msg(ws)
        assert isinstance(task, p.Instruction)
        payload = p.encode_tensors({n: np.zeros(orch.global_state[n].shape, np.float32)
                                    for n in orch.model.state_names(task.split)})
        await send_msg(ws, p.Report(task.round, "train", 50, (task.split, welcome.num_blocks), "t", {}))
        await send_msg(ws, p.TransferBegin("t", "update", len(payload), "", 1, 0, {}))
        for offset in range(len(payload)):
            await send_msg(ws, p.TransferFrame("t", offset, payload[offset:offset + 1]))
            try:
                return await asyncio.wait_for(recv_msg(ws), timeout=0.2)
            except asyncio.TimeoutError:
                continue
        raise AssertionError("the trickle was never cut")


def test_a_trickled_update_times_out_and_the_round_goes_on(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "s", min_devices=2, deadline_s=120, transfer_stall_s=5,
                               transfer_min_rate=1024, transfer_grace_s=1)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        t0 = time.monotonic()
        error, acks, history = await asyncio.gather(
            _trickler(url, orch),
            scripted_device(url, orch, "honest", {}, lambda n, shape: np.full(shape, 0.01, np.float32)),
            server)
        return error, acks, history, time.monotonic() - t0

    error, acks, history, wall = asyncio.run(main())
    assert isinstance(error, p.Error) and error.code == "timeout" and "B/s" in error.message
    assert [a.accepted for a in acks] == [True]
    assert history[0]["reported"] == 1 and history[0]["stragglers"] == ["slow"]
    assert wall < 30  # closed by the pace, not by the 120 s deadline


def test_with_no_slowest_pace_a_download_has_no_time_limit(tmp_path: Path) -> None:
    """``transfer_min_rate = 0`` turns the pace off: the payloads a device fetches are served (a
    download's time limit is its size at that rate: none), and the round completes."""
    from edge_sdk.client import DeviceClient, DeviceSettings
    from edge_sdk.data import load_dataset
    from emulator.localfleet import role_budgets
    from orchestrator.config import ServerConfig

    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=1, local_steps=1, store_dir=tmp_path / "s",
                          deadline_s=120, transfer_min_rate=0)
    digits = load_dataset("digits")

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        budget = role_budgets("digits_mlp")["weak"] + (8 << 20)
        device = DeviceClient(DeviceSettings(f"ws://127.0.0.1:{orch.port}", "weak-0", budget, backend="torch"),
                              digits.x[:200], digits.y[:200])
        await asyncio.gather(device.run(), return_exceptions=True)
        return await asyncio.wait_for(server, timeout=120)

    history = asyncio.run(main())
    assert history[0]["reported"] == 1, history[0]


def test_a_sender_slow_to_start_is_not_cut_once_its_frames_flow() -> None:
    """The average rate runs from the first frame: a device busy (encoding, or starved of CPU) for longer
    than the grace before its first frame, then sending at full speed, is not a trickle (stall_s bounds
    the wait for that first frame)."""
    payload = bytes(range(256)) * 64  # 16 KiB in 16 frames
    pace = Pace(stall_s=5.0, min_rate=4096, grace_s=0.3)

    async def main() -> bytes:
        received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def handler(ws) -> None:  # type: ignore[no-untyped-def]
            begin = await recv_msg(ws)
            try:
                received.set_result(bytes(await recv_payload(ws, begin, pace=pace)))
            except Exception as exc:  # noqa: BLE001 - handed to the test
                received.set_exception(exc)

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}", **ws_options()) as ws:
                await send_msg(ws, p.TransferBegin("t", "update", len(payload), hashlib.sha256(payload).hexdigest(),
                                                   1024, 0, {}))
                await asyncio.sleep(3 * pace.grace_s)  # busy before the first frame
                for offset in range(0, len(payload), 1024):
                    await send_msg(ws, p.TransferFrame("t", offset, payload[offset:offset + 1024]))
                return await asyncio.wait_for(received, timeout=10)

    assert asyncio.run(main()) == payload
