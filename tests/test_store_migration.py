"""A store written by the previous version opens, migrates and resumes.

tests/data/store_v1/ was made by that version (its README says how): one secure round of the tiny
model with three enrolled devices, its journal at schema version 0 (no ``user_version``, no privacy
table, no identity column) and the identity keys in ``secagg_roster.json`` beside it. Opening it to
write moves the keys into the credentials and removes the file; a real server then resumes the run
with the devices' secrets and runs a secure round that verifies their key advertisements by them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import pytest

from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient
from edge_sdk.settings import DeviceSettings
from edge_sdk.credentials import derive_key
from edge_sdk.models import build_model
from edge_sdk.secagg import identity_public_key
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store, StoreError, schema
from orchestrator.store.schema import LEGACY_ROSTER, VERSION

FIXTURE = Path(__file__).resolve().parent / "data" / "store_v1"


def old_store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the store the previous version wrote, and its devices' secrets."""
    store_dir = tmp_path / "store"
    shutil.copytree(FIXTURE / "store", store_dir)
    secrets = dict(line.split() for line in (FIXTURE / "secrets.txt").read_text().splitlines())
    return store_dir, secrets


def test_the_old_store_is_read_as_it_was_written(tmp_path: Path) -> None:
    """A reader changes nothing: the old journal reads through the repositories without a migration."""
    store_dir, _ = old_store(tmp_path)
    with Store.open_readonly(store_dir) as store:
        assert store.db.version() == 0
        assert store.rounds.completed() == 1 and [r["complete"] for r in store.rounds.all()] == [True]
        assert sorted(u["device_id"] for u in store.reports.all(1)) == ["dev-0", "dev-1", "dev-2"]
        assert sorted(d["device_id"] for d in store.devices.all()) == ["dev-0", "dev-1", "dev-2"]
        assert store.meta.get("model") == "tiny" and store.privacy.last() is None
        assert set(store.checkpoints.read(1)) == set(build_model("tiny").state_dict())
    assert (store_dir / LEGACY_ROSTER).is_file()


def test_opening_the_old_store_moves_its_roster_into_the_credentials(tmp_path: Path) -> None:
    store_dir, secrets = old_store(tmp_path)
    roster = {d: bytes.fromhex(k) for d, k in json.loads((store_dir / LEGACY_ROSTER).read_text()).items()}
    with Store(store_dir) as store:
        assert store.db.version() == VERSION
        assert store.credentials.identities() == roster == {d: identity_public_key(s, d) for d, s in secrets.items()}
        assert all(store.credentials.get(d)["key"] == derive_key(s) for d, s in secrets.items())
        round, state = store.checkpoints.last()
        assert round == 1 and set(state) == set(build_model("tiny").state_dict())
        assert store.privacy.last() is None and store.norms.history(4) == []  # tables it lacked exist now
        store.rounds.begin(2, ["dev-0"])
        store.privacy.record(2, {"ledger": "x"})
        store.rounds.complete(2, state, {"accuracy": 0.5})
        assert store.privacy.last() == {"ledger": "x"} and store.rounds.completed() == 2
    assert not (store_dir / LEGACY_ROSTER).exists() and not list(store_dir.glob("*.json"))
    with Store(store_dir) as store:  # migrated once: opening again changes nothing
        assert store.db.version() == VERSION and store.credentials.identities() == roster


def test_a_roster_left_behind_by_a_crash_is_absorbed_without_replacing_keys(tmp_path: Path, caplog) -> None:
    """The file is removed after the commit that moved its keys: a crash between the two leaves it.
    The next open keeps the journal's keys, drops keys of devices without a credential, removes it."""
    store_dir, secrets = old_store(tmp_path)
    with Store(store_dir) as store:
        keys = store.credentials.identities()
        new_secret = store.credentials.enroll("dev-3")
    stale = {"dev-0": "ab" * 32, "dev-3": "cd" * 32, "ghost": "ef" * 32}
    (store_dir / LEGACY_ROSTER).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING, logger="edgetrain.store"), Store(store_dir) as store:
        assert store.credentials.identities() == {**keys, "dev-3": identity_public_key(new_secret, "dev-3")}
    assert "ghost" in caplog.text
    assert not (store_dir / LEGACY_ROSTER).exists()


def test_a_secure_run_of_the_old_store_resumes(tmp_path: Path) -> None:
    """The real server resumes the old run at round 2: its devices' advertisements verify against the
    identity keys moved out of the JSON roster, and every block's sum is revealed."""
    store_dir, secrets = old_store(tmp_path)
    config = ServerConfig(model="tiny", eval_data="synthetic", strategy="fedavg", rounds=2, min_devices=3,
                          local_steps=2, store_dir=store_dir, deadline_s=300, require_credentials=True,
                          secure_aggregation=True, seed=7, resume=True)

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        devices = []
        for i, (d, secret) in enumerate(sorted(secrets.items())):
            x, y = load_shard("synthetic", client=i, num_clients=3)
            cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=2 << 30,
                               backend="torch", secret=secret)
            devices.append(asyncio.create_task(DeviceClient(cfg, x, y).run()))
        history = await asyncio.wait_for(server, timeout=300)
        await asyncio.gather(*devices, return_exceptions=True)
        return history

    history = asyncio.run(main())
    assert [h["round"] for h in history][-1:] == [2]
    secure = history[-1]["secure"]
    assert secure["masked"] == 3 and all(b["revealed"] for b in secure["blocks"].values()), secure
    assert not (store_dir / LEGACY_ROSTER).exists()
    with Store.open_readonly(store_dir) as store:
        assert [r["round"] for r in store.rounds.all() if r["complete"]] == [1, 2]



def test_a_store_of_a_newer_version_is_refused(tmp_path: Path, monkeypatch) -> None:
    """This code does not know the tables a later version added: it refuses to open that store to write."""
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, schema.Migration(VERSION + 1, "")))
    monkeypatch.setattr(schema, "VERSION", VERSION + 1)
    with Store(tmp_path) as store:
        assert store.db.version() == VERSION + 1
    monkeypatch.undo()
    with pytest.raises(StoreError, match=f"schema version {VERSION + 1}; this edgetrain knows up to {VERSION}"):
        Store(tmp_path)
    with Store.open_readonly(tmp_path) as store:  # a reader still reads what it knows
        assert store.rounds.completed() == 0
