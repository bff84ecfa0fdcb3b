"""The split a device trains: the largest trainable suffix whose footprint fits its budget.

EmbracingFL (Section 3.1) lets every device train as many output-side layers as its memory
allows; the input-side layers reach it frozen, one chunk at a time (the multi-step forward pass,
Algorithm 1). The planner picks the split k (blocks [0, k) frozen, [k, L) trained), groups the
frozen blocks into chunks, and names the device's role.

Roles. ``strong`` trains the whole model (k = 0). A partial device is ``moderate`` when the
capacity of its suffix (EmbracingFL Section 4: C = (2p + 2a) / (2P + 2A)) is at least
``RoleThresholds.moderate``, else ``weak``. With the defaults (0.40, from the paper's ~40%
moderate clients) this gives every label of the paper's Table 1: ResNet20 0.42 moderate and
0.16 weak, FEMNIST CNN 0.99 moderate and 0.02 weak, IMDB BiLSTM 0.48 moderate and 0.35 weak.
``RoleThresholds.weak`` is the paper's nominal weak capacity (~15%); it is not a cut, since
the paper's weak clients go as low as 0.02.

The footprint need not shrink as k grows: streaming a frozen block costs its weights several
times over in ONNX Runtime (see ``TrainingMemory.frozen_copies``), so freezing the LEAF CNN's
6.4 M-parameter dense layer costs more than training it. The planner takes the smallest k that
fits, whatever the larger ones cost.

Sparse models: an embedding block is counted in full (every row, trained or frozen), as if the
device held the whole table, unless the plan is for a row selection (``rows``: table entry -> the
rows the device declared). A device that fetches only its submodel rows (FedSubAvg) builds its
trained tables with just those rows, so they are counted for those rows only, and a recommender
whose full tables would not fit a weak device still trains its submodel there. Frozen tables are
streamed whole and counted whole.

Width reduction (static HeteroFL, FjORD's ordered dropout; EmbracingFL Section 4.1, appendix 6.4)
is planned by width instead of by split: a device trains the whole depth of the model built at a
width ratio r (``edge_sdk.models.zoo``: the first ceil(r c) channels of every hidden layer), so its
footprint is that of the narrow model at split 0 (:func:`width_cost`, :func:`width_footprint`), and
its capacity the narrow model's (2p + 2a) over the full model's (Table 10: 1.00, 0.43, 0.18 at
r = 1, 0.45, 0.2). :func:`plan_width` gives a budget the widest of the roles' ratios
(:data:`WIDTH_RATIOS`) that fits; the server checks every width slice it sends against the device's
budget with the same arithmetic (:func:`tail_footprint` over the narrow model's cost).

Adapters (LoRA; edge_sdk.models.adapters). A model whose blocks carry adapters can be trained
through them: the device holds every weight of its tail, but trains (and keeps gradients,
optimizer state and an upload frame for) only the adapters and the parameters outside adapted
layers. The planner then chooses, per budget, between training fewer blocks fully and more blocks
through adapters: it takes the smallest split any way fits, trying each split whole before
through adapters, so a device trains as many blocks as it can hold, whole where it can
(``Plan.adapters`` says which; EmbracingFL's rule of the largest trainable suffix, with the
adapted block as a cheaper way to train one).

Runtimes. A device's runtime (``profiles.runtime.RUNTIMES``, named in its hello) decides the
runtime memory counted and which splits it can train; :func:`tail_footprint` is the one place a
footprint is counted for a runtime, and :func:`make_plan` the one place a :class:`Plan` is built.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from profiles.accounting import Footprint, ModelCost, TrainingMemory, measure_model
from profiles.runtime import RUNTIMES
from profiles.units import format_size

if TYPE_CHECKING:
    from edge_sdk.models.layered import LayeredModel
    from profiles.devices import DeviceClass
    from profiles.runtime import RuntimeMemory

__all__ = [
    "Plan", "PlanError", "ROLES", "RoleThresholds", "WIDTH_RATIOS", "backend_memory", "group_chunks", "make_plan",
    "plan_at", "plan_for_device", "plan_split", "plan_width", "reachable_splits", "tail_footprint", "width_capacity",
    "width_cost", "width_footprint",
]

ROLES: tuple[str, ...] = ("strong", "moderate", "weak")

#: Width ratio per role under width reduction (EmbracingFL appendix 6.4: moderate clients drop 55%
#: and weak clients 80% of the channels at every layer).
WIDTH_RATIOS: Mapping[str, float] = {"strong": 1.0, "moderate": 0.45, "weak": 0.2}


class PlanError(ValueError):
    """No split of the model fits the budget; says how much the device would need."""

    def __init__(self, message: str, *, needed_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes


@dataclass(frozen=True)
class RoleThresholds:
    """Capacities that name a partial device's role (see the module docstring)."""

    moderate: float = 0.40
    weak: float = 0.15

    def __post_init__(self) -> None:
        if not 0 < self.weak <= self.moderate <= 1:
            raise ValueError(
                f"role thresholds need 0 < weak <= moderate <= 1, not weak={self.weak}, moderate={self.moderate}"
            )

    def role(self, split: int, capacity: float) -> str:
        """``strong`` for the whole model, else ``moderate`` or ``weak`` by capacity."""
        if split == 0:
            return "strong"
        return "moderate" if capacity >= self.moderate else "weak"


