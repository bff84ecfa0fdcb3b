"""Local training of a device's share of the model with torch (EmbracingFL Algorithm 2).

A device trains blocks [split, L) on the activations its multi-step forward pass cached
(Algorithm 1); a strong device has split 0 and trains the whole model on its raw data. The
frozen prefix is never materialised: the model is built on torch's ``meta`` device and only the
trained blocks get real storage, so a weak device never holds the full model.

Width reduction (static HeteroFL, FjORD's ordered dropout; EmbracingFL Section 4.1): a device
sent a channel slice builds the whole model at its width ratio (``build_tail(..., width=r)``), so
only the narrow model ever gets storage; it loads the slice, trains it as any tail, and its
deltas have the slice's shapes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
import numpy as np
import torch

from edge_sdk.models import LayeredModel, build_model
from edge_sdk.models.adapters import adapter_frozen
from edge_sdk.protocol import RowSparse
from edge_sdk.training import TrainConfig, TrainResult, sample_plan

__all__ = [
    "MomentumSGD", "TrainConfig", "TrainResult", "build_tail", "evaluate_tail", "load_tail_state", "local_rows",
    "mode_free", "tail_state", "train_tail", "warm_up",
]


class MomentumSGD:
    """SGD with momentum and weight decay, step for step what ``torch.optim.SGD`` computes.

    Written out because constructing any ``torch.optim`` optimizer imports sympy and
    torch._dynamo on torch 2.13: about 70 MiB of RSS, a fifth of a small board's budget, for an
    update rule of three lines (PyTorch's SGD documentation, dampening 0, no Nesterov).
    """

    def __init__(self, params: list[torch.nn.Parameter], *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0 (got {lr}, {momentum}, {weight_decay})")
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        # In place throughout: no temporary the size of a parameter (a device's budget counts
        # weight, gradient and momentum buffer, nothing more).
        lr, mu, wd = self.lr, self.momentum, self.weight_decay
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            if not mu:
                if wd:
                    p.mul_(1 - lr * wd)  # p - lr * wd * p
                p.add_(p.grad, alpha=-lr)  # ... - lr * g
                continue
            buf = self._buffers[i]
            if buf is None:
                buf = self._buffers[i] = p.grad.detach().clone()  # b_1 <- g_1 + wd * p
            else:
                buf.mul_(mu).add_(p.grad)  # b_t <- mu * b_(t-1) + g_t + wd * p
            if wd:
                buf.add_(p, alpha=wd)
            p.add_(buf, alpha=-lr)  # p <- p - lr * b_t


def warm_up() -> None:
    """One tiny training step the way :func:`train_tail` takes it, so that a process has loaded
    everything training loads (the runtime's memory is measured after this, profiles.runtime)."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64, 2),
    )
    optimiser = MomentumSGD(list(model.parameters()), lr=0.1, momentum=0.9, weight_decay=1e-4)
    torch.nn.functional.cross_entropy(model(torch.rand(2, 3, 8, 8)), torch.tensor([0, 1])).backward()
    optimiser.step()


def build_tail(model_name: str, split: int, table_rows: Mapping[str, int] | None = None,
               width: float = 1.0, adapters: float = 0.0) -> LayeredModel:
    """The zoo model with real storage only for blocks [split, L); the prefix stays on ``meta``.

    ``table_rows`` cuts embedding tables to a submodel (FedSubAvg): entry -> number of rows the
    device received. The full table is never allocated, only its rows. ``width`` < 1 builds the
    model reduced to that width ratio (a channel selection, width reduction): the full-width model
    is never allocated, only the slice. ``adapters`` (true: an ``adapters`` selection) trains the
    tail through its LoRA adapters: the weights under them are frozen (no gradient, no optimizer
    state, no delta; edge_sdk.models.adapters).
    """
    with torch.device("meta"):
        model = build_model(model_name, seed=None, width=width)
        for entry, rows in (table_rows or {}).items():
            _shrink_table(model, entry, rows)
    if not 0 <= split < len(model):
        raise ValueError(f"split {split} outside [0, {len(model)})")
    for name in model.block_names[split:]:
        _materialise(model.blocks[name])
    if adapters:
        frozen = set(adapter_frozen(model))
        if not frozen:
            raise ValueError(f"{model_name} has no adapters to train through (a model option rank > 0 adds them)")
        for name, param in model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
    return model


def _shrink_table(model: LayeredModel, entry: str, rows: int) -> None:
    """Replace the embedding that owns ``entry`` (``<module path>.weight``) by one of ``rows`` rows."""
    path, _, leaf = entry.rpartition(".")
    table = model.get_submodule(path)
    if leaf != "weight" or not isinstance(table, torch.nn.Embedding):
        raise ValueError(f"{entry!r} is not the weight of an embedding table")
    parent_path, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent_path), attr, torch.nn.Embedding(rows, table.embedding_dim))


