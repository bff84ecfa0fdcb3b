"""Emulated devices get credentials: a secure-aggregation fleet runs under the lightweight emulator.

The emulator enrolls each device in the run's store (its key in the credentials table, its identity
key beside it, the roster secure rounds verify against) and hands it its secret in a 0600 file inside the run's
directory, never on a command line; the real orchestrator, real worker processes and websockets
then run secure rounds whose block sums are revealed.
"""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest

from emulator.fleet import load_fleet
from emulator.launch import DeviceLaunch, device_argv
from emulator.runner import run_emulation
from emulator.schedule import server_config
from orchestrator.store import Store

SECURE_FLEET = """
[fleet]
model = "tiny"
seed = 3

[training]
rounds = 2
fraction = 1.0
local_steps = 2
batch_size = 8
secure_aggregation = true
secure_threshold = 2

[emulation]
mode = "lightweight"
memory_cap = "none"
throttle_cpu = false

[[groups]]
name = "steady"
class = "mid-phone"
count = 4
"""


def test_a_launch_with_a_secret_goes_through_a_private_file_never_the_command_line(tmp_path: Path) -> None:
    launch = DeviceLaunch("d-1", budget_bytes=1 << 30, client=0, num_clients=1, secret="s3cr3t-value")
    assert "s3cr3t-value" not in repr(launch)
    with pytest.raises(ValueError, match="launch_dir"):
        device_argv(launch, "ws://127.0.0.1:1")
    argv = device_argv(launch, "ws://127.0.0.1:1", launch_dir=tmp_path)
    assert not any("s3cr3t-value" in a for a in argv)
    path = tmp_path / "d-1.launch.json"
    assert str(path) in argv and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert DeviceLaunch.from_json(path.read_text()).secret == "s3cr3t-value"
    plain = DeviceLaunch("d-2", budget_bytes=1 << 30, client=0, num_clients=1)
    assert plain.to_json() in device_argv(plain, "ws://127.0.0.1:1")  # no secret: as before, no file


@pytest.mark.slow
def test_a_secure_lightweight_fleet_is_enrolled_and_its_rounds_reveal_sums(tmp_path: Path) -> None:
    path = tmp_path / "secure.toml"
    path.write_text(SECURE_FLEET)
    fleet = load_fleet(path)
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=120)
    assert config.secure_aggregation and config.require_credentials
    logs = tmp_path / "logs"
    run = asyncio.run(run_emulation(fleet, config, workers=2, stderr_dir=logs))
    ids = sorted(s.id for s in fleet.devices())
    assert [h["round"] for h in run.history] == [1, 2]
    for h in run.history:
        secure = h["secure"]
        assert secure["masked"] == 4 and secure["blocks"], secure
        assert all(b["revealed"] and b["cohort"] == 4 for b in secure["blocks"].values()), secure
    with Store(config.store_dir) as store:
        assert sorted(c["device_id"] for c in store.credentials.all()) == ids
        assert sorted(store.credentials.identities()) == ids
    assert not list(config.store_dir.glob("*.json"))  # no file of identities beside the store
    specs = sorted(logs.glob("worker-*.json"))
    assert len(specs) == 2
    secrets = []
    for spec in specs:
        assert stat.S_IMODE(spec.stat().st_mode) == 0o600
        secrets += [d["launch"]["secret"] for d in json.loads(spec.read_text())["devices"]]
    assert len(secrets) == 4 and all(secrets)
    logged = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    assert not any(s in logged for s in secrets)


@pytest.mark.slow
def test_secure_device_processes_get_their_secret_from_a_private_launch_file(tmp_path: Path) -> None:
    text = SECURE_FLEET.replace('"lightweight"', '"processes"').replace("count = 4", "count = 3")
    path = tmp_path / "secure.toml"
    path.write_text(text.replace("rounds = 2", "rounds = 1"))
    fleet = load_fleet(path)
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=120)
    logs = tmp_path / "logs"
    run = asyncio.run(run_emulation(fleet, config, stderr_dir=logs))
    secure = run.history[0]["secure"]
    assert secure["masked"] == 3 and all(b["revealed"] for b in secure["blocks"].values()), secure
    files = sorted(logs.glob("*.launch.json"))
    assert [f.name for f in files] == [f"{s.id}.launch.json" for s in fleet.devices()]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 and DeviceLaunch.from_json(f.read_text()).secret
               for f in files)
