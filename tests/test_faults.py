"""Fault injection from outside the client: a wrapped connection cuts, drops and delays.

A tiny websockets server on 127.0.0.1 plays the orchestrator's side of one transfer; the device
side is the wrapper alone (no client), so each fault is seen exactly where it strikes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedError

from edge_sdk import protocol as p
from edge_sdk.transport import send_msg, send_payload, ws_options
from emulator import faults as faults_module
from emulator.faults import DROP_EXIT, DeviceVanished, FaultInjector, Faults
from emulator.launch import DeviceLaunch, device_argv

FRAME = 1024
PAYLOAD = bytes(range(256)) * 32  # 8 KiB: 8 frames
REPO = Path(__file__).resolve().parents[1]


async def _serve_transfer(ws, *, round: int, kind: str, digest_first: bool) -> None:
    """The server's side: the round (an Ack carries it), then one payload as frames."""
    await send_msg(ws, p.Ack(round=round, accepted=True))
    await send_payload(ws, PAYLOAD, transfer_id=f"{kind}-1", kind=kind, meta={}, frame_size=FRAME,
                       sha256=p.sha256_hex(PAYLOAD) if digest_first else None)
    await ws.wait_closed()


async def _with_server(handler: Callable, device: Callable[[str], Awaitable[object]]) -> tuple[object, list]:
    """Run ``device(url)`` against a server whose connections run ``handler``; return what the device
    returned and, per server-side connection, the closing frame it got (None: the link was reset)."""
    ended: list = []

    async def handle(ws) -> None:
        with contextlib.suppress(ConnectionClosed):
            await handler(ws)
        await ws.wait_closed()
        ended.append(ws.protocol.close_rcvd)

    async with serve(handle, "127.0.0.1", 0, **ws_options()) as server:
        port = server.sockets[0].getsockname()[1]
        result = await asyncio.wait_for(device(f"ws://127.0.0.1:{port}"), timeout=30)
        for _ in range(200):
            if ended:
                break
            await asyncio.sleep(0.01)
    return result, ended


def _received_until_closed(injector: FaultInjector) -> Callable[[str], Awaitable[dict]]:
    async def device(url: str) -> dict:
        seen: dict = {"frames": 0, "held": 0, "closed": None, "messages": []}
        async with injector.connect(url, **ws_options()) as ws:
            try:
                digest_first = False
                while True:
                    msg = p.decode(await ws.recv())
                    seen["messages"].append(msg.TYPE)
                    if isinstance(msg, p.TransferBegin):
                        digest_first = bool(msg.sha256)
                    elif isinstance(msg, p.TransferFrame):
                        seen["frames"] += 1
                        seen["held"] = msg.offset + len(msg.data)
                    if isinstance(msg, p.TransferEnd) or (digest_first and seen["held"] == len(PAYLOAD)):
                        break  # all of it: leave with a goodbye
            except ConnectionClosed as exc:
                seen["closed"] = exc
        return seen

    return device


def test_a_cut_download_drops_the_link_once_half_the_transfer_is_held() -> None:
    events: list[tuple[str, dict]] = []
    injector = FaultInjector(Faults(cut_download_rounds=(2,)), "d-0", on_event=lambda k, d: events.append((k, d)))
    seen, ended = asyncio.run(_with_server(
        lambda ws: _serve_transfer(ws, round=2, kind="chunk", digest_first=False), _received_until_closed(injector)))
    # The device got exactly the frames up to half the payload, then its next read failed like a reset.
    assert seen["held"] == len(PAYLOAD) // 2 and seen["frames"] == 4
    assert isinstance(seen["closed"], ConnectionClosedError) and seen["closed"].rcvd is None
    assert "transfer_end" not in seen["messages"]
    assert events == [("download_cut", {"device": "d-0", "round": 2, "kind": "chunk", "held": len(PAYLOAD) // 2,
                                        "total": len(PAYLOAD)})]
    assert ended == [None]  # the server saw no closing handshake: a reset


def test_other_rounds_and_a_second_transfer_are_not_cut() -> None:
    injector = FaultInjector(Faults(cut_download_rounds=(2,)), "d-0")
    seen, _ = asyncio.run(_with_server(
        lambda ws: _serve_transfer(ws, round=1, kind="chunk", digest_first=False), _received_until_closed(injector)))
    assert seen["held"] == len(PAYLOAD) and seen["messages"][-1] == "transfer_end"

    async def twice(ws) -> None:  # round 2, cut once; the reconnected device is not cut again
        await _serve_transfer(ws, round=2, kind="chunk", digest_first=True)

    cut, _ = asyncio.run(_with_server(twice, _received_until_closed(injector := FaultInjector(
        Faults(cut_download_rounds=(2,)), "d-0"))))
    again, _ = asyncio.run(_with_server(twice, _received_until_closed(injector)))
    assert cut["held"] == len(PAYLOAD) // 2 and again["held"] == len(PAYLOAD)


