"""Local training of a device's share of the model with torch (EmbracingFL Algorithm 2).

A device trains blocks [split, L) on the activations its multi-step forward pass cached
(Algorithm 1); a strong device has split 0 and trains the whole model on its raw data. The
frozen prefix is never materialised: the model is built on torch's ``meta`` device and only the
trained blocks get real storage, so a weak device never holds the full model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from edge_sdk.models import LayeredModel, build_model


@dataclass(frozen=True)
class TrainConfig:
    """Local optimiser settings; defaults follow EmbracingFL appendix 6.1 (SGD, momentum 0.9, wd 1e-4, batch 32, tau 10)."""

    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    eval_samples: int = 512
    threads: int = 1


@dataclass(frozen=True)
class TrainResult:
    deltas: dict[str, np.ndarray]
    num_samples: int
    loss_before: float
    loss_after: float
    steps: int


def build_tail(model_name: str, split: int) -> LayeredModel:
    """The zoo model with real storage only for blocks [split, L); the prefix stays on ``meta``."""
    with torch.device("meta"):
        model = build_model(model_name, seed=None)
    if not 0 <= split < len(model):
        raise ValueError(f"split {split} outside [0, {len(model)})")
    for name in model.block_names[split:]:
        model.blocks[name] = model.blocks[name].to_empty(device="cpu")
    return model


def load_tail_state(model: LayeredModel, split: int, state: Mapping[str, np.ndarray]) -> None:
    """Copy the server's tensors for blocks [split, L) into the tail; every entry must be present."""
    expected = set(model.state_names(split))
    missing = expected - set(state)
    extra = set(state) - expected
    if missing or extra:
        raise ValueError(f"tail state mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    own = model.state_dict()
    with torch.no_grad():
        for name in expected:
            target = own[name]
            source = torch.from_numpy(np.asarray(state[name]))
            if tuple(source.shape) != tuple(target.shape):
                raise ValueError(f"{name}: shape {tuple(source.shape)} != {tuple(target.shape)}")
            target.copy_(source.to(target.dtype))


def _mean_loss(model: LayeredModel, split: int, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb = torch.from_numpy(np.ascontiguousarray(x[i : i + batch]))
            yb = torch.from_numpy(np.ascontiguousarray(y[i : i + batch]))
            total += float(model.loss(model(xb, start=split), yb)) * len(xb)
            count += len(xb)
    return total / max(count, 1)


def train_tail(
    model: LayeredModel, split: int, x: np.ndarray, y: np.ndarray, config: TrainConfig,
    initial: Mapping[str, np.ndarray] | None = None,
) -> TrainResult:
    """Run tau local SGD steps on blocks [split, L) and return deltas (new - received).

    ``x`` is the input of block ``split``: raw data for a strong device, cached activations for
    the others. Each step samples a mini-batch from the local (cached) data, as in Algorithm 2,
    line "xi_i <- a random data sampled from D-bar^i". ``initial`` is the state the tail was
    loaded from; given it, deltas are taken against it and no copy of the tail is made.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need matching, non-empty inputs and labels (got {len(x)} and {len(y)})")
    torch.set_num_threads(max(1, config.threads))
    rng = np.random.default_rng(config.seed)
    names = model.state_names(split)
    if initial is None:
        initial = {n: t.detach().numpy().copy() for n, t in model.state_dict().items() if n in set(names)}
    params = [p for i in range(split, len(model)) for p in model.block(i).parameters()]

    eval_idx = rng.permutation(len(x))[: config.eval_samples]
    eval_idx.sort()
    x_eval, y_eval = x[eval_idx], y[eval_idx]
    loss_before = _mean_loss(model, split, x_eval, y_eval, 256)

    optimiser = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    model.train()
    batch = min(config.batch_size, len(x))
    for _ in range(config.local_steps):
        idx = np.sort(rng.choice(len(x), size=batch, replace=False))
        xb = torch.from_numpy(np.ascontiguousarray(x[idx]))
        yb = torch.from_numpy(np.ascontiguousarray(y[idx]))
        optimiser.zero_grad(set_to_none=True)
        loss = model.loss(model(xb, start=split), yb)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"local loss became {loss.item()}; lower the learning rate")
        loss.backward()
        optimiser.step()
    del optimiser

    loss_after = _mean_loss(model, split, x_eval, y_eval, 256)
    after = model.state_dict()
    deltas = {
        n: np.subtract(after[n].numpy(), initial[n], dtype=np.float32)
        for n in names
        if after[n].is_floating_point()
    }
    return TrainResult(deltas, len(x), loss_before, loss_after, config.local_steps)


def tail_state(model: LayeredModel, split: int) -> dict[str, np.ndarray]:
    """The entries of blocks [split, L) as numpy arrays (what the server sends a device)."""
    keep = set(model.state_names(split))
    return {n: t.detach().cpu().numpy() for n, t in model.state_dict().items() if n in keep}
