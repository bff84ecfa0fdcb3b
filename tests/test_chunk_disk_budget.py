"""The chunk cache on disk keeps its byte budget over a long run: past versions' chunks are removed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from edge_sdk.models import build_model
from emulator.localfleet import start_orchestrator
from exporters.onnx_export import export_chunk
from tests.factories import server_config
from tests.scripted import scripted_device


def test_the_chunk_store_stays_within_its_budget(tmp_path: Path) -> None:
    rounds = 8
    chunk = len(export_chunk(build_model("tiny"), 0, 1))  # every version of chunk [0, 1) has this size
    budget = int(2.5 * chunk)

    async def main():
        config = server_config(tmp_path / "s", rounds=rounds, eval_every=0, deadline_s=30, allow_forced_split=True,
                               chunk_disk_bytes=budget)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        # A weak device (block 0 frozen): every round exports a new version of chunk [0, 1).
        await asyncio.gather(scripted_device(url, orch, "weak", {"force_split": "1"},
                                             lambda n, shape: np.full(shape, 0.01, np.float32)), server)
        return orch

    orch = asyncio.run(main())
    kept = sorted((tmp_path / "s" / "chunks").glob("*.onnx"))
    assert orch.cache.stats.exports >= rounds  # one version per round was exported (8 x the chunk)...
    assert 0 < sum(f.stat().st_size for f in kept) <= budget  # ...but the store holds at most its budget
    assert len(kept) <= 2