@pytest.mark.parametrize(("kind", "digest_first"), [("model", True), ("model", False), ("tail", True)])
def test_a_drop_in_process_ends_the_device_once_the_model_is_held(kind: str, digest_first: bool) -> None:
    events: list[tuple[str, dict]] = []
    injector = FaultInjector(Faults(drop_rounds=(3,)), "d-1", in_process=True,
                             on_event=lambda k, d: events.append((k, d)))
    with pytest.raises(DeviceVanished, match="d-1"):
        asyncio.run(_with_server(lambda ws: _serve_transfer(ws, round=3, kind=kind, digest_first=digest_first),
                                 _received_until_closed(injector)))
    assert events == [("dropped", {"device": "d-1", "round": 3})]


def test_a_drop_at_upload_holds_the_model_and_vanishes_as_its_upload_begins() -> None:
    events: list[tuple[str, dict]] = []
    got: list[str] = []
    injector = FaultInjector(Faults(drop_rounds=(3,), drop_at="upload"), "d-1", in_process=True,
                             on_event=lambda k, d: events.append((k, d)))

    async def server(ws) -> None:
        await send_msg(ws, p.Ack(round=3, accepted=True))
        await send_payload(ws, PAYLOAD, transfer_id="model-1", kind="model", meta={}, frame_size=FRAME,
                           sha256=p.sha256_hex(PAYLOAD))
        async for data in ws:
            got.append(p.decode(data).TYPE)

    async def device(url: str) -> dict:
        seen = await _received_until_closed(injector)(url)  # the whole model: no drop yet
        assert seen["held"] == len(PAYLOAD) and events == []
        async with injector.connect(url, **ws_options()) as ws:
            while not isinstance(p.decode(await ws.recv()), p.TransferFrame):
                pass
            await send_msg(ws, p.Ack(round=3, accepted=True))  # any other message passes
            await send_payload(ws, PAYLOAD, transfer_id="update-1", kind="update", meta={}, frame_size=FRAME)
        return seen

    with pytest.raises(DeviceVanished, match="d-1"):
        asyncio.run(_with_server(server, device))
    assert events == [("dropped", {"device": "d-1", "round": 3})]
    assert "transfer_begin" not in got  # the server never saw the upload begin
    with pytest.raises(ValueError, match="drop_at"):
        Faults(drop_at="later")


def test_a_fleet_group_names_where_its_devices_drop() -> None:
    import tomllib

    from emulator.fleet import FleetError, parse_fleet
    from emulator.schedule import device_launch

    text = ('[fleet]\nmodel = "tiny"\n[behaviour]\ndropout = 0.5\ndrop_at = "upload"\n'
            '[[groups]]\nname = "a"\nclass = "mid-phone"\ncount = 1\n'
            '[[groups]]\nname = "b"\nclass = "mid-phone"\ncount = 1\ndrop_at = "model"\n')
    fleet = parse_fleet(tomllib.loads(text), source="t", default_name="t")
    assert [device_launch(fleet, s).faults.drop_at for s in fleet.devices()] == ["upload", "model"]
    with pytest.raises(FleetError, match="drop_at"):
        parse_fleet(tomllib.loads(text.replace('"upload"', '"never"')), source="t", default_name="t")


def test_no_drop_for_other_payloads_or_rounds() -> None:
    injector = FaultInjector(Faults(drop_rounds=(3,)), "d-1", in_process=True)
    seen, _ = asyncio.run(_with_server(lambda ws: _serve_transfer(ws, round=3, kind="chunk", digest_first=True),
                                       _received_until_closed(injector)))
    assert seen["held"] == len(PAYLOAD)
    seen, _ = asyncio.run(_with_server(lambda ws: _serve_transfer(ws, round=4, kind="model", digest_first=True),
                                       _received_until_closed(injector)))
    assert seen["held"] == len(PAYLOAD)


def test_drawn_drops_are_seeded_by_device_and_round() -> None:
    f = Faults(drop_prob=0.5)
    draws = [f.drops(r, device_id="d-2", seed=7) for r in range(1, 41)]
    assert draws == [f.drops(r, device_id="d-2", seed=7) for r in range(1, 41)]
    assert 5 < sum(draws) < 35 and draws != [f.drops(r, device_id="d-3", seed=7) for r in range(1, 41)]
    assert not Faults().drops(1, device_id="d", seed=0) and Faults(drop_rounds=(1,)).drops(1, device_id="d", seed=0)


