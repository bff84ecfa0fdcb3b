"""The parts report intake is assembled from, each one small interface, and what they hand each other.

A report goes through four parts (docs/architecture.md, "Report intake"), which the assembly
(:mod:`orchestrator.aggregation.assembly`) picks from their tables by the settings and the strategy:

1. its **upload format** (:class:`UploadFormat`, table ``UPLOAD_FORMATS``): the bound on the upload
   before its first byte, the decoding and its value checks, the check against the instruction
   (plain: decoded tensors through the configured update codec; masked: secure aggregation's ring words);
2. a **chain of bounds** (:class:`Bound`, table ``BOUNDS``): each may change the update it sees
   (clip it), weigh it (direction trust), refuse it, or, where the server cannot see it, name the
   clip the device applies itself;
3. the **combiner** (:class:`Combiner`, table ``COMBINERS``): the strategy's streaming fold
   (``on_report`` then ``aggregate``), or secure block sums that apply the strategy's declared mean
   rule (``Strategy.combines``);
4. the **release** (:class:`Release`): the combiner's result as it is, or a privacy mechanism's noised
   sums, accounted (:mod:`orchestrator.aggregation.privacy.release`).

What they share is here: :class:`Pending` (one report on its way through the bounds) and
:class:`BlockSums` (a combiner's sums per block, for a mechanism to release).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from edge_sdk import protocol as p
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Session, Work
from orchestrator.strategies import DeviceReport, RoundContext, RoundResult
from orchestrator.strategies.selection import Selection

__all__ = ["BlockSums", "Bound", "Combiner", "Pending", "Release", "Tensors", "UploadFormat", "registered_samples",
           "report_info"]

Tensors = Mapping[str, object]


def registered_samples(config: ServerConfig, session: Session) -> int:
    """The sample count a device's reports may weigh: what it declared when it registered, capped by
    the operator's policy (``max_device_samples``, and the count fixed at its enrollment), never what
    an update claims."""
    limit = config.max_device_samples
    if session.enrolled_samples is not None:
        limit = min(limit, session.enrolled_samples)
    return min(session.hello.num_samples, limit)


def report_info(r: DeviceReport) -> dict[str, object]:
    """What the journal keeps of a folded or refused report."""
    return {"phase": r.phase, "role": r.role, "trained": list(r.trained), "num_samples": r.num_samples,
            "loss_before": r.metrics.get("loss_before"), "loss_after": r.metrics.get("loss_after"),
            "selection": r.selection.kind, "metrics": dict(r.metrics)}


@dataclass(frozen=True)
class Pending:
    """One checked report on its way through the bounds to the combiner: its tensors as the bounds
    left them, the weight it may have (``samples``: never more than the device registered), what the
    bounds changed (``changed``: the journal's ``bounded``), what they scored (``scored``: journal
    fields of their own, as ``trust``), the per-entry factors on its weight (``entry_weights``), and a
    bound's refusal. Each bound returns a new one (:meth:`with_`): none writes another's."""

    device_id: str
    selection: Selection
    tensors: Tensors
    samples: int
    changed: Mapping[str, object] = field(default_factory=dict)
    scored: Mapping[str, object] = field(default_factory=dict)
    entry_weights: Mapping[str, float] = field(default_factory=dict)
    refusal: str | None = None

    def with_(self, *, changed: Mapping[str, object] | None = None, scored: Mapping[str, object] | None = None,
              **fields: object) -> Pending:
        """This report with ``fields`` replaced and ``changed`` / ``scored`` entries added."""
        return replace(self, changed={**self.changed, **(changed or {})}, scored={**self.scored, **(scored or {})},
                       **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class BlockSums:
    """A round's sums per block, revealed whole (secure aggregation): block b's ``values`` are the sum of
    its cohort's clipped (and weighted) updates, flat in the order of ``entries[b]`` (with ``shapes``),
    ``cohorts[b]`` how many updates it summed, and ``multipliers[b]`` the noise multiplier the devices'
    shares gave the sum (0: none added)."""

    values: Mapping[int, np.ndarray]
    cohorts: Mapping[int, int]
    multipliers: Mapping[int, float]
    entries: Mapping[int, list[str]]
    shapes: Mapping[str, tuple[int, ...]]

    def split(self, block: int, divisor: float) -> dict[str, np.ndarray]:
        """Block ``block``'s sum over ``divisor``, as the entries it holds."""
        from edge_sdk.secagg.layout import split_vector  # secure aggregation's (cryptography loads with it)

        return split_vector(self.values[block] / divisor, self.entries[block], self.shapes)


