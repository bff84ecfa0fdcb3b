"""The server enforces budgets: a strategy may ask a device for more than its plan (FedAvg asks every
device for the whole model), but a device whose budget cannot hold it is never sent the instruction."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet
from orchestrator.config import ServerConfig


@pytest.mark.slow  # real devices through serve
def test_fedavg_never_sends_the_whole_model_to_a_weak_device(tmp_path: Path) -> None:
    budgets = role_budgets("digits_mlp")
    launches = [DeviceLaunch("strong-0", budgets["strong"], client=0, num_clients=2),
                DeviceLaunch("weak-1", budgets["weak"], client=1, num_clients=2)]
    config = ServerConfig(model="digits_mlp", strategy="fedavg", rounds=2, min_devices=2, local_steps=2,
                          store_dir=tmp_path / "store", deadline_s=120)
    events: list[tuple[str, dict]] = []
    run = asyncio.run(run_local_fleet(config, launches, on_event=lambda k, d: events.append((k, d))))
    over = [d for k, d in events if k == "over_budget"]
    assert {d["device"] for d in over} == {"weak-1"} and len(over) == 2  # once per round
    assert all(d["footprint_bytes"] > d["budget_bytes"] for d in over)
    sent_to = {d["device"] for k, d in events if k == "sent"}
    assert "weak-1" not in sent_to and "strong-0" in sent_to
    assert [h["reported"] for h in run.history] == [1, 1]
    assert all(h["over_budget"] == ["weak-1"] and h["stragglers"] == [] for h in run.history)
