"""The training-backend interface: how a device turns an instruction into a trained (or scored) tail.

A backend is what a device trains its share of the model with. Each names the runtimes it declares
in the hello (``Hello.runtimes``, planned by the server from ``profiles.runtime.RUNTIMES``) and its
*kind*, which says what the server sends it to train from:

- ``torch``: the tail's received state, loaded into a torch module (any split, any selection kind);
- ``graph``: also an ONNX training graph the server exported and verified for that split
  (``Instruction.config["train_graph_id"]``), run in a runtime without torch.

Per instruction the round work (:mod:`edge_sdk.roundwork`) picks the backend once
(:func:`edge_sdk.backends.choose_backend`), asks it to :meth:`~TrainingBackend.prepare` a
:class:`Tail` from what the instruction names (the frozen chunks run forward, the payloads it
needs), then to :meth:`~TrainingBackend.train` or :meth:`~TrainingBackend.evaluate` it in a worker
thread. Both built-in backends draw the same mini-batches (``edge_sdk.training.sample_plan``) and
apply the same update (EmbracingFL Algorithm 2's local SGD, appendix 6.1), so they return the same
deltas up to float32 rounding.

Importing this module imports neither torch nor onnx.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from edge_sdk import protocol as p

if TYPE_CHECKING:
    from edge_sdk.training import TrainConfig, TrainResult

__all__ = ["KINDS", "Tail", "TailInputs", "TrainingBackend"]

#: What a backend trains from (``TrainingBackend.kind``; ``profiles.runtime.Runtime.backend`` of the
#: runtimes it declares): the tail's state as a torch module, or the server's training graph.
KINDS: tuple[str, ...] = ("torch", "graph")


class TailInputs(Protocol):
    """What a backend may use to prepare one instruction's tail (the round work provides it). Each
    step is done at most once per round however many phases ask: the frozen chunks run forward
    once, a payload is downloaded once."""

    @property
    def instruction(self) -> p.Instruction: ...

    @property
    def model(self) -> str: ...  # the model the server trains (Welcome.model)

    @property
    def limits(self) -> p.Limits: ...

    def model_options(self) -> dict[str, float]:
        """The instruction's selection kind's build options (a channel slice's width); a bad
        instruction raises ``ProtocolError`` here, before any download."""
        ...

    async def forward(self) -> np.ndarray:
        """The input of block ``instruction.split`` for every local sample (EmbracingFL Algorithm 1):
        the raw data, or the output of the frozen chunks run one at a time."""
        ...

    async def fetch(self, payload_id: str) -> memoryview:
        """One payload's bytes, verified (resumed after a dropped connection, or from a bundle)."""
        ...

    async def state(self) -> dict[str, np.ndarray | p.RowSparse]:
        """The instruction's model payload, decoded: the received state of blocks [split, L)."""
        ...


@dataclass
class Tail:
    """A tail ready to train: its input, the received state, and what the backend built for it."""

    model: str
    split: int
    x: np.ndarray  # the tail's input, one row per local sample
    state: dict[str, np.ndarray | p.RowSparse]
    #: Row-cut tables (FedSubAvg): entry -> the received rows; their deltas go back as ``RowSparse``.
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    built: Any = None  # the backend's own: the build options (torch), the ONNX Runtime session (graph)


class TrainingBackend(ABC):
    """One way a device trains: a subclass, registered by name in :data:`edge_sdk.backends.BACKENDS`
    or named by reference (``--backend package.module:Class``).

    ``threads``: compute threads (``--threads``); ``warm_tails``: built tails kept between rounds
    by the devices of one process (:class:`edge_sdk.warm_tails.WarmTails`), for a backend that
    builds models. A backend holds nothing of a round between calls: what a round keeps (the
    activations, the trained update) is the round work's.
    """

    #: How ``--backend``, the report's ``backend`` metric and the run summaries name it.
    name: ClassVar[str] = ""
    #: What it trains from, one of :data:`KINDS`.
    kind: ClassVar[str] = "torch"
    #: ``Hello.runtimes``: the runtimes this device has, each a name in ``profiles.runtime.RUNTIMES``;
    #: the server plans the device on the first of the registry's order it names.
    runtimes: ClassVar[tuple[str, ...]] = ()
    #: A short name for narrow tables (``edgetrain demo``'s summary).
    short: ClassVar[str] = ""

    def __init__(self, *, threads: int = 1, warm_tails: Any = None) -> None:
        self.threads = threads
        self.warm_tails = warm_tails

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind not in KINDS:
            raise TypeError(f"training backend {cls.__name__}: kind must be one of {', '.join(KINDS)}, not {cls.kind!r}")

    @classmethod
    def available(cls) -> bool:
        """Whether this machine can run it (``--backend auto`` takes the first that can)."""
        return True

    @classmethod
    def warm_up(cls, threads: int = 1) -> None:
        """Load what the backend loads lazily (a runtime's first step), before a device connects."""

    @abstractmethod
    async def prepare(self, inputs: TailInputs) -> Tail:
        """Download and build what training or evaluating the instruction's tail needs."""

    @abstractmethod
    def train(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> TrainResult:
        """tau local steps on ``tail`` from its received state; deltas (new - received). Runs in a
        worker thread; returns arrays the backend no longer writes to."""

    @abstractmethod
    def evaluate(self, tail: Tail, y: np.ndarray, config: TrainConfig) -> dict[str, float]:
        """The received model's loss (and accuracy) on the local data, without training."""
