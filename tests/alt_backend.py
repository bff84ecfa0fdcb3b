"""A training backend of the test suite's own: all a new backend is, one module.

``AltBackend`` trains from the server's training graphs by handing every step to the ONNX Runtime
graph backend, under its own name, so a run shows which backend a device used without changing a
number. A device names it by reference (``--backend tests.alt_backend:AltBackend``, a fleet group's
``backend = "..."``, ``DeviceSettings(backend=...)``); one entry in ``edge_sdk.backends.BACKENDS``
would name it ``alt``. No other file changes for it: the hello declares its runtimes, and the
server plans, ships and checks its rounds as for any graph runtime.
"""

from __future__ import annotations

from edge_sdk.backends import GraphBackend, Tail, TailInputs, TrainingBackend

__all__ = ["AltBackend"]


class AltBackend(TrainingBackend):
    """The graph backend's training under the name ``alt``."""

    name = "alt"
    kind = "graph"
    runtimes = ("onnxruntime",)

    def __init__(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.graph = GraphBackend(**kwargs)

    async def prepare(self, inputs: TailInputs) -> Tail:
        return await self.graph.prepare(inputs)

    def train(self, tail, y, config):  # type: ignore[no-untyped-def]
        return self.graph.train(tail, y, config)

    def evaluate(self, tail, y, config):  # type: ignore[no-untyped-def]
        return self.graph.evaluate(tail, y, config)
