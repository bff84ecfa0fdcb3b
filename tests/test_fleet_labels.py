"""A fleet group's ``priority`` and ``tags`` reach the orchestrator in the devices' hellos.

The launch record carries them (JSON round trip, as a device process or a lightweight worker gets
it), ``build_client`` puts them in the hello, and FedALIGN, configured by name as the server's
configuration gives it, treats exactly the fleet's priority device as priority: over real
websockets on 127.0.0.1, with the real device client, on the synthetic data.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from edge_sdk.cli import load_shard
from orchestrator.config import ServerConfig
from orchestrator.emulation.device import build_client
from orchestrator.emulation.fleet import parse_fleet
from orchestrator.emulation.launch import DeviceLaunch
from orchestrator.emulation.schedule import device_launch
from orchestrator.server import Orchestrator

FLEET = {
    "fleet": {"model": "tiny", "seed": 0},
    "training": {"rounds": 1, "fraction": 1.0, "local_steps": 2, "batch_size": 8},
    "groups": [
        {"name": "prio", "class": "mid-phone", "count": 1, "priority": True, "tags": ["internal", "site:lab"]},
        {"name": "other", "class": "mid-phone", "count": 2},
    ],
}


def _launches() -> list[DeviceLaunch]:
    fleet = parse_fleet(FLEET)
    return [DeviceLaunch.from_json(device_launch(fleet, spec).to_json()) for spec in fleet.devices()]


def test_the_launch_carries_the_groups_labels_through_json() -> None:
    by_group = {launch.device_id.rsplit("-", 1)[0]: launch.labels for launch in _launches()}
    assert by_group["prio"] == {"priority": "1", "internal": "1", "site": "lab"}
    assert by_group["other"] == {}


def test_build_client_puts_fleet_labels_and_force_split_in_the_config() -> None:
    import numpy as np

    launch = DeviceLaunch(device_id="d", budget_bytes=1 << 30, client=0, num_clients=1, labels={"priority": "1"},
                          faults={"force_split": 1})
    client = build_client(launch, np.zeros((2, 4), np.float32), np.zeros(2, np.int64), server="ws://127.0.0.1:1",
                          on_event=lambda kind, data: None, in_process=True)
    assert client.config.labels == {"priority": "1", "force_split": "1"}


async def _round(tmp: Path) -> list[tuple[str, str]]:
    launches = _launches()
    config = ServerConfig(model="tiny", strategy="fedalign", strategy_options={"epsilon": "0", "warmup": "0"},
                          rounds=1, min_devices=len(launches), local_steps=2, batch_size=8, lr=0.1,
                          store_dir=tmp / "store", eval_data="synthetic", deadline_s=60)
    events: list[tuple[str, dict]] = []
    orch = Orchestrator(config, on_event=lambda kind, data: events.append((kind, data)))
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    clients = []
    for launch in launches:
        x, y = load_shard(launch.data, client=launch.client, num_clients=launch.num_clients,
                          partition=launch.partition, seed=launch.seed)
        clients.append(build_client(launch, x, y, server=f"ws://127.0.0.1:{orch.port}",
                                    on_event=lambda kind, data: None, in_process=True).run())
    await asyncio.wait_for(asyncio.gather(server, *clients), timeout=120)
    return sorted((d["device"], d["phase"]) for kind, d in events if kind == "update")


def test_fedalign_sees_the_fleets_priority_device_in_its_hello(tmp_path: Path) -> None:
    phases = asyncio.run(_round(tmp_path))
    prio = next(launch.device_id for launch in _launches() if launch.labels.get("priority") == "1")
    others = [launch.device_id for launch in _launches() if launch.device_id != prio]
    # Epsilon 0: the priority device evaluates and trains; the non-priority ones only evaluate.
    assert phases == sorted([(prio, "evaluate"), (prio, "train")] + [(d, "evaluate") for d in others])
