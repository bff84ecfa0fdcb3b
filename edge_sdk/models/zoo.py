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

A model of your own is named ``package.module:factory`` wherever a zoo name goes (``--model``, fleet
files, ``ServerConfig.model``): :func:`model_spec` resolves both, and everything that builds a
model goes through it (docs/models.md, the layered-model contract).

Width (static HeteroFL, FjORD's ordered dropout; EmbracingFL Section 4.1 and appendix 6.4): the
models that take a ``width`` ratio r in (0, 1] (``ModelSpec.widths``; ``build_model(name, width=r)``)
keep the first ``scaled(c, r) = max(1, ceil(r c))`` channels or units of every hidden layer; the
model's input channels and its class outputs keep their size. The narrow model's state is a
leading slice of the full model's, entry by entry: ``full[name][:c_out, :c_in, ...]`` has exactly
the shape of ``narrow[name]`` (:func:`width_shapes`), and flattened features are channel-major, so
a dense layer after a flatten keeps the first ``scaled(c, r) x H x W`` inputs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edge_sdk.models.layered import LayeredModel
from edge_sdk.models import survival, text, transformer
from edge_sdk.references import is_reference, load_reference


def scaled(channels: int, width: float) -> int:
    """Channels a layer of ``channels`` keeps at width ratio ``width``: ceil(width x channels), at least 1.

    The ceiling is taken with a small tolerance, so that 10 x 0.3 (3.0000000000000004 in floating
    point) keeps 3, not 4."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be in (0, 1], not {width}")
    return max(1, min(channels, math.ceil(channels * width - 1e-9)))


# -- ResNet20 --------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """Two 3x3 conv + BN; identity shortcut, or 1x1 conv + BN where stride or width changes.

    ``projection`` forces the 1x1 shortcut on or off (a narrow ResNet keeps the full one's shortcuts)."""

    def __init__(self, cin: int, cout: int, stride: int, projection: bool | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if projection if projection is not None else (stride != 1 or cin != cout):
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


def resnet20(num_classes: int = 10, width: float = 1.0) -> LayeredModel:
    """11 blocks: stem, 9 residual blocks (3 stages of 3), head. ``width``: see the module docstring
    (appendix 6.4, Table 10: r = 0.45 for moderate and 0.2 for weak clients)."""
    w = lambda c: scaled(c, width)  # noqa: E731
    blocks: list[tuple[str, nn.Module]] = [("stem", Stem(3, w(16)))]
    cin = 16
    for stage, cout in enumerate((16, 32, 64), start=1):
        for b in range(1, 4):
            stride = 2 if (b == 1 and stage > 1) else 1
            blocks.append((f"stage{stage}_block{b}", BasicBlock(w(cin), w(cout), stride, stride != 1 or cin != cout)))
            cin = cout
    blocks.append(("head", PoolHead(w(64), num_classes)))
    return _with_width(LayeredModel("resnet20", blocks, input_shape=(3, 32, 32), num_outputs=num_classes), width)


# -- LEAF CNN --------------------------------------------------------------------------------
def leaf_cnn(num_classes: int = 62, width: float = 1.0) -> LayeredModel:
    """4 blocks: conv1, conv2 (each conv 5x5 'same' + ReLU + 2x2 max-pool), dense1 2048, dense2.
    ``width``: see the module docstring (conv2's flattened output is channel-major, so dense1 keeps
    its first 7 x 7 x scaled(64) inputs)."""
    c1, c2, d1 = scaled(32, width), scaled(64, width), scaled(2048, width)
    blocks: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())),
        ("dense1", nn.Sequential(nn.Linear(7 * 7 * c2, d1), nn.ReLU())),
        ("dense2", nn.Linear(d1, num_classes)),
    ]
    return _with_width(LayeredModel("leaf_cnn", blocks, input_shape=(1, 28, 28), num_outputs=num_classes), width)


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

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

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


class OneHotLR(nn.Module):
    """A logistic regression over one-hot features: one weight table per input column (row = the
    column's value), summed with a bias into one logit. Every table is sparse: a device trains only
    the rows its data holds."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, rows: Sequence[int], names: Sequence[str]) -> None:
        super().__init__()
        self.names = tuple(names)
        self.tables = nn.ModuleDict({n: nn.Embedding(r, 1) for n, r in zip(names, rows)})
        for t in self.tables.values():
            nn.init.zeros_(t.weight)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias + sum(self.tables[n](x[:, i]) for i, n in enumerate(self.names))


def movielens_lr(rows: Sequence[int] = (7, 2, 9_742, 68_194, 19_484),
                 names: Sequence[str] = ("activity", "taste", "item", "activity_item", "taste_item")) -> LayeredModel:
    """The hot-and-cold FedSubAvg paper's LR (Section 5.1) on the ``movielens_lr`` features: 1 block."""
    model = LayeredModel("movielens_lr", [("lr", OneHotLR(rows, names))], input_shape=(len(names),),
                         input_dtype=torch.int64, task="binary", num_outputs=1, sparse_blocks=["lr"])
    model.input_high = min(rows)
    model.sparse_inputs = {f"blocks.lr.tables.{n}.weight": i for i, n in enumerate(names)}
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


