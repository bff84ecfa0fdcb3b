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

import math
import time
import weakref

import numpy as np

from edge_sdk import protocol as p

if TYPE_CHECKING:
    from edge_sdk.training import TrainConfig, TrainResult

__all__ = ["KINDS", "Tail", "TailInputs", "TrainingBackend", "measure_probe", "probe_sgd_step"]

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

    @classmethod
    def probe_step(cls) -> None:
        """One local training step of the probe (:func:`probe_sgd_step`), as this backend's training
        thread runs a step; :func:`measure_probe` times it for the hello's ``probe_step_s``. A backend
        whose steps cost more than numpy's (or an emulated slow device) overrides it."""
        probe_sgd_step()


#: The probe: one SGD step of a dense layer (64 inputs, 10 classes) with softmax cross-entropy on a
#: batch of 32 fixed rows. The JavaScript SDK's probe is the same step (edge_sdk_js/src/backends/probe.ts).
PROBE_SHAPE = (32, 64, 10)
_PROBE: dict[str, np.ndarray] = {}
#: backend class -> its probe step (seconds), measured once per process.
_MEASURED: weakref.WeakKeyDictionary[type[TrainingBackend], float] = weakref.WeakKeyDictionary()


def probe_sgd_step(lr: float = 0.1) -> None:
    """One local SGD step on the probe batch (EmbracingFL Algorithm 2's local step, on a one-layer
    model): forward, softmax cross-entropy's gradient, the update of the weights. The products are
    numpy's own loops (``einsum``), not BLAS: a first BLAS call starts OpenBLAS's threads and their
    buffers, address space a device that trains in ONNX Runtime never reserves otherwise (under an
    RLIMIT_AS cap it cost a weak device its ONNX Runtime session)."""
    if not _PROBE:
        batch, inputs, classes = PROBE_SHAPE
        rng = np.random.default_rng(0)
        _PROBE["x"] = rng.standard_normal((batch, inputs)).astype(np.float32)
        _PROBE["y"] = np.arange(batch) % classes
        _PROBE["w"] = np.zeros((inputs, classes), np.float32)
    x, y, w = _PROBE["x"], _PROBE["y"], _PROBE["w"]
    logits = np.einsum("bi,ic->bc", x, w)
    p_ = np.exp(logits - logits.max(axis=1, keepdims=True))
    p_ /= p_.sum(axis=1, keepdims=True)
    p_[np.arange(len(y)), y] -= 1.0
    w -= (lr / len(y)) * np.einsum("bi,bc->ic", x, p_)


def measure_probe(backend: type[TrainingBackend]) -> float:
    """The seconds one probe step takes with ``backend`` (the hello's ``probe_step_s``), after one
    untimed step of the probe itself (numpy's first call allocates); held within
    ``(0, PROBE_STEP_MAX_S]`` so the hello carries a valid claim. Measured once per backend class and
    process (the devices of one emulator worker share it): a reconnecting device repeats its figure."""
    cached = _MEASURED.get(backend)
    if cached is not None:
        return cached
    probe_sgd_step()
    start = time.perf_counter()
    backend.probe_step()
    elapsed = time.perf_counter() - start
    seconds = min(p.PROBE_STEP_MAX_S, max(elapsed, 1e-6)) if math.isfinite(elapsed) else p.PROBE_STEP_MAX_S
    _MEASURED[backend] = seconds
    return seconds
