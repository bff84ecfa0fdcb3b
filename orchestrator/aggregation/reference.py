"""The server's own reference update: what a device's update is measured against, round by round.

Every round the server trains the global model from the round's state on its held-out data with the
round's learning rate, local steps and batch size (Cao et al., 2021, "FLTrust", Section 4.2: client
updates are normalised to the magnitude of an update the server computes on a small root dataset it
holds). The norm bound (:mod:`orchestrator.aggregation.normbound`) takes each block's norm of it; it exists
before any history, so round 1, and blocks only one device trains, are bounded too. One owner, so
that a direction check per block (FLTrust's cosine trust score) reads the same update.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager

import numpy as np
import torch

from edge_sdk.models import LayeredModel
from edge_sdk.trainer import train_tail
from edge_sdk.training import TrainConfig
from orchestrator.config import ServerConfig
from orchestrator.server.evaluate import Evaluator
from orchestrator.server.payloads import model_at

__all__ = ["ReferenceUpdate"]


class ReferenceUpdate:
    """The server's update of the whole model from a round's state, on its held-out data."""

    def __init__(self, config: ServerConfig, template: LayeredModel, evaluator: Evaluator,
                 heap: AbstractContextManager) -> None:
        self.config, self.template, self.evaluator, self.heap = config, template, evaluator, heap

    def __call__(self, state: Mapping[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        """The deltas of the whole model trained from ``state`` with round ``round``'s settings
        (blocking: run it in a worker thread)."""
        c = self.config
        config = TrainConfig(local_steps=c.local_steps, batch_size=c.batch_size, lr=c.lr_at(round),
                             momentum=c.momentum, weight_decay=c.weight_decay, seed=c.seed + round, eval_samples=64,
                             threads=torch.get_num_threads())
        x, y = self.evaluator.x, self.evaluator.y
        with self.heap:
            return train_tail(model_at(self.template, state), 0, x, y, config).deltas
