"""The CUDA path: the server's evaluation on a GPU scores what the CPU scores, and the device choice
(``EDGETRAIN_TORCH_DEVICE``, :mod:`edge_sdk.accelerator`) is honoured or refused with a clear error.
The GPU tests run where torch sees a CUDA device (``bench/gpu_check.sh`` runs them on a GPU machine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.accelerator import ENV, torch_device
from edge_sdk.models import build_model
from orchestrator.config import ServerConfig
from orchestrator.server.evaluate import Evaluator
from orchestrator.server.payloads import model_at

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def test_the_device_choice_is_honoured_and_a_missing_gpu_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV, "cpu")
    assert torch_device(default="auto").type == "cpu"
    monkeypatch.delenv(ENV)
    assert torch_device().type == "cpu"  # a device process's default
    assert torch_device(default="auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv(ENV, "tpu")
    with pytest.raises(ValueError, match="cpu, cuda, cuda:N or auto"):
        torch_device()
    if not torch.cuda.is_available():
        monkeypatch.setenv(ENV, "cuda")
        with pytest.raises(RuntimeError, match="sees no CUDA device"):
            torch_device()


def _evaluator(tmp_path: Path, model: str, shape: tuple[int, ...], classes: int, n: int = 300) -> Evaluator:
    rng = np.random.default_rng(0)
    path = tmp_path / "held-out.npz"
    np.savez(path, x=rng.normal(size=(n, *shape)).astype(np.float32), y=rng.integers(0, classes, n))
    return Evaluator(ServerConfig(model=model, eval_source=str(path), store_dir=tmp_path / "store"))


def test_per_sample_results_add_up_to_the_accuracy(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "cpu")
    template = build_model("mnist_2nn", seed=1)
    model = model_at(template, {k: v.detach().numpy().copy() for k, v in template.state_dict().items()})
    evaluator = _evaluator(tmp_path, "mnist_2nn", (784,), 10)
    correct = evaluator.correct(model)
    assert correct.dtype == bool and len(correct) == 300
    assert correct.mean() == pytest.approx(evaluator.evaluate(model)["accuracy"])


@needs_cuda
@pytest.mark.parametrize("name, shape, classes", [("resnet20", (3, 32, 32), 10), ("mnist_2nn", (784,), 10)])
def test_the_server_scores_a_model_the_same_on_the_gpu_and_the_cpu(tmp_path, monkeypatch, name, shape, classes):
    # TF32 would round convolutions' inputs to 10 bits on the GPU: off, the two paths agree to float32 rounding.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    template = build_model(name, seed=3)
    state = {k: v.detach().numpy().copy() for k, v in template.state_dict().items()}
    evaluator = _evaluator(tmp_path, name, shape, classes)
    scores, correct = {}, {}
    for device in ("cpu", "cuda"):
        monkeypatch.setenv(ENV, device)
        model = model_at(template, state)
        scores[device], correct[device] = evaluator.evaluate(model), evaluator.correct(model)
        assert next(model.parameters()).device.type == "cpu"  # the server's model stays on the CPU
    assert scores["cuda"]["test_loss"] == pytest.approx(scores["cpu"]["test_loss"], rel=1e-5)
    assert scores["cuda"]["accuracy"] == scores["cpu"]["accuracy"]
    assert np.array_equal(correct["cuda"], correct["cpu"]) and len(correct["cpu"]) == 300


@needs_cuda
def test_auto_is_the_gpu_where_torch_sees_one(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert torch_device(default="auto").type == "cuda"