def local_rows(model: LayeredModel, x: np.ndarray, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """``x`` with each table's input column renumbered to positions in the rows received.

    ``model.sparse_inputs`` maps a table entry to the input column that indexes it. Every index the
    data holds must be among the rows (the device declared them in its hello).
    """
    columns = getattr(model, "sparse_inputs", {})
    out = np.array(x, copy=True)
    for entry, idx in rows.items():
        if entry not in columns:
            raise ValueError(f"{entry!r} is not a sparse table of {model.name}")
        col = columns[entry]
        pos = np.searchsorted(idx, x[:, col])
        pos_clipped = np.minimum(pos, max(len(idx) - 1, 0))
        if len(idx) == 0 or not np.array_equal(idx[pos_clipped], x[:, col]):
            raise ValueError(f"the local data indexes rows of {entry!r} that were not received")
        out[:, col] = pos
    return out


def _materialise(module: torch.nn.Module) -> None:
    """Give a meta module real, uninitialised CPU storage (its values come from the server).

    ``Module.to_empty`` does the same but imports sympy on torch 2.13 (about 35 MiB).
    """
    for mod in module.modules():
        for key, param in list(mod._parameters.items()):
            if param is not None:
                # setattr, not the dict: RNN modules keep their flat weight list in step this way.
                setattr(mod, key, torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype), param.requires_grad))
        for key, buf in list(mod._buffers.items()):
            if buf is not None:
                mod._buffers[key] = torch.empty(buf.shape, dtype=buf.dtype)


def load_tail_state(model: LayeredModel, split: int, state: Mapping[str, np.ndarray | RowSparse]) -> None:
    """Copy the server's tensors for blocks [split, L) into the tail; every entry must be present.
    A row-sparse entry fills a table built with :func:`build_tail`'s ``table_rows``."""
    expected = set(model.state_names(split))
    missing = expected - set(state)
    extra = set(state) - expected
    if missing or extra:
        raise ValueError(f"tail state mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    own = model.state_dict()
    with torch.no_grad(), warnings.catch_warnings():
        # The received arrays are read-only views of the receive buffer, and they are only read here.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name in expected:
            target = own[name]
            value = state[name]
            source = torch.from_numpy(np.asarray(value.values if isinstance(value, RowSparse) else value))
            if tuple(source.shape) != tuple(target.shape):
                raise ValueError(f"{name}: shape {tuple(source.shape)} != {tuple(target.shape)}")
            target.copy_(source.to(target.dtype))


#: Modules whose output depends on ``Module.training``: batch statistics and dropout.
_MODE_DEPENDENT = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd)


def mode_free(model: LayeredModel, split: int) -> bool:
    """Whether blocks [split, L) compute the same function in training and evaluation mode: every
    module is one of torch.nn's or says so (a class attribute ``mode_free = True``), and none keeps
    batch statistics or drops out (a ``dropout`` rate above 0, as recurrent and attention layers
    take). Any other module may read ``self.training`` and is not assumed to be."""
    for i in range(split, len(model)):
        for module in model.block(i).modules():
            known = type(module).__module__.startswith("torch.nn.") or getattr(type(module), "mode_free", False) is True
            if not known or isinstance(module, _MODE_DEPENDENT):
                return False
            rate = getattr(module, "dropout", 0.0)
            if isinstance(rate, (int, float)) and rate > 0:
                return False
    return True


