"""Local training settings and results, shared by both trainer backends and importable without torch.

``edge_sdk.trainer`` trains a tail with torch; ``edge_sdk.ort_trainer`` trains it from an ONNX
training graph in ONNX Runtime. Both take a :class:`TrainConfig`, draw the same mini-batches from
the same seed (:func:`sample_plan`) and return a :class:`TrainResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["TrainConfig", "TrainResult", "sample_plan"]


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
    #: FedProx's proximal term (Li et al., 2020, eq. 2): the local objective adds (mu / 2) ||w - w_t||^2
    #: around the received weights w_t. 0 is plain local SGD.
    prox_mu: float = 0.0
    #: Score the loss after training (one forward pass over the loss samples). A server that does not
    #: need it says so (``Instruction.config["loss_after"]`` false): the report then carries the loss
    #: before training and the mean loss of the local steps, as a training loop's own log has them.
    loss_after: bool = True


@dataclass(frozen=True)
class TrainResult:
    deltas: dict[str, np.ndarray]
    num_samples: int
    loss_before: float
    loss_after: float  # nan when TrainConfig.loss_after is off
    steps: int
    loss_steps: float = math.nan  # the mean of the local steps' mini-batch losses (each before its update)


def sample_plan(n: int, config: TrainConfig) -> tuple[np.ndarray, list[np.ndarray]]:
    """The evaluation samples and each step's mini-batch for ``n`` local samples.

    One generator seeded with ``config.seed`` draws both, in this order, so the two backends
    train on exactly the same batches (Algorithm 2: a random mini-batch per local step). When the
    evaluation samples are as many as a batch, they are the first step's batch.
    """
    rng = np.random.default_rng(config.seed)
    eval_idx = rng.permutation(n)[: config.eval_samples]
    eval_idx.sort()
    batch = min(config.batch_size, n)
    steps = [np.sort(rng.choice(n, size=batch, replace=False)) for _ in range(config.local_steps)]
    if steps and len(eval_idx) == batch:
        # Loss samples of one batch (a train report's default) are the first step's mini-batch: the
        # loss before training is then that step's own loss, which a trainer need not compute twice
        # (edge_sdk.trainer.train_tail). The permutation is still drawn, so the steps do not move.
        eval_idx = steps[0]
    return eval_idx, steps
