"""The strategy interface: a strategy drives each round; the server only does the I/O.

In the spirit of Flower's ``configure_train`` / ``aggregate_train``, but streaming
(docs/architecture.md, "Strategies"):

1. :meth:`Strategy.configure` chooses who takes part and with what :class:`Instruction`
   (phase, payload :class:`~orchestrator.strategies.selection.Selection`, config values, a :class:`Broadcast`).
2. :meth:`Strategy.on_report` sees each :class:`DeviceReport` as it arrives, folds it into running
   sums (O(model) memory however many devices report) or refuses it (:class:`Refused`), and may
   return follow-up instructions for any device: a second phase in the same round.
3. :meth:`Strategy.round_complete` says when the round may close before its deadline (default:
   the quorum of the train phase, with no other phase still out); the server also closes it when
   nothing is outstanding.
4. :meth:`Strategy.aggregate` returns the new global state (:class:`RoundResult`).

What a strategy needs of the server beyond these hooks it declares on its class, with the defaults
of :class:`Strategy`: ``selects_rows`` (plans count declared rows), ``sends_chunks`` (new states'
frozen chunks are exported and checked), ``hello_fields`` (per-device values the hello carries in
``Hello.ext``, parsed into ``DeviceInfo.ext``) and :meth:`Strategy.selection_cost` (a selection whose
device-side model is not a tail of the served model). What it is capable of it declares as
:attr:`Strategy.combines` (:class:`Combines`: a weighted mean of whole blocks, a robust statistic,
or a rule of its own): secure aggregation and differential privacy ask it, never a list of names.

The server checks every report before a strategy sees it: tensors are exactly the deltas of what
the selection sent (names, shapes, dtypes, rows), finite, and the sample count is the device's own.
:class:`WeightedSums` is the running sum with per-element weights that every averaging rule here
shares: entries, rows or channels that different numbers of devices trained are each averaged over
their own contributors.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal, get_args

import numpy as np

from edge_sdk.protocol import RowSparse, Scalar
from orchestrator.rounds import RoundState, sample_devices
from orchestrator.strategies.options import typed_init
from orchestrator.strategies.robust import AGGREGATIONS, Aggregation, RobustHistory, RobustRound, WeightCap
from orchestrator.strategies.selection import Selection
from orchestrator.values import NonNegative, NonNegativeInt, Range
from profiles.accounting import ModelCost

Weighting = Literal["samples", "uniform"]

#: Default cap on one device's share of an entry's total weight (docs/security.md, "Weight cap").
DEFAULT_WEIGHT_SHARE = 1 / 5
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)

__all__ = [
    "AGGREGATIONS", "DEFAULT_WEIGHT_SHARE", "WEIGHTINGS", "AveragingStrategy", "RobustStack", "Broadcast", "Combines",
    "DeviceInfo", "DeviceReport",
    "HelloContext", "HelloField", "Instruction", "Refused", "RoundContext", "RoundResult", "SelectionCost",
    "ServerSetting", "Strategy", "WeightedSums",
]


class Refused(Exception):
    """Raised by :meth:`Strategy.on_report`: the report is valid but not taken (the device gets a
    negative ack with ``reason`` and stays connected; nothing was folded)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DeviceInfo:
    """A connected device as strategies see it: its plan and what it declared in its hello."""

    device_id: str
    role: str  # the planner's: strong | moderate | weak
    split: int  # its planned tail is blocks [split, L)
    num_samples: int
    device_class: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)  # hello labels (priority, group, ...)
    runtimes: tuple[str, ...] = ()
    rows: Mapping[str, np.ndarray] = field(default_factory=dict)  # sparse table entry -> rows its data touches
    #: The strategy's declared hello fields (``Strategy.hello_fields``) this device sent, as parsed.
    ext: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class HelloContext:
    """What a hello field's parser may check a value against: the served model's sparse inputs
    (hello column ``"0"``, ``"1"``... -> table entry) and the shapes of its state entries."""

    columns: Mapping[str, str]
    shapes: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class ServerSetting:
    """A server setting (a :class:`~orchestrator.config.ServerConfig` field) a strategy's algorithm
    needs other than the server's default: the ``value`` it needs and ``why``, which ``edgetrain
    serve`` and ``edgetrain emulate`` print when they apply it (:mod:`orchestrator.strategies.server_settings`)."""

    value: object
    why: str


