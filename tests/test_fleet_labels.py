"""A fleet group's ``priority`` and ``tags`` reach the orchestrator in the devices' hellos, and its
``classes``, ``samples`` and ``label_noise`` shape the devices' data.

The launch record carries them (JSON round trip, as a device process or a lightweight worker gets
it), ``build_client`` puts the labels in the hello, and FedALIGN, configured by name as the server's
configuration gives it, treats exactly the fleet's priority device as priority: over real
websockets on 127.0.0.1, with the real device client, on the synthetic data. The shipped
``prioritized-mnist`` fleet runs through ``edgetrain emulate`` (lightweight workers, MNIST) and
FedALIGN folds its aligned devices and none of its noisy or irrelevant ones.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.cli import load_shard
from emulator.device import build_client, shape_data
from emulator.fleet import FleetError, parse_fleet
from emulator.launch import DeviceLaunch
from emulator.localfleet import device_env
from emulator.schedule import device_launch
from orchestrator.server import Orchestrator
from tests.factories import server_config
from tests.shared_data import SHARED

MNIST = SHARED / "mnist"

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
    launch = DeviceLaunch(device_id="d", budget_bytes=1 << 30, client=0, num_clients=1, labels={"priority": "1"},
                          faults={"force_split": 1})
    client = build_client(launch, np.zeros((2, 4), np.float32), np.zeros(2, np.int64), server="ws://127.0.0.1:1",
                          on_event=lambda kind, data: None, in_process=True)
    assert client.config.labels == {"priority": "1", "force_split": "1"}


async def _round(tmp: Path) -> list[tuple[str, str]]:
    launches = _launches()
    config = server_config(tmp / "store", strategy="fedalign", strategy_options={"epsilon": "0", "warmup": "0"},
                           min_devices=len(launches), local_steps=2, batch_size=8, lr=0.1, deadline_s=60)
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


def test_group_data_options_reach_the_launch_and_shape_the_shard() -> None:
    groups = [{"name": "noisy", "class": "mid-phone", "count": 2, "classes": [1, 2], "samples": 40,
               "label_noise": 0.5}]
    fleet = parse_fleet({**FLEET, "groups": groups})
    launch = DeviceLaunch.from_json(device_launch(fleet, fleet.devices()[0]).to_json())
    assert (launch.classes, launch.max_samples, launch.label_noise) == ((1, 2), 40, 0.5)
    y = np.arange(3000) % 4
    x = np.arange(3000, dtype=np.float32)[:, None]
    clean = DeviceLaunch(**{**launch.to_dict(), "label_noise": 0.0})
    xs, ys = shape_data(clean, x, y)
    assert len(ys) == 40 and set(ys) <= {1, 2} and np.array_equal(y[xs[:, 0].astype(int)], ys)
    xs, ys = shape_data(launch, x, y)
    true = y[xs[:, 0].astype(int)]
    assert len(ys) == 40 and set(true) <= {1, 2} and 0 < np.mean(ys != true) < 0.8 and set(ys) <= {0, 1, 2, 3}
    again = shape_data(launch, x, y)
    assert np.array_equal(again[0], xs) and np.array_equal(again[1], ys)  # a restarted device: the same data
    assert shape_data(DeviceLaunch("d", 1, 0, 1), x, y)[1] is y  # nothing asked: the shard untouched


@pytest.mark.parametrize("key,value", [("classes", [1, 1]), ("classes", "1"), ("label_noise", 1.5), ("samples", 0)])
def test_bad_group_data_options_name_the_key(key: str, value: object) -> None:
    with pytest.raises(FleetError, match=rf"groups\[0\]\.{key}"):
        parse_fleet({**FLEET, "groups": [{"class": "mid-phone", "count": 1, key: value}]})


@pytest.mark.slow
@pytest.mark.skipif(not MNIST.is_dir(), reason="the shared MNIST folder is not on this machine")
def test_the_prioritized_mnist_fleet_runs_fedalign_in_the_emulator(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "edgetrain", "emulate", "--fleet", "prioritized-mnist", "--rounds", "4",
            "--out", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=device_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [r["included"] for r in rounds[:3]] == [{}, {}, {}]  # the 3 warm-up rounds
    last = rounds[3]
    assert last["priority_devices"] == 3
    assert sorted(last["included"]) and all(d.startswith("aligned-") for d in last["included"])
    # The noisy and irrelevant devices' own check declined them (FedALIGN Section 3.1).
    assert sorted(last["declined"]) == [f"{g}-{i:03d}" for g in ("irrelevant", "noisy") for i in range(6)]
