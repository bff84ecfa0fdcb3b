"""Fine-tuning from a starting model: a run's round 1 starts from weights trained elsewhere (edgetrain
export's model.pt, or an .npz), checked against the model; an adapted model starts from a plain one's
weights with fresh adapters; the emulator runs the transformer's fleet from scratch and from such a model."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.models import build_model
from exporters.checkpoints import read_start_state
from orchestrator.config import ServerConfig
from orchestrator.server.resume import start_run
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _state(name: str, seed: int) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in build_model(name, seed=seed).state_dict().items()}


def test_a_run_starts_from_the_given_model_and_the_store_names_it(tmp_path: Path) -> None:
    trained = build_model("char_transformer_tiny", seed=7)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    path = tmp_path / "model.pt"
    path.write_bytes(buffer.getvalue())
    config = ServerConfig(model="char_transformer_tiny@rank=4", seed=0, store_dir=tmp_path / "store",
                          start_from=str(path))
    template = build_model(config.model, seed=config.seed)
    store = Store(config.store_dir)
    start = start_run(config, store, "embracingfl", template)
    fresh = _state(config.model, 0)
    for name, value in trained.state_dict().items():  # the plain model's weights, all of them
        np.testing.assert_array_equal(start.state[name], value.numpy())
    adapters = [n for n in fresh if ".lora_" in n]
    assert adapters and all(np.array_equal(start.state[n], fresh[n]) for n in adapters)  # fresh: B is zero
    assert store.meta.get("start_from") == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_starting_model_of_another_model_is_refused(tmp_path: Path) -> None:
    initial = _state("char_transformer_tiny", 0)
    np.savez(tmp_path / "lstm.npz", **_state("char_lstm", 0))
    with pytest.raises(ValueError, match="which the model does not have"):
        read_start_state(tmp_path / "lstm.npz", initial)
    np.savez(tmp_path / "wide.npz", **_state("char_transformer_tiny@dim=64", 0))
    with pytest.raises(ValueError, match="has shape"):
        read_start_state(tmp_path / "wide.npz", initial)
    np.savez(tmp_path / "part.npz", **{k: v for k, v in initial.items() if "head" not in k})
    with pytest.raises(ValueError, match="lacks"):
        read_start_state(tmp_path / "part.npz", initial)
    with pytest.raises(ValueError, match="no starting model"):
        read_start_state(tmp_path / "absent.pt", initial)
    np.savez(tmp_path / "same.npz", **initial)
    state, _ = read_start_state(tmp_path / "same.npz", initial)
    assert all(np.array_equal(state[k], v) for k, v in initial.items())


def _edgetrain(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "edgetrain.cli", *args], capture_output=True, text=True, env=env,
                          timeout=1500, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_emulate_runs_the_transformers_fleet_from_scratch_and_from_a_given_model(tmp_path: Path) -> None:
    """The shipped fleet (the test-sized model, fewer samples, the weak devices on torch: exporting
    their training graphs while they wait for a plan can outlast the server's wait for devices on a
    loaded machine; tests/test_lora.py runs such devices): from scratch; its exported model; a second
    run from that model, whose first round starts where the first run ended."""
    from emulator.fleet import FLEETS_DIR
    from tests.shared_data import need

    root = need("tinyshakespeare")
    text = (FLEETS_DIR / "tinyshakespeare-transformer.toml").read_text()
    fleet = tmp_path / "lm.toml"
    fleet.write_text(text.replace('model = "char_transformer"', 'model = "char_transformer_tiny"')
                     .replace("samples = 1500", "samples = 200").replace("validation_samples = 512",
                                                                        "validation_samples = 128")
                     .replace('backend = "onnxruntime"', 'backend = "torch"'))
    first = _edgetrain("emulate", "--fleet", str(fleet), "--rounds", "2", "--out", str(tmp_path / "a"),
                       "--data-root", str(root))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_a = next((tmp_path / "a").iterdir())
    exported = _edgetrain("export", "--store", str(run_a), "--out", str(tmp_path / "model"))
    assert exported.returncode == 0, exported.stderr[-2000:]
    second = _edgetrain("emulate", "--fleet", str(fleet), "--rounds", "1", "--out", str(tmp_path / "b"),
                        "--data-root", str(root), "--start-from", str(tmp_path / "model" / "model.pt"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    run_b = next((tmp_path / "b").iterdir())
    with Store.open_readonly(run_a / "store") as a, Store.open_readonly(run_b / "store") as b:
        assert b.meta.get("start_from") and a.meta.get("start_from") is None
        loss = {name: [r["metrics"]["loss_before"] for r in s.rounds.all()] for name, s in (("a", a), ("b", b))}
        final_a = a.checkpoints.read(a.rounds.completed())
        first_b = b.reports.all(1)
    assert loss["b"][0] < loss["a"][0] - 0.2, loss  # it fine-tuned the trained model, not a fresh one
    assert all(u["accepted"] for u in first_b) and len({u["device_id"] for u in first_b}) == 8
    assert set(final_a) == set(_state("char_transformer_tiny", 0))