def test_a_cut_upload_stops_half_way_and_the_server_keeps_what_came() -> None:
    events: list[tuple[str, dict]] = []
    received: list[int] = []

    async def server(ws) -> None:
        await send_msg(ws, p.Ack(round=5, accepted=True))
        while True:
            msg = p.decode(await ws.recv())
            if isinstance(msg, p.TransferFrame):
                received.append(msg.offset + len(msg.data))

    async def device(url: str) -> BaseException | None:
        injector = FaultInjector(Faults(cut_upload_rounds=(5,)), "d-4", on_event=lambda k, d: events.append((k, d)))
        async with injector.connect(url, **ws_options()) as ws:
            p.decode(await ws.recv())  # the round
            try:
                await send_payload(ws, PAYLOAD, transfer_id="u-1", kind="update", meta={"round": 5}, frame_size=FRAME)
            except ConnectionClosed as exc:
                return exc
        return None

    closed, ended = asyncio.run(_with_server(server, device))
    assert isinstance(closed, ConnectionClosedError)
    assert events == [("upload_cut", {"device": "d-4", "round": 5, "sent": len(PAYLOAD) // 2, "total": len(PAYLOAD)})]
    assert max(received, default=0) <= len(PAYLOAD) // 2
    assert ended == [None]


def test_a_report_leaves_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    # Any message type can stand for the report here: the wrapper delays messages by type only.
    monkeypatch.setattr(faults_module, "REPORT_TYPES", frozenset({"ack"}))
    arrived: list[float] = []

    async def server(ws) -> None:
        async for _ in ws:
            arrived.append(time.monotonic())

    async def device(url: str) -> float:
        injector = FaultInjector(Faults(delay_s=0.3), "d-5")
        async with injector.connect(url, **ws_options()) as ws:
            t0 = time.monotonic()
            await send_msg(ws, p.Ack(round=1, accepted=True))
            return t0

    t0, _ = asyncio.run(_with_server(server, device))
    assert arrived and arrived[0] - t0 >= 0.29


def test_a_device_process_that_drops_exits_with_the_drop_status(tmp_path: Path) -> None:
    """Outside the lightweight mode a vanish ends the whole process, as a killed app would."""
    code = textwrap.dedent("""
        import asyncio, json
        from websockets.asyncio.server import serve
        from edge_sdk import protocol as p
        from edge_sdk.transport import send_msg, send_payload, ws_options
        from emulator.faults import FaultInjector, Faults

        async def handler(ws):
            await send_msg(ws, p.Ack(round=1, accepted=True))
            await send_payload(ws, b"x" * 4096, transfer_id="m", kind="model", meta={}, frame_size=1024)
            await ws.wait_closed()

        async def main():
            on_event = lambda kind, data: print(json.dumps({"event": kind, **data}), flush=True)
            injector = FaultInjector(Faults(drop_rounds=(1,)), "d-6", on_event=on_event)
            async with serve(handler, "127.0.0.1", 0) as server:
                port = server.sockets[0].getsockname()[1]
                async with injector.connect(f"ws://127.0.0.1:{port}") as ws:
                    while True:
                        await ws.recv()

        asyncio.run(main())
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == DROP_EXIT, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"event": "dropped", "device": "d-6", "round": 1}


def test_launch_records_round_trip_as_json() -> None:
    launch = DeviceLaunch("weak-3", 300 << 20, client=3, num_clients=8, data="synthetic", partition="dirichlet:0.5",
                          device_class="pi-zero-2w", seed=4, data_limit=100, threads=2,
                          faults=Faults(drop_rounds=(3, 1), cut_upload_rounds=[2], delay_s=0.25, force_split=2))
    assert launch.faults.drop_rounds == (1, 3)
    assert DeviceLaunch.from_json(launch.to_json()) == launch
    argv = device_argv(launch, "ws://127.0.0.1:1", data_root="/data")
    assert argv[1:3] == ["-m", "emulator.device"] and DeviceLaunch.from_json(argv[3]) == launch
    assert argv[4:] == ["--server", "ws://127.0.0.1:1", "--json-events", "--data-root", "/data"]
    with pytest.raises(ValueError, match="unknown fields"):
        DeviceLaunch.from_dict({**launch.to_dict(), "extra_args": ["--drop-rounds", "1"]})
    with pytest.raises(ValueError, match="not a device launch"):
        DeviceLaunch.from_dict({**launch.to_dict(), "faults": {"drop_round": [1]}})
    with pytest.raises(ValueError, match="client"):
        DeviceLaunch("d", 1 << 20, client=2, num_clients=2)


def test_the_device_entry_refuses_a_bad_launch() -> None:
    proc = subprocess.run([sys.executable, "-m", "emulator.device", '{"device_id": "d"}', "--server",
                           "ws://127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a device launch" in proc.stderr


def test_slow_steps_wrap_the_backend_not_the_connection() -> None:
    """``step_delay_s`` slows training per local step (emulator.faults.slowed_backend), so the server's
    pacing (tests/test_slow_device_paced.py) sees a device that fewer steps really make faster."""
    from edge_sdk.backends import TorchBackend

    f = Faults(step_delay_s=0.5)
    assert not f.on_connection  # nothing to inject in the connection
    launch = DeviceLaunch.from_json(DeviceLaunch("slow", 1 << 30, client=0, num_clients=1, faults=f).to_json())
    assert launch.faults.step_delay_s == 0.5  # travels to the device process in its launch
    slowed = faults_module.slowed_backend(TorchBackend, 0.5)
    assert issubclass(slowed, TorchBackend) and slowed is not TorchBackend
    assert (slowed.name, slowed.kind, slowed.runtimes) == (TorchBackend.name, TorchBackend.kind, TorchBackend.runtimes)
    assert faults_module.slowed_backend(TorchBackend, 0.0) is TorchBackend
    with pytest.raises(ValueError, match="step_delay_s"):
        Faults(step_delay_s=-1.0)