@dataclass(frozen=True)
class HelloField:
    """A per-device value a strategy needs from the hello, carried in ``Hello.ext`` under its key
    (``namespace.name``). ``parse(value, context)`` returns what the strategy sees in
    ``DeviceInfo.ext[key]``, or raises ValueError saying what is wrong (the device is refused with
    ``malformed``). ``requires``: keys that must be sent with this one."""

    parse: Callable[[object, HelloContext], object]
    requires: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class SelectionCost:
    """What a device builds for a selection that is not a tail of the served model (width
    reduction's narrow model): the cost its budget check counts, and the runtime backends
    (``profiles.runtime.Runtime.backend``) that can train it. Such a selection never gets a
    training graph."""

    cost: ModelCost
    backends: frozenset[str] = frozenset({"torch"})


@dataclass(frozen=True, eq=False)
class Broadcast:
    """Tensors sent along with instructions (for example the internal devices' mean update, VaRSeL).

    Create one and give it to every instruction that carries it: the server encodes and hashes it
    once per round, however many devices fetch it.
    """

    tensors: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Instruction:
    """What the strategy asks of one device (the server sends it as a protocol ``Instruction``).

    ``selection`` None means the device's planned tail. ``local_steps`` and ``lr`` None mean the
    server's configuration (for ``lr``, the round's rate after any step decay). ``config`` values
    reach the device's phase (a broadcast loss, mu, ...).
    """

    device_id: str
    phase: str = "train"
    selection: Selection | None = None
    broadcast: Broadcast | None = None
    config: Mapping[str, Scalar] = field(default_factory=dict)
    local_steps: int | None = None
    lr: float | None = None


@dataclass(frozen=True)
class DeviceReport:
    """One device's answer to one instruction, already checked by the server.

    ``tensors`` hold ``new - old`` for the entries the selection sent: dense arrays shaped as sent
    (a channel slice is smaller than the global tensor) or :class:`~edge_sdk.protocol.RowSparse`
    rows. Phases without tensors (evaluate, compare) report only ``metrics``.

    ``entry_weights``: entry name -> a factor in [0, 1] on the report's weight in that entry's mean
    (the server's direction trust of the entry's block, :mod:`orchestrator.aggregation.trust`; 1 where absent).
    A strategy that weighs reports applies it through :meth:`weight_of`; a factor of 0 leaves the
    entry out of the round (:meth:`WeightedSums.add_report`), so robust statistics skip it too.
    """

    device_id: str
    round: int
    phase: str
    role: str
    num_samples: int
    trained: tuple[int, int]
    metrics: Mapping[str, Scalar]
    tensors: Mapping[str, np.ndarray | RowSparse]
    selection: Selection
    entry_weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def weight_of(self, name: str, weight: float) -> float:
        """``weight`` of this report in entry ``name``'s mean, scaled by the entry's trust."""
        return weight * self.entry_weights.get(name, 1.0)

    def metric(self, name: str, default: float = math.nan) -> float:
        value = self.metrics.get(name, default)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    @property
    def loss_before(self) -> float:
        return self.metric("loss_before")

    @property
    def loss_after(self) -> float:
        return self.metric("loss_after")


@dataclass
class RoundContext:
    """A strategy's window on the round: the state devices start from, the candidates, progress."""

    round: int
    global_state: Mapping[str, np.ndarray]
    devices: Mapping[str, DeviceInfo]  # connected and idle when the round began
    state: RoundState
    blocks: tuple[str, ...] = ()
    fraction: float = 1.0
    seed: int | None = 0  # None: cohorts are secret draws (ServerConfig.cohort_seed)
    poisson: bool = False  # a fraction samples each device independently (dp_sampling = "poisson")

    def sample(self, candidates: Iterable[str] | None = None, *, fraction: float | None = None,
               k: int | None = None, salt: int = 0) -> list[str]:
        """Sample of ``candidates`` (default: every device), by fraction or count: reproducible per
        seed, or secret (``os.urandom``) when the context has none."""
        pool = self.devices if candidates is None else candidates
        return sample_devices(pool, self.fraction if fraction is None else fraction, self.round,
                              None if self.seed is None else self.seed + salt, k=k, poisson=self.poisson)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


