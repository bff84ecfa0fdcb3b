"""Each hello field is checked whatever else is present, and device ids keep to the documented
character set (docs/protocol.md, "Device ids"): a real server refuses each bad hello with an error
frame, journals the reason, and goes on serving honest devices; the device SDK refuses such an id
before it connects."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.settings import DeviceSettings, SettingError, device_id_problem, load_settings
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config

GOOD = dict(device_id="d", token="", budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)
#: Ids outside the set ("" is the protocol's own refusal: the codec will not even encode it).
BAD_IDS = ["bad\x00id", "a/../b", "../etc", "evil\u202etxt.exe", "with space", ".hidden", "x" * 129]


#: Each bad hello's changes, the error code it gets and a piece of its message.
BAD_HELLOS = [({"num_classes": 10**9}, "refused", "classes"),  # no input_shape: checked all the same
              *[({"device_id": bad}, "malformed", "device id") for bad in BAD_IDS]]


def test_each_bad_hello_is_refused_journaled_and_the_server_goes_on(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "s", deadline_s=10, wait_devices_s=10)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        errors = []
        for changes, _, _ in BAD_HELLOS:  # one after another on the same server
            async with connect(url, **ws_options()) as ws:
                await send_msg(ws, p.Hello(**{**GOOD, "device_id": "bad", **changes}))
                errors.append(await recv_msg(ws))
                await ws.wait_closed()
        async with connect(url, **ws_options()) as ws:  # an honest device declaring 1 class is still served
            await send_msg(ws, p.Hello(**{**GOOD, "num_classes": 1}))
            welcome = await recv_msg(ws)
        server.cancel()
        return errors, welcome

    errors, welcome = asyncio.run(main())
    for error, (changes, code, fragment) in zip(errors, BAD_HELLOS, strict=True):
        assert isinstance(error, p.Error) and error.code == code and fragment in error.message, (changes, error)
    assert isinstance(welcome, p.Welcome)
    with Store(tmp_path / "s") as store:
        assert [d["device_id"] for d in store.devices.all()] == ["d"]  # no refused hello was registered
        refused = store.closures.all("hello_refused")
    assert len(refused) == len(BAD_HELLOS)
    for row, (_, code, fragment) in zip(refused, BAD_HELLOS, strict=True):
        assert row["reason"].startswith(code) and fragment in row["reason"]
        assert row["device_id"].isascii() and "\x00" not in row["device_id"]  # journaled escaped: no NUL, no U+202E
        assert row["device_id"].isprintable()


@pytest.mark.parametrize("good", ["d", "phone-1", "pi_zero.2", "tab:3f2a@lab+x=1", "9" * 128])
def test_ordinary_ids_are_device_ids(good: str) -> None:
    assert device_id_problem(good) is None


@pytest.mark.parametrize("bad", BAD_IDS)
def test_the_device_refuses_a_bad_id_before_it_connects(bad: str) -> None:
    with pytest.raises(SettingError, match="device id") as raised:
        load_settings({"device_id": bad, "server": "ws://127.0.0.1:1"})
    assert "\x00" not in str(raised.value) and "\u202e" not in str(raised.value)  # named safely
    with pytest.raises(SettingError, match="device id"):
        DeviceSettings(server="ws://127.0.0.1:1", device_id=bad, budget_bytes=1 << 30)
