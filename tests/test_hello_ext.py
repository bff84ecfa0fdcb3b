"""A new algorithm that needs a per-device value from the hello is one strategy class: declared here,
in the test suite only, with no edit to the protocol, the device client or the server.

``Tagged`` declares the hello field ``tagging.color`` (``Strategy.hello_fields``); devices send it in
the hello's extension fields (``DeviceSettings.hello_ext`` passes it through as it is); the server
parses it at hello and hands the parsed value to the strategy (``DeviceInfo.ext``). The server loads
the strategy by ``tests.test_hello_ext:Tagged``, plans the devices, and runs two rounds over real
websockets on 127.0.0.1; a device sending a bad value is refused with ``malformed`` and the others
train on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset, partition
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.strategies import FedAvg, Instruction, RoundContext
from orchestrator.strategies.base import HelloContext, HelloField

COLOR = "tagging.color"


def parse_color(value: object, context: HelloContext) -> str:
    """A color the strategy knows, upper-cased (so the test sees the parsed value, not the sent one)."""
    if value not in ("red", "green"):
        raise ValueError(f"must be red or green, not {value!r}")
    return str(value).upper()


class Tagged(FedAvg):
    """FedAvg that trains only the devices whose hello said ``tagging.color`` is red."""

    name = "tagged"
    hello_fields = MappingProxyType({COLOR: HelloField(parse_color, description="the device's color")})

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, dict[str, object]] = {}

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self.seen[ctx.round] = {d: info.ext.get(COLOR) for d, info in ctx.devices.items()}
        return [i for i in super().configure(ctx) if ctx.devices[i.device_id].ext.get(COLOR) == "RED"]


async def _run(tmp_path: Path) -> tuple[Tagged, list[dict], p.Message, list[str]]:
    config = ServerConfig(model="digits_mlp", strategy="tests.test_hello_ext:Tagged", rounds=2, min_devices=3,
                          local_steps=3, store_dir=tmp_path / "store", deadline_s=60, wait_devices_s=60)
    orch, server = await start_orchestrator(config, lambda kind, data: None)
    url = f"ws://127.0.0.1:{orch.port}"
    async with connect(url, **ws_options()) as ws:  # a bad value: refused at hello, nothing kept
        await send_msg(ws, p.Hello(device_id="blue", token="", budget_bytes=2 << 30, cores=1, runtimes=["torch"],
                                   num_samples=10, ext={COLOR: "blue"}))
        error = await recv_msg(ws)
    data = load_dataset("digits", split="train")
    colors = {"dev-0": "red", "dev-1": "red", "dev-2": "green"}
    clients = []
    for (device_id, color), idx in zip(colors.items(), partition(data.y, len(colors), "iid", seed=0)):
        cfg = DeviceSettings(server=url, device_id=device_id, budget_bytes=2 << 30, hello_ext={COLOR: color})
        clients.append(DeviceClient(cfg, data.x[idx], data.y[idx]))
    history, *_ = await asyncio.wait_for(asyncio.gather(server, *(c.run() for c in clients)), timeout=240)
    store = Store(config.store_dir)
    planned = [d["device_id"] for d in store.devices.all() if d.get("plan", {}).get("role")]
    store.close()
    return orch.strategy, history, error, planned


@pytest.mark.slow
def test_a_strategy_of_the_tests_own_reads_its_hello_field(tmp_path: Path) -> None:
    strategy, history, error, planned = asyncio.run(_run(tmp_path))
    assert isinstance(error, p.Error) and error.code == "malformed"
    assert COLOR in error.message and "red or green" in error.message
    assert sorted(planned) == ["dev-0", "dev-1", "dev-2"]  # planned and journaled; "blue" never was
    assert type(strategy).__name__ == "Tagged"  # loaded by name (pytest may hold a second copy of this module)
    assert strategy.seen[1] == {"dev-0": "RED", "dev-1": "RED", "dev-2": "GREEN"}  # parsed, as declared
    assert [h["round"] for h in history] == [1, 2]
    assert all(h["reported"] == 2 and h["selected"] == 2 and h["attempt"] == 1 for h in history)


def test_a_declared_field_is_parsed_and_an_undeclared_one_ignored() -> None:
    from orchestrator.server.admission import parse_hello_ext

    hello = p.Hello("d", "", 1, 1, ["torch"], 1, ext={COLOR: "green", "other.thing": [1, 2]})
    context = HelloContext(columns={}, shapes={})
    ext = parse_hello_ext(hello, Tagged(), context)
    assert dict(ext) == {COLOR: "GREEN"}
    with pytest.raises(TypeError):
        ext[COLOR] = "RED"  # type: ignore[index]  # read-only for the strategy
