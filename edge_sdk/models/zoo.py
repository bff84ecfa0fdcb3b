"""The papers' models as layered models, plus small ones for demos and exact tests.

- ``resnet20``: ResNet20 for CIFAR-10 (He et al.), 1x1 projection shortcuts with BatchNorm where the
  shape changes; 272,474 trainable parameters (EmbracingFL Table 1 prints 272,762).
- ``leaf_cnn``: the LEAF CNN for FEMNIST (EmbracingFL appendix 6.1): two 5x5 convs (32, 64) each
  followed by 2x2 max-pool, dense 2048, dense 62.
- ``bilstm``: the IMDB model (appendix 6.1): embedding 10,000 x 256, dropout 0.3, bidirectional LSTM
  256, dropout 0.3, dense 1. torch's LSTM has two bias vectors per gate where Keras has one.
- ``recommender``: user and item embedding tables (sparse: rows fetched by index, FedSubAvg) and
  dense layers that predict a MovieLens rating.
- ``digits_mlp``: a wide four-block MLP for scikit-learn's 8x8 digits (the demo's default).
- ``tiny``: two linear blocks, small enough to check aggregation by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from edge_sdk.models.layered import LayeredModel


# -- ResNet20 --------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """Two 3x3 conv + BN; identity shortcut, or 1x1 conv + BN where stride or width changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class Stem(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class PoolHead(nn.Module):
    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet20(num_classes: int = 10) -> LayeredModel:
    """11 blocks: stem, 9 residual blocks (3 stages of 3), head."""
    blocks: list[tuple[str, nn.Module]] = [("stem", Stem(3, 16))]
    cin = 16
    for stage, cout in enumerate((16, 32, 64), start=1):
        for b in range(1, 4):
            stride = 2 if (b == 1 and stage > 1) else 1
            blocks.append((f"stage{stage}_block{b}", BasicBlock(cin, cout, stride)))
            cin = cout
    blocks.append(("head", PoolHead(64, num_classes)))
    return LayeredModel("resnet20", blocks, input_shape=(3, 32, 32), num_outputs=num_classes)


# -- LEAF CNN --------------------------------------------------------------------------------
def leaf_cnn(num_classes: int = 62) -> LayeredModel:
    """4 blocks: conv1, conv2 (each conv 5x5 'same' + ReLU + 2x2 max-pool), dense1 2048, dense2."""
    blocks: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())),
        ("dense1", nn.Sequential(nn.Linear(7 * 7 * 64, 2048), nn.ReLU())),
        ("dense2", nn.Linear(2048, num_classes)),
    ]
    return LayeredModel("leaf_cnn", blocks, input_shape=(1, 28, 28), num_outputs=num_classes)


# -- IMDB BiLSTM -----------------------------------------------------------------------------
class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embedding(x))