#: The loss metrics of a train report the round summary averages (sample-weighted, each over the
#: reports that carry it: a device asked not to score ``loss_after`` leaves it out).
_LOSSES = ("loss_before", "loss_after", "loss_steps")


@dataclass(frozen=True)
class RoundResult:
    """The new global state and what went into it."""

    round: int
    state: dict[str, np.ndarray]
    devices: tuple[str, ...]  # folded, in arrival order
    num_samples: int  # over folded devices
    contributors: dict[str, int]  # state entry -> devices that trained (part of) it this round
    roles: dict[str, int]  # role -> devices folded
    rejected: int  # reports refused
    mean_loss_before: float | None  # sample-weighted over folded devices
    mean_loss_after: float | None
    extra: dict[str, object] = field(default_factory=dict)  # strategy-specific (weights, included devices)
    mean_loss_steps: float | None = None  # of the local steps' mini-batch losses

    @property
    def untouched(self) -> list[str]:
        """Entries nobody trained this round (they kept their old value)."""
        return [name for name, n in self.contributors.items() if n == 0]

    def summary(self) -> dict[str, object]:
        """A JSON-ready digest for the journal and the metrics files."""
        return {
            "round": self.round, "devices": len(self.devices), "num_samples": self.num_samples,
            "roles": dict(self.roles), "rejected": self.rejected, "untouched": len(self.untouched),
            "loss_before": self.mean_loss_before, "loss_after": self.mean_loss_after,
            "loss_steps": self.mean_loss_steps, **self.extra,
        }


#: The ways a strategy combines a round's reports (:class:`Combines`).
CombineRule = Literal["weighted_mean", "robust", "own"]


@dataclass(frozen=True)
class Combines:
    """How a strategy combines a round's reports: what the parts that never see one update alone ask
    of it. Secure aggregation sums each block's masked updates over the devices that trained it, and
    differential privacy releases each block's clipped sum: both run a strategy whose rule is that sum
    over a weight sum, and nothing else.

    - ``"weighted_mean"``: x[k] <- x[k] + sum_i w_i delta_i[k] / sum_i w_i over the devices that trained
      entry k, each report a whole tail of blocks ``[split, L)``, w_i its sample count
      (``weighting="samples"``) or 1 (``"uniform"``): FedAvg's rule (McMahan et al., 2017) and
      EmbracingFL's per block (Lee et al., Section 3.1);
    - ``"robust"``: a statistic of the individual updates (``detail`` names it: a median, Krum, ...);
    - ``"own"``: a rule of the strategy's own (``detail`` says what it reads beyond block sums: rows,
      channel slices, losses, a second phase).
    """

    rule: CombineRule
    weighting: Weighting = "samples"
    detail: str = ""

    @classmethod
    def weighted_mean(cls, weighting: Weighting = "samples") -> Combines:
        return cls("weighted_mean", weighting)

    @classmethod
    def robust(cls, statistic: str) -> Combines:
        return cls("robust", detail=statistic)

    @classmethod
    def own(cls, what: str) -> Combines:
        return cls("own", detail=what)

    @property
    def is_sum(self) -> bool:
        """Whether the rule is a sum of whole blocks over a weight sum: what block sums can compute."""
        return self.rule == "weighted_mean"

    def describe(self) -> str:
        if self.rule == "weighted_mean":
            return f"a weighted mean of whole blocks ({self.weighting} weighting)"
        if self.rule == "robust":
            return f"the robust statistic {self.detail}, which reads individual updates"
        return f"a rule of its own ({self.detail})" if self.detail else "a rule of its own"


