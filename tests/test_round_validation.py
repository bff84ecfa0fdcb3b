"""A round whose model fails its validation is not committed: the server scores the aggregated model
on its held-out data before committing it, and a round whose loss jumps beyond the bound
(``max_loss_rise``: (1 + 1.0) x the committed model's loss + 0.1 by default) runs again from the last
good state. The poisoned result never reaches a checkpoint, the committed round's journal says why
its first attempt was refused, and a server resumed from the store starts from the clean model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.factories import server_config
from tests.scripted import scripted_device


@pytest.mark.parametrize("validation_samples", [1024, 16])  # the whole set (100), then a subset of it
def test_a_round_whose_loss_jumps_is_not_committed(tmp_path: Path, validation_samples: int) -> None:
    events: list[tuple[str, dict]] = []

    def poison_once(n: int, shape) -> np.ndarray:
        return np.full(shape, 50.0 if n == 0 else 0.01, np.float32)

    def honest(n: int, shape) -> np.ndarray:
        return np.full(shape, -0.01, np.float32)

    async def main():
        # The norm bound off: this round's poison must get past every other bound to reach the check.
        config = server_config(tmp_path / "s", rounds=2, min_devices=2, deadline_s=30, norm_bound=0,
                               validation_samples=validation_samples)
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        initial = {k: v.copy() for k, v in orch.global_state.items()}
        url = f"ws://127.0.0.1:{orch.port}"
        *_, history = await asyncio.gather(scripted_device(url, orch, "attacker", {}, poison_once),
                                           scripted_device(url, orch, "honest", {}, honest), server)
        return initial, history

    initial, history = asyncio.run(main())
    failed = [d for k, d in events if k == "round_failed"]
    assert len(failed) == 1 and failed[0]["round"] == 1 and "validation loss rose" in failed[0]["reason"]
    assert [h["round"] for h in history] == [1, 2] and history[0]["attempt"] == 2
    assert "validation loss rose" in history[0]["retried"][0] and "failed" not in history[0]
    assert history[1]["test_loss"] < 2 * history[0]["test_loss"] + 0.1
    assert all(h["test_samples"] == 100 for h in history)  # the rounds' scores: the whole held-out set
    with Store(tmp_path / "s") as store:
        done, state = store.checkpoints.last()
        journaled = store.rounds.all()[0]["metrics"]
    assert done == 2 and "validation loss rose" in journaled["retried"][0]
    for name, value in state.items():  # two committed rounds of small updates: nothing of the poison
        assert np.abs(value - initial[name]).max() < 0.1, name


def test_validation_scores_a_fixed_subset_of_the_held_out_set() -> None:
    """Validation every round costs a thousand samples, not a whole evaluation: the same samples
    every round (a candidate is compared with the committed model on equal terms), the whole set
    when it is no larger, and an evaluation round of such a set scores once for both."""
    from orchestrator.server.evaluate import Evaluator

    full = Evaluator(ServerConfig(model="digits_mlp", eval_data="digits"))
    part = full.subset(100, seed=3)
    assert len(part.x) == 100 and part.enabled and len(full.x) > 100
    assert np.array_equal(part.x, full.subset(100, seed=3).x)  # the same samples each time
    rows = {r.tobytes() for r in full.x}
    assert all(r.tobytes() in rows for r in part.x)
    assert full.subset(0, seed=3) is full and full.subset(len(full.x), seed=3) is full


def test_the_bound_holds_for_a_negative_loss() -> None:
    """A loss that may be negative (a Cox model's) gets the same margin above it, not a bound below it."""
    from orchestrator.server.validation import SLACK, RoundValidation

    v = RoundValidation(max_rise=0.5)
    v.committed({"test_loss": -2.0})
    assert v.limit() == pytest.approx(-2.0 + 0.5 * 2.0 + SLACK)
    assert v.judge({"test_loss": -2.1}) is None  # better
    assert v.judge({"test_loss": -1.5}) is None  # a little worse, inside the margin
    assert "rose" in v.judge({"test_loss": -0.5})  # past it
    v.committed({"test_loss": 2.0})
    assert v.limit() == pytest.approx(3.0 + SLACK)  # a loss >= 0: (1 + rise) x L + slack, as before
