"""Devices without torch: a virtual environment with the core dependencies only trains its tails
from ONNX training graphs, in a mixed fleet with a torch device, to today's accuracy bar."""

from __future__ import annotations

import asyncio
import gzip
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from emulator.launch import DeviceLaunch
from emulator.localfleet import role_budgets, run_local_fleet
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.views.fleetview import summarise_run
from tests.conftest import _digits_csv

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: What `pip install .` installs (pyproject.toml's core dependencies), pinned like everything else.
CORE: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_pip_install_gives_a_device_without_torch_and_train_adds_it() -> None:
    """`pip install .` is the device without torch (nor onnx, which only exporters need);
    `pip install '.[train]'` adds torch."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _names(project["dependencies"])
    assert not core & {"torch", "onnx", "onnxscript"}, core
    assert {"onnxruntime", "numpy", "msgpack", "websockets"} <= core
    assert "torch" in _names(project["optional-dependencies"]["train"])


def test_digits_csv_is_readable() -> None:
    with gzip.open(_digits_csv(), "rt") as f:
        assert f.readline().count(",") == 64


def test_mixed_fleet_with_onnxruntime_devices_without_torch(tmp_path: Path, no_torch_python: str) -> None:
    config = ServerConfig(model="digits_mlp", rounds=6, min_devices=4, local_steps=10, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120,
                          # every device in every round, however loaded the machine: the straggler grace
                          # (wall time) is tests/test_lifecycle.py's, and a cut device misses an update here
                          straggler_policy="deadline")
    torch_budgets = role_budgets("digits_mlp")
    ort_budgets = role_budgets("digits_mlp", backend="onnxruntime")
    launches = [
        DeviceLaunch("strong-0", torch_budgets["strong"], client=0, num_clients=4, backend="torch"),
        DeviceLaunch("moderate-1", ort_budgets["moderate"], client=1, num_clients=4, backend="auto"),
        DeviceLaunch("weak-2", ort_budgets["weak"], client=2, num_clients=4, backend="auto"),
        DeviceLaunch("weak-3", ort_budgets["weak"], client=3, num_clients=4, backend="auto"),
    ]
    run = asyncio.run(run_local_fleet(
        config, launches, stderr_dir=tmp_path / "stderr",
        python=lambda d: sys.executable if d.backend == "torch" else no_torch_python,
    ))
    assert [r["round"] for r in run.history] == list(range(1, 7))
    assert run.history[-1]["accuracy"] > 0.6, run.history[-1]

    store = Store(tmp_path / "store")
    devices = {d["device_id"]: d for d in store.devices.all()}
    updates = store.reports.all()
    for launch in launches:
        plan = devices[launch.device_id]["plan"]
        role = launch.device_id.split("-")[0]
        assert plan["role"] == role, (launch.device_id, plan)
        assert plan["backend"] == ("torch" if launch.backend == "torch" else "onnxruntime")
        assert sum(u["device_id"] == launch.device_id and u["accepted"] for u in updates) == 6
        done = [e for e in run.device_events[launch.device_id] if e["event"] == "round_done"]
        assert len(done) == 6
        # Said by each device process about itself: the torch device loaded torch, the others never did.
        assert all(e["torch_loaded"] == (launch.backend == "torch") for e in done), done[-1]
        assert all(e["backend"] == plan["backend"] for e in done)
    # The same weak budget under torch would train only the head: ONNX Runtime buys a larger tail.
    assert devices["weak-2"]["plan"]["split"] <= 3
    store.close()
    # The run summary (the demo's table and metrics.json) says how each device trained.
    summary = {d["device"]: d for d in summarise_run(run, launches, config)["devices"]}
    assert {k: (d["backend"], d["torch_loaded"]) for k, d in summary.items()} == {
        "strong-0": ("torch", True), "moderate-1": ("onnxruntime", False), "weak-2": ("onnxruntime", False),
        "weak-3": ("onnxruntime", False)}
