"""LoRA adapters as trainable parts: a block trained through its adapters (the weights under them
frozen), its training graph verified like any other, the ONNX Runtime and torch trainers agreeing,
the planner choosing between fewer whole blocks and more adapted ones, the server's selection
taking back only the adapters, and the exported model with its adapters merged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_sdk.models import build_model
from edge_sdk.models.adapters import adapter_frozen, adapter_update_names
from edge_sdk.ort_trainer import OrtTail, TrainGraph, train_tail_ort
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, tail_state, train_tail
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache, verify_train_graph
from profiles.accounting import measure_model
from profiles.planner import plan_split

MODEL = "char_transformer_tiny@rank=4"


def _adapted(seed: int = 0) -> torch.nn.Module:
    """The model with its adapters' B factors away from zero (at initialisation they are zero, so
    the A factors would have no gradient and nothing of theirs would be checked)."""
    model = build_model(MODEL, seed=seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".lora_b"):
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(seed))
    return model


@pytest.fixture(scope="module")
def graphs(request: pytest.FixtureRequest) -> TrainGraphCache:
    return TrainGraphCache(request.config.cache.mkdir("edgetrain-train-graphs"))


def test_the_adapters_graph_is_verified_and_trains_as_torch_does(graphs: TrainGraphCache) -> None:
    model = _adapted()
    split = 2
    gid, data = graphs.get_or_export(model, split, adapters=True)
    assert gid != graphs.graph_id(model, split)  # another graph than the whole tail's
    graph = TrainGraph.from_bytes(data)
    frozen = {n for n in adapter_frozen(model) if model.block_of(n) >= split}
    assert set(graph.frozen) == frozen and frozen.isdisjoint(graph.params)
    assert set(graph.trained) == set(adapter_update_names(model, split))
    assert any(n.endswith(".lora_a") for n in graph.params) and "blocks.head.out.weight" in graph.params
    # Against torch autograd in float64, with the same weights frozen; the whole tail's check of the
    # same bytes fails (the graph does not say what torch would train).
    assert verify_train_graph(model, split, data, tolerance=1e-4, adapters=True) <= 1.0
    with pytest.raises(ExportError, match="do not match"):
        verify_train_graph(model, split, data, tolerance=1e-4)

    x = model.sample_input(64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        x = model(x, 0, split).numpy()
    y = np.random.default_rng(5).integers(0, 65, 64)
    state = tail_state(model, split)
    config = TrainConfig(local_steps=4, batch_size=16, lr=0.1, momentum=0.9, weight_decay=1e-4, seed=2)
    tail = build_tail(MODEL, split, adapters=True)
    load_tail_state(tail, split, state)
    expected = train_tail(tail, split, x, y, config, state)
    got = train_tail_ort(OrtTail(graph), state, x, y, config)
    assert set(got.deltas) == set(expected.deltas) == set(graph.trained)  # nothing of the frozen weights
    assert got.loss_after == pytest.approx(expected.loss_after, rel=1e-3)
    for name, delta in expected.deltas.items():
        assert np.linalg.norm(got.deltas[name] - delta) <= 2e-2 * max(1e-6, float(np.linalg.norm(delta))), name
    assert all(np.abs(got.deltas[n]).max() > 0 for n in graph.params if n.endswith(".lora_a"))


def test_the_planner_trains_more_blocks_through_adapters_where_fewer_fit_whole() -> None:
    plain, adapted = (measure_model(build_model(n, seed=None)) for n in ("char_transformer", "char_transformer@rank=8"))
    assert adapted.adapters and not plain.adapters and not plan_split(plain, 2**30, 32, runtime=0).adapters
    whole, through = (adapted.footprint(1, 32, runtime_bytes=0, adapters=a) for a in (False, True))
    assert through.trainable_state < whole.trainable_state and through.upload < whole.upload
    assert adapted.trainable_params(1, adapters=True) < adapted.trainable_params(1) / 4
    def fits(k: int, adapters: bool, budget: int) -> bool:  # each frozen block its own chunk: the least
        return adapted.footprint(k, 32, runtime_bytes=0, adapters=adapters).total <= budget

    chosen = set()
    for mib in np.arange(44, 60, 0.1):
        budget = int(mib * 2**20)
        try:
            plan = plan_split(adapted, budget, 32, runtime=0)
        except ValueError:
            continue
        whole = min(k for k in range(len(adapted)) if fits(k, False, budget))
        if plan.adapters:
            # More blocks through adapters than the budget trains whole, and the plan says so.
            assert plan.split < whole and "through their adapters" in plan.describe() and plan.role != "strong"
            assert plan.footprint_bytes <= budget and plan.trainable_params < adapted.trainable_params(plan.split)
            chosen.add(plan.split)
        else:  # whole where no earlier split fits through adapters
            assert plan.split == whole and not any(fits(k, True, budget) for k in range(whole))
    assert chosen, "no budget got adapters"


def test_the_server_takes_back_only_the_adapters() -> None:
    from orchestrator.strategies.selection import Selection

    model = build_model(MODEL, seed=0)
    split = 2
    names = model.state_names(split)
    state = {n: v.numpy() for n, v in model.state_dict().items()}
    selection = Selection.of_adapters(split, adapter_update_names(model, split))
    assert set(selection.cut(state, names)) == set(names)  # the device needs every weight to compute
    update = {n: np.zeros_like(state[n]) for n in adapter_update_names(model, split)}
    assert selection.check(update, state, names) is None
    frozen = next(n for n in adapter_frozen(model) if model.block_of(n) >= split)
    reason = selection.check({**update, frozen: np.zeros_like(state[frozen])}, state, names)
    assert reason is not None and frozen in reason
    assert Selection.tail(split).check(update, state, names) is not None  # a whole tail wants every entry


def test_the_exported_model_has_its_adapters_merged() -> None:
    from exporters.model_export import export_model, merged_model

    model = _adapted(seed=3).eval()
    merged = merged_model(model)
    assert merged.name == "char_transformer_tiny" and not any("lora" in n for n in merged.state_dict())
    x = model.sample_input(6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        np.testing.assert_allclose(merged(x).numpy(), model(x).numpy(), atol=1e-5)
    fresh = build_model("char_transformer_tiny", seed=None)
    fresh.load_state_dict(merged.state_dict())  # the plain architecture, by its name
    exported = export_model(merged, {"model": merged.name})
    assert exported.max_abs_diff < 1e-4 and b"lora" not in exported.onnx


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_weak_device_trains_adapters_through_serve(tmp_path) -> None:
    """A strong torch device and a device without torch whose budget fits more blocks through
    adapters than whole: the server plans and sends it an ``adapters`` selection, its graph trains
    them, and every report of both is accepted, the weak one's holding adapters only."""
    import asyncio

    from orchestrator.config import ServerConfig
    from emulator.launch import DeviceLaunch
    from emulator.localfleet import min_budget_for_split, run_local_fleet
    from orchestrator.store import Store
    from tests.shared_data import need

    root = str(need("tinyshakespeare"))
    cost = measure_model(build_model(MODEL, seed=None))
    samples = 400  # each device's share of the first 800 windows
    budget = min_budget_for_split(cost, 1, 32, samples, backend="onnxruntime", graph_splits=range(len(cost)))
    plan = plan_split(cost, budget, 32, local_samples=samples, backends=("onnxruntime",), graph_splits=range(4))
    # What buys blocks 1-3 whole buys more blocks through adapters (the raw tokens beat cached activations).
    assert plan.adapters and plan.split <= 1 and plan.role != "strong"
    config = ServerConfig(model=MODEL, strategy="embracingfl", rounds=2, min_devices=2, local_steps=4, lr=0.2,
                          eval_data="tinyshakespeare", eval_limit=256, data_root=root, store_dir=tmp_path / "store",
                          deadline_s=300)
    common = dict(data="tinyshakespeare", partition="natural", data_limit=2 * samples, num_clients=2)
    launches = [DeviceLaunch("strong-0", 2**31, client=0, backend="torch", **common),
                DeviceLaunch("adapters-1", budget, client=1, backend="onnxruntime", **common)]
    run = asyncio.run(run_local_fleet(config, launches, data_root=root, stderr_dir=tmp_path / "stderr"))
    assert [h["round"] for h in run.history] == [1, 2]
    with Store.open_readonly(tmp_path / "store") as store:
        plans = {d["device_id"]: d["plan"] for d in store.devices.all()}
        updates = store.reports.all()
    assert plans["adapters-1"].get("adapters") and not plans["strong-0"].get("adapters")
    assert all(u["accepted"] for u in updates) and {u["device_id"] for u in updates} == {"strong-0", "adapters-1"}
    assert all(u["selection"] == ("adapters" if u["device_id"] == "adapters-1" else "tail") for u in updates)