def _mean_loss(model: LayeredModel, split: int, x: np.ndarray, y: np.ndarray, idx: np.ndarray, batch: int) -> float:
    """Mean loss over the samples ``idx``, one batch at a time (never a copy of all of them)."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(idx), batch):
            rows = idx[i : i + batch]
            xb = torch.from_numpy(np.ascontiguousarray(x[rows]))
            yb = torch.from_numpy(np.ascontiguousarray(y[rows]))
            total += float(model.loss(model(xb, start=split), yb)) * len(rows)
    return total / max(len(idx), 1)


def evaluate_tail(model: LayeredModel, split: int, x: np.ndarray, y: np.ndarray, config: TrainConfig) -> dict[str, float]:
    """Loss (and accuracy, for classification) of blocks [split, L) on up to ``eval_samples`` local samples."""
    torch.set_num_threads(max(1, config.threads))
    idx = np.sort(np.random.default_rng(config.seed).permutation(len(x))[: config.eval_samples])
    out = {"loss": _mean_loss(model, split, x, y, idx, config.batch_size)}
    if model.task == "classification":
        correct = 0
        with torch.no_grad():
            for i in range(0, len(idx), config.batch_size):
                rows = idx[i : i + config.batch_size]
                logits = model(torch.from_numpy(np.ascontiguousarray(x[rows])), start=split)
                correct += int((logits.argmax(1).numpy() == np.asarray(y[rows])).sum())
        out["accuracy"] = correct / max(len(idx), 1)
    return out


def train_tail(
    model: LayeredModel, split: int, x: np.ndarray, y: np.ndarray, config: TrainConfig,
    initial: Mapping[str, np.ndarray | RowSparse] | None = None,
) -> TrainResult:
    """Run tau local SGD steps on blocks [split, L) and return deltas (new - received).

    The model's weights are replaced by the deltas (see the end): use it for nothing afterwards.

    ``x`` is the input of block ``split``: raw data for a strong device, cached activations for
    the others. Each step samples a mini-batch from the local (cached) data, as in Algorithm 2,
    line "xi_i <- a random data sampled from D-bar^i". ``initial`` is the state the tail was
    loaded from; given it, deltas are taken against it and no copy of the tail is made.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need matching, non-empty inputs and labels (got {len(x)} and {len(y)})")
    torch.set_num_threads(max(1, config.threads))
    eval_idx, batches = sample_plan(len(x), config)
    names = model.state_names(split)
    if initial is None:
        initial = {n: t.detach().numpy().copy() for n, t in model.state_dict().items() if n in set(names)}
    initial = {n: v.values if isinstance(v, RowSparse) else v for n, v in initial.items()}
    params = [p for i in range(split, len(model)) for p in model.block(i).parameters()]
    anchors: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    if config.prox_mu > 0:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            anchors = [(p, torch.from_numpy(np.asarray(initial[n]))) for n, p in model.named_parameters()
                       if p.requires_grad and n in initial]

    # The loss before training is the first step's own when that step sees the evaluation samples
    # (sample_plan) and the tail computes the same function in training and evaluation mode: one
    # forward pass less per round. Otherwise it is evaluated at the training batch size (a larger
    # one would need more memory than the plan gives).
    first_step_scores = bool(batches) and eval_idx is batches[0] and mode_free(model, split)
    loss_before = math.nan if first_step_scores else _mean_loss(model, split, x, y, eval_idx, config.batch_size)

    optimiser = MomentumSGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    model.train()
    step_losses = 0.0
    for step, idx in enumerate(batches):
        xb = torch.from_numpy(np.ascontiguousarray(x[idx]))
        yb = torch.from_numpy(np.ascontiguousarray(y[idx]))
        optimiser.zero_grad()
        loss = model.loss(model(xb, start=split), yb)
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"local loss became {value}; lower the learning rate")
        if step == 0 and first_step_scores:
            loss_before = value
        step_losses += value
        loss.backward()
        for p, w0 in anchors:  # gradient of (mu / 2) ||w - w_t||^2 is mu (w - w_t)
            if p.grad is not None:
                p.grad.add_(p.detach() - w0, alpha=config.prox_mu)
        optimiser.step()
    del optimiser

    loss_after = _mean_loss(model, split, x, y, eval_idx, config.batch_size) if config.loss_after else math.nan
    for param in params:
        param.grad = None
    # The deltas overwrite the trained weights in place: no extra copy of the tail is ever held,
    # and the model is spent afterwards (the device has nothing more to do with it this round).
    after = model.state_dict()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}  # under adapters: unchanged
    deltas = {}
    for n in names:
        if after[n].is_floating_point() and n not in frozen:
            arr = after[n].numpy()
            np.subtract(arr, initial[n], out=arr)
            deltas[n] = arr
    return TrainResult(deltas, len(x), loss_before, loss_after, config.local_steps,
                       step_losses / len(batches) if batches else math.nan)


def tail_state(model: LayeredModel, split: int) -> dict[str, np.ndarray]:
    """The entries of blocks [split, L) as numpy arrays (what the server sends a device)."""
    keep = set(model.state_names(split))
    return {n: t.detach().cpu().numpy() for n, t in model.state_dict().items() if n in keep}