def mnist_2nn(num_classes: int = 10, hidden: int = 64, width: float = 1.0) -> LayeredModel:
    """2 blocks for flattened 28x28 MNIST (784 features): 784-64 (ReLU), 64-10; 51k parameters.

    A small version of the 2NN of the FedALIGN and VaRSeL experiments (Section 4; VaRSeL Section
    5.1), so that a benchmark of many devices, strategies and seeds runs in minutes on 2 cores."""
    h = scaled(hidden, width)
    blocks: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Sequential(nn.Linear(784, h), nn.ReLU())),
        ("head", nn.Linear(h, num_classes)),
    ]
    return _with_width(LayeredModel("mnist_2nn", blocks, input_shape=(784,), num_outputs=num_classes), width)


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


def tiny(features: int = 4, hidden: int = 3, num_classes: int = 2, width: float = 1.0) -> LayeredModel:
    """2 linear blocks; small enough that an aggregation can be checked by hand."""
    h = scaled(hidden, width)
    blocks: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Linear(features, h)),
        ("head", nn.Linear(h, num_classes)),
    ]
    return _with_width(LayeredModel("tiny", blocks, input_shape=(features,), num_outputs=num_classes), width)


def _with_width(model: LayeredModel, width: float) -> LayeredModel:
    model.width = float(width)  # the ratio it was built at (1.0: the full model)
    return model


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry, or a factory of your own: how to build the model and what data it expects.

    ``widths``: the factory takes a ``width`` ratio (width reduction; see the module docstring).
    ``dataset``: the registered dataset it trains on (``edge_sdk.data.DATASETS``; "" when it names none)."""

    name: str
    factory: Callable[..., LayeredModel]
    dataset: str
    description: str
    widths: bool = False


_SPECS = {
    s.name: s
    for s in (
        ModelSpec("resnet20", resnet20, "cifar10", "ResNet20, CIFAR-10 (EmbracingFL)", widths=True),
        ModelSpec("leaf_cnn", leaf_cnn, "femnist", "LEAF CNN, FEMNIST (EmbracingFL)", widths=True),
        # IMDB is not among the registered datasets (edge_sdk.data): a fleet of it names its dataset.
        ModelSpec("bilstm", bilstm, "", "bidirectional LSTM, IMDB (EmbracingFL)"),
        ModelSpec("recommender", recommender, "movielens", "embedding recommender, MovieLens (FedSubAvg)"),
        ModelSpec("movielens_lr", movielens_lr, "movielens_lr", "one-hot logistic regression, MovieLens (FedSubAvg)"),
        ModelSpec("digits_mlp", digits_mlp, "digits", "4-block wide MLP, scikit-learn digits (demo)"),
        ModelSpec("mnist_2nn", mnist_2nn, "mnist", "2-block MLP, MNIST (FedALIGN / VaRSeL benchmark)", widths=True),
        ModelSpec("mnist_cnn", mnist_cnn, "mnist", "4-block CNN, MNIST (benchmark against Flower)"),
        ModelSpec("tiny", tiny, "synthetic", "2 linear blocks (exact tests)", widths=True),
        ModelSpec("char_lstm", text.char_lstm, "tinyshakespeare", "character LSTM, next character (VaRSeL Shakespeare)"),
        ModelSpec("cox_linear", survival.cox_linear, "fed_tcga_brca", "linear Cox model, TCGA-BRCA survival (FLamby)"),
        ModelSpec("char_transformer", transformer.char_transformer, "tinyshakespeare",
                  "decoder-only transformer, next character (4 blocks, width 64)"),
        ModelSpec("char_transformer_tiny", transformer.char_transformer_tiny, "tinyshakespeare",
                  "decoder-only transformer, next character (2 blocks, width 32; tests)"),
        ModelSpec("char_transformer_phone", transformer.char_transformer_phone, "tinyshakespeare",
                  "decoder-only transformer, next character (8 blocks, width 512; a phone)"),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)


#: Separates a model's name from its options: ``char_transformer@rank=8,context=64``.
OPTIONS_MARK = "@"


def model_spec(name: str) -> ModelSpec:
    """The one place a model name resolves: a zoo name, or ``package.module:factory`` for a model
    of your own (a callable returning a :class:`LayeredModel`), either with options
    (``name@key=value,...``: :func:`with_options`). A factory with a ``width`` parameter can be
    built at reduced widths; a ``dataset`` attribute on it names the built-in dataset it trains on
    (fleet files default to it). Raises ValueError for an unknown name or option."""
    base, mark, options = name.partition(OPTIONS_MARK)
    if is_reference(base):
        spec = _factory_spec(base)
    else:
        try:
            spec = _SPECS[base]
        except KeyError:
            raise ValueError(f"unknown model {base!r}; known: {', '.join(MODEL_NAMES)}, "
                             "or package.module:factory") from None
    return with_options(spec, options) if mark else spec


@functools.lru_cache(maxsize=128)
def with_options(spec: ModelSpec, options: str) -> ModelSpec:
    """``spec`` built with keyword options ``key=value,...`` (numbers or true/false) given to its
    factory: each must be a parameter of the factory with a default of that type. The resulting
    name is canonical (options sorted, those equal to their default left out), so two spellings of
    one architecture are one model; a model's name travels everywhere a model is named (the
    welcome, chunk and graph ids), so every machine builds the same one. Cached: one name, one
    factory object (pools of built tails key on it)."""
    try:
        defaults = {n: p.default for n, p in inspect.signature(spec.factory).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}
    chosen: dict[str, object] = {}
    for item in filter(None, options.split(",")):
        key, eq, text = item.partition("=")
        key, text = key.strip(), text.strip()
        default = defaults.get(key)
        if not eq or key not in defaults or key == "width" or not isinstance(default, (int, float)):
            raise ValueError(f"model {spec.name!r}: unknown option {item!r}; its options: "
                             f"{', '.join(n for n, d in defaults.items() if isinstance(d, (int, float)) and n != 'width')}")
        chosen[key] = _option_value(spec.name, key, text, default)
    chosen = {k: v for k, v in sorted(chosen.items()) if v != defaults[k]}
    if not chosen:
        return spec
    name = spec.name + OPTIONS_MARK + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                                               for k, v in chosen.items())
    return ModelSpec(name, functools.partial(spec.factory, **chosen), spec.dataset, spec.description,
                     widths=spec.widths)


def option_dropped(name: str, key: str) -> str:
    """Model ``name`` with option ``key`` left out (its factory's default): e.g. the model a LoRA
    run exports, its adapters merged, is ``char_transformer@rank=8`` without ``rank``."""
    base, mark, options = name.partition(OPTIONS_MARK)
    kept = ",".join(o for o in options.split(",") if o and o.partition("=")[0].strip() != key)
    return model_spec(f"{base}{OPTIONS_MARK}{kept}" if kept else base).name


def _option_value(model: str, key: str, text: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if isinstance(default, int):
            return int(text)
        return float(text)
    except ValueError:
        raise ValueError(f"model {model!r}: option {key}={text!r} is not a {type(default).__name__}") from None


def _factory_spec(reference: str) -> ModelSpec:
    factory = load_reference(reference, "model")
    if not callable(factory):
        raise ValueError(f"model {reference!r} is not callable: a model factory returns a LayeredModel")
    try:
        widths = "width" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature (a builtin)
        widths = False
    doc = (inspect.getdoc(factory) or "").strip().splitlines()
    return ModelSpec(reference, factory, str(getattr(factory, "dataset", "") or ""), doc[0] if doc else reference,
                     widths=widths)


def build_model(name: str, seed: int | None = 0, width: float = 1.0) -> LayeredModel:
    """Build a zoo model (or ``package.module:factory``, :func:`model_spec`); with a seed, its
    initial weights are the same on every machine.

    ``width`` < 1 builds the model reduced to that width ratio (only for ``ModelSpec.widths``)."""
    spec = model_spec(name)
    width = float(width)
    if width != 1.0 and not spec.widths:
        raise ValueError(f"model {name!r} cannot be built at a reduced width; models that can: "
                         f"{', '.join(n for n, s in _SPECS.items() if s.widths)}")
    scaled(1, width)  # checks 0 < width <= 1
    make = (lambda: spec.factory(width=width)) if width != 1.0 else spec.factory
    if seed is None:
        return _named(spec, make(), width)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return _named(spec, make(), width)
    finally:
        torch.random.set_rng_state(state)


def _named(spec: ModelSpec, model: object, width: float) -> LayeredModel:
    """The model, named by what it was resolved from (chunk and graph ids, the welcome and a
    device's check of a training graph all name a model so; a zoo model's name is its entry's),
    with the width it was built at (training graph ids tell widths apart by it)."""
    if not isinstance(model, LayeredModel):
        raise ValueError(f"model {spec.name!r}: the factory returned {type(model).__name__}, not a LayeredModel "
                         "(docs/models.md)")
    model.name = spec.name
    model.width = width
    return model


def width_shapes(name: str, width: float) -> dict[str, tuple[int, ...]]:
    """The state shapes of model ``name`` built at ``width``: the leading slice of every entry of
    the full model that a device at that width holds (built on torch's ``meta`` device: no storage)."""
    return dict(_width_shapes(name, float(width)))


@functools.lru_cache(maxsize=128)
def _width_shapes(name: str, width: float) -> tuple[tuple[str, tuple[int, ...]], ...]:
    with torch.device("meta"):
        model = build_model(name, seed=None, width=width)
    return tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


def model_for_state(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The zoo model (at its default arguments) that takes a width and whose state has exactly these
    entry names and shapes, or None."""
    want = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
    for name, spec in _SPECS.items():
        if spec.widths and width_shapes(name, 1.0) == want:
            return name
    return None
