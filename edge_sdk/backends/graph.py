"""The ONNX Runtime graph backend: the tail's training step as the ONNX graph the server exported and
verified for this split (``exporters.train_export``), run by :func:`edge_sdk.ort_trainer.train_tail_ort`;
the process never imports torch (about 55 MiB of runtime where torch takes 267, profiles.runtime)."""

from __future__ import annotations

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.backends.base import Tail, TailInputs, TrainingBackend
from edge_sdk.training import TrainConfig, TrainResult

__all__ = ["GraphBackend"]


class GraphBackend(TrainingBackend):
    """Trains from the instruction's training graph (``config["train_graph_id"]``) in ONNX Runtime."""

    name = "onnxruntime"
    kind = "graph"
    runtimes = ("onnxruntime",)
    short = "ort"

    async def prepare(self, inputs: TailInputs) -> Tail:
        from edge_sdk.ort_trainer import OrtTail, TrainGraph

        ins = inputs.instruction
        x = await inputs.forward()
        graph = TrainGraph.from_bytes(await inputs.fetch(str(ins.config[p.TRAIN_GRAPH_KEY])))
        if graph.model != inputs.model or graph.split != ins.split:
            raise p.ProtocolError("malformed", f"training graph of {graph.model} split {graph.split}, instruction "
                                               f"for {inputs.model} split {ins.split}")
        state = await inputs.state()
        return Tail(inputs.model, ins.split, x, state, built=OrtTail(graph, threads=self.threads))

    def train(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> TrainResult:
        from edge_sdk.ort_trainer import train_tail_ort

        return train_tail_ort(tail.built, tail.state, tail.x, y, config)

    def evaluate(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> dict[str, float]:
        from edge_sdk.ort_trainer import evaluate_tail_ort

        return evaluate_tail_ort(tail.built, tail.state, tail.x, y, config)
