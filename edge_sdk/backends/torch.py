"""The torch backend: the tail as a torch module, any split and selection kind (a channel slice, row-cut
tables), trained by :func:`edge_sdk.trainer.train_tail` (EmbracingFL Algorithm 2 with in-place
momentum SGD). torch loads at the first :meth:`~TorchBackend.train`, never at import."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.backends.base import Tail, TailInputs, TrainingBackend
from edge_sdk.training import TrainConfig, TrainResult

__all__ = ["TorchBackend"]


class TorchBackend(TrainingBackend):
    """Trains the received tail in torch; its device also runs ONNX Runtime (the frozen chunks)."""

    name = "torch"
    kind = "torch"
    runtimes = ("onnxruntime", "torch")
    short = "torch"

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec("torch") is not None  # without importing it

    @classmethod
    def warm_up(cls, threads: int = 1) -> None:
        from edge_sdk.trainer import warm_up

        warm_up()

    async def prepare(self, inputs: TailInputs) -> Tail:
        # The selection's build options (a channel slice's width) before any download: a bad
        # instruction costs nothing.
        options = inputs.model_options()
        x = await inputs.forward()
        state = await inputs.state()
        rows = {n: v.indices for n, v in state.items() if isinstance(v, p.RowSparse)}
        return Tail(inputs.model, inputs.instruction.split, x, state, rows, built=options)

    def train(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> TrainResult:
        """Load the tail and train it; a pooled tail goes back at once, its deltas copied out of it."""
        from edge_sdk.trainer import train_tail

        x, model = self._loaded(tail)
        try:
            result = train_tail(model, tail.split, x, y, config, tail.state)
            if self.warm_tails is not None:  # the deltas are views of the tail's storage
                result = dataclasses.replace(result, deltas={n: np.array(v, copy=True) for n, v in result.deltas.items()})
            return result
        finally:
            self._give_back(model)

    def evaluate(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> dict[str, float]:
        from edge_sdk.trainer import evaluate_tail

        x, model = self._loaded(tail)
        try:
            return evaluate_tail(model, tail.split, x, y, config)
        finally:
            self._give_back(model)

    def _loaded(self, tail: Tail) -> tuple[np.ndarray, Any]:
        """A tail model loaded with the received state, and its input (local rows renumbered)."""
        from edge_sdk.trainer import build_tail, load_tail_state, local_rows  # torch loads here

        table_rows = {n: len(r) for n, r in tail.rows.items()}
        # A channel slice (width reduction) is built at the slice's width, never at full width, and
        # load_tail_state refuses a slice whose shapes are not that model's.
        pool = self.warm_tails
        model = (pool.take if pool is not None else build_tail)(tail.model, tail.split, table_rows, **tail.built)
        x = tail.x
        try:
            load_tail_state(model, tail.split, tail.state)  # every entry of the tail: nothing of a past round stays
            if tail.rows:
                x = local_rows(model, np.asarray(x), tail.rows)
        except BaseException:
            self._give_back(model)
            raise
        return x, model

    def _give_back(self, model: Any) -> None:
        if self.warm_tails is not None:
            self.warm_tails.give_back(model)
