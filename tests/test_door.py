"""No outsider holds the door (docs/security.md, "The door"): a wrong token or credential proof in the
upgrade request's ``Authorization`` header is refused with HTTP 401 before the websocket opens; one
address holds at most ``max_pending_per_address`` connections still to say hello; and a connection
proven in its upgrade request is exempt from the pending caps, so a flood of connections that never
say hello does not keep a token-holding device out.

``python -m tests.test_door URL CONNECTIONS ADDRESSES`` is the flood the slow test runs: CONNECTIONS
websockets spread over 127.0.0.2.. (ADDRESSES of them) that never say hello, each reopened as soon
as it is closed or refused, until killed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from edge_sdk import protocol as p
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings, DeviceRefused
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config


def _hello(device_id: str, token: str) -> p.Hello:
    return p.Hello(device_id=device_id, token=token, budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


async def _status(url: str, header: str | None, local: str = "127.0.0.1") -> int:
    """The HTTP status of an opening handshake with ``header`` from address ``local`` (101: opened)."""
    try:
        async with connect(url, additional_headers={"Authorization": header} if header else None,
                           local_addr=(local, 0), **ws_options()):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def test_a_wrong_token_in_the_upgrade_request_is_refused_before_the_websocket_opens(tmp_path: Path) -> None:
    async def main():
        orch, server = await start_orchestrator(server_config(tmp_path / "s", token="s3cret", wait_devices_s=30),
                                                lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        statuses = [await _status(url, h) for h in ("Bearer wrong", "Bearer s3cret", "Edgetrain d x", None)]
        x, y = load_shard("synthetic", client=0, num_clients=2)
        with pytest.raises(DeviceRefused, match="unauthorized"):  # final: the device does not retry a 401
            await DeviceClient(DeviceSettings(url, "d", 2 << 30, token="wrong"), x, y).run()
        server.cancel()
        return statuses

    # A scheme the server does not use is ignored (the hello still proves itself), as is no header.
    assert asyncio.run(main()) == [401, 101, 101, 101]


def test_a_credential_proof_in_the_upgrade_request_is_checked_and_binds_the_hello(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with Store(store_dir) as store:
        secret = store.credentials.enroll("dev-0")

    async def main():
        config = server_config(store_dir, require_credentials=True, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        spent = f"Edgetrain dev-0 {make_proof('dev-0', secret, purpose='upgrade')}"
        statuses = [await _status(url, f"Edgetrain dev-0 {make_proof('dev-0', 'forged', purpose='upgrade')}"),
                    await _status(url, spent), await _status(url, spent),
                    await _status(url, f"Edgetrain nobody {make_proof('nobody', secret, purpose='upgrade')}")]
        upgrade = {"Authorization": f"Edgetrain dev-0 {make_proof('dev-0', secret, purpose='upgrade')}"}
        async with connect(url, additional_headers=upgrade,
                           **ws_options()) as ws:  # proven as dev-0, the hello may not name another device
            await send_msg(ws, _hello("dev-1", make_proof("dev-1", secret)))
            other = await recv_msg(ws)
        server.cancel()
        return statuses, other

    statuses, other = asyncio.run(main())
    assert statuses == [401, 101, 401, 401]  # forged, good, the same proof replayed, an id not enrolled
    assert isinstance(other, p.Error) and other.code == "unauthorized" and "another device" in other.message


def test_one_address_holds_at_most_its_share_of_pending_connections(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "s", token="s3cret", max_pending_per_address=3, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        held = [await connect(url, local_addr=("127.0.0.2", 0), **ws_options()) for _ in range(3)]
        statuses = [await _status(url, None, "127.0.0.2"), await _status(url, None, "127.0.0.3"),
                    await _status(url, "Bearer s3cret", "127.0.0.2")]
        for ws in held:
            await ws.close()
        await asyncio.sleep(0.2)
        statuses.append(await _status(url, None, "127.0.0.2"))  # the share is free again
        server.cancel()
        return statuses

    assert asyncio.run(main()) == [429, 101, 101, 101]


@pytest.mark.slow
def test_a_server_short_of_devices_waits_and_says_so(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main():
        config = server_config(tmp_path / "s", wait_devices_s=float("inf"))
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        await asyncio.sleep(10.5)  # longer than a server without devices used to say nothing for
        waiting = server.done()
        x, y = load_shard("synthetic", client=0, num_clients=2)
        await DeviceClient(DeviceSettings(f"ws://127.0.0.1:{orch.port}", "late-0", 2 << 30), x, y).run()
        return waiting, await server

    waiting, history = asyncio.run(main())
    assert not waiting and [h["reported"] for h in history] == [1]
    assert ("waiting", {"ready": 0, "needed": 1, "waited_s": pytest.approx(10, abs=0.6)}) in events


async def _flood_one(url: str, local: str, opened: list[int]) -> None:
    while True:
        try:
            async with connect(url, local_addr=(local, 0), open_timeout=30, **ws_options()) as ws:
                opened[0] += 1
                await ws.wait_closed()  # never says hello: held until the server's hello timeout
        except Exception:  # refused (429, 503), closed: at once again
            await asyncio.sleep(0)


async def _flood(url: str, connections: int, addresses: int) -> None:
    opened = [0]
    tasks = [asyncio.create_task(_flood_one(url, f"127.0.0.{2 + n % addresses}", opened)) for n in range(connections)]
    while True:
        await asyncio.sleep(1.0)
        print(opened[0], flush=True)
    await asyncio.gather(*tasks)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_flood_that_never_says_hello_does_not_keep_a_token_holding_device_out(tmp_path: Path) -> None:
    """600 connections from 40 loopback addresses (more than the pending caps hold, in all and per
    address), reopened as fast as they close, run from before two token-holding devices start:
    both are welcomed within a few seconds and the run trains to its end."""
    root = Path(__file__).resolve().parents[1]
    welcomed: dict[str, float] = {}

    async def main():
        def on_event(kind: str, data: dict) -> None:
            if kind == "welcomed":
                welcomed.setdefault(data["device"], time.monotonic())

        config = server_config(tmp_path / "s", token="s3cret", rounds=2, min_devices=2, max_pending_hellos=100,
                               hello_timeout_s=5, wait_devices_s=120)
        orch, server = await start_orchestrator(config, on_event)
        url = f"ws://127.0.0.1:{orch.port}"
        flood = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.test_door", url, "600", "40",
                                                     cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            await flood.stdout.readline()
            held = int(await flood.stdout.readline())  # connections the flood has opened by now
            started = time.monotonic()
            devices = [DeviceClient(DeviceSettings(url, f"dev-{i}", 2 << 30, token="s3cret"),
                                    *load_shard("synthetic", client=i, num_clients=2)) for i in range(2)]
            *_, history = await asyncio.gather(*(d.run() for d in devices), server)
        finally:
            flood.kill()
            await flood.wait()
        return started, held, history

    started, held, history = asyncio.run(main())
    assert held >= 100  # the flood does fill the pending slots it may hold
    assert sorted(welcomed) == ["dev-0", "dev-1"]
    assert max(welcomed.values()) - started < 5.0, {d: t - started for d, t in welcomed.items()}
    assert [h["reported"] for h in history] == [2, 2]


if __name__ == "__main__":
    asyncio.run(_flood(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
