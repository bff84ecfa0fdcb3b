"""What a device does for an instruction, looked up by name: phases and selection kinds.

A server's instruction names a ``phase`` (what to do: ``train``, ``evaluate``, ``compare``, or any
phase an algorithm adds) and a ``selection`` (how the state it sends is cut: ``tail``, ``rows``,
``channels``). The device client knows neither by name: it looks both up in a
:class:`DeviceRegistry` and runs what it finds, so an algorithm's device-side part is one module
that adds its entries (its server-side part is its strategy, ``orchestrator/strategies``):

- a **phase handler** (:data:`PhaseHandler`) is an ``async`` function of a :class:`PhaseContext`
  that returns a :class:`PhaseResult` (the report's metrics, and tensors if the phase has any);
- a **report hook** (:data:`ReportHook`) runs after a phase's handler and may add metrics to its
  report (FedALIGN's incentive check on ``evaluate``, :mod:`edge_sdk.algorithms.fedalign`);
- a **selection kind** (:class:`SelectionKind`) says how a device builds the model for state cut
  that way (width reduction's ``channels``, :mod:`edge_sdk.algorithms.width`).

Registries are immutable values: :meth:`DeviceRegistry.extended` returns a new one, and a device
is given its registry (``DeviceSettings.registry``; default :data:`edge_sdk.algorithms.DEFAULT_REGISTRY`),
so two devices in one process may run different algorithms and no test changes another's.

    async def label_counts(ctx: PhaseContext) -> PhaseResult:
        return PhaseResult({"classes": int(len(set(ctx.y.tolist())))})

    registry = DEFAULT_REGISTRY.extended(phases={"label_counts": label_counts})
    DeviceClient(DeviceSettings(..., registry=registry), x, y)

Importing this module imports neither torch nor onnx.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, Union

import numpy as np

from edge_sdk import protocol as p

__all__ = [
    "BUILTIN_REGISTRY", "DeviceRegistry", "PhaseContext", "PhaseHandler", "PhaseResult", "ReportHook",
    "SelectionKind", "Tensors", "TrainedUpdate", "compare", "evaluate", "train", "update_distance",
]

Tensors = dict[str, Union[np.ndarray, p.RowSparse]]


@dataclass(frozen=True)
class TrainedUpdate:
    """A device's trained update of this round for one model payload (trained once per round)."""

    deltas: Tensors
    num_samples: int
    trained: tuple[int, int]  # the block range [split, L) the deltas cover
    metrics: dict[str, p.Scalar]  # loss_before, loss_after, steps, backend


@dataclass
class PhaseResult:
    """What a phase reports: ``metrics``, and ``tensors`` for a phase that sends some (an ``update``
    transfer follows the report). ``num_samples`` None means all the device's local samples;
    ``trained`` is the block range the tensors cover ((0, 0) without tensors)."""

    metrics: dict[str, p.Scalar]
    tensors: Tensors | None = None
    num_samples: int | None = None
    trained: tuple[int, int] = (0, 0)


class PhaseContext(Protocol):
    """What a phase handler or report hook may use (the device client implements it).

    The device's own steps are done at most once per round however many phases ask for them:
    the frozen chunks run forward once, the update is trained once."""

    @property
    def instruction(self) -> p.Instruction: ...

    @property
    def device_id(self) -> str: ...

    @property
    def x(self) -> np.ndarray: ...  # the local inputs

    @property
    def y(self) -> np.ndarray: ...  # the local labels

    @property
    def notes(self) -> dict[str, p.Scalar]: ...  # values phases of this round share (cleared each round)

    async def trained(self) -> TrainedUpdate:
        """This round's update for the instruction's model payload (trained on first use)."""
        ...

    async def evaluate(self) -> dict[str, p.Scalar]:
        """Loss (and accuracy) of the received model on the local data, without training."""
        ...

    async def fetch_tensors(self, payload_id: str) -> Tensors:
        """Download and decode one of the instruction's payloads (a broadcast, ...)."""
        ...

    def usage(self) -> dict[str, p.Scalar]:
        """This round's timings, peak memory and activation storage, as report metrics."""
        ...

    def event(self, kind: str, data: Mapping[str, object]) -> None:
        """Tell the device's event listener (``--json-events``) something happened."""
        ...


PhaseHandler = Callable[[PhaseContext], Awaitable[PhaseResult]]
ReportHook = Callable[[PhaseContext, dict[str, p.Scalar]], None]


def _no_options(ins: p.Instruction) -> dict[str, float]:
    return {}


@dataclass(frozen=True)
class SelectionKind:
    """How a device trains state cut one way.

    ``model_options(instruction)``: keyword options the model is built with for this cut (``width``
    for a channel slice), checked before any download (raise ``ProtocolError`` on a bad
    instruction). ``trains_graph``: a training graph (the ONNX Runtime backend) can train it;
    if not, only a torch device can."""

    model_options: Callable[[p.Instruction], dict[str, float]] = _no_options
    trains_graph: bool = True


