"""Training runtimes are one registry (profiles.runtime.RUNTIMES) that planning, budget checks and
payloads all read: a device's runtime decides the memory counted and the tails it can train, a hello
naming no known runtime is refused at hello (the server goes on), and the server's budget check of
a longer tail than the plan's counts the device's own runtime, as the planner does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset, partition
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from profiles.accounting import measure_model
from profiles.planner import plan_split, tail_footprint
from profiles.runtime import FALLBACK, RUNTIMES, Runtime, UnknownRuntime, device_runtime

pytestmark = pytest.mark.slow


def test_the_registry_names_each_runtime_once() -> None:
    # The planner's order of preference: torch, then the Python and JavaScript graph runtimes.
    assert list(RUNTIMES) == ["torch", "onnxruntime", "onnxruntime-node", "onnxruntime-webgpu", "onnxruntime-web"]
    assert RUNTIMES["torch"].backend == "torch" and not RUNTIMES["torch"].needs_graph
    assert RUNTIMES["onnxruntime"].needs_graph
    assert RUNTIMES["onnxruntime"].can_train(2, {2}) and not RUNTIMES["onnxruntime"].can_train(1, {2})
    assert RUNTIMES["torch"].can_train(1, set())
    # A device names what it has; it trains with the first of the registry's runtimes it names.
    assert device_runtime(["onnxruntime", "torch"]).name == "torch"
    assert device_runtime(["onnxruntime"]).name == "onnxruntime"
    assert device_runtime(["onnxruntime-web"]).needs_graph and device_runtime(["onnxruntime-node"]).needs_graph
    # A tab with a GPU names both browser runtimes and is planned (and charged) on the GPU's.
    webgpu = device_runtime(["onnxruntime-webgpu", "onnxruntime-web"])
    assert webgpu.name == "onnxruntime-webgpu" and webgpu.needs_graph
    assert FALLBACK.for_backend("onnxruntime-webgpu") > FALLBACK.for_backend("onnxruntime-web")
    with pytest.raises(UnknownRuntime, match="known: torch, onnxruntime, onnxruntime-node, onnxruntime-webgpu, onnxruntime-web"):
        device_runtime(["tensorflow"])
    # Memory: a RuntimeMemory figure by name, or bytes measured elsewhere (a browser's runtime).
    assert FALLBACK.for_backend("torch") == FALLBACK.training
    assert FALLBACK.for_backend("onnxruntime") == FALLBACK.onnxruntime_training
    assert Runtime("onnxruntime-web", memory=80 << 20, backend="graph").needs_graph
    with pytest.raises(ValueError, match="torch or graph"):
        Runtime("x", memory=1, backend="tflite")


async def _unknown_runtime(tmp_path: Path) -> tuple[p.Message, list[dict]]:
    config = ServerConfig(model="digits_mlp", strategy="fedavg", rounds=3, min_devices=1, local_steps=3,
                          store_dir=tmp_path / "store", deadline_s=60, wait_devices_s=60)
    started = asyncio.Event()
    orch, server = await start_orchestrator(config, lambda kind, data: started.set() if kind == "round_start" else None)
    url = f"ws://127.0.0.1:{orch.port}"
    data = load_dataset("digits", split="train")
    honest = DeviceClient(DeviceSettings(server=url, device_id="honest", budget_bytes=2 << 30), data.x[:300], data.y[:300])
    device = asyncio.create_task(honest.run())
    await started.wait()  # mid-run: the honest device is training
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id="tf", token="", budget_bytes=2 << 30, cores=1, runtimes=["tensorflow"],
                                   num_samples=100))
        error = await recv_msg(ws)
    history, _ = await asyncio.wait_for(asyncio.gather(server, device), timeout=240)
    return error, history


def test_a_hello_naming_no_known_runtime_is_refused_and_the_server_goes_on(tmp_path: Path) -> None:
    error, history = asyncio.run(_unknown_runtime(tmp_path))
    assert isinstance(error, p.Error) and error.code == "refused"
    assert "tensorflow" in error.message and "known: torch, onnxruntime" in error.message
    assert [h["round"] for h in history] == [1, 2, 3]  # the server stayed up and finished
    assert all(h["reported"] == 1 and h["attempt"] == 1 for h in history)


async def _longer_tail_on_onnxruntime(tmp_path: Path, budget: int, x, y) -> list[dict]:
    config = ServerConfig(model="digits_mlp", strategy="fedavg", rounds=1, min_devices=1, local_steps=3,
                          store_dir=tmp_path / "store", deadline_s=60, wait_devices_s=60, allow_forced_split=True)
    orch, server = await start_orchestrator(config, lambda kind, data: None)
    cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id="ort", budget_bytes=budget,
                       backend="onnxruntime", labels={"force_split": "3"})
    history, _ = await asyncio.wait_for(asyncio.gather(server, DeviceClient(cfg, x, y).run()), timeout=240)
    return history


def test_a_longer_tail_is_checked_against_the_devices_own_runtime(tmp_path: Path) -> None:
    """A device on ONNX Runtime planned at the last block (a forced split) is asked by FedAvg for the
    whole model. Its budget holds the whole model on ONNX Runtime but not on torch: it must be sent
    the whole model (the server counts the device's runtime, as the planner does), not skipped."""
    from edge_sdk.models import build_model

    data = load_dataset("digits", split="train")
    idx = partition(data.y, 4, "iid", seed=0)[0]
    cost = measure_model(build_model("digits_mlp", seed=0))
    need = {r: tail_footprint(cost, 0, 32, backend=r, chunks=[], local_samples=len(idx)).total for r in RUNTIMES}
    assert need["onnxruntime"] < need["torch"]
    budget = (need["onnxruntime"] + need["torch"]) // 2
    # The planner alone would give this budget the whole model on ONNX Runtime, never on torch.
    assert plan_split(cost, budget, 32, local_samples=len(idx), backends=("onnxruntime",),
                      graph_splits=range(4)).split == 0
    with pytest.raises(ValueError):
        plan_split(cost, budget, 32, local_samples=len(idx), backends=("torch",))
    history = asyncio.run(_longer_tail_on_onnxruntime(tmp_path, budget, data.x[idx], data.y[idx]))
    assert history[0]["over_budget"] == [] and history[0]["reported"] == 1, history[0]
