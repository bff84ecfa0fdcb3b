"""The server survives its own rounds: a round whose result fails its checks (here a huge but finite
update whose frozen chunk no longer exports and verifies) is not committed; it runs again from the
last good state, training goes on, and a server resumed from the journal starts cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config
from tests.scripted import scripted_device as _device


def test_a_huge_update_is_not_committed_and_training_goes_on(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []
    store_dir = tmp_path / "store"

    def hostile_once(n: int, shape) -> np.ndarray:
        # Huge but finite: every value passes the NaN/Inf check of the decoder, but the new model's
        # activations overflow, so its frozen chunk cannot be verified.
        return np.full(shape, 3e38 if n == 0 else 0.01, np.float32)

    def honest(n: int, shape) -> np.ndarray:
        return np.full(shape, -0.03, np.float32)

    async def main():
        # The export check alone (the norm bound would clip the update).
        config = server_config(store_dir, rounds=2, min_devices=2, deadline_s=30, allow_forced_split=True,
                               round_retries=2, norm_bound=0)
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        initial = {k: v.copy() for k, v in orch.global_state.items()}
        url = f"ws://127.0.0.1:{orch.port}"
        # The weak device's plan freezes block 0, so the server must be able to export it every round.
        results = await asyncio.gather(
            _device(url, orch, "attacker", {}, hostile_once),
            _device(url, orch, "weak", {"force_split": "1"}, honest),
            server,
        )
        return initial, orch.global_state, results[2]

    initial, final, history = asyncio.run(main())
    failed = [d for k, d in events if k == "round_failed"]
    assert len(failed) == 1 and failed[0]["round"] == 1 and "export check" in failed[0]["reason"]
    assert [h["round"] for h in history] == [1, 2] and history[0]["attempt"] == 2 and "failed" not in history[0]
    # Two committed rounds of small updates: the model moved, and nothing of the huge one is in it.
    for name, value in final.items():
        assert np.isfinite(value).all()
        assert np.abs(value - initial[name]).max() < 0.1, name
    assert not np.array_equal(final["blocks.head.weight"], initial["blocks.head.weight"])

    # A server resumed from this journal starts from the last good checkpoint and serves at once.
    store = Store(store_dir)
    done, state = store.checkpoints.last()
    store.close()
    assert done == 2 and all(np.isfinite(v).all() for v in state.values())

    async def resumed():
        config = server_config(store_dir, rounds=3, deadline_s=30, resume=True)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        await asyncio.gather(_device(url, orch, "honest", {}, honest), server)
        return orch.start_round

    assert asyncio.run(resumed()) == 3