@dataclass(frozen=True)
class DeviceRegistry:
    """Phases, report hooks and selection kinds a device knows, by name. Immutable: build a new
    one with :meth:`extended`."""

    phases: Mapping[str, PhaseHandler] = field(default_factory=dict)
    selections: Mapping[str, SelectionKind] = field(default_factory=dict)
    hooks: Mapping[str, tuple[ReportHook, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for attr in ("phases", "selections", "hooks"):
            object.__setattr__(self, attr, MappingProxyType(dict(getattr(self, attr))))

    def extended(self, *, phases: Mapping[str, PhaseHandler] | None = None,
                 selections: Mapping[str, SelectionKind] | None = None,
                 after: Mapping[str, ReportHook] | None = None) -> DeviceRegistry:
        """A registry with these entries added: new ``phases`` and ``selections`` (a name already
        registered is an error: extend an existing phase with a hook instead), and report hooks
        run ``after`` the named phase (after the hooks it has)."""
        phases, selections, after = dict(phases or {}), dict(selections or {}), dict(after or {})
        for kind, new, old in (("phase", phases, self.phases), ("selection", selections, self.selections)):
            taken = sorted(set(new) & set(old))
            if taken:
                raise ValueError(f"{kind} {', '.join(map(repr, taken))} is already registered")
            for name in new:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"a {kind} name is a non-empty string, not {name!r}")
        hooks = dict(self.hooks)
        for phase, hook in after.items():
            hooks[phase] = (*hooks.get(phase, ()), hook)
        return DeviceRegistry({**self.phases, **phases}, {**self.selections, **selections}, hooks)

    def phase(self, name: str) -> PhaseHandler:
        try:
            return self.phases[name]
        except KeyError:
            raise p.ProtocolError("unexpected", f"this device does not know the phase {name!r} "
                                                f"(it knows {', '.join(sorted(self.phases))})") from None

    def selection(self, name: str) -> SelectionKind:
        try:
            return self.selections[name]
        except KeyError:
            raise p.ProtocolError("unexpected", f"this device does not know the selection {name!r} "
                                                f"(it knows {', '.join(sorted(self.selections))})") from None

    async def run(self, ctx: PhaseContext) -> PhaseResult:
        """The instruction's phase, then the hooks registered after it."""
        result = await self.phase(ctx.instruction.phase)(ctx)
        for hook in self.hooks.get(ctx.instruction.phase, ()):
            hook(ctx, result.metrics)
        return result


# -- the built-in phases (docs/protocol.md, "Phases") ------------------------------------------
async def train(ctx: PhaseContext) -> PhaseResult:
    """Train the received model (once per round) and report its deltas."""
    update = await ctx.trained()
    return PhaseResult({**update.metrics, **ctx.usage()}, tensors=update.deltas,
                       num_samples=update.num_samples, trained=update.trained)


async def evaluate(ctx: PhaseContext) -> PhaseResult:
    """Report the received model's loss on the local data."""
    return PhaseResult(await ctx.evaluate())


async def compare(ctx: PhaseContext) -> PhaseResult:
    """Report the distance between this round's update and the instruction's broadcast."""
    if not ctx.instruction.broadcast_id:
        raise p.ProtocolError("malformed", "a compare instruction needs a broadcast")
    update = await ctx.trained()
    broadcast = await ctx.fetch_tensors(ctx.instruction.broadcast_id)
    return PhaseResult({**update_distance(update.deltas, broadcast), **update.metrics})


def update_distance(deltas: Mapping[str, np.ndarray | p.RowSparse],
                    broadcast: Mapping[str, np.ndarray | p.RowSparse]) -> dict[str, p.Scalar]:
    """||delta - b||^2, <delta, b> and ||delta||^2 over the broadcast's entries (VaRSeL eq. 8 needs
    the first); entries the update lacks are skipped."""
    sq_distance = dot = sq_norm = 0.0
    for name, b in broadcast.items():
        d = deltas.get(name)
        if d is None:
            continue
        d = d.dense() if isinstance(d, p.RowSparse) else d
        b = b.dense() if isinstance(b, p.RowSparse) else b
        if np.shape(b) != np.shape(d):
            raise p.ProtocolError("malformed", f"broadcast {name!r} has shape {np.shape(b)}, the update {np.shape(d)}")
        d64, b64 = np.asarray(d, np.float64), np.asarray(b, np.float64)
        sq_distance += float(np.sum((d64 - b64) ** 2))
        dot += float(np.sum(d64 * b64))
        sq_norm += float(np.sum(d64 * d64))
    return {"sq_distance": sq_distance, "dot": dot, "sq_norm": sq_norm}


#: The phases and selections every device knows without any algorithm's module: train, evaluate,
#: compare; the whole tail and row-cut tables (rows are renumbered from the received payload).
BUILTIN_REGISTRY = DeviceRegistry(
    phases={"train": train, "evaluate": evaluate, "compare": compare},
    selections={"tail": SelectionKind(), "rows": SelectionKind()},
)