class BiLSTM(nn.Module):
    """Bidirectional LSTM; returns the final hidden state of both directions, concatenated."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        return self.dropout(torch.cat([h[0], h[1]], dim=1))


def bilstm(vocab: int = 10_000, dim: int = 256, hidden: int = 256, seq_len: int = 256) -> LayeredModel:
    """3 blocks: embedding, bilstm, head (dense 1, a logit)."""
    blocks: list[tuple[str, nn.Module]] = [
        ("embedding", Embedding(vocab, dim, 0.3)),
        ("bilstm", BiLSTM(dim, hidden, 0.3)),
        ("head", nn.Linear(2 * hidden, 1)),
    ]
    model = LayeredModel("bilstm", blocks, input_shape=(seq_len,), input_dtype=torch.int64, task="binary", num_outputs=1)
    model.input_high = vocab
    return model


# -- MovieLens recommender -------------------------------------------------------------------
class PairEmbedding(nn.Module):
    """User and item tables looked up by a (user, item) index pair; output their concatenation."""

    def __init__(self, users: int, items: int, dim: int) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.user(x[:, 0]), self.item(x[:, 1])], dim=1)


def recommender(users: int = 611, items: int = 9_742, dim: int = 32, hidden: int = 64) -> LayeredModel:
    """3 blocks: embeddings (sparse), mlp, head (predicted rating)."""
    blocks: list[tuple[str, nn.Module]] = [
        ("embeddings", PairEmbedding(users, items, dim)),
        ("mlp", nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU())),
        ("head", nn.Linear(hidden, 1)),
    ]
    model = LayeredModel(
        "recommender", blocks, input_shape=(2,), input_dtype=torch.int64, task="regression",
        num_outputs=1, sparse_blocks=["embeddings"],
    )
    model.input_high = min(users, items)
    # Which input column indexes which table: a device declares the rows its data touches per
    # column, and trains a submodel of exactly those rows (FedSubAvg).
    model.sparse_inputs = {"blocks.embeddings.user.weight": 0, "blocks.embeddings.item.weight": 1}
    return model


# -- small models ----------------------------------------------------------------------------
def digits_mlp(num_classes: int = 10, width: int = 2048) -> LayeredModel:
    """4 blocks for 8x8 digits (64 features): 64-2048, 2048-2048, 2048-2048 (ReLU each), 2048-10.

    Wide on purpose: 8.5M parameters (34 MB in float32) make memory the constraint it is for the
    papers' models, so the planner gives strong, moderate and weak devices different splits
    (capacities 1.0, 0.49 and 0.002 at splits 0, 2 and 3), while a round still takes seconds.
    """
    blocks: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Sequential(nn.Linear(64, width), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(width, width), nn.ReLU())),
        ("fc3", nn.Sequential(nn.Linear(width, width), nn.ReLU())),
        ("head", nn.Linear(width, num_classes)),
    ]
    return LayeredModel("digits_mlp", blocks, input_shape=(64,), num_outputs=num_classes)


def mnist_2nn(num_classes: int = 10, hidden: int = 64) -> LayeredModel:
    """2 blocks for flattened 28x28 MNIST (784 features): 784-64 (ReLU), 64-10; 51k parameters.

    A small version of the 2NN of the FedALIGN and VaRSeL experiments (Section 4; VaRSeL Section
    5.1), so that a benchmark of many devices, strategies and seeds runs in minutes on 2 cores."""
    blocks: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Sequential(nn.Linear(784, hidden), nn.ReLU())),
        ("head", nn.Linear(hidden, num_classes)),
    ]
    return LayeredModel("mnist_2nn", blocks, input_shape=(784,), num_outputs=num_classes)


def mnist_cnn(num_classes: int = 10) -> LayeredModel:
    """4 blocks for flattened 28x28 MNIST (784 features): conv1 (1->16 3x3 'same' + ReLU + 2x2
    max-pool), conv2 (16->32 3x3 'same' + ReLU + 2x2 max-pool), dense1 1568->256, head 256->10;
    409,034 parameters. The workload of the side-by-side benchmark with Flower (bench/vs_flower.py).

    The input is MNIST as the dataset loader gives it, (N, 784); conv1 reshapes it to (N, 1, 28, 28)."""
    blocks: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())),
        ("dense1", nn.Sequential(nn.Linear(32 * 7 * 7, 256), nn.ReLU())),
        ("head", nn.Linear(256, num_classes)),
    ]
    return LayeredModel("mnist_cnn", blocks, input_shape=(784,), num_outputs=num_classes)


def tiny(features: int = 4, hidden: int = 3, num_classes: int = 2) -> LayeredModel:
    """2 linear blocks; small enough that an aggregation can be checked by hand."""
    blocks: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Linear(features, hidden)),
        ("head", nn.Linear(hidden, num_classes)),
    ]
    return LayeredModel("tiny", blocks, input_shape=(features,), num_outputs=num_classes)


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: how to build the model and what data it expects."""

    name: str
    factory: Callable[[], LayeredModel]
    dataset: str
    description: str


_SPECS = {
    s.name: s
    for s in (
        ModelSpec("resnet20", resnet20, "cifar10", "ResNet20, CIFAR-10 (EmbracingFL)"),
        ModelSpec("leaf_cnn", leaf_cnn, "femnist", "LEAF CNN, FEMNIST (EmbracingFL)"),
        ModelSpec("bilstm", bilstm, "imdb", "bidirectional LSTM, IMDB (EmbracingFL)"),
        ModelSpec("recommender", recommender, "movielens", "embedding recommender, MovieLens (FedSubAvg)"),
        ModelSpec("digits_mlp", digits_mlp, "digits", "4-block wide MLP, scikit-learn digits (demo)"),
        ModelSpec("mnist_2nn", mnist_2nn, "mnist", "2-block MLP, MNIST (FedALIGN / VaRSeL benchmark)"),
        ModelSpec("mnist_cnn", mnist_cnn, "mnist", "4-block CNN, MNIST (benchmark against Flower)"),
        ModelSpec("tiny", tiny, "synthetic", "2 linear blocks (exact tests)"),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)


def model_spec(name: str) -> ModelSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}") from None


def build_model(name: str, seed: int | None = 0) -> LayeredModel:
    """Build a zoo model; with a seed, its initial weights are the same on every machine."""
    spec = model_spec(name)
    if seed is None:
        return spec.factory()
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return spec.factory()
    finally:
        torch.random.set_rng_state(state)
