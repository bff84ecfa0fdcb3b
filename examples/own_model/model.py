"""A model of one's own, outside edgetrain's zoo: a small residual MLP for 8x8 digits.

Served and trained by reference, wherever a zoo name would go:

    edgetrain serve --model examples.own_model.model:make_model --data digits

The server builds it to plan splits, export the frozen chunks and training graphs, and evaluate.
A device that trains with torch imports this same factory; a device on ONNX Runtime trains the
graph the server exported and never imports this file.
"""

from __future__ import annotations

import torch
from torch import nn

from edge_sdk.models import LayeredModel


class Residual(nn.Module):
    """x + W2 relu(W1 x): a block with a skip connection (any torch code that exports to plain ONNX)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.inner(x))


def make_model(num_classes: int = 10, dim: int = 96) -> LayeredModel:
    """A residual MLP for scikit-learn's 8x8 digits: stem 64-96, two residual blocks, head 96-10."""
    blocks: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(nn.Linear(64, dim), nn.ReLU())),
        ("res1", Residual(dim, 2 * dim)),
        ("res2", Residual(dim, 2 * dim)),
        ("head", nn.Linear(dim, num_classes)),
    ]
    return LayeredModel("own_mlp", blocks, input_shape=(64,), num_outputs=num_classes)


#: The built-in dataset it trains on: fleet files default to it (serve still takes --data digits).
make_model.dataset = "digits"  # type: ignore[attr-defined]
