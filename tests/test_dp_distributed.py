"""Distributed DP in a running server (orchestrator.aggregation.privacy.distributed): ``dp`` with
``secure_aggregation``. A real orchestrator on 127.0.0.1 and the production device client over real
websockets (torch devices, digits_mlp under EmbracingFL's nested cohorts), real SQLite: the devices
add the noise of ``dp_min_survivors`` of each block's cohort inside the secure round, the server
reveals each block whose survivors carry it, accounts each at the multiplier its survivors gave,
journals the ledger, and a resumed run continues it (with ``dp_expected_survivors`` = 1: the shares
sized for the whole cohort, which then carries z_b exactly)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.aggregation.privacy.accountant import PrivacyLedger
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.distributed import DISTRIBUTED
from orchestrator.aggregation.privacy.gaussian import CENTRAL
from orchestrator.aggregation.privacy.release import resumed_ledger
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.inprocess import serve
from orchestrator.views.terminal import privacy_words

FLEET = {"strong-0": "strong", "strong-1": "strong", "moderate-2": "moderate", "weak-3": "weak", "weak-4": "weak"}
Z = 1.0


def _run(store_dir: Path, rounds: int, resume: bool = False, expected: float | None = None) -> list[dict]:
    if not resume:
        with Store(store_dir) as store:
            secrets = {d: store.credentials.enroll(d) for d in FLEET}
        (store_dir / "secrets.txt").write_text("\n".join(f"{d} {s}" for d, s in secrets.items()))
    secrets = dict(line.split() for line in (store_dir / "secrets.txt").read_text().splitlines())
    config = ServerConfig(model="digits_mlp", rounds=rounds, min_devices=len(FLEET), local_steps=3, lr=0.1,
                          store_dir=store_dir, deadline_s=300, require_credentials=True, secure_aggregation=True,
                          dp=True, dp_noise_multiplier=Z, dp_clip=1.0, dp_min_cohort=2, dp_min_survivors=0.6,
                          dp_expected_survivors=expected, eval_every=rounds, resume=resume,
                          # Five devices' noised mean is mostly noise: validation would refuse every round (and
                          # each attempt's release is accounted); this test is about the accounting, not accuracy.
                          max_loss_rise=0.0)
    budgets = role_budgets("digits_mlp", secure=True)

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        clients = []
        for i, (d, role) in enumerate(FLEET.items()):
            x, y = load_shard("digits", client=i, num_clients=len(FLEET))
            cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=budgets[role],
                               backend="torch", secret=secrets[d], reconnect_retries=3)
            clients.append(DeviceClient(cfg, x, y))
        return await serve(server, clients, timeout=600)

    return asyncio.run(main())


@pytest.mark.slow
def test_devices_add_the_noise_the_survivors_carry_and_the_ledger_counts_it_across_a_resume(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    first = _run(store_dir, rounds=2)
    assert [h["round"] for h in first] == [1, 2]
    z_b = Z * math.sqrt(4)  # digits_mlp's four blocks: z_b = z sqrt(L)
    for h in first:
        privacy = h["privacy"]
        assert privacy["mode"] == DISTRIBUTED and privacy["multipliers"], privacy
        # every device survived: each block's noise is z_b sqrt(s_b / n_min_b) >= z_b, n_min_b = ceil(0.6 s_b)
        for name, multiplier in privacy["multipliers"].items():
            cohort = h["secure"]["blocks"][name]["cohort"]
            assert multiplier == pytest.approx(z_b * math.sqrt(cohort / math.ceil(0.6 * cohort))), (name, cohort)
            assert multiplier >= z_b
    assert 0 < first[0]["privacy"]["epsilon"] < first[1]["privacy"]["epsilon"]
    with Store(store_dir) as store:
        saved = store.privacy.last()
    assert saved is not None and saved["mode"] == DISTRIBUTED and len(saved["ledger"]["rounds"]) == 2

    resumed = _run(store_dir, rounds=3, resume=True, expected=1.0)
    assert [h["round"] for h in resumed] == [1, 2, 3]  # the journaled rounds, then the one it ran
    # shares sized for every device of each block, all surviving: exactly the planned multiplier
    assert resumed[-1]["privacy"]["multipliers"] == pytest.approx(dict.fromkeys(resumed[-1]["privacy"]["multipliers"], z_b))
    assert privacy_words(resumed[-1]["privacy"]).endswith("distributed noise)")
    ledger = PrivacyLedger.from_json(saved["ledger"])
    assert resumed[-1]["privacy"]["epsilon"] > ledger.spent().epsilon  # continued, not restarted
    with Store(store_dir) as store:
        assert len(store.privacy.last()["ledger"]["rounds"]) == 3  # type: ignore[index]
    # A central run cannot continue a ledger kept with distributed noise, nor the reverse.
    fresh = PrivacyLedger(ledger.blocks, ledger.delta, accountant=ledger.accountant, sampling=ledger.sampling)
    with pytest.raises(PrivacyPlanError, match="distributed noise"):
        resumed_ledger(saved, 2, fresh, CENTRAL)
