"""Evaluation of the global model on a held-out set, on the server, after a round; and the check
that a model can take a set of data at all (its evaluation set at start, a device's at hello).

The held-out set is the user's (``--eval-data``: a ``.npz``/``.npy``/``.csv`` file read by
:class:`~edge_sdk.data.sources.TabularSource`, or ``package.module:function`` returning arrays
``(x, y)``, a data source or batches), the test split of a built-in dataset (``--data``), or none.

The model is scored on a CUDA GPU when torch sees one (``EDGETRAIN_TORCH_DEVICE``, default
``auto``: :mod:`edge_sdk.accelerator`), else on the CPU; the scores are the same either way up to
floating-point rounding (``tests/test_cuda.py``). The model is moved there for the evaluation and
back: the server's model stays on the CPU, where the rest of the server works on it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from edge_sdk.accelerator import torch_device
from edge_sdk.data import load_dataset
from edge_sdk.data.sources import DataSourceError, TabularSource, as_source, source_arrays
from edge_sdk.models import LayeredModel
from edge_sdk.references import is_reference, load_reference
from orchestrator.config import ServerConfig

__all__ = ["NO_EVALUATION", "Evaluator", "data_mismatch", "evaluation_arrays", "model_classes"]

#: ``--eval-data none``: the server scores no model (devices still report their own losses).
NO_EVALUATION = "none"


def model_classes(model: LayeredModel) -> int | None:
    """The labels a model tells apart: its outputs for classification, 2 for a binary one, None
    for a target that is not a class (regression, survival)."""
    if model.task == "classification":
        return int(model.num_outputs)
    return 2 if model.task == "binary" else None


def data_mismatch(model: LayeredModel, input_shape: tuple[int, ...], num_classes: int | None,
                  what: str) -> str | None:
    """Why ``model`` cannot train or score ``what`` (samples of ``input_shape``, labels 0..num_classes-1),
    naming both sides; None when it can. Fewer labels than classes is fine (a device's share may
    lack some), more is not."""
    classes = model_classes(model)
    shape_ok = tuple(input_shape) == tuple(model.input_shape)
    classes_ok = classes is None or num_classes is None or num_classes <= classes
    if shape_ok and classes_ok:
        return None
    takes = f"samples of shape {tuple(model.input_shape)}" + (f" and {classes} classes" if classes else "")
    has = f"samples of shape {tuple(input_shape)}" + (f" and labels 0..{num_classes - 1}" if num_classes else "")
    return f"model {model.name} takes {takes}, but {what} has {has}"


def evaluation_arrays(config: ServerConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """The held-out samples and labels ``config`` names (None for ``--eval-data none``); a file or a
    function that does not give them is a ValueError naming ``--eval-data``."""
    given = config.eval_source.strip()
    if given.lower() == NO_EVALUATION:
        return None
    if not given:
        data = load_dataset(config.eval_data, root=Path(config.data_root) if config.data_root else None, split="test")
        return data.x, data.y
    try:
        if is_reference(given) and not Path(given).exists():
            made = load_reference(given, "--eval-data")
            return source_arrays(as_source(made() if callable(made) else made))
        return TabularSource(given).arrays()
    except (DataSourceError, ValueError, TypeError) as e:
        raise ValueError(f"--eval-data {given}: {e}") from None


class Evaluator:
    """Holds the held-out set (loaded once) and scores a model on it: accuracy and mean loss.
    Given the model, it refuses a set the model cannot take, before the server listens."""

    def __init__(self, config: ServerConfig, model: LayeredModel | None = None) -> None:
        arrays = evaluation_arrays(config) if config.eval_every else None  # eval_every 0: never scored
        self.enabled = arrays is not None
        x, y = arrays if arrays is not None else (np.zeros((0,), np.float32), np.zeros((0,), np.int64))
        if model is not None and self.enabled:
            source = as_source(x, y)
            problem = data_mismatch(model, source.input_shape, source.num_classes,
                                    f"the evaluation data ({config.eval_source or config.eval_data})")
            if problem is not None:
                raise ValueError(f"{problem}; give --data or --eval-data that matches the model, or --eval-data none")
        if config.eval_limit is not None and len(x) > config.eval_limit:
            keep = np.random.default_rng(config.seed).permutation(len(x))[: config.eval_limit]
            keep.sort()
            x, y = x[keep], y[keep]
        self.x, self.y = x, y

    def subset(self, n: int, seed: int) -> Evaluator:
        """The same scoring on a fixed random ``n`` of the held-out samples (itself when ``n`` is 0 or
        covers the set): round validation's set, scored every round at a fraction of an evaluation."""
        if not n or n >= len(self.x):
            return self
        keep = np.sort(np.random.default_rng(seed).permutation(len(self.x))[:n])
        part = copy.copy(self)
        part.x, part.y = self.x[keep], self.y[keep]
        return part

    def evaluate(self, model: LayeredModel, batch: int = 256) -> dict[str, float]:
        """The model's mean loss (and accuracy, for classes) on the held-out set; nothing without one."""
        if not self.enabled:
            return {}
        loss_sum, correct = self._pass(model, batch)
        n = max(len(self.x), 1)
        result = {"test_loss": loss_sum / n, "test_samples": float(len(self.x))}
        if model.task in ("classification", "binary"):
            result["accuracy"] = float(correct.sum()) / n
        return result

    def correct(self, model: LayeredModel, batch: int = 256) -> np.ndarray:
        """Per held-out sample, whether the model classifies it right (what a benchmark's bootstrap
        intervals resample); empty without a held-out set or for a model without classes."""
        if not self.enabled or model.task not in ("classification", "binary"):
            return np.zeros(0, bool)
        return self._pass(model, batch)[1]

    def _pass(self, model: LayeredModel, batch: int) -> tuple[float, np.ndarray]:
        """One pass over the held-out set on the evaluation device: the summed loss, and per sample
        whether it was classified right (all False for a model without classes)."""
        device = torch_device(default="auto")
        model.eval()
        loss_sum, correct = 0.0, np.zeros(len(self.x), bool)
        model.to(device)
        try:
            with torch.no_grad():
                for i in range(0, len(self.x), batch):
                    xb = torch.from_numpy(np.ascontiguousarray(self.x[i : i + batch])).to(device, model.input_dtype)
                    yb = torch.from_numpy(np.ascontiguousarray(self.y[i : i + batch])).to(device)
                    out = model(xb)
                    loss_sum += float(model.loss(out, yb)) * len(xb)
                    if model.task == "classification":
                        correct[i : i + batch] = (out.argmax(dim=1) == yb).cpu().numpy()
                    elif model.task == "binary":
                        correct[i : i + batch] = ((out.squeeze(-1) > 0).long() == yb.long()).cpu().numpy()
        finally:
            model.to("cpu")
        return loss_sum, correct
