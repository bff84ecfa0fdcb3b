"""The losses a train report carries, through a real server and real devices: by default the loss
before and after local training and the mean of the steps' own losses; with the server's
``loss_after`` off, the devices skip the pass after training and leave that loss out, on either
training backend, and the round's summary averages what the reports carry."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig


def _run(store: Path, loss_after: bool) -> tuple[list[dict], list]:
    async def main():
        orch, server = await start_orchestrator(ServerConfig(
            model="digits_mlp", eval_data="digits", store_dir=store, rounds=2, min_devices=2, local_steps=3,
            wait_devices_s=60, deadline_s=120, loss_after=loss_after), lambda kind, data: None)
        clients = []
        for i, backend in enumerate(("torch", "onnxruntime")):
            x, y = load_shard("digits", client=i, num_clients=2)
            config = DeviceSettings(f"ws://127.0.0.1:{orch.port}", f"dev-{i}", 2 << 30, reconnect=False, backend=backend)
            clients.append(DeviceClient(config, np.asarray(x), np.asarray(y)))
        *_, history = await asyncio.gather(*(c.run() for c in clients), server)
        return history, [r for c in clients for r in c.reports]

    return asyncio.run(main())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_loss_after_devices_skip_it_and_the_round_averages_what_they_report(tmp_path: Path) -> None:
    history, reports = _run(tmp_path / "off", loss_after=False)
    assert {r.metrics["backend"] for r in reports} == {"torch", "onnxruntime"}
    for r in reports:
        assert "loss_after" not in r.metrics and math.isnan(r.loss_after)
        assert math.isfinite(r.metrics["loss_steps"]) and math.isfinite(r.loss_before)
    for h in history:
        assert "loss_after" not in h and math.isfinite(h["loss_steps"]) and math.isfinite(h["loss_before"])

    history, reports = _run(tmp_path / "on", loss_after=True)
    assert all(math.isfinite(r.loss_after) and math.isfinite(r.metrics["loss_steps"]) for r in reports)
    assert all(math.isfinite(h["loss_after"]) for h in history)
