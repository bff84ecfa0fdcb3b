"""The norm bound holds from round 1 and across a restart, per layer group.

Round 1 has no history: an update 100 times the server's own reference update is clipped to
``norm_bound`` times that reference at every layer group, and journaled as clipped (not as a plain
accepted report). The accepted norms of committed rounds are kept in the store: a resumed server
bounds its first round against them, not against nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from edge_sdk.models.zoo import tiny
from emulator.localfleet import start_orchestrator
from orchestrator.aggregation.normbound import HISTORY, NormBound, block_norms
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.factories import server_config
from tests.scripted import scripted_device

HONEST = {"h1": 0.01, "h2": -0.02, "h3": 0.03}


def _fleet(config: ServerConfig, attacker_delta) -> tuple[dict, dict, list, list]:
    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        initial = {k: v.copy() for k, v in orch.global_state.items()}
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [scripted_device(url, orch, d, {}, lambda n, shape, v=v: np.full(shape, v, np.float32))
                   for d, v in HONEST.items()]
        devices.append(scripted_device(url, orch, "attacker", {}, attacker_delta))
        *acks, history = await asyncio.gather(*devices, server)
        return initial, orch.global_state, acks, history

    return asyncio.run(main())


def test_round_one_is_bounded_by_the_servers_reference_update(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", min_devices=4, deadline_s=30, norm_bound=3.0, max_loss_rise=0)
    initial, final, acks, _ = _fleet(config, lambda n, shape: np.full(shape, 100.0, np.float32))
    assert all(a.accepted for device_acks in acks for a in device_acks)
    with Store(tmp_path / "s") as store:
        rows = {u["device_id"]: u for u in store.reports.all(1)}
    clipped = rows["attacker"]["bounded"]["clipped"]
    assert set(clipped) == {"fc1", "head"} and all(0 < s < 1e-2 for s in clipped.values())
    assert all("bounded" not in rows[d] for d in HONEST)
    # The attacker's share of the mean (1/4 of its clipped delta) is at most 3/4 of the server's
    # reference norm per block (under 1 for tiny); honest deltas are tiny by comparison.
    template = tiny()
    moved = block_norms({n: final[n] - initial[n] for n in final}, {n: template.block_of(n) for n in final})
    assert all(norm < 3.0 for norm in moved.values()), moved


def test_norm_history_survives_a_restart(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", rounds=2, min_devices=4, deadline_s=30, norm_bound=3.0,
                           norm_bound_action="reject")
    _fleet(config, lambda n, shape: np.full(shape, 0.02, np.float32))
    with Store(tmp_path / "s") as store:
        rows = store.norms.history(HISTORY)
        assert {r["round"] for r in rows} == {1, 2} and {r["device_id"] for r in rows} == {*HONEST, "attacker"}
        bound = NormBound(config, tiny(), store, lambda state, round: {})
        # Reloaded: with no reference update this round, every block is bounded by its peers' history.
        bound.begin_round({}, 3)
        assert all(bound.reference(b, 0)[1] == "peers at this split" for b in range(2))
        assert 0 < bound.reference(0, 0)[0] < 1

    # The resumed server bounds its first round (3): 100x the honest norms is refused.
    resumed = server_config(tmp_path / "s", rounds=3, min_devices=4, deadline_s=30, norm_bound=3.0,
                            norm_bound_action="reject", resume=True)
    _, _, acks, history = _fleet(resumed, lambda n, shape: np.full(shape, 2.0, np.float32))
    assert [h["round"] for h in history] == [1, 2, 3]
    assert not acks[-1][0].accepted and "exceeds" in acks[-1][0].reason
