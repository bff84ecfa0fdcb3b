"""The chunk cache on disk keeps its byte budget over a long run: past versions' chunks are removed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from orchestrator.config import ServerConfig
from orchestrator.localfleet import start_orchestrator
from tests.scripted import scripted_device


def test_the_chunk_store_stays_within_its_budget(tmp_path: Path) -> None:
    rounds = 8

    async def main():
        config = ServerConfig(model="tiny", rounds=rounds, min_devices=1, eval_data="synthetic", eval_every=0,
                              store_dir=tmp_path / "s", deadline_s=30, allow_forced_split=True, chunk_disk_bytes=1)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        sizes: list[int] = []

        async def watch():
            while not server.done():
                sizes.append(sum(f.stat().st_size for f in (tmp_path / "s" / "chunks").glob("*.onnx")))
                await asyncio.sleep(0.05)

        # A weak device (block 0 frozen): every round exports a new version of chunk [0, 1).
        await asyncio.gather(scripted_device(url, orch, "weak", {"force_split": "1"},
                                             lambda n, shape: np.full(shape, 0.01, np.float32)), server, watch())
        return orch, sizes

    orch, sizes = asyncio.run(main())
    most = max(sizes)
    assert orch.cache.stats.exports >= rounds  # one version per round was exported...
    assert most < 3 * min(s for s in sizes if s)  # ...but the store never held more than the newest
