"""Built tails kept between rounds (edge_sdk.warm_tails): a tail handed out again trains exactly as a
freshly built one on the new round's state, and a new split, slice, table size or factory never gets
a tail built for another."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from edge_sdk import protocol as p
from edge_sdk.backends import Tail
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.models import build_model
from edge_sdk.models import zoo
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, tail_state, train_tail
from edge_sdk.warm_tails import WarmTails

CONFIG = TrainConfig(local_steps=3, batch_size=16, lr=0.1, momentum=0.9, seed=3, eval_samples=16)


def _data(split: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    full = build_model("digits_mlp", seed=0)
    rng = np.random.default_rng(seed)
    x = full(torch.from_numpy(rng.random((64, 64), dtype=np.float32)), 0, split).detach().numpy()
    return x, rng.integers(0, 10, 64)


def _fresh(state: dict, split: int, x: np.ndarray, y: np.ndarray):
    tail = build_tail("digits_mlp", split)
    load_tail_state(tail, split, state)
    return train_tail(tail, split, x, y, CONFIG, state)


def test_a_tail_handed_out_again_trains_as_a_fresh_one_on_the_next_rounds_state() -> None:
    split = 1
    x, y = _data(split)
    pool = WarmTails(keep=1)
    states = [tail_state(build_model("digits_mlp", seed=s), split) for s in (1, 2)]  # two model versions
    used = []
    for state in states:
        tail = pool.take("digits_mlp", split)
        used.append(tail)
        load_tail_state(tail, split, state)
        result = train_tail(tail, split, x, y, CONFIG, state)
        deltas = {n: v.copy() for n, v in result.deltas.items()}
        pool.give_back(tail)
        expected = _fresh(state, split, x, y)
        assert result.loss_before == pytest.approx(expected.loss_before, abs=1e-7)
        assert result.loss_after == pytest.approx(expected.loss_after, abs=1e-7)
        for name, value in expected.deltas.items():
            np.testing.assert_allclose(deltas[name], value, atol=1e-7, err_msg=name)
    assert used[0] is used[1], "the second round reuses the first round's tail"
    assert (pool.built, pool.reused) == (1, 1)
    assert all(p.grad is None for p in used[1].parameters()), "a tail goes back without gradients"


def test_a_new_split_slice_table_size_or_factory_gets_its_own_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = WarmTails(keep=2)
    first = pool.take("digits_mlp", 1)
    pool.give_back(first)
    other_split = pool.take("digits_mlp", 2)
    assert other_split is not first and other_split.block_names[2:] == first.block_names[2:]
    assert all(t.device.type == "meta" for n, t in other_split.named_parameters() if n.startswith("blocks.fc1"))
    pool.give_back(other_split)

    slim = pool.take("mnist_2nn", 0, width=0.5)
    pool.give_back(slim)
    wide = pool.take("mnist_2nn", 0)
    assert wide is not slim
    assert wide.blocks[wide.block_names[0]][0].out_features > slim.blocks[slim.block_names[0]][0].out_features

    # A factory registered again under the same name is another model.
    spec = zoo.model_spec("digits_mlp")
    monkeypatch.setitem(zoo._SPECS, "digits_mlp", dataclasses.replace(spec, factory=lambda: spec.factory()))
    again = pool.take("digits_mlp", 1)
    assert again is not first
    assert pool.reused == 0


def test_a_table_cut_to_other_rows_gets_its_own_tail() -> None:
    pool = WarmTails()
    a = pool.take("movielens_lr", 0, {"blocks.lr.tables.item.weight": 5})
    pool.give_back(a)
    b = pool.take("movielens_lr", 0, {"blocks.lr.tables.item.weight": 7})
    assert b is not a and b.state_dict()["blocks.lr.tables.item.weight"].shape[0] == 7
    pool.give_back(b)
    assert pool.take("movielens_lr", 0, {"blocks.lr.tables.item.weight": 5}) is a


def test_idle_tails_are_capped_per_key() -> None:
    pool = WarmTails(keep=1)
    a, b = pool.take("digits_mlp", 2), pool.take("digits_mlp", 2)
    pool.give_back(a)
    pool.give_back(b)
    pool.give_back(a)
    assert pool.idle() == 1
    pool.clear()
    assert pool.idle() == 0
    with pytest.raises(ValueError):
        WarmTails(keep=0)


def test_the_client_with_a_pool_reports_what_it_reports_without_one() -> None:
    """The device's own path (build or take, load, train, copy the deltas out, give back) over two
    model versions: the same deltas and losses as a device that builds its tail every round, and the
    first round's deltas are not overwritten by the second round's training on the same tail."""
    split = 0
    rng = np.random.default_rng(1)
    x, y = rng.random((64, 64), dtype=np.float32), rng.integers(0, 10, 64)
    pool = WarmTails(keep=1)
    clients = [DeviceClient(DeviceSettings(server="ws://127.0.0.1:1", device_id=f"d{i}", budget_bytes=1 << 30,
                                         warm_tails=warm), x, y) for i, warm in enumerate((pool, None))]
    welcome = p.Welcome("d", "strong", split, 4, [], "digits_mlp", 1, 16, 3, {})
    for c in clients:
        c.welcome = welcome
    ins = p.Instruction(round=1, phase="train", model_version=1, split=split, chunk_ids=[], model_id="m",
                        selection="tail", broadcast_id="", local_steps=3, lr=0.1, deadline_s=60.0, config={})
    results = []
    for seed in (1, 2):
        state = tail_state(build_model("digits_mlp", seed=seed), split)
        tail = Tail("digits_mlp", split, x, state, built={})
        results.append([c.work.backend_for(ins).train(tail, y, CONFIG) for c in clients])
    for warm, cold in results:
        assert warm.loss_before == pytest.approx(cold.loss_before, abs=1e-7)
        for name in cold.deltas:
            np.testing.assert_allclose(warm.deltas[name], cold.deltas[name], atol=1e-7, err_msg=name)
    assert pool.reused == 1
