"""What a privacy mechanism is: how a round's clipped sums become a noised release, and what the
accountant is told of it (docs/security.md, "Privacy mechanisms").

A mechanism (:class:`PrivacyMechanism`) does four things, and owns no ledger: the one owner of a run's
ledger, :class:`~orchestrator.aggregation.privacy.release.PrivateRelease`, asks it each round.

1. **Plan**: for the run's cohort, the noise multiplier, the delta and the per-block clips it is
   planned with (``plan``; :func:`~orchestrator.aggregation.privacy.central.plan_central` by default).
2. **Clip**: on plain uploads the server clips each update per block before summing it
   (:meth:`server_clip`, a step of the report's bounds that also sums); on masked uploads each device
   clips its own (:meth:`device_clip`) and every device weighs 1 (:attr:`uniform`), so that one
   device's sensitivity is its clip.
3. **Noise**: the sums noised by the server (:meth:`release`), or, under secure aggregation, the noise
   shares each device adds, sized from the cohort that advertised keys (:meth:`noise_shares`).
4. **The accountant's event**: which blocks a round released and at what multiplier (:meth:`releases`),
   which the ledger composes.

The mechanisms, by name (``orchestrator.aggregation.privacy.MECHANISMS``; ``dp_mechanism``): ``gaussian``
(central Gaussian noise on the server, :mod:`.central`) and ``discrete_gaussian`` (the devices' discrete
Gaussian shares inside the secure round, :mod:`.distributed`). One of your own is a module with a
subclass plus one table row, or ``@register_mechanism("name")`` on the class, or
``dp_mechanism = "package.module:Class"`` with neither.

Where the next mechanisms plug in: DP-FTRL (tree-aggregated noise, state across rounds, accounted
without sampling) keeps its tree in :meth:`state` / :meth:`restore` (journaled with the ledger every
round) and builds its own event in :meth:`releases`; per-block noise multipliers are each block's
:class:`~orchestrator.aggregation.privacy.accountant.BlockRelease` in :meth:`releases` and its noise in
:meth:`release`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from edge_sdk.references import is_reference, load_reference
from orchestrator.aggregation.pipeline import BlockSums, Bound
from orchestrator.aggregation.privacy import MECHANISMS
from orchestrator.aggregation.privacy.accountant import BlockRelease, RoundEvent
from orchestrator.aggregation.privacy.calibrate import allocate_multipliers
from orchestrator.aggregation.privacy.central import CentralPlan, plan_central
from orchestrator.config import ServerConfig
from orchestrator.strategies import RoundContext, RoundResult

if TYPE_CHECKING:  # the secure round's record: cryptography loads only with secure aggregation
    from orchestrator.aggregation.secure.round import NoisePlan

__all__ = ["MECHANISMS", "PrivacyMechanism", "mechanism_class", "register_mechanism"]

M = TypeVar("M", bound=type["PrivacyMechanism"])


class PrivacyMechanism(ABC):
    """One way of adding noise to a round's clipped sums (see the module docstring).

    ``blocks``: the model's block names in order; ``block_of``: each state entry's block index."""

    #: The name it is registered under.
    name: ClassVar[str] = ""
    #: Where the noise is added, as the ledger journals it (a resumed run must keep it): ``"central"``
    #: (by the server) or ``"distributed"`` (by the devices); a mechanism of your own: its name.
    mode: ClassVar[str] = ""
    #: The upload formats it releases from: ``"plain"`` (the server sees each clipped update) and/or
    #: ``"masked"`` (secure aggregation: the server sees block sums only).
    formats: ClassVar[frozenset[str]] = frozenset()
    #: Why it does not release from the other formats (the refusal's reason), if it says.
    formats_why: ClassVar[str] = ""

    def __init__(self, config: ServerConfig, blocks: Sequence[str], block_of: Mapping[str, int]) -> None:
        self.config, self.blocks, self.block_of = config, tuple(blocks), dict(block_of)
        self.plan: CentralPlan = plan_central(config, len(self.blocks))

    def bind(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """The model's floating-point entries and their shapes, before the first round: each block's
        coordinates d_b, which the per-block allocation weighs (:meth:`block_multipliers`)."""
        sizes = dict.fromkeys(range(len(self.blocks)), 0)
        for name, shape in shapes.items():
            sizes[self.block_of[name]] += int(np.prod(shape, dtype=np.int64))
        self.sizes = sizes

    def block_multipliers(self, expected: Mapping[int, float]) -> dict[int, float]:
        """Each released block's multiplier z_b (block -> expected cohort m_b in ``expected``):
        z sqrt(L) each (``dp_allocation = "uniform"``), or the allocation that minimises the noise on the
        mean update for the same model multiplier z (``"utility"``,
        :func:`~orchestrator.aggregation.privacy.calibrate.allocate_multipliers`, weights d_b C_b^2 / m_b^2)."""
        if self.config.dp_allocation == "uniform" or not expected:
            return {b: self.plan.block_multiplier for b in expected}
        c = self.plan.block_clip
        z = allocate_multipliers(self.plan.multiplier, {self.blocks[b]: getattr(self, "sizes", {}).get(b, 0) * c**2 / m**2
                                                        for b, m in expected.items()})
        return {b: z[self.blocks[b]] for b in expected}

    @property
    def journal_mode(self) -> str:
        return self.mode or self.name

    # -- clipping ---------------------------------------------------------------------------------
    #: Whether every device weighs 1 in a block's sum (a weight per sample count would let one
    #: device's weight, and so its sensitivity, grow).
    uniform: ClassVar[bool] = True

    def server_clip(self) -> Bound | None:
        """On plain uploads: the step of the report's bounds that clips each update per block and sums
        the clipped updates the strategy took (None: this mechanism takes masked uploads only)."""
        return None

    def device_clip(self) -> float:
        """On masked uploads: the clip each device applies to each block before masking it, C_b."""
        return self.plan.block_clip

    def noise_shares(self, cohorts: Mapping[int, int]) -> NoisePlan | None:
        """On masked uploads: the noise each device adds, from each block's advertised cohort
        (block -> devices that advertised keys and train it). None: none."""
        return None

    # -- the release ------------------------------------------------------------------------------
    @abstractmethod
    def releases(self, sums: BlockSums | None, expected: Mapping[int, float]) -> dict[int, BlockRelease]:
        """Block -> what the round releases of it, as the accountant takes it, for the blocks whose
        expected cohort is ``expected`` (block -> m_b) and, under masking, the revealed ``sums``.
        Empty: nothing is released this round."""

    @abstractmethod
    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None, expected: Mapping[int, float],
                released: Mapping[int, BlockRelease]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        """The round's state with each released block's noised sum over its expected cohort, and what
        the round's privacy metrics say of it (beyond the ledger's)."""

    def withheld(self, ctx: RoundContext, result: RoundResult) -> dict[str, np.ndarray]:
        """The round's state when it releases no block."""
        return result.state

    # -- the accountant's event ------------------------------------------------------------------------
    @property
    def sampling(self) -> str:
        """How the ledger takes the rounds: the run's ``dp_sampling`` (DP-FTRL: its trees)."""
        return self.config.dp_sampling

    def event(self, rate: float, fleet: int, cohort: int, blocks: Mapping[str, BlockRelease]) -> RoundEvent:
        """The round as the accountant takes it: Poisson at ``rate``, or ``cohort`` of the ``fleet``."""
        if self.config.dp_sampling == "poisson":
            return RoundEvent(rate, blocks)
        return RoundEvent.fixed(fleet, cohort, blocks)

    def excluded(self) -> frozenset[str]:
        """Devices the next round's selection must leave out (DP-FTRL: those in the open tree)."""
        return frozenset()

    # -- state across rounds ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the mechanism keeps across rounds, journaled with the ledger (adaptive clips)."""
        return {}

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Continue from what :meth:`state` journaled with a resumed run's last completed round."""

    def end_round(self) -> None:
        """The round is over, committed or not."""


def register_mechanism(name: str) -> Callable[[M], M]:
    """Class decorator: register a :class:`PrivacyMechanism` under ``name`` (``dp_mechanism = name``)."""
    def register(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, PrivacyMechanism)):
            raise TypeError(f"{cls!r} is not a PrivacyMechanism subclass")
        if name in MECHANISMS and MECHANISMS[name] != f"{cls.__module__}:{cls.__qualname__}":
            raise ValueError(f"a privacy mechanism named {name!r} is registered already: {MECHANISMS[name]}")
        MECHANISMS[name] = f"{cls.__module__}:{cls.__qualname__}"
        return cls
    return register


def mechanism_class(name: str) -> type[PrivacyMechanism]:
    """The mechanism registered as ``name``, or ``package.module:Class`` for one of your own."""
    reference = name if is_reference(name) else MECHANISMS.get(name)
    if reference is None:
        raise ValueError(f"unknown privacy mechanism {name!r}; known: {', '.join(MECHANISMS)}, or package.module:Class")
    cls = load_reference(reference, "privacy mechanism")
    if not (isinstance(cls, type) and issubclass(cls, PrivacyMechanism)):
        raise ValueError(f"privacy mechanism {name!r} is not a PrivacyMechanism subclass")
    return cls
