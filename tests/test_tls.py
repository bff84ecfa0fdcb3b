"""TLS: an orchestrator serving wss:// and devices that verify it (real sockets, a real handshake).

The certificate in tests/data is self-signed for localhost and 127.0.0.1, valid from 2024 to 2124
(``openssl ca -selfsign -startdate 20240101000000Z -enddate 21240101000000Z`` over a 2048-bit RSA
key, with subjectAltName DNS:localhost, IP:127.0.0.1); it protects nothing but these tests.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset
from edge_sdk.transport import client_tls
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from tests.factories import server_config

DATA = Path(__file__).parent / "data"
CERT, KEY = DATA / "localhost-cert.pem", DATA / "localhost-key.pem"


def _config(tmp_path: Path) -> ServerConfig:
    return server_config(tmp_path / "store", local_steps=2, lr=0.1, token="s3cret", tls_cert=str(CERT),
                         tls_key=str(KEY))


def _device(url: str, **kwargs) -> DeviceClient:
    data = load_dataset("synthetic", split="train")
    config = DeviceSettings(server=url, device_id="phone-1", budget_bytes=512 << 20, token="s3cret", **kwargs)
    return DeviceClient(config, data.x[:100], data.y[:100])


def test_a_device_trains_over_tls(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(_config(tmp_path), lambda kind, data: events.append((kind, data)))
        reports = await asyncio.wait_for(_device(f"wss://127.0.0.1:{orch.port}", tls_ca=str(CERT)).run(), 60)
        assert [r.round for r in reports] == [1]
        return await server

    history = asyncio.run(main())
    assert [r["round"] for r in history] == [1] and history[0]["reported"] == 1
    assert ("listening", {"host": "127.0.0.1", "port": events[0][1]["port"], "tls": True}) == events[0]


def test_tls_refuses_an_unverified_server_and_plain_websockets(tmp_path: Path) -> None:
    async def main() -> None:
        orch, server = await start_orchestrator(_config(tmp_path), lambda kind, data: None)
        url = f"wss://127.0.0.1:{orch.port}"
        # The system's authorities do not vouch for a self-signed certificate: no connection.
        with pytest.raises(ssl.SSLCertVerificationError):
            async with connect(url, ssl=client_tls()):
                pass
        with pytest.raises(ConnectionError):  # the device gives up, it does not talk in the clear
            await _device(url, reconnect_retries=0).run()
        # The certificate names 127.0.0.1 and localhost, nothing else.
        context = client_tls(CERT)
        with pytest.raises(ssl.SSLCertVerificationError):
            async with connect(url, ssl=context, server_hostname="edge.example.org"):
                pass
        # A ws:// client gets no websocket from a wss:// server.
        with pytest.raises((InvalidMessage, ConnectionError, EOFError)):
            async with connect(f"ws://127.0.0.1:{orch.port}", open_timeout=10):
                pass
        # The server is unharmed: a verified device still trains.
        reports = await asyncio.wait_for(_device(url, tls_ca=str(CERT)).run(), 60)
        assert [r.round for r in reports] == [1]
        await server

    asyncio.run(main())


def test_tls_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="wss://"):
        _device("ws://127.0.0.1:1", tls_ca=str(CERT))._tls()
    assert _device("ws://127.0.0.1:1")._tls() is None
    context = _device("wss://127.0.0.1:1", tls_ca=str(CERT))._tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
