"""Bring your own model: ``package.module:factory`` resolves wherever a zoo name does (the server, the
planner, ``edgetrain profile`` and ``bundle``, fleet files), and the example project outside the zoo
(examples/own_model) trains end to end with a torch device and ONNX Runtime devices; the latter
train the exported graph and never import the example's code."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.models import LayeredModel
from edge_sdk.models.zoo import build_model, model_spec, width_shapes
from edge_sdk.references import load_reference
from emulator.fleet import FleetError, parse_fleet
from emulator.launch import DeviceLaunch
from emulator.localfleet import Faults, run_local_fleet
from orchestrator.config import ServerConfig
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.own_model.model:make_model"

#: A module of the test's own, written to a temporary folder: factories with and without width.
OWN = '''
import torch
from torch import nn
from edge_sdk.models import LayeredModel
from edge_sdk.models.zoo import scaled


def narrowable(width: float = 1.0) -> LayeredModel:
    """Two blocks whose hidden layer takes a width."""
    h = scaled(8, width)
    return LayeredModel("x", [("fc1", nn.Linear(4, h)), ("head", nn.Linear(h, 2))], input_shape=(4,), num_outputs=2)


def not_layered():
    return nn.Linear(4, 2)


NOT_CALLABLE = 3
'''


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``own_models_<test>`` importable from a temporary folder that is the current directory but not
    on sys.path: the reference loader finds it there, as ``python -m`` would."""
    name = f"own_models_{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(OWN)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def test_a_reference_resolves_to_a_spec_and_builds_a_named_model(own_module: str) -> None:
    spec = model_spec(f"{own_module}:narrowable")
    assert spec.widths and spec.dataset == "" and spec.description == "Two blocks whose hidden layer takes a width."
    model = build_model(f"{own_module}:narrowable", seed=3)
    # Named by its reference: chunk ids, graph ids and the welcome all name the model so.
    assert isinstance(model, LayeredModel) and model.name == f"{own_module}:narrowable"
    assert build_model(f"{own_module}:narrowable", seed=3).state_dict()["blocks.fc1.weight"].equal(
        model.state_dict()["blocks.fc1.weight"])  # the seed fixes the initial weights
    assert width_shapes(f"{own_module}:narrowable", 0.5)["blocks.fc1.weight"] == (4, 4)


@pytest.mark.parametrize("attr, message", [
    ("not_layered", "returned Linear, not a LayeredModel"),
    ("NOT_CALLABLE", "is not callable"),
    ("missing", "has no 'missing'"),
])
def test_a_bad_factory_is_named_in_the_error(own_module: str, attr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(f"{own_module}:{attr}")


def test_bad_references_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="cannot import 'no_such_package_x.models'"):
        model_spec("no_such_package_x.models:make")
    with pytest.raises(ValueError, match="expected package.module:name"):
        model_spec("examples.own_model.model:")
    with pytest.raises(ValueError, match="unknown model 'resnet21'.*or package.module:factory"):
        model_spec("resnet21")
    with pytest.raises(ValueError, match="cannot be built at a reduced width"):
        build_model(EXAMPLE, width=0.5)  # the example's factory takes no width
    assert load_reference("edge_sdk.models.zoo:ModelSpec.__name__", "thing") == "ModelSpec"


def test_the_example_factory_declares_its_dataset() -> None:
    spec = model_spec(EXAMPLE)
    assert spec.dataset == "digits" and not spec.widths


def _fleet(model: str, dataset: str | None) -> dict:
    fleet = {"model": model, **({"dataset": dataset} if dataset is not None else {})}
    return {"fleet": fleet, "groups": [{"name": "g", "class": "mid-phone", "count": 2}]}


def test_a_fleet_file_takes_a_reference(own_module: str) -> None:
    assert parse_fleet(_fleet(EXAMPLE, None)).dataset == "digits"  # the factory's own
    assert parse_fleet(_fleet(f"{own_module}:narrowable", "synthetic")).dataset == "synthetic"
    with pytest.raises(FleetError, match="names no dataset: give one"):
        parse_fleet(_fleet(f"{own_module}:narrowable", None))
    with pytest.raises(FleetError, match="trains on 'digits', not 'synthetic'"):
        parse_fleet(_fleet(EXAMPLE, "synthetic"))
    with pytest.raises(FleetError, match="cannot import"):
        parse_fleet(_fleet("no_such_package_x:make", "digits"))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.slow
def test_profile_and_bundle_take_a_reference(tmp_path: Path) -> None:
    out = _cli("profile", "--model", EXAMPLE, "--budget", "1GiB", cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert EXAMPLE in out.stdout and "4 blocks" in out.stdout
    out = _cli("bundle", "--model", EXAMPLE, "--split", "2", "--out", str(tmp_path / "own.tar"), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    from edge_sdk.bundle import load_bundle

    manifest = load_bundle(tmp_path / "own.tar").manifest
    assert (manifest.model, manifest.split) == (EXAMPLE, 2)


@pytest.mark.slow
def test_the_example_trains_on_both_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three device processes: one trains the whole model with torch (it imports the example's
    factory); two train with ONNX Runtime from the training graphs the server exported, one the whole
    model, one its last two blocks after running the first two as frozen chunks. Torch, which the
    example imports, is never loaded in them, so neither is the example. Four rounds on digits."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    config = ServerConfig(model=EXAMPLE, eval_data="digits", rounds=4, min_devices=3, local_steps=10, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120)
    launches = [
        DeviceLaunch("torch-0", 1 << 30, client=0, num_clients=3, backend="torch"),
        DeviceLaunch("ort-1", 1 << 30, client=1, num_clients=3, backend="onnxruntime"),
        DeviceLaunch("ort-2", 1 << 30, client=2, num_clients=3, backend="onnxruntime", faults=Faults(force_split=2)),
    ]
    run = asyncio.run(run_local_fleet(config, launches, stderr_dir=tmp_path / "stderr"))
    assert [r["round"] for r in run.history] == [1, 2, 3, 4]
    assert run.history[-1]["accuracy"] > 0.5, run.history
    assert run.history[-1]["accuracy"] > run.history[0]["accuracy"], run.history
    store = Store(tmp_path / "store")
    plans = {d["device_id"]: d["plan"] for d in store.devices.all()}
    updates = store.reports.all()
    store.close()
    assert {d: (plan["backend"], plan["split"]) for d, plan in plans.items()} == {
        "torch-0": ("torch", 0), "ort-1": ("onnxruntime", 0), "ort-2": ("onnxruntime", 2)}
    for launch in launches:
        assert sum(u["device_id"] == launch.device_id and u["accepted"] for u in updates) == 4
        done = [e for e in run.device_events[launch.device_id] if e["event"] == "round_done"]
        assert len(done) == 4 and all(e["backend"] == launch.backend for e in done)
        assert all(e["torch_loaded"] == (launch.backend == "torch") for e in done), done[-1]