class UploadFormat(ABC):
    """How an update travels from the device: bounded before its first byte, decoded with its values
    checked, and checked against the instruction it answers (names, shapes, the trained range)."""

    name: ClassVar[str]
    #: Whether the server sees each update in the clear (a bound that reads it is available).
    sees_updates: ClassVar[bool]
    #: Whether an upload a dropped connection cut waits for the device's reconnect (else it is a dropout).
    resumable: ClassVar[bool]
    #: The combiner of ``COMBINERS`` that takes this format's uploads.
    combiner: ClassVar[str]
    #: Whether its combiner reveals sums the bounds that read updates apply to (secure groups' sums).
    bounded_sums: ClassVar[bool] = False

    @abstractmethod
    def bound(self, session: Session, work: Work | None) -> int:
        """The most bytes an update answering ``work`` may have (None: a late report, bounded by the
        device's planned tail): nothing larger is received."""

    @abstractmethod
    def decode(self, data: bytes) -> Tensors:
        """The upload's tensors, its values checked (a ``ProtocolError`` for anything malformed)."""

    @abstractmethod
    def check(self, msg: p.Report, work: Work, tensors: Tensors, state: Mapping[str, np.ndarray]) -> None:
        """Raise ``ProtocolError`` unless the report is what ``work`` asked for."""


class Bound(ABC):
    """One bound of a report's influence. The chain runs in order on every checked report before the
    combiner takes it; each bound changes only what it owns of the :class:`Pending` report."""

    name: ClassVar[str]

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """What the round's reports are measured against (in a worker thread, while devices train)."""

    @abstractmethod
    def apply(self, pending: Pending) -> Pending:
        """One report bounded, weighed, scored or refused (before the combiner sees it)."""

    def taken(self, pending: Pending) -> None:
        """The combiner took the report as the chain left it."""

    def discard(self, device_id: str) -> None:
        """The combiner refused the report: what the bound noted of it does not count."""

    def finish(self, ctx: RoundContext, result: RoundResult) -> RoundResult:
        """The round's result as this bound leaves it (what it says of the round)."""
        return result

    def instruction_config(self, work: Work) -> Mapping[str, p.Scalar]:
        """What an instruction tells the device of this bound (a clip the device applies itself)."""
        return {}

    def end_round(self) -> None:
        """The round is over, committed or not."""

    def commit(self, round: int) -> None:
        """Round ``round``'s model was committed: what the bound learnt of its reports may be kept."""


class Combiner(ABC):
    """What turns a round's taken reports into its result. Besides folding it owns the round's
    conversation with the devices beyond reports (a secure round's stages): the connection hooks
    below have defaults for a combiner that has none."""

    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """Round ``round`` opens (on the event loop: quick)."""

    def instruction_config(self, work: Work) -> Mapping[str, p.Scalar]:
        """What an instruction of the round carries for the combiner (a secure round's scope)."""
        return {}

    def turned_away(self, session: Session, msg: p.Report) -> Folded | None:
        """A report the combiner does not take now, though the round awaits it (not in a secure
        round's cohort): its answer, before any check. None: it is checked and bounded, then taken."""
        return None

    @abstractmethod
    def take(self, session: Session, msg: p.Report, work: Work, pending: Pending, ctx: RoundContext) -> Folded:
        """Fold a checked, bounded report, or refuse it (``Folded(accepted=False)``)."""

    async def settle(self, ctx: RoundContext) -> None:
        """The round stopped taking reports: what the combiner needs from the devices before its aggregate."""

    @abstractmethod
    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """The round's result."""

    def block_sums(self) -> BlockSums | None:
        """The round's sums per block where the combiner reveals them whole (secure aggregation), else None."""
        return None

    def sum_updates(self) -> list[Pending]:
        """After :meth:`settle`: the sums the combiner reveals, each as one update for the bounds that
        read updates (a secure group's mean over its revealed blocks); none here."""
        return []

    def take_sum(self, pending: Pending) -> None:
        """One of :meth:`sum_updates` as the bounds left it (clipped, normalised, weighed or refused)."""

    def end_round(self) -> None:
        """The round is over, committed or not."""

    # -- the conversation beyond reports ---------------------------------------------------------
    async def on_message(self, session: Session, msg: p.Message) -> None:
        """A message of the device that is neither a fetch nor a report (a secure round's SecAgg*)."""
        raise p.ProtocolError("unexpected", f"a device may not send {msg.TYPE} here")

    def returned(self, session: Session) -> None:
        """A device came back (reconnected and welcomed again), before its round resumes."""

    def dropped(self, device_id: str) -> None:
        """A device's connection ended."""

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        """A frame of the device failed the codec's checks before any part saw it; the connection closes."""


class Release:
    """What leaves the round: here the combiner's result as it is (no privacy). A private release
    (:class:`~orchestrator.aggregation.privacy.release.PrivateRelease`) noises and accounts it."""

    def begin_round(self) -> None:
        """A round opens; a release that stops the run (a spent privacy budget) raises here."""

    async def settle(self, ctx: RoundContext, sums: BlockSums | None) -> None:
        """After the combiner settled, before the aggregate: costly work the release can do ahead."""

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None) -> RoundResult:
        """The round's result as released."""
        return result

    def ends_run(self) -> bool:
        """Whether the round just released is the run's last before its planned rounds."""
        return False

    def excluded(self) -> frozenset[str]:
        """Devices a new round may not select (DP-FTRL: each device once per tree)."""
        return frozenset()

    def end_round(self) -> None:
        """The round is over, committed or not."""
