"""Training backends are one table (edge_sdk.backends.BACKENDS) that the device, its command line,
fleet files, bundles and the planner all read, and a backend of your own is one module.

``tests/alt_backend.py`` is such a module: it hands every step to the ONNX Runtime graph backend
under the name ``alt``. Named by reference, it trains rounds through a real server from the API,
from ``python -m edge_sdk`` and in an emulated fleet, with the same numbers as the graph backend,
and nothing else changes for it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk import protocol as p
from edge_sdk.backends import AUTO, BACKENDS, GraphBackend, TorchBackend, backend_class, choose_backend
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from emulator.fleet import load_fleet
from emulator.localfleet import device_env, start_orchestrator
from emulator.runner import run_emulation
from emulator.schedule import server_config
from orchestrator.config import ServerConfig
from profiles.runtime import RUNTIMES, backend_runtime
from tests.alt_backend import AltBackend
from tests.factories import EXACT_TRANSFERS

ROOT = Path(__file__).resolve().parents[1]
ALT = "tests.alt_backend:AltBackend"


def _instruction(**config: p.Scalar) -> p.Instruction:
    return p.Instruction(round=1, phase="train", model_version=0, split=2, chunk_ids=[], model_id="m",
                         selection="tail", broadcast_id="", local_steps=1, lr=0.1, deadline_s=0.0, config=dict(config))


def test_every_backend_of_the_table_is_planned_on_a_runtime_of_the_registry() -> None:
    assert list(BACKENDS) == ["torch", "onnxruntime"]
    for backend in BACKENDS.values():
        runtime = backend_runtime(backend)
        assert runtime.name in RUNTIMES and runtime.backend == backend.kind
        assert set(backend.runtimes) <= set(RUNTIMES)
    assert backend_runtime("torch").name == "torch" and backend_runtime("onnxruntime").name == "onnxruntime"
    assert backend_runtime(ALT) is RUNTIMES["onnxruntime"]


def test_a_backend_is_named_by_table_entry_auto_or_reference() -> None:
    assert backend_class("torch") is TorchBackend and backend_class("onnxruntime") is GraphBackend
    assert backend_class(AUTO) is TorchBackend  # torch is installed here
    assert backend_class(ALT) is AltBackend and backend_class(AltBackend) is AltBackend
    with pytest.raises(ValueError, match="auto, torch, onnxruntime, or package.module:Class"):
        backend_class("tflite")
    with pytest.raises(ValueError, match="not a subclass of edge_sdk.backends.TrainingBackend"):
        backend_class("tests.alt_backend:__all__")
    with pytest.raises(ValueError, match="cannot import"):
        backend_class("tests.no_such_module:Backend")


def test_the_backend_is_chosen_once_per_instruction_from_the_plan() -> None:
    graph = _instruction(train_graph_id="g")
    assert choose_backend(TorchBackend, _instruction(), trains_graph=True) is TorchBackend
    assert choose_backend(AltBackend, graph, trains_graph=True) is AltBackend
    # A torch device the server planned on a graph runtime trains the graph it was sent.
    assert choose_backend(TorchBackend, graph, trains_graph=True) is GraphBackend
    with pytest.raises(p.ProtocolError, match="trains with torch, which this device does not use"):
        choose_backend(GraphBackend, graph, trains_graph=False)  # a channel slice has no graph
    with pytest.raises(p.ProtocolError, match="names no training graph, which backend alt trains from"):
        choose_backend(AltBackend, _instruction(), trains_graph=True)


async def _one_device(tmp: Path, backend: str) -> list:
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=1, local_steps=3, seed=0, store_dir=tmp / backend,
                          allow_forced_split=True, deadline_s=120, **EXACT_TRANSFERS)
    orch, server = await start_orchestrator(config, lambda kind, data: None)
    x, y = load_shard("digits", client=0, num_clients=4)
    device = DeviceSettings(f"ws://127.0.0.1:{orch.port}", "dev-0", 4 << 30, backend=backend, reconnect=False,
                          labels={"force_split": "2"})
    reports = await DeviceClient(device, x, y).run()
    await server
    return reports


@pytest.mark.slow
def test_a_backend_of_your_own_trains_rounds_through_the_server_as_the_one_it_delegates_to(tmp_path: Path) -> None:
    alt = asyncio.run(_one_device(tmp_path, ALT))
    graph = asyncio.run(_one_device(tmp_path, "onnxruntime"))
    assert [r.round for r in alt] == [r.round for r in graph] == [1, 2]
    assert {r.metrics["backend"] for r in alt} == {"alt"} and {r.metrics["backend"] for r in graph} == {"onnxruntime"}
    for a, g in zip(alt, graph):  # same seeds, same batches, same arithmetic
        assert a.trained == g.trained == (2, 4)
        assert a.metrics["loss_before"] == g.metrics["loss_before"] and a.metrics["loss_after"] == g.metrics["loss_after"]


@pytest.mark.slow
def test_the_device_command_trains_with_a_backend_named_by_reference(tmp_path: Path) -> None:
    async def run() -> tuple[list[dict], str, int]:
        config = ServerConfig(model="digits_mlp", rounds=1, min_devices=1, local_steps=2, store_dir=tmp_path / "s",
                              deadline_s=90)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{orch.port}", "--id", "alt-0", "--budget",
            "1GiB", "--backend", ALT, "--data", "digits", "--json-events", "--once", cwd=ROOT, env=device_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        history = await asyncio.wait_for(server, timeout=120)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        return history, out.decode() + err.decode(), proc.returncode

    history, output, returncode = asyncio.run(run())
    assert returncode == 0 and history[0]["reported"] == 1, output
    done = [json.loads(line) for line in output.splitlines() if line.startswith('{"event": "round_done"')]
    assert done and all(e["backend"] == "alt" and e["torch_loaded"] is False for e in done), output


FLEET = """
[fleet]
model = "digits_mlp"
seed = 0

[training]
rounds = 1
local_steps = 2

[emulation]
memory_cap = "none"
throttle_cpu = false

[[groups]]
name = "alt"
class = "pi-4-2gb"
count = 2
backend = "{backend}"

[[groups]]
name = "torch"
class = "pi-4-2gb"
count = 1
backend = "torch"
"""


@pytest.mark.slow
def test_an_emulated_fleet_group_trains_with_a_backend_named_by_reference(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(backend=ALT))
    fleet = load_fleet(path)
    assert [d.backend for d in fleet.devices()] == [ALT, ALT, "torch"]
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=90)
    run = asyncio.run(run_emulation(fleet, config, stderr_dir=tmp_path / "logs"))
    assert run.history[0]["reported"] == 3
    done = {d.device: [e for e in d.events if e.get("event") == "round_done"] for d in run.devices}
    assert {d: {e["backend"] for e in events} for d, events in done.items()} == {
        "alt-000": {"alt"}, "alt-001": {"alt"}, "torch-000": {"torch"}}
    assert {d: {e["torch_loaded"] for e in events} for d, events in done.items()} == {
        "alt-000": {False}, "alt-001": {False}, "torch-000": {True}}


def test_a_fleet_refuses_a_backend_it_cannot_load(tmp_path: Path) -> None:
    from emulator.fleet import FleetError

    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(backend="tflite"))
    with pytest.raises(FleetError, match=r"groups\[0\]\.backend: must be one of auto, torch, onnxruntime"):
        load_fleet(path)
