"""Width reduction: static HeteroFL and FjORD's ordered dropout, the baseline EmbracingFL compares
against (Lee et al., "Embracing Federated Learning", Section 4.1, appendix 6.4, Tables 2, 6, 9, 10).

Every device trains the whole depth of the model at a reduced width. A device of role ``q`` gets a
width ratio r_q (appendix 6.4: moderate clients drop 55% and weak clients 80% of the channels at
every layer, so r = 1, 0.45, 0.2 for strong, moderate, weak; Table 10 gives their capacities
1.00, 0.43, 0.18, against EmbracingFL's 1.00, ~0.4, ~0.16 in Table 1). It receives the leading slice
``x[:c_out(r), :c_in(r), ...]`` of every entry (ordered dropout keeps the *first* channels; the
model's input channels and class outputs keep their size), trains it and returns deltas of the
slice's shape. The server averages every element over the devices that hold it:

    x_{t+1}[e] = x_t[e] + sum_{i: e in S_i} w_i delta_i[e] / sum_{i: e in S_i} w_i,

with S_i device i's slice and w_i its sample count (``weighting="samples"``) or 1 (``"uniform"``).
Elements nobody holds this round keep their value. This is
:class:`~orchestrator.strategies.base.WeightedSums` with :meth:`Selection.region` (a channel
selection places a slice), so it is :class:`AveragingStrategy`'s rule per element.

BatchNorm (Section 4.5, Table 9: ResNet20 with 16 strong and 112 weak clients reaches 64% with
static BN and 19% with globally averaged statistics). HeteroFL's static BN does not track global
moving statistics: a narrow model's running statistics describe the narrow model's activations,
not the full model's, so averaging them into the global model ruins it. This strategy therefore
never folds the running statistics of reduced-width devices. What the server's evaluation of the
full-width model uses is the option ``bn``:

- ``"full"`` (default): the global running statistics are averaged over the devices that trained
  at full width this round only (the strong devices), whose statistics were computed by the
  full-width model on real local data; a round without one keeps the previous statistics. These
  are statistics of the evaluated model itself, as HeteroFL's post-hoc sBN statistics are (it
  recomputes them with the global model over training data; here the devices that run the global
  model do so on their data, and the server holds no training data). Every paper case has strong
  clients (at least 12.5%); with none at all the statistics stay at their initial values.
- ``"static"``: never fold running statistics (they stay as initialised).
- ``"global"``: average them per channel over every holder, width-reduced devices included: the
  "global BN" row of Table 9, for reproducing that ablation.

Devices: a width slice is trained with torch (training graphs are exported for full-width tails
only), so a device whose hello lists no torch runtime gets no width-reduced instruction: it is left
out of the round and listed in ``extra["skipped_no_torch"]``. Full-width devices get
``Selection.tail(0)``, the whole model, and may train with either backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

import numpy as np

from edge_sdk.algorithms.width import WIDTH_KEY  # the device side reads the ratio from this key
from orchestrator.strategies.base import (
    DEFAULT_WEIGHT_SHARE,
    AveragingStrategy,
    Combines,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    SelectionCost,
    WeightedSums,
    Weighting,
)
from orchestrator.strategies.selection import Selection
from orchestrator.values import Fraction
from profiles.planner import width_cost

__all__ = ["BN_MODES", "WIDTH_KEY", "WidthReduction"]

#: How the global BatchNorm running statistics are formed (see the module docstring).
BnMode = Literal["full", "static", "global"]
BN_MODES: tuple[str, ...] = get_args(BnMode)

#: Entry name endings of BatchNorm running statistics (torch's BatchNorm buffers).
_BN_STATS = (".running_mean", ".running_var", ".num_batches_tracked")


class WidthReduction(AveragingStrategy):
    """Static width reduction (HeteroFL / FjORD ordered dropout) on the planner's roles.

    Options: ``strong``, ``moderate``, ``weak`` (width ratios per role, in (0, 1]; appendix 6.4),
    ``bn`` (one of :data:`BN_MODES`), ``weighting``, ``model`` (the zoo model the state belongs
    to; by default recognised from the global state's entries and shapes) and ``max_weight_share``
    (:class:`AveragingStrategy`'s cap on one device's weight; 1.0: the papers' sample-weighted mean).
    """

    name = "width"
    method = "width reduction (static HeteroFL / FjORD ordered dropout)"
    #: Every device trains the whole depth: no frozen chunks are ever sent, so the server need not
    #: export and check the planned splits' chunks of each new state.
    sends_chunks = False

    @property  # type: ignore[override]
    def combines(self) -> Combines:
        """A weighted mean per element of channel slices: not a sum of whole blocks."""
        return Combines.own("a weighted mean per element over channel slices of each block")

    def __init__(self, weighting: Weighting = "samples", strong: Fraction = 1.0, moderate: Fraction = 0.45,
                 weak: Fraction = 0.2, bn: BnMode = "full", model: str = "",
                 max_weight_share: Fraction = DEFAULT_WEIGHT_SHARE) -> None:
        super().__init__(weighting=weighting, max_weight_share=max_weight_share)
        self.ratios: dict[str, float] = {"strong": strong, "moderate": moderate, "weak": weak}
        self.bn = bn
        self.model = model
        self._selections: dict[tuple[str, float], Selection] = {}
        self._skipped: list[str] = []
        self._widths: dict[str, float] = {}

    # -- configure -------------------------------------------------------------------------------
    def ratio(self, role: str) -> float | None:
        """The width ratio of a device of ``role`` (None for a role this strategy has no ratio for)."""
        return self.ratios.get(role)

    def model_name(self, global_state: Mapping[str, np.ndarray]) -> str:
        """The zoo model whose width-reduced shapes are cut (option ``model``, else recognised)."""
        if self.model:
            return self.model
        from edge_sdk.models.zoo import model_for_state  # torch: only when a round is cut

        name = model_for_state({k: tuple(v.shape) for k, v in global_state.items()})
        if name is None:
            raise ValueError("width: the global state is not that of a zoo model that takes a width "
                             "(resnet20, leaf_cnn, mnist_2nn, tiny); name it with the option model=NAME")
        self.model = name
        return name

    def selection(self, global_state: Mapping[str, np.ndarray], width: float) -> Selection:
        """The payload selection of a device at ``width``: the whole model (``tail(0)``) at full
        width, else each entry cut to the shape it has in the model built at ``width``. One object
        per width, so devices of one role share one payload."""
        model = self.model_name(global_state)
        key = (model, width)
        sel = self._selections.get(key)
        if sel is None:
            if width == 1.0:
                sel = Selection.tail(0)
            else:
                from edge_sdk.models.zoo import width_shapes  # torch: only when a round is cut

                shapes = width_shapes(model, width)
                bad = sorted(n for n in set(shapes) | set(global_state)
                             if n not in shapes or n not in global_state
                             or len(shapes[n]) != global_state[n].ndim
                             or any(not 0 < s <= d for s, d in zip(shapes[n], global_state[n].shape)))
                if bad:
                    raise ValueError(f"width: {model} at width {width} is not a slice of the global state at "
                                     f"{bad[:3]}")
                # Scalars (BatchNorm's num_batches_tracked) have no channels: they are sent whole.
                sel = Selection.of_channels(0, {n: s for n, s in shapes.items() if len(s)})
            self._selections[key] = sel
        return sel

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._sums = WeightedSums(ctx.global_state)
        self._refused, self._skipped, self._widths = 0, [], {}
        out = []
        for device_id in ctx.sample():
            info = ctx.devices[device_id]
            width = self.ratio(info.role)
            if width is None:
                continue  # a role without a ratio (the planner names strong, moderate, weak only)
            if width < 1.0 and info.runtimes and "torch" not in info.runtimes:
                self._skipped.append(device_id)  # a width slice trains with torch only
                continue
            self._widths[device_id] = width
            out.append(Instruction(device_id, "train", self.selection(ctx.global_state, width),
                                   config={WIDTH_KEY: width} if width < 1.0 else {}))
        return out

    def selection_cost(self, instruction: Instruction, selection: Selection, model: str) -> SelectionCost | None:
        """A channel slice is the model built at the instruction's width (``config["width"]``; a
        channel selection without a valid one counts at full width), trained with torch only
        (graphs are exported for full-width tails), and must cut ``model`` to its shapes at that
        width: what the device builds and what the budget check counts (profiles.planner.width_cost)."""
        if selection.kind != "channels":
            return None
        w = instruction.config.get(WIDTH_KEY, 1.0)
        ok = isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 < float(w) <= 1.0
        width = float(w) if ok else 1.0
        if width < 1.0:
            from edge_sdk.models.zoo import width_shapes

            shapes = width_shapes(model, width)
            wrong = sorted(n for n, s in selection.channels.items() if shapes.get(n) != tuple(s))
            wrong += sorted(n for n, s in shapes.items() if s and n not in selection.channels)  # scalars go whole
            if wrong:
                raise ValueError(f"a channel selection at width {width} must cut {model} to its shapes at that "
                                 f"width; {wrong[:3]} differ")
        return SelectionCost(width_cost(model, width))

    # -- fold ------------------------------------------------------------------------------------
    def admit(self, report: DeviceReport, ctx: RoundContext) -> str | None:
        if report.trained[0] != 0 or report.selection.split != 0:
            return f"width reduction trains the whole depth; the report trained {tuple(report.trained)}"
        if report.selection.kind not in ("tail", "channels"):
            return f"width reduction sends channel slices, not {report.selection.kind} selections"
        return None

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None:
            raise RuntimeError("width: report before configure")
        reason = "only train reports are folded" if report.phase != "train" else self.admit(report, ctx)
        if reason is not None:
            self._refused += 1
            raise Refused(reason)
        weight = self.weight(report)
        full = report.selection.kind == "tail"
        # Section 4.5: running statistics of a narrow model are never folded ("static BN"), and
        # with bn="full" only full-width devices' are; with bn="global" every holder's (Table 9).
        fold_stats = self.bn == "global" or (self.bn == "full" and full)
        for name, delta in report.tensors.items():
            if name.endswith(_BN_STATS) and not fold_stats:
                continue
            if ctx.global_state[name].dtype.kind != "f":
                self._sums.add(name, delta, weight)  # a counter: whole, the largest any holder reached
                continue
            w = report.weight_of(name, weight)  # scaled by the block's direction trust (orchestrator.aggregation.trust)
            if w > 0:
                self._sums.add(name, delta, w, report.selection.region(name))  # the slice it trained
        self._sums.note(report)
        return ()

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        self._sums = None
        folded = set(sums.devices)
        widths: dict[str, int] = {}
        for device_id, w in self._widths.items():
            if device_id in folded:
                widths[f"{w:g}"] = widths.get(f"{w:g}", 0) + 1
        extra: dict[str, object] = {
            "method": self.method, "strategy": self.name, "bn": self.bn,
            "width_ratios": dict(self.ratios), "devices_per_width": widths,
            "skipped_no_torch": sorted(self._skipped),
        }
        return sums.result(ctx.round, self._refused, extra=extra)
