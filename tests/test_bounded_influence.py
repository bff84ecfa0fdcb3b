"""Bounded influence: a device weighs at most the sample count the operator's policy allows, however
many it claims, and with the norm bound on, an update far larger than the others is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.factories import server_config
from tests.scripted import scripted_device

HONEST = {"h1": 0.01, "h2": -0.02, "h3": 0.03}


def _run(tmp_path: Path, config: ServerConfig, attacker_delta, attacker_samples: int, claimed: int | None = None):
    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        initial = {k: v.copy() for k, v in orch.global_state.items()}
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [scripted_device(url, orch, d, {}, lambda n, shape, v=v: np.full(shape, v, np.float32), num_samples=100)
                   for d, v in HONEST.items()]
        devices.append(scripted_device(url, orch, "attacker", {}, attacker_delta, num_samples=attacker_samples,
                                       report_samples=claimed))
        *acks, history = await asyncio.gather(*devices, server)
        return initial, orch.global_state, acks, history

    return asyncio.run(main())


def test_a_sample_claim_weighs_no_more_than_the_policy_allows(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", min_devices=4, deadline_s=30, max_device_samples=100,
                           norm_bound=0)  # the weights alone
    initial, final, _, history = _run(tmp_path, config, lambda n, shape: np.full(shape, 1.0, np.float32),
                                      1_000_000, claimed=10**12)
    # Every device weighs 100: the attacker's claims (10^6 at registration, 10^12 in its update)
    # count as the policy's 100.
    want = (sum(HONEST.values()) + 1.0) / 4
    for name, value in final.items():
        np.testing.assert_allclose(value - initial[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert history[0]["reported"] == 4


def test_with_the_norm_bound_a_scaled_update_is_refused_and_journaled(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", rounds=2, min_devices=4, deadline_s=30, norm_bound=3.0,
                           norm_bound_action="reject")
    # Honest in round 1, 100x the largest honest update in round 2 (over 3x the server's reference update too).
    initial, final, acks, history = _run(tmp_path, config,
                                         lambda n, shape: np.full(shape, 0.02 if n == 0 else 3.0, np.float32), 100)
    attacker_acks = acks[-1]
    assert attacker_acks[0].accepted and not attacker_acks[1].accepted and "norm" in attacker_acks[1].reason
    # Round 2 is the honest devices' mean alone.
    want = (sum(HONEST.values()) + 0.02) / 4 + sum(HONEST.values()) / 3
    for name, value in final.items():
        np.testing.assert_allclose(value - initial[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    store = Store(tmp_path / "s")
    refused = [u for u in store.reports.all(2) if not u["accepted"]]
    store.close()
    assert [u["device_id"] for u in refused] == ["attacker"] and "norm" in refused[0]["reason"]
    assert history[1]["rejected"] == 1


def test_a_device_alone_at_its_split_is_bounded_from_round_1(tmp_path: Path) -> None:
    # Three weak devices train the head only (split 1); the strong one, alone at split 0, sends a
    # head update far larger than theirs. Round 1 has no history: its head is bounded by the
    # server's own reference update; later rounds by the larger of that and the head's peers
    # (the weak devices, whose small updates do not loosen it). Its fc1 update is small and passes.
    config = server_config(tmp_path / "s", rounds=3, min_devices=4, deadline_s=30, norm_bound=2.0,
                           norm_bound_action="reject", allow_forced_split=True)

    def strong(n: int, shape) -> np.ndarray:
        return np.full(shape, 1.0 if shape[0] == 2 else 0.001, np.float32)  # head entries: 2 outputs

    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        weak = [scripted_device(url, orch, f"weak-{i}", {"force_split": "1"},
                                lambda n, shape: np.full(shape, 0.001, np.float32)) for i in range(3)]
        *acks, history = await asyncio.gather(*weak, scripted_device(url, orch, "strong", {}, strong), server)
        return acks, history

    acks, history = asyncio.run(main())
    assert all(a.accepted for device_acks in acks[:3] for a in device_acks)
    assert [a.accepted for a in acks[3]] == [False, False, False]
    assert all("at head" in a.reason and "server reference update" in a.reason for a in acks[3])
    assert [h["rejected"] for h in history] == [1, 1, 1]


def test_a_down_weighted_report_is_journaled_as_such(tmp_path: Path) -> None:
    # Defaults: the weight cap (1/5) and max_device_samples. The attacker registers 10^6 samples
    # and claims 10^12 in its report: the claim is cut to its registered count (capped at 100,000),
    # then the cap gives it the weight of an honest device (4 contributors cannot meet a share of
    # 1/5 otherwise: they are averaged with equal weights).
    config = server_config(tmp_path / "s", min_devices=4, deadline_s=30, norm_bound=0)  # the weights alone
    initial, final, acks, _ = _run(tmp_path, config, lambda n, shape: np.full(shape, 1.0, np.float32),
                                   1_000_000, claimed=10**12)
    assert all(a.accepted for device_acks in acks for a in device_acks)
    with Store(tmp_path / "s") as store:
        rows = {u["device_id"]: u for u in store.reports.all(1)}
    bounded = rows["attacker"]["bounded"]
    assert bounded["samples"] == {"claimed": 10**12, "weighed": 100_000}
    assert bounded["weight_kept"] == 0.001  # 100 of 100,000
    assert all("bounded" not in rows[d] for d in HONEST)
    want = (sum(HONEST.values()) + 1.0) / 4
    for name, value in final.items():
        np.testing.assert_allclose(value - initial[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
