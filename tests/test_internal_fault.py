"""A fault while the server handles one device's message ends that device's connection with an
``internal`` error frame, logged; the server and every other device go on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from edge_sdk.client import DeviceClient, DeviceSettings, DeviceRefused
from edge_sdk.data import load_dataset, partition
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator
from orchestrator.strategies import DeviceReport, FedAvg, Instruction, RoundContext

pytestmark = pytest.mark.slow


class Faulty(FedAvg):
    """FedAvg with a bug that only one device's reports reach."""

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if report.device_id == "faulty":
            raise RuntimeError("a bug in the strategy")
        return super().on_report(report, ctx)


async def _run(tmp_path: Path) -> tuple[list[dict], list[object]]:
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=3, store_dir=tmp_path / "store",
                          deadline_s=60, wait_devices_s=60)
    orch = Orchestrator(config, strategy=Faulty())
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    data = load_dataset("digits", split="train")
    shards = partition(data.y, 2, "iid", seed=0)
    clients = [DeviceClient(DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=2 << 30),
                            data.x[idx], data.y[idx]) for d, idx in zip(("faulty", "honest"), shards)]
    outcomes = await asyncio.wait_for(asyncio.gather(*(c.run() for c in clients), return_exceptions=True), 240)
    return await asyncio.wait_for(server, 60), outcomes


def test_a_fault_handling_one_device_ends_only_its_connection(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="edgetrain.server"):
        history, (faulty, honest) = asyncio.run(_run(tmp_path))
    assert isinstance(faulty, DeviceRefused) and str(faulty).startswith("internal:")
    assert not isinstance(honest, BaseException)
    assert [h["round"] for h in history] == [1, 2]
    assert history[-1]["reported"] == 1  # the honest device trained on
    assert any("internal error" in r.getMessage() and r.exc_info for r in caplog.records)
