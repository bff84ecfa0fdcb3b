"""Next-character prediction: a small character LSTM (the model of LEAF's Shakespeare task, and of
the Selfish FL paper's Section 5.2 and appendix C: an 8-dimensional embedding, an LSTM, a dense
output layer over the characters), sized for many devices on a laptop's cores."""

from __future__ import annotations

import torch
from torch import nn

from edge_sdk.models.layered import LayeredModel

__all__ = ["char_lstm"]


class LastStep(nn.Module):
    """An LSTM over the sequence; its output is the top layer's state after the last character."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        return h[-1]


def char_lstm(vocab: int = 65, seq_len: int = 40, dim: int = 8, hidden: int = 64, layers: int = 1) -> LayeredModel:
    """3 blocks: embedding (vocab x 8), lstm (``layers`` x ``hidden``), head (hidden -> vocab).

    The paper's is 2 x 256 over 80 characters (816k parameters here, 175 ms a step of 32 on one
    core); the default, 1 x 64 over 40 characters (24k parameters, 5 ms a step), lets a benchmark
    of tens of devices, four algorithms and three seeds run in minutes. Tiny Shakespeare has 65
    characters (``edge_sdk.data.shakespeare``)."""
    blocks: list[tuple[str, nn.Module]] = [
        ("embedding", nn.Embedding(vocab, dim)),
        ("lstm", LastStep(dim, hidden, layers)),
        ("head", nn.Linear(hidden, vocab)),
    ]
    model = LayeredModel("char_lstm", blocks, input_shape=(seq_len,), input_dtype=torch.int64, num_outputs=vocab)
    model.input_high = vocab
    return model
