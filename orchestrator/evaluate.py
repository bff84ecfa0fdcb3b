"""Evaluation of the global model on a held-out set, on the server, after a round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edge_sdk.data import load_dataset
from edge_sdk.models import LayeredModel
from orchestrator.config import ServerConfig


class Evaluator:
    """Holds the test split (loaded once) and scores a model on it: accuracy and mean loss."""

    def __init__(self, config: ServerConfig) -> None:
        root = Path(config.data_root) if config.data_root else None
        data = load_dataset(config.eval_data, root=root, split="test")
        x, y = data.x, data.y
        if config.eval_limit is not None and len(x) > config.eval_limit:
            keep = np.random.default_rng(config.seed).permutation(len(x))[: config.eval_limit]
            keep.sort()
            x, y = x[keep], y[keep]
        self.x, self.y = x, y

    def evaluate(self, model: LayeredModel, batch: int = 256) -> dict[str, float]:
        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(self.x), batch):
                xb = torch.from_numpy(np.ascontiguousarray(self.x[i : i + batch]))
                yb = torch.from_numpy(np.ascontiguousarray(self.y[i : i + batch]))
                out = model(xb)
                loss_sum += float(model.loss(out, yb)) * len(xb)
                if model.task == "classification":
                    correct += int((out.argmax(dim=1) == yb).sum())
                elif model.task == "binary":
                    correct += int(((out.squeeze(-1) > 0).long() == yb.long()).sum())
        n = max(len(self.x), 1)
        result = {"test_loss": loss_sum / n, "test_samples": float(len(self.x))}
        if model.task in ("classification", "binary"):
            result["accuracy"] = correct / n
        return result
