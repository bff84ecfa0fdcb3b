"""Training backends: the one table of how a Python device can train, read by every front end.

:data:`BACKENDS` maps a backend's name to its class (:class:`~edge_sdk.backends.base.TrainingBackend`).
The device's ``--backend`` (and the ``backend`` key of its config file, of a fleet group, of an
emulator's launch record, ``edgetrain bundle --backend``, ``edgetrain demo --weak-backend``) takes one
of these names, ``auto`` (the first whose :meth:`~TrainingBackend.available` is true: torch where it
is installed, else ONNX Runtime), or ``package.module:Class`` for a backend of your own. The planner
reads the runtimes a backend declares (``profiles.runtime.backend_runtime``), so a backend whose
runtimes the server's registry does not know is refused at hello.

Adding a backend is one module (a ``TrainingBackend`` subclass: its ``name``, ``kind``, ``runtimes``,
``prepare``, ``train`` and ``evaluate``) plus one entry here; or, without editing the SDK, the
module alone, named by reference.

Importing this package imports neither torch nor onnx.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from edge_sdk import protocol as p
from edge_sdk.backends.base import KINDS, Tail, TailInputs, TrainingBackend, measure_probe
from edge_sdk.backends.graph import GraphBackend
from edge_sdk.backends.torch import TorchBackend
from edge_sdk.references import is_reference, load_reference

__all__ = ["AUTO", "BACKENDS", "KINDS", "GraphBackend", "Tail", "TailInputs", "TorchBackend", "TrainingBackend",
           "backend_class", "backend_names", "choose_backend", "measure_probe"]

#: The backends by name, in the order ``auto`` tries them (torch's steps are faster; ONNX Runtime
#: needs far less memory and no torch install).
BACKENDS: Mapping[str, type[TrainingBackend]] = MappingProxyType({b.name: b for b in (
    TorchBackend,
    GraphBackend,
)})

#: The backend setting that picks the first available one of :data:`BACKENDS`.
AUTO = "auto"


def backend_names() -> tuple[str, ...]:
    """What ``--backend`` accepts by name (a reference ``package.module:Class`` besides)."""
    return (AUTO, *BACKENDS)


def backend_class(backend: str | type[TrainingBackend]) -> type[TrainingBackend]:
    """The class a backend setting names: ``auto``, a name of :data:`BACKENDS`, a reference
    ``package.module:Class``, or the class itself. ValueError saying what is accepted otherwise."""
    if isinstance(backend, type) and issubclass(backend, TrainingBackend):
        return backend
    if not isinstance(backend, str):
        raise ValueError(f"a backend is a name or package.module:Class, not {backend!r}")
    if backend == AUTO:
        return next((b for b in BACKENDS.values() if b.available()), GraphBackend)
    if backend in BACKENDS:
        return BACKENDS[backend]
    if not is_reference(backend):
        raise ValueError(f"must be one of {', '.join(backend_names())}, or package.module:Class for a "
                         f"backend of your own, got {backend!r}")
    found = load_reference(backend, "backend")
    if not (isinstance(found, type) and issubclass(found, TrainingBackend)):
        raise ValueError(f"backend {backend!r} is {found!r}, not a subclass of "
                         "edge_sdk.backends.TrainingBackend")
    if not found.name or not found.runtimes:
        raise ValueError(f"backend {backend!r} declares no name or no runtimes")
    return found


def choose_backend(configured: type[TrainingBackend], ins: p.Instruction, *,
                   trains_graph: bool) -> type[TrainingBackend]:
    """The backend that carries out ``ins``, chosen once per instruction: the device's own, unless
    the plan says otherwise. The server names a training graph for a device it planned on a graph
    runtime: a device whose own backend trains from state (torch) trains that graph with the
    table's first graph backend. ``trains_graph`` False (the selection kind, e.g. a channel slice,
    has no graph) needs a torch backend; a device without one refuses, as it does an instruction
    that names no graph when its backend trains from graphs."""
    graph = bool(ins.config.get(p.TRAIN_GRAPH_KEY))
    if not trains_graph and (graph or configured.kind == "graph"):
        # The server never sends such a cut to a device without torch (it skips the device instead).
        raise p.ProtocolError("unexpected", f"a {ins.selection} selection trains with torch, "
                                            "which this device does not use")
    if graph and configured.kind != "graph":
        return next(b for b in BACKENDS.values() if b.kind == "graph")
    if not graph and configured.kind == "graph":
        raise p.ProtocolError("unexpected", f"the instruction names no training graph, which backend "
                                            f"{configured.name} trains from")
    return configured
