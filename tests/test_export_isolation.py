"""Exports never touch the model the round loop and the evaluator use.

Devices on ONNX Runtime (no torch in their training: ``DeviceSettings(backend="onnxruntime")``) join a
running fleet at several points of several rounds, each at a split whose training graph the server
has not exported yet, so the server exports and verifies graphs in worker threads while it
evaluates, checks and exports chunks of new states. Every round must be committed at its first
attempt (no state thrown away by a check that saw a model changed under it), the server must not
crash, and every device that joined must have trained.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset, partition
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store

pytestmark = pytest.mark.slow

ROUNDS = 6
#: (event, round, seconds after it, forced split) of each joining device: when the round starts, or
#: when its first report arrives (the round is about to close: aggregation, the state's checks and
#: chunk exports, evaluation). The four splits of digits_mlp, each graph exported on its first join.
JOINS = [("round_start", 1, 0.0, 3), ("update", 1, 0.0, 2), ("update", 2, 0.0, 1), ("round_start", 2, 0.3, 3),
         ("update", 3, 0.05, 0), ("round_start", 4, 0.0, 1), ("update", 4, 0.0, 2), ("update", 5, 0.1, 0)]


async def _run(tmp_path: Path) -> tuple[list[dict], list[tuple[str, dict]], set[str]]:
    config = ServerConfig(model="digits_mlp", rounds=ROUNDS, min_devices=2, local_steps=3, store_dir=tmp_path / "store",
                          train_graph_dir=tmp_path / "graphs", deadline_s=120, wait_devices_s=60,
                          allow_forced_split=True, round_retries=2)
    events: list[tuple[str, dict]] = []
    moments = {(kind, r): asyncio.Event() for kind in ("round_start", "update") for r in range(1, ROUNDS + 1)}

    def on_event(kind: str, data: dict) -> None:
        events.append((kind, data))
        if (kind, data.get("round")) in moments:
            moments[kind, data["round"]].set()

    orch, server = await start_orchestrator(config, on_event)
    url = f"ws://127.0.0.1:{orch.port}"
    data = load_dataset("digits", split="train")
    shards = partition(data.y, 2 + len(JOINS), "iid", seed=0)

    def client(i: int, **kw: object) -> DeviceClient:
        cfg = DeviceSettings(server=url, budget_bytes=4 << 30, **kw)  # type: ignore[arg-type]
        return DeviceClient(cfg, data.x[shards[i]], data.y[shards[i]])

    async def join(i: int, event: str, round_no: int, delay: float, split: int) -> None:
        await moments[event, round_no].wait()
        await asyncio.sleep(delay)
        await client(2 + i, device_id=f"ort-{i}", backend="onnxruntime", labels={"force_split": str(split)}).run()

    fleet = [client(i, device_id=f"torch-{i}", backend="torch").run() for i in range(2)]
    joins = [join(i, *j) for i, j in enumerate(JOINS)]
    history, *_ = await asyncio.wait_for(asyncio.gather(server, *fleet, *joins), timeout=600)
    store = Store(config.store_dir)
    trained = {u["device_id"] for u in store.reports.all() if u.get("accepted")}
    store.close()
    return history, events, trained


def test_onnxruntime_devices_joining_mid_round_never_disturb_the_rounds(tmp_path: Path) -> None:
    history, events, trained = asyncio.run(_run(tmp_path))
    assert [h["round"] for h in history] == list(range(1, ROUNDS + 1))
    assert all(h["attempt"] == 1 and "failed" not in h for h in history), [
        (h["round"], h["attempt"], h.get("failed")) for h in history]
    assert not [d for kind, d in events if kind in ("round_failed", "train_graph_refused")]
    # Every device that joined was planned, and those that joined two rounds before the end trained
    # (one that joins as a round closes may miss the next round's start).
    registered = {d["device"]: d for kind, d in events if kind == "registered"}
    assert {f"ort-{i}" for i in range(len(JOINS))} <= set(registered)
    assert {f"ort-{i}" for i, (_, r, _, _) in enumerate(JOINS) if r < ROUNDS - 1} <= trained
    assert all(h["accuracy"] > 0.1 for h in history[-2:])