class Strategy(ABC):
    """One federated algorithm. Subclasses set ``name`` and implement :meth:`on_report` and
    :meth:`aggregate`; the defaults of the other hooks run a one-phase round of training on each
    sampled device's planned tail.

    A subclass's constructor receives its options converted to, and checked against, its parameters'
    annotations (``trim: Annotated[float, Range(0, 0.5)]``, ``weighting: Literal[...]``): text from the
    command line and TOML values alike (:mod:`orchestrator.strategies.options`)."""

    name: ClassVar[str]
    #: Sends row selections (FedSubAvg): devices are planned for the rows they declare, not whole tables.
    selects_rows: ClassVar[bool] = False
    #: Sends frozen chunks: each new state's chunks are exported and checked before it is committed.
    sends_chunks: ClassVar[bool] = True
    #: Per-device values the strategy needs from the hello (``Hello.ext``), by key.
    hello_fields: ClassVar[Mapping[str, HelloField]] = MappingProxyType({})
    #: Server settings the algorithm needs other than the server's defaults, by field name; applied
    #: where the user left the default (a setting the user gave is kept, with a warning).
    server_settings: ClassVar[Mapping[str, ServerSetting]] = MappingProxyType({})
    #: How the strategy combines a round's reports (:class:`Combines`); a strategy whose rule is a
    #: weighted mean of whole blocks declares it and runs under secure aggregation and differential
    #: privacy. Default: a rule of its own, which neither can run.
    combines: Combines = Combines.own("")

    def selection_cost(self, instruction: Instruction, selection: Selection, model: str) -> SelectionCost | None:
        """For a selection whose device-side model is not a tail of ``model`` (the served zoo
        model): what it costs and who can train it; raise ValueError if the selection is not one
        this strategy can send. Default None: a tail (or rows) of the served model."""
        return None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = typed_init(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        """Round start: the instructions to send. Default: train ``fraction`` of the devices on their tails."""
        return [Instruction(d, "train", Selection.tail(ctx.devices[d].split)) for d in ctx.sample()]

    @abstractmethod
    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        """Take (fold) one report, or raise :class:`Refused`. Returns follow-up instructions (often none)."""

    def on_missing(self, device_id: str, phases: Sequence[str], ctx: RoundContext) -> Sequence[Instruction]:
        """A device vanished with instructions of ``phases`` open. Returns follow-ups (default: none)."""
        return ()

    def round_complete(self, ctx: RoundContext) -> bool:
        """True when the round may close though instructions are still out. Default: the train
        phase reached its quorum and only train instructions (stragglers) are still out."""
        state = ctx.state
        return state.quorum_reached("train") and all(phase == "train" for _, phase in state.outstanding)

    @abstractmethod
    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """Close the round: the new global state from what was folded."""


class WeightedSums:
    """Per-element running sums ``sum_i w_i * delta_i`` and ``sum_i w_i`` over contributors.

    A dense delta adds its weight to every element of its entry; a channel slice only to its slice;
    row-sparse deltas only to their rows, so each row, channel or entry is averaged over the devices
    that trained it (EmbracingFL Section 3.1 per entry; HeteroFL per channel; FedSubAvg per row).
    Float entries accumulate in float64 and are cast back at the end. Integer entries (BatchNorm
    ``num_batches_tracked``) are counters, not parameters: they take the largest value any
    contributor reached (old + max delta), so averaging cannot make them fractional.
    Memory is O(model): one accumulator (and at most one weight array) per entry touched.

    ``max_share`` < 1 caps every device's weight in each whole entry's average at that share of
    the entry's total (:class:`~orchestrator.strategies.robust.WeightCap`; it keeps the deltas of
    the few heaviest contributors per entry until the round closes).
    """

    def __init__(self, global_state: Mapping[str, np.ndarray], max_share: float = 1.0) -> None:
        self._global = global_state
        self._cap = WeightCap(max_share) if max_share < 1 else None
        self._sums: dict[str, np.ndarray] = {}
        self._dense_w: dict[str, float] = {}  # weight added to every element of the entry
        self._part_w: dict[str, np.ndarray] = {}  # weight of rows (shape [rows]) or slices (full shape)
        self.counts: dict[str, int] = dict.fromkeys(global_state, 0)
        self.roles: Counter[str] = Counter()
        self.devices: list[str] = []
        self.samples = 0
        self._loss = {name: [0.0, 0] for name in _LOSSES}  # loss metric -> [sample-weighted sum, samples]
        self._scratch = np.empty(0, dtype=np.float64)  # w * delta of one entry, reused report after report

    def add(self, name: str, delta: np.ndarray | RowSparse, weight: float,
            region: tuple[slice, ...] | np.ndarray | None = None, *, device: str = "") -> None:
        """Add ``weight * delta`` to entry ``name``; ``region`` places a slice (slices) or rows (indices).
        ``device`` names the contributor (the weight cap reports whom it capped)."""
        old = self._global[name]
        if old.dtype.kind != "f":
            if region is not None or isinstance(delta, RowSparse):
                raise ValueError(f"counter entry {name!r} takes whole deltas only")
            acc = self._sums.get(name)
            self._sums[name] = np.array(delta, copy=True) if acc is None else np.maximum(acc, delta)
            self._dense_w[name] = self._dense_w.get(name, 0.0) + weight
            self.counts[name] += 1
            return
        acc = self._sums.get(name)
        if acc is None:
            acc = self._sums[name] = np.zeros(old.shape, dtype=np.float64)
        if self._cap is not None and (region is not None or isinstance(delta, RowSparse)):
            raise ValueError(f"the weight cap takes whole-entry deltas; {name!r} came as a slice or rows")
        if isinstance(delta, RowSparse):
            rows = delta.indices
            # acc[rows] += w * values: rows are unique (checked on decode), so fancy assignment is exact.
            acc[rows] += np.multiply(delta.values, weight, dtype=np.float64)
            w = self._part_w.get(name)
            if w is None:
                w = self._part_w[name] = np.zeros(old.shape[0], dtype=np.float64)
            w[rows] += weight
        elif region is None:
            np.add(acc, self._scaled(delta, weight), out=acc)
            self._dense_w[name] = self._dense_w.get(name, 0.0) + weight
            if self._cap is not None:
                self._cap.track(name, weight, delta, device)
        else:
            view = acc[region]
            np.add(view, self._scaled(delta, weight), out=view)
            w = self._part_w.get(name)
            if w is None:
                w = self._part_w[name] = np.zeros(old.shape, dtype=np.float64)
            w[region] += weight
        self.counts[name] += 1

    def _scaled(self, delta: np.ndarray, weight: float) -> np.ndarray:
        """``weight * delta`` in float64, written into a buffer the sums keep (the size of the largest
        entry): a report's fold allocates no temporary the size of its tensors."""
        delta = np.asarray(delta)
        if self._scratch.size < delta.size:
            self._scratch = np.empty(delta.size, dtype=np.float64)
        out = self._scratch[: delta.size].reshape(delta.shape)
        np.multiply(delta, weight, out=out, dtype=np.float64)
        return out

    def add_report(self, report: DeviceReport, weight: float) -> None:
        """Add every tensor of a checked report, each where its selection placed it, with ``weight``
        scaled by the entry's trust (:meth:`DeviceReport.weight_of`); a float entry of weight 0 is
        not added (its elements keep their old value if nobody else trained them)."""
        for name, delta in report.tensors.items():
            w = report.weight_of(name, weight)
            if w <= 0 and self._global[name].dtype.kind == "f":
                continue
            region = None if isinstance(delta, RowSparse) else report.selection.region(name)
            if isinstance(region, np.ndarray):
                region = None  # a row entry always arrives as RowSparse
            self.add(name, delta, w, region, device=report.device_id)
        self.note(report)

    def note(self, report: DeviceReport) -> None:
        """Count a folded report in the round's summary (devices, roles, samples, losses)."""
        self.roles[report.role] += 1
        self.devices.append(report.device_id)
        n = int(report.num_samples)
        self.samples += n
        for name, acc in self._loss.items():  # each over the reports that carry it
            value = report.metric(name)
            if math.isfinite(value):
                acc[0] += value * n
                acc[1] += n

    def weights(self, name: str) -> np.ndarray | float:
        """Total weight per element of entry ``name`` (a scalar when only whole deltas were added)."""
        dense = self._dense_w.get(name, 0.0)
        part = self._part_w.get(name)
        if part is None:
            return dense
        if part.ndim == 1 and self._global[name].ndim > 1:
            part = part.reshape(-1, *([1] * (self._global[name].ndim - 1)))
        return part + dense

    def new_state(self, scale: Mapping[str, np.ndarray | float] | None = None) -> dict[str, np.ndarray]:
        """``old + scale * sum_i w_i delta_i / sum_i w_i`` per element (``scale`` 1 by default);
        elements nobody trained keep their old value bit for bit."""
        state: dict[str, np.ndarray] = {}
        for name, old in self._global.items():
            acc = self._sums.get(name)
            if acc is None:
                state[name] = old.copy()
                continue
            if old.dtype.kind != "f":
                state[name] = np.asarray(old + acc, dtype=old.dtype)
                continue
            w = self.weights(name)
            if self._cap is not None:
                taken, removed = self._cap.correction(name)
                if taken is not None:
                    acc, w = acc - taken, w - removed
            s = 1.0 if scale is None else scale.get(name, 1.0)
            if isinstance(w, float):
                state[name] = np.asarray(old.astype(np.float64) + s * (acc / w), dtype=old.dtype)
            else:
                w_full = np.broadcast_to(w, old.shape)
                mean = np.divide(acc, w_full, out=np.zeros_like(acc), where=w_full > 0)
                new = np.asarray(old.astype(np.float64) + s * mean, dtype=old.dtype)
                state[name] = np.where(w_full > 0, new, old)
        return state

    def extra(self) -> dict[str, object]:
        """What the round's summary says about how the sums were taken (after :meth:`new_state`):
        the devices the weight cap reduced, each with the fraction of its weight it kept."""
        capped = self._cap.summary() if self._cap is not None else {}
        return {"weight_capped": capped} if capped else {}

    def result(self, round: int, rejected: int, state: dict[str, np.ndarray] | None = None,
               extra: dict[str, object] | None = None) -> RoundResult:
        mean = {name: s / n if n else None for name, (s, n) in self._loss.items()}
        return RoundResult(
            round=round, state=self.new_state() if state is None else state, devices=tuple(self.devices),
            num_samples=self.samples, contributors=dict(self.counts), roles=dict(self.roles), rejected=rejected,
            mean_loss_before=mean["loss_before"], mean_loss_after=mean["loss_after"],
            extra=dict(extra or {}), mean_loss_steps=mean["loss_steps"],
        )


class RobustStack(WeightedSums):
    """The running sums' interface over a robust statistic (:mod:`orchestrator.strategies.robust`):
    float entries go to a :class:`~orchestrator.strategies.robust.RobustRound`, aggregated per layer
    group when the round closes; counters take the largest, as for the mean. Whole-entry deltas
    only: rows and channel slices have contributors per element, which these statistics do not handle.
    """

    def __init__(self, global_state: Mapping[str, np.ndarray], robust: RobustRound) -> None:
        super().__init__(global_state)
        self.robust = robust

    def add(self, name: str, delta: np.ndarray | RowSparse, weight: float,
            region: tuple[slice, ...] | np.ndarray | None = None, *, device: str = "") -> None:
        if self._global[name].dtype.kind != "f":
            super().add(name, delta, weight, region)  # counters: the largest, as for the mean
            return
        if region is not None or isinstance(delta, RowSparse):
            raise ValueError(f"{self.robust.method} aggregation takes whole-entry deltas; "
                             f"{name!r} came as a slice or rows")
        self.robust.add(device or f"#{len(self.devices)}", name, delta)
        self.counts[name] += 1

    def new_state(self, scale: Mapping[str, np.ndarray | float] | None = None) -> dict[str, np.ndarray]:
        state = super().new_state(scale)
        for name, agg in self.robust.aggregate().items():
            old = self._global[name]
            s = 1.0 if scale is None else scale.get(name, 1.0)
            state[name] = np.asarray(old.astype(np.float64) + s * agg, dtype=old.dtype)
        return state

    def extra(self) -> dict[str, object]:
        return {"aggregation": self.robust.method, "groups": self.robust.summary()}


class AveragingStrategy(Strategy):
    """One train phase; the new state is the per-element weighted mean of the folded deltas.

    w_i is the device's sample count (``weighting="samples"``) or 1 (``weighting="uniform"``).
    Subclasses add admission rules (:meth:`admit`) or override :meth:`weight`.

    ``aggregation`` other than ``"mean"`` replaces the mean by a robust statistic, taken per layer
    group (the entries the same devices trained) over that group's contributors, unweighted
    (:mod:`orchestrator.strategies.robust`): ``"median"``, ``"trimmed_mean"`` (``trim`` of the
    values dropped at each end, at least one once there are three), ``"krum"`` / ``"multi_krum"``
    (tolerating ``byzantine`` hostile devices per group; below 2 x byzantine + 3 contributors the
    group takes the median) or ``"centered_clip"`` (radius ``clip_radius`` around the group's
    previous aggregate; 0: the median of the contributors' distances to it).

    ``max_weight_share`` caps any one device's weight in every entry's mean at that share of the
    entry's total weight, whatever sample count it claims (fewer than 1 / share contributors get
    equal weights). The default, :data:`DEFAULT_WEIGHT_SHARE` = 1/5, means no device weighs more
    than one of five equal devices: a device that claims 100 times its data weighs, in a round of
    five, as much as one honest device, not 95% of the round (docs/security.md, "Bounded influence
    by default"). 1.0 is the plain sample-weighted mean of the papers' update rules.
    """

    def __init__(self, weighting: Weighting = "samples", aggregation: Aggregation = "mean",
                 trim: Annotated[float, Range(0, 0.5, high_open=True)] = 0.1, byzantine: NonNegativeInt = 1,
                 clip_radius: NonNegative = 0.0,
                 max_weight_share: Annotated[float, Range(0, 1, low_open=True)] = DEFAULT_WEIGHT_SHARE) -> None:
        self.weighting = weighting
        self.aggregation, self.trim = aggregation, trim
        self.byzantine, self.clip_radius, self.max_weight_share = byzantine, float(clip_radius), float(max_weight_share)
        self._history = RobustHistory()  # centered clipping's centers and radii, round to round
        self._sums: WeightedSums | None = None
        self._refused = 0

    @property  # type: ignore[override]
    def combines(self) -> Combines:
        """A weighted mean of whole blocks with the strategy's weighting, or the robust statistic
        ``aggregation`` names."""
        return Combines.weighted_mean(self.weighting) if self.aggregation == "mean" else Combines.robust(self.aggregation)

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        if self.aggregation == "mean":
            self._sums = WeightedSums(ctx.global_state, self.max_weight_share)
        else:
            self._sums = RobustStack(ctx.global_state, RobustRound(
                self.aggregation, trim=self.trim, byzantine=self.byzantine, clip_radius=self.clip_radius,
                history=self._history))
        self._refused = 0
        return super().configure(ctx)

    def weight(self, report: DeviceReport) -> float:
        """w_i for a checked report."""
        return float(report.num_samples) if self.weighting == "samples" else 1.0

    def admit(self, report: DeviceReport, ctx: RoundContext) -> str | None:
        """None to fold the report, else why it is refused."""
        return None

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None:
            raise RuntimeError(f"{type(self).__name__}: report before configure")
        reason = "only train reports are folded" if report.phase != "train" else self.admit(report, ctx)
        if reason is not None:
            self._refused += 1
            raise Refused(reason)
        self._sums.add_report(report, self.weight(report))
        return ()

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        self._sums = None
        state = sums.new_state()
        return sums.result(ctx.round, self._refused, state, extra=sums.extra())