@dataclass(frozen=True)
class Plan:
    """What a device trains, what it streams, and what that costs."""

    model: str
    split: int  # blocks [0, split) frozen, [split, num_blocks) trained
    role: str
    chunks: list[tuple[int, int]]  # frozen block ranges, streamed in this order
    footprint_bytes: int  # peak bytes, runtime included
    capacity: float
    budget_bytes: int
    batch_size: int
    num_blocks: int
    trainable_params: int
    footprint: Footprint = field(repr=False)
    #: The training runtime the footprint was counted with (a name in ``profiles.runtime.RUNTIMES``:
    #: ``torch``, or ``onnxruntime``: a training graph run by ONNX Runtime, edge_sdk.ort_trainer).
    backend: str = "torch"
    #: The row selection the footprint was counted for (table entry -> rows); empty: whole tables.
    rows: dict[str, int] = field(default_factory=dict)
    #: The width ratio the model is built at (1.0: full width; < 1 only from :func:`plan_width`).
    width: float = 1.0
    #: The tail is trained through its LoRA adapters (the weights under them frozen), not whole.
    adapters: bool = False

    @property
    def trained_blocks(self) -> range:
        return range(self.split, self.num_blocks)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for the wire, the journal and JSON)."""
        data = asdict(self)
        data["chunks"] = [list(c) for c in self.chunks]
        data["footprint"] = {**asdict(self.footprint), "total": self.footprint.total}
        return data

    def describe(self) -> str:
        chunks = ", ".join(f"[{s}, {e})" for s, e in self.chunks) or "none"
        how = " through their adapters" if self.adapters else ""
        return (
            f"{self.model}: {self.role}, split {self.split}/{self.num_blocks} "
            f"(trains {self.num_blocks - self.split} blocks{how}, capacity {self.capacity:.2f}), "
            f"chunks {chunks}, footprint {format_size(self.footprint_bytes)} of "
            f"{format_size(self.budget_bytes)} at batch {self.batch_size}, trains with {self.backend}"
        )


def _runtime_bytes(runtime: RuntimeMemory | int | None, backend: str = "torch") -> int:
    if runtime is None:
        from profiles.runtime import runtime_memory

        return runtime_memory().for_backend(backend)
    if isinstance(runtime, int):
        if runtime < 0:
            raise ValueError(f"runtime bytes must be >= 0, not {runtime}")
        return runtime
    return runtime.for_backend(backend)


def backend_memory(memory: TrainingMemory, backend: str) -> TrainingMemory:
    """``memory`` as a device on runtime ``backend`` trains: a training-graph runtime holds its
    gradients once more (``TrainingMemory.graph_copies``), and a runtime may hold more copies of
    the trainable parameters of its own (``Runtime.training_copies``: a browser tab's)."""
    runtime = RUNTIMES[backend]
    extra = (memory.graph_copies if runtime.needs_graph else 0) + runtime.training_copies
    return dataclasses.replace(memory, optimizer_copies=memory.optimizer_copies + extra) if extra else memory


def tail_footprint(
    cost: ModelCost, split: int, batch_size: int, *, backend: str, chunks: Sequence[tuple[int, int]] | None = None,
    local_samples: int = 0, rows: Mapping[str, int] | None = None, runtime: RuntimeMemory | int | None = None,
    memory: TrainingMemory = TrainingMemory(), adapters: bool = False,
) -> Footprint:
    """What a device on runtime ``backend`` holds to train blocks [split, L) of ``cost`` with the
    frozen ``chunks`` (None: each frozen block its own chunk), whole or through its ``adapters``:
    the one footprint count that plans and the server's budget checks share. The runtime's part is its
    figure and what it holds compiling the model's kernels (``Runtime.compile_bytes``: a tab's, for
    a model with attention)."""
    attention = any(b.attention_elements for b in cost.blocks)  # chunks and tail: the device runs them all
    return cost.footprint(split, batch_size, memory=backend_memory(memory, backend),
                          runtime_bytes=_runtime_bytes(runtime, backend) + RUNTIMES[backend].compile_bytes(attention),
                          chunks=chunks,
                          local_samples=local_samples, rows=rows, adapters=adapters)


def make_plan(
    cost: ModelCost, split: int, footprint: Footprint, *, budget_bytes: int, batch_size: int, backend: str,
    chunks: Sequence[tuple[int, int]], thresholds: RoleThresholds = RoleThresholds(),
    rows: Mapping[str, int] | None = None, capacity: float | None = None, role: str | None = None,
    width: float = 1.0, adapters: bool = False,
) -> Plan:
    """The :class:`Plan` for training [split, L) of ``cost`` (whole, or through its ``adapters``):
    role from capacity (``strong`` only for the whole model trained whole), and the rows of only
    the tables it trains."""
    capacity = cost.capacity(split, batch_size, adapters) if capacity is None else capacity
    if role is None:
        role = thresholds.role(split, capacity) if not adapters else thresholds.role(max(split, 1), capacity)
    return Plan(
        model=cost.model, split=split, role=role, chunks=list(chunks),
        footprint_bytes=footprint.total, capacity=capacity, budget_bytes=budget_bytes, batch_size=batch_size,
        num_blocks=len(cost), trainable_params=cost.trainable_params(split, adapters), footprint=footprint,
        backend=backend,
        rows={e: n for e, n in (rows or {}).items() if any(t.entry == e and t.block >= split for t in cost.tables)},
        width=width, adapters=adapters,
    )


def _as_cost(model: LayeredModel | ModelCost) -> ModelCost:
    return model if isinstance(model, ModelCost) else measure_model(model)


def group_chunks(
    cost: ModelCost, split: int, batch_size: int, fits: Callable[[int], bool], memory: TrainingMemory
) -> list[tuple[int, int]]:
    """Frozen blocks [0, split) grouped greedily, in order, into chunks whose bytes ``fits``.

    Fewer, larger chunks mean fewer round trips; each still fits beside what the device holds.
    Raises ValueError if a single block does not fit.
    """
    chunks: list[tuple[int, int]] = []
    start = 0
    while start < split:
        if not fits(cost.chunk_bytes(start, start + 1, batch_size, memory)):
            raise ValueError(f"frozen block {start} ({cost.blocks[start].name}) does not fit on its own")
        stop = start + 1
        while stop < split and fits(cost.chunk_bytes(start, stop + 1, batch_size, memory)):
            stop += 1
        chunks.append((start, stop))
        start = stop
    return chunks


def plan_split(
    model: LayeredModel | ModelCost,
    budget_bytes: int,
    batch_size: int = 32,
    *,
    thresholds: RoleThresholds = RoleThresholds(),
    runtime: RuntimeMemory | int | None = None,
    memory: TrainingMemory = TrainingMemory(),
    local_samples: int = 0,
    backends: Sequence[str] = ("torch",),
    graph_splits: Collection[int] = (),
    rows: Mapping[str, int] | None = None,
) -> Plan:
    """The largest trainable suffix of ``model`` whose footprint fits ``budget_bytes``.

    ``runtime`` is what the runtimes take (a :class:`RuntimeMemory`, whose figure for the chosen
    backend is used, or bytes for any backend); by default it is measured on this machine
    (cached). ``local_samples`` is the size of the device's dataset (its hello says it), held in
    memory throughout. ``backends`` are the training runtimes the device has (Hello.runtimes,
    names in ``profiles.runtime.RUNTIMES``; a device's training backend declares them,
    ``edge_sdk.backends``, and ``profiles.runtime.backend_runtime`` gives the one it is planned on);
    a graph runtime counts only at ``graph_splits``, the splits whose tail has a training graph.
    At each split they are tried in the registry's order, torch first (faster steps), then ONNX
    Runtime (a smaller runtime), so a device gets the largest suffix any of its runtimes fits. ``rows`` plans for a row selection:
    the trained tables count only those rows (see the module docstring). Raises :class:`PlanError`
    when not even the last block fits, saying how much it would need.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, not {budget_bytes}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, not {batch_size}")
    cost = _as_cost(model)
    unknown = set(backends) - set(RUNTIMES)
    if unknown or not backends:
        raise ValueError(f"backends must be among {', '.join(RUNTIMES)}, not {list(backends)}")
    graph_splits = frozenset(graph_splits)
    rows = dict(rows or {})
    smallest: Footprint | None = None
    ways = (False, True) if cost.adapters else (False,)  # whole, then through adapters (module docstring)
    for k, adapters, backend in ((k, a, b) for k in range(len(cost)) for a in ways for b in RUNTIMES):
        if backend not in backends or not RUNTIMES[backend].can_train(k, graph_splits):
            continue
        # Each frozen block its own chunk: the smallest peak this split can reach.
        least = tail_footprint(cost, k, batch_size, backend=backend, runtime=runtime, memory=memory,
                               local_samples=local_samples, rows=rows, adapters=adapters)
        if smallest is None or least.total < smallest.total:
            smallest = least
        if least.total > budget_bytes:
            continue
        def fits(chunk_bytes: int, least: Footprint = least) -> bool:
            return dataclasses.replace(least, frozen_chunk=chunk_bytes).total <= budget_bytes

        chunks = group_chunks(cost, k, batch_size, fits, backend_memory(memory, backend))
        footprint = tail_footprint(cost, k, batch_size, backend=backend, runtime=runtime, memory=memory,
                                   chunks=chunks, local_samples=local_samples, rows=rows, adapters=adapters)
        return make_plan(cost, k, footprint, budget_bytes=budget_bytes, batch_size=batch_size, backend=backend,
                         chunks=chunks, thresholds=thresholds, rows=rows, adapters=adapters)
    if smallest is None:
        raise PlanError(f"{cost.model}: the device's backends {list(backends)} can train no split of it "
                        "(no training graph exports and torch is not installed)",
                        needed_bytes=0, budget_bytes=budget_bytes)
    k = smallest.split
    raise PlanError(
        f"{cost.model} does not fit a budget of {format_size(budget_bytes)} at batch {batch_size}: "
        f"the smallest footprint is {format_size(smallest.total)} (split {k}, training "
        f"{len(cost) - k} of {len(cost)} blocks: {format_size(smallest.runtime)} runtime + "
        f"{format_size(smallest.model_bytes)} model); it needs {format_size(smallest.total - budget_bytes)} more, "
        "or a smaller batch",
        needed_bytes=smallest.total,
        budget_bytes=budget_bytes,
    )


def plan_at(
    model: LayeredModel | ModelCost, split: int, budget_bytes: int, batch_size: int = 32, *, backend: str = "torch",
    thresholds: RoleThresholds = RoleThresholds(), runtime: RuntimeMemory | int | None = None,
    memory: TrainingMemory = TrainingMemory(), local_samples: int = 0, rows: Mapping[str, int] | None = None,
    adapters: bool = False,
) -> Plan:
    """A plan at a split chosen elsewhere (a forced split: emulation and tests), its frozen blocks
    one chunk, counted as :func:`plan_split` counts, whether or not it fits ``budget_bytes``."""
    cost = _as_cost(model)
    chunks = [(0, split)] if split > 0 else []
    footprint = tail_footprint(cost, split, batch_size, backend=backend, runtime=runtime, memory=memory,
                               chunks=chunks, local_samples=local_samples, rows=rows, adapters=adapters)
    return make_plan(cost, split, footprint, budget_bytes=budget_bytes, batch_size=batch_size, backend=backend,
                     chunks=chunks, thresholds=thresholds, rows=rows, adapters=adapters)


@functools.lru_cache(maxsize=64)
def width_cost(model_name: str, width: float) -> ModelCost:
    """The measured cost of zoo model ``model_name`` built at width ratio ``width`` (cached: about a
    second for ResNet20). Imports torch."""
    from edge_sdk.models.zoo import build_model

    return measure_model(build_model(model_name, seed=0, width=float(width)))


def width_footprint(
    model_name: str,
    width: float,
    batch_size: int = 32,
    *,
    memory: TrainingMemory = TrainingMemory(),
    runtime_bytes: int = 0,
    local_samples: int = 0,
) -> Footprint:
    """What a device holds that trains the whole depth of ``model_name`` at ``width``: the narrow
    model's footprint at split 0 (no frozen chunks, no cached activations; local data held)."""
    return width_cost(model_name, float(width)).footprint(0, batch_size, memory=memory, runtime_bytes=runtime_bytes,
                                                          local_samples=local_samples)


def width_capacity(model_name: str, width: float, batch_size: int = 32) -> float:
    """EmbracingFL's capacity C = (2p + 2a) / (2P + 2A) of the model at ``width`` against the full
    model (appendix 6.4, Table 10; the paper counts weight parameters only, this counts all trainable
    parameters, as :meth:`ModelCost.capacity` does)."""
    narrow, full = width_cost(model_name, float(width)), width_cost(model_name, 1.0)
    p, a = narrow.trainable_params(0), narrow.activations(0, batch_size)
    whole_p, whole_a = full.trainable_params(0), full.activations(0, batch_size)
    return (2 * p + 2 * a) / (2 * whole_p + 2 * whole_a)


def plan_width(
    model_name: str,
    budget_bytes: int,
    batch_size: int = 32,
    *,
    ratios: Mapping[str, float] = WIDTH_RATIOS,
    runtime: RuntimeMemory | int | None = None,
    memory: TrainingMemory = TrainingMemory(),
    local_samples: int = 0,
) -> Plan:
    """Width reduction's plan for a budget: the role with the widest of ``ratios`` whose
    :func:`width_footprint` fits (the whole depth, trained with torch). Raises :class:`PlanError`
    when not even the narrowest fits."""
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, not {budget_bytes}")
    if not ratios:
        raise ValueError("no width ratios to plan with")
    runtime_bytes = _runtime_bytes(runtime, "torch")
    smallest: Footprint | None = None
    for role, width in sorted(ratios.items(), key=lambda item: -item[1]):
        footprint = width_footprint(model_name, width, batch_size, memory=memory, runtime_bytes=runtime_bytes,
                                    local_samples=local_samples)
        smallest = footprint
        if footprint.total > budget_bytes:
            continue
        return make_plan(width_cost(model_name, float(width)), 0, footprint, budget_bytes=budget_bytes,
                         batch_size=batch_size, backend="torch", chunks=[], role=role,
                         capacity=width_capacity(model_name, width, batch_size), width=float(width))
    assert smallest is not None
    raise PlanError(
        f"{model_name} at width {min(ratios.values()):g} does not fit a budget of {format_size(budget_bytes)} at "
        f"batch {batch_size}: it needs {format_size(smallest.total)}",
        needed_bytes=smallest.total, budget_bytes=budget_bytes,
    )


def reachable_splits(
    model: LayeredModel | ModelCost,
    batch_size: int = 32,
    *,
    runtime_bytes: int = 0,
    memory: TrainingMemory = TrainingMemory(),
    local_samples: int = 0,
    candidates: Collection[int] | None = None,
) -> list[int]:
    """The splits among ``candidates`` (default: all) that :func:`plan_split` picks for some budget.

    The planner takes the smallest split that fits, so a split whose least footprint is no
    smaller than that of an earlier candidate is never picked: any budget it fits, the earlier
    one fits too. These are the tails that need a training graph.
    """
    cost = _as_cost(model)
    allowed = range(len(cost)) if candidates is None else sorted(set(candidates))
    out: list[int] = []
    best: int | None = None
    for k in allowed:
        total = cost.footprint(k, batch_size, memory=memory, runtime_bytes=runtime_bytes,
                               local_samples=local_samples).total
        if best is None or total < best:
            out.append(k)
            best = total
    return out


def plan_for_device(
    model: LayeredModel | ModelCost,
    device: DeviceClass | str,
    batch_size: int = 32,
    *,
    thresholds: RoleThresholds = RoleThresholds(),
    runtime: RuntimeMemory | None = None,
    memory: TrainingMemory = TrainingMemory(),
    backends: Sequence[str] = ("torch",),
    graph_splits: Collection[int] = (),
    rows: Mapping[str, int] | None = None,
) -> Plan:
    """:func:`plan_split` for a device class: its budget, and its runtime overrides if it has any."""
    from profiles.devices import load_device_class
    from profiles.runtime import runtime_memory

    if isinstance(device, str):
        device = load_device_class(device)
    figures = (runtime or runtime_memory()).with_overrides(device.runtime_overrides)
    return plan_split(
        model, device.budget_bytes, batch_size, thresholds=thresholds, runtime=figures, memory=memory,
        backends=backends, graph_splits=graph_splits, rows=rows,
    )
