"""The privacy ledger: (epsilon, delta) per block and for the model after every round, with ``dp-accounting``.

What a round releases. A device is in a round with probability ``q`` (Poisson sampling of the
fleet, each device independently; or a fixed-size cohort of K of the N devices, see below). Each
block b whose sum the round released was clipped per device to C_b and noised with N(0, (z_b C_b)^2)
per coordinate: a Gaussian mechanism of noise multiplier z_b. With adaptive clipping (Andrew et al.,
2021) the round also released a noised count per block, whose sensitivity is 1/2 (centred bits) and
whose noise has standard deviation sigma_c: a Gaussian of multiplier 2 sigma_c.

Per block. Only devices whose split is at most b train block b, and each of them is in the round
with probability q, so block b's release is a Poisson-sampled Gaussian with rate q (the block's
expected cohort over the devices able to train it) and the multiplier of everything released about
it, z_b' = (z_b^-2 + (2 sigma_c)^-2)^-1/2 (Gaussians on the same sample compose into one Gaussian
whose inverse squared multiplier is the sum of theirs: McMahan, Andrew et al., 2018, "A General
Approach to Adding Differential Privacy to Iterative Training Procedures", Section 3;
``dp_accounting``'s RDP accountant does the same for composed Gaussians). Devices outside block b's
population are not in its release at all: its epsilon is for the devices that train it.

For the model. One device's data reaches every block it trains, with the same sampling coin, so the
device's round is one sampled Gaussian with the combined multiplier of all its blocks. Under nested
partial training the device at the smallest split trains every released block, so the model's
epsilon is the combination of every released block's multiplier each round. That is larger than the
worst block's epsilon: a strong device of an L-block model released with equal multipliers z_b has
z = z_b / sqrt(L). (Calibrate z for the model and give each block z sqrt(L): McMahan et al.'s
per-layer clipping with equal noise on every layer, ``orchestrator.aggregation.privacy.calibrate``.)

Accountant. Privacy loss distributions (``dp_accounting.pld.PLDAccountant``, pessimistic estimate,
discretisation 1e-3) by default: an upper bound, tighter than RDP (q = 0.1, z = 1, 100 rounds,
delta 1e-5: 7.05 against 7.90) at 0.1-0.3 s per evaluation on the shared 2-core machine (the
default discretisation, 1e-4, gives the same epsilon to 1e-3 and takes 10 times as long). RDP
(``rdp.RdpAccountant``) on request, and for fixed-size sampling, which the PLD accountant does not
support: a cohort of exactly K of N devices is ``SampledWithoutReplacementDpEvent`` under the
replace-one relation (Wang, Balle, Kasiviswanathan, 2019), where replacing a device moves a clipped
sum by up to 2 C: the event's multiplier is z / 2.

Without sampling: DP-FTRL's tree aggregation (``sampling = "tree"``, the ``ftrl`` mechanism,
:mod:`orchestrator.aggregation.privacy.ftrl`). No cohort is assumed secret or uniformly drawn; each
device takes part at most once per tree (a restart every b rounds), and each tree of T rounds
releases its prefix sums through the nodes of a binary tree, each noised with N(0, (z C)^2): one
device's contribution reaches ceil(log2(T + 1)) nodes, a Gaussian of multiplier z composed that
many times (Kairouz et al., 2021, "Practical and Private (Deep) Learning without Sampling or
Shuffling", Theorem 4.1 and Appendix D). ``dp_accounting``'s ``SingleEpochTreeAggregationDpEvent``
per tree, composed over the trees, in its RDP accountant under the replace-with-a-special-record
relation it requires (:func:`tree_epsilon`). A round's event carries its step in its tree
(``RoundEvent.tree_step``, 1 for a tree's first round).

State. The ledger is its list of rounds, plain JSON (:meth:`PrivacyLedger.to_json`); epsilon is a
pure function of that list (consecutive equal rounds are composed as one self-composition, left to
right), so a resumed run rebuilt from the JSON reports exactly the epsilons of an uninterrupted one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dp_accounting
from dp_accounting import pld, rdp

from orchestrator.aggregation.privacy import ACCOUNTANTS, SAMPLINGS

__all__ = [
    "ACCOUNTANTS",
    "SAMPLINGS",
    "BlockRelease",
    "LedgerError",
    "PrivacyLedger",
    "RoundEvent",
    "Spent",
    "combined_multiplier",
    "epsilon_for",
    "fresh_accountant",
    "sampled_gaussian",
    "tree_epsilon",
    "tree_event",
    "TREE",
]

#: PLD discretisation of the privacy loss (dp_accounting's default is 1e-4; see the module docstring).
PLD_INTERVAL = 1e-3
#: RDP orders: dp_accounting's defaults from 2 up. Its fractional orders under 2 often fail to
#: converge (logged and dropped each time); they lower epsilon only where it exceeds about 20
#: (q = 0.1, 100 rounds, delta 1e-5: z = 0.7 gives 16.44 either way, z = 0.6 gives 24.18 against 23.35).
RDP_ORDERS = tuple(o for o in rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS if o >= 2)
STATE_VERSION = 1
#: The ledger's sampling for DP-FTRL's tree aggregation: no sampling, participation once per tree.
TREE = "tree"


class LedgerError(ValueError):
    """A ledger setting, a round or a saved state that cannot be accounted."""


def combined_multiplier(multipliers: Iterable[float]) -> float:
    """The multiplier of Gaussians released on the same sample, as one Gaussian:
    (sum_i z_i^-2)^-1/2 (infinite multipliers release nothing and drop out)."""
    total = sum(z**-2 for z in multipliers if math.isfinite(z))
    return math.inf if total == 0 else total**-0.5


def _positive(value: Any, what: str, *, infinite: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise LedgerError(f"{what} must be a number, got {value!r}") from None
    if not (x > 0 and (infinite or math.isfinite(x))):
        raise LedgerError(f"{what} must be a finite number > 0, got {value!r}")
    return x


@dataclass(frozen=True)
class BlockRelease:
    """What a round released about one block: its sum's noise multiplier (noise standard deviation
    over the block's clip) and, with adaptive clipping, the standard deviation of the noise on its
    count of devices within the clip (0: no count released)."""

    noise_multiplier: float
    count_stddev: float = 0.0

    def __post_init__(self) -> None:
        _positive(self.noise_multiplier, "a block's noise multiplier")
        if not (self.count_stddev >= 0 and math.isfinite(self.count_stddev)):
            raise LedgerError(f"a count's noise must be a finite number >= 0, got {self.count_stddev!r}")

    @property
    def multiplier(self) -> float:
        """Everything released about the block as one Gaussian: the sum, and the count whose
        sensitivity is 1/2 (multiplier 2 sigma_c)."""
        count = 2.0 * self.count_stddev if self.count_stddev > 0 else math.inf
        return combined_multiplier((self.noise_multiplier, count))


@dataclass(frozen=True)
class RoundEvent:
    """One round as the accountant sees it: each device's chance of being in it (``q``; for
    fixed-size sampling the ``fleet`` size N and the ``cohort`` K with q = K / N) and the release
    of every block whose sum it published (blocks no device trained are absent)."""

    q: float
    blocks: Mapping[str, BlockRelease]
    fleet: int | None = None
    cohort: int | None = None
    tree_step: int | None = None  # DP-FTRL: the round's step in its tree (1: a new tree); None: sampled

    def __post_init__(self) -> None:
        if not (0 < self.q <= 1):
            raise LedgerError(f"the sampling rate must be in (0, 1], got {self.q!r}")
        if not self.blocks:
            raise LedgerError("a round that released no block has nothing to account")
        if self.tree_step is not None and (isinstance(self.tree_step, bool) or not isinstance(self.tree_step, int)
                                           or self.tree_step < 1):
            raise LedgerError(f"a round's step in its tree must be an integer >= 1, got {self.tree_step!r}")

    @classmethod
    def fixed(cls, fleet: int, cohort: int, blocks: Mapping[str, BlockRelease]) -> RoundEvent:
        """A round whose cohort is exactly ``cohort`` of the ``fleet``'s devices, drawn uniformly."""
        if not 1 <= cohort <= fleet:
            raise LedgerError(f"a cohort of {cohort} out of {fleet} devices is not a sample")
        return cls(cohort / fleet, blocks, fleet, cohort)

    @property
    def multiplier(self) -> float:
        """The model's multiplier: every released block, as the device that trains them all sees it."""
        return combined_multiplier(b.multiplier for b in self.blocks.values())

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"q": self.q, "blocks": {
            name: {"z": b.noise_multiplier, **({"count_stddev": b.count_stddev} if b.count_stddev else {})}
            for name, b in self.blocks.items()}}
        if self.fleet is not None:
            data.update(fleet=self.fleet, cohort=self.cohort)
        if self.tree_step is not None:
            data["tree_step"] = self.tree_step
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundEvent:
        if not isinstance(data, Mapping) or not isinstance(data.get("blocks"), Mapping):
            raise LedgerError(f"a round must be an object with blocks, got {data!r}")
        blocks = {}
        for name, b in data["blocks"].items():
            if not isinstance(b, Mapping):
                raise LedgerError(f"block {name!r} of a round must be an object, got {b!r}")
            count = b.get("count_stddev", 0.0)
            if not isinstance(count, (int, float)) or isinstance(count, bool):
                raise LedgerError(f"block {name!r}'s count_stddev must be a number, got {count!r}")
            blocks[str(name)] = BlockRelease(_positive(b.get("z"), f"block {name!r}'s z"), float(count))
        if data.get("fleet") is not None:
            return cls.fixed(int(data["fleet"]), int(data["cohort"]), blocks)
        return cls(_positive(data.get("q"), "q"), blocks, tree_step=data.get("tree_step"))


@dataclass(frozen=True)
class Spent:
    """Privacy spent so far: epsilon at ``delta`` for the model (every device, whatever it trains)
    and per block (the devices that train it), after ``rounds`` rounds."""

    epsilon: float
    delta: float
    blocks: dict[str, float]
    rounds: int
    accountant: str
    sampling: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a round's metrics, the journal, the run summary and model metadata."""
        return {"epsilon": self.epsilon, "delta": self.delta, "blocks": dict(self.blocks),
                "rounds": self.rounds, "accountant": self.accountant, "sampling": self.sampling}


def sampled_gaussian(q: float, z: float, fleet: int | None, cohort: int | None) -> dp_accounting.DpEvent:
    if fleet is None:
        return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    # Replace-one: a device replaced moves a clipped sum by 2 C, so the multiplier is z / 2.
    return dp_accounting.SampledWithoutReplacementDpEvent(fleet, cohort, dp_accounting.GaussianDpEvent(z / 2))


def fresh_accountant(accountant: str, sampling: str) -> dp_accounting.PrivacyAccountant:
    """An empty accountant of the given kind for the given sampling."""
    if accountant not in ACCOUNTANTS:
        raise LedgerError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    if sampling == "fixed":
        return rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.REPLACE_ONE)
    if accountant == "rdp":
        return rdp.RdpAccountant(RDP_ORDERS)
    return pld.PLDAccountant(value_discretization_interval=PLD_INTERVAL)


def epsilon_for(noise_multiplier: float, q: float, rounds: int, delta: float, *, accountant: str = "pld",
                fleet: int | None = None) -> float:
    """Epsilon after ``rounds`` equal rounds (Poisson rate ``q``; or, with ``fleet``, cohorts of
    round(q * fleet) devices), for one Gaussian of ``noise_multiplier``."""
    cohort = None if fleet is None else max(1, round(q * fleet))
    acct = fresh_accountant(accountant, "poisson" if fleet is None else "fixed")
    acct.compose(sampled_gaussian(q, noise_multiplier, fleet, cohort), rounds)
    return float(acct.get_epsilon(delta))


def tree_event(multiplier: float, trees: Iterable[int]) -> dp_accounting.DpEvent:
    """The trees of DP-FTRL (each tree's number of rounds, ``trees``), every node noised at
    ``multiplier``, a device in each tree at most once: one ``SingleEpochTreeAggregationDpEvent`` per
    tree, composed (Kairouz et al., 2021, Appendix D)."""
    return dp_accounting.ComposedDpEvent([dp_accounting.SingleEpochTreeAggregationDpEvent(multiplier, int(t))
                                          for t in trees])


def tree_accountant() -> rdp.RdpAccountant:
    """RDP at dp_accounting's default orders (a tree's RDP is linear in the order, alpha d / 2 z^2:
    no order fails to converge), under the relation its tree events require."""
    return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)


def tree_epsilon(multiplier: float, trees: Iterable[int], delta: float) -> float:
    """Epsilon at ``delta`` of DP-FTRL's trees (:func:`tree_event`)."""
    acct = tree_accountant()
    acct.compose(tree_event(multiplier, trees))
    return float(acct.get_epsilon(delta))


_Key = tuple[float, float, "int | None", "int | None"]  # (q, multiplier, fleet, cohort) of one round in one view


@dataclass
class _View:
    """One sequence of sampled-Gaussian rounds (the model's, or one block's), folded left to right:
    ``prefix`` has composed every run of equal rounds but the last, which stays open to grow."""

    accountant: str
    sampling: str
    runs: list[list[Any]] = field(default_factory=list)  # [key, count]
    prefix: dp_accounting.PrivacyAccountant | None = None

    def add(self, key: _Key) -> None:
        if self.runs and self.runs[-1][0] == key:
            self.runs[-1][1] += 1
            return
        if self.prefix is None:
            self.prefix = fresh_accountant(self.accountant, self.sampling)
        elif self.runs:
            last, count = self.runs[-1]
            self.prefix.compose(sampled_gaussian(*last), count)
        self.runs.append([key, 1])

    def epsilon(self, delta: float, extra: tuple[_Key, ...] = ()) -> float:
        """Epsilon of the view (with more rounds ``extra``, not recorded)."""
        view = copy.deepcopy(self) if extra else self
        for key in extra:
            view.add(key)
        if not view.runs:
            return 0.0
        acct = copy.deepcopy(view.prefix)
        last, count = view.runs[-1]
        acct.compose(sampled_gaussian(*last), count)
        return float(acct.get_epsilon(delta))


@dataclass
class _TreeView:
    """One sequence of DP-FTRL rounds (the model's, or one block's) as its trees: ``runs`` holds
    [multiplier, rounds] per tree. A round at step 1 (or at a step not past the last tree's) starts
    a tree; a later step extends the last tree to it (a block not released at a step still had its
    node noised: the tree's size is what counts)."""

    runs: list[list[Any]] = field(default_factory=list)

    def add(self, key: tuple[float, int]) -> None:
        z, step = key
        if not self.runs or step <= self.runs[-1][1]:
            self.runs.append([z, step])
            return
        if z != self.runs[-1][0]:
            raise LedgerError(f"a tree's nodes are noised at one multiplier: {self.runs[-1][0]:g}, then {z:g}")
        self.runs[-1][1] = step

    def epsilon(self, delta: float, extra: tuple[tuple[float, int], ...] = ()) -> float:
        view = copy.deepcopy(self) if extra else self
        for key in extra:
            view.add(key)
        if not view.runs:
            return 0.0
        acct = tree_accountant()
        for z, steps in view.runs:
            acct.compose(tree_event(z, [steps]))
        return float(acct.get_epsilon(delta))


class PrivacyLedger:
    """Every round's release, and the (epsilon, delta) it adds up to, per block and for the model.

    ``blocks`` are the model's block names in order (the ledger refuses rounds naming others);
    ``delta`` the target delta; ``accountant`` ``"pld"`` or ``"rdp"``; ``sampling`` ``"poisson"``
    (rounds give ``q``), ``"fixed"`` (rounds give the fleet and the cohort; accounted with RDP) or
    ``"tree"`` (DP-FTRL: rounds give their step in their tree; accounted with RDP).
    """

    def __init__(self, blocks: Iterable[str], delta: float, *, accountant: str = "pld",
                 sampling: str = "poisson") -> None:
        self.blocks = tuple(blocks)
        if not self.blocks or len(set(self.blocks)) != len(self.blocks):
            raise LedgerError(f"a ledger needs distinct block names, got {list(self.blocks)}")
        if not 0 < delta < 1:
            raise LedgerError(f"delta must be in (0, 1), got {delta!r}")
        if accountant not in ACCOUNTANTS:
            raise LedgerError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
        if sampling not in (*SAMPLINGS, TREE):
            raise LedgerError(f"sampling must be one of {', '.join((*SAMPLINGS, TREE))}, got {sampling!r}")
        self.delta, self.sampling = float(delta), sampling
        self.accountant = "rdp" if sampling in ("fixed", TREE) else accountant
        self.rounds: list[RoundEvent] = []
        view = _TreeView if sampling == TREE else (lambda: _View(self.accountant, sampling))
        self._model: _View | _TreeView = view()
        self._views: dict[str, _View | _TreeView] = {b: view() for b in self.blocks}
        self._spent: Spent | None = None
        # What spent_after answered or look_ahead computed: (rounds recorded then, the events after
        # them, what they spend); events compare by value. Recording an event makes (n, (event,)) the
        # spent; asking again is answered from here (an accountant's epsilon costs 0.3-2 s on the
        # shared 2-core machine).
        self._after: list[tuple[int, tuple[RoundEvent, ...], Spent]] = []

    def _keys(self, event: RoundEvent) -> tuple[Any, dict[str, Any]]:
        unknown = sorted(set(event.blocks) - set(self.blocks))
        if unknown:
            raise LedgerError(f"round releases blocks the model does not have: {', '.join(unknown)}")
        if (event.fleet is not None) != (self.sampling == "fixed") or (event.tree_step is None) == (self.sampling == TREE):
            kind = "tree" if event.tree_step is not None else "fixed-size" if event.fleet is not None else "Poisson"
            raise LedgerError(f"a round of {kind} sampling in a ledger of {self.sampling} sampling")
        if event.tree_step is not None:
            return (event.multiplier, event.tree_step), {
                name: (b.multiplier, event.tree_step) for name, b in event.blocks.items()}
        keys = {name: (event.q, b.multiplier, event.fleet, event.cohort) for name, b in event.blocks.items()}
        return (event.q, event.multiplier, event.fleet, event.cohort), keys

    def record(self, event: RoundEvent) -> None:
        """Add a round that happened (:meth:`spent` then says what it cost)."""
        n = len(self.rounds)
        self._spent = self._known(n, (event,))
        self._add(event)
        # What was computed for rounds that began with this one stays known, one round shorter.
        self._after = [(n + 1, tail[1:], s) for m, tail, s in self._after
                       if m == n and len(tail) > 1 and tail[0] == event]

    def _known(self, n: int, tail: tuple[RoundEvent, ...]) -> Spent | None:
        return next((s for m, t, s in self._after if m == n and t == tail), None)

    def _ahead(self, tail: tuple[RoundEvent, ...]) -> Spent:
        n = len(self.rounds)
        spent = self._known(n, tail)
        if spent is None:
            spent = self._spent_with(tail)
            self._after.append((n, tail, spent))
        return spent

    def _add(self, event: RoundEvent) -> None:
        model, keys = self._keys(event)
        self.rounds.append(event)
        self._model.add(model)
        for name, key in keys.items():
            self._views[name].add(key)

    def spent(self) -> Spent:
        """What the recorded rounds have spent."""
        if self._spent is None:
            self._spent = self._spent_with()
        return self._spent

    def spent_after(self, event: RoundEvent) -> Spent:
        """What would be spent once ``event`` happened too (the ledger is unchanged)."""
        return self._ahead((event,))

    def look_ahead(self, event: RoundEvent) -> None:
        """Compute, ahead of need, what a round like ``event`` would spend and what one more like it
        would then: :meth:`would_exceed` before recording it, :meth:`spent` after, and the check
        whether the next round like it would pass a target are then answered without the accountant.
        For a worker thread (``asyncio.to_thread``): the server's loop keeps serving devices meanwhile;
        nothing else may use the ledger until it returns."""
        for tail in ((event,), (event, event)):
            self._ahead(tail)

    def would_exceed(self, target_epsilon: float, event: RoundEvent) -> bool:
        """Whether the round ``event`` would take the model's epsilon past ``target_epsilon``: the
        run ends before it (a target already passed is exceeded by any further round)."""
        return self.spent_after(event).epsilon > target_epsilon

    def _spent_with(self, events: tuple[RoundEvent, ...] = ()) -> Spent:
        """What the recorded rounds and then ``events`` spend."""
        models: list[Any] = []
        keys: dict[str, list[Any]] = {}
        for event in events:
            model, block_keys = self._keys(event)
            models.append(model)
            for name, key in block_keys.items():
                keys.setdefault(name, []).append(key)
        # Views whose rounds are equal give equal epsilons: compute each distinct one once.
        memo: dict[Any, float] = {}

        def eps(view: _View | _TreeView, extra: tuple[Any, ...]) -> float:
            signature = (tuple((k, c) for k, c in view.runs), extra)
            if signature not in memo:
                memo[signature] = view.epsilon(self.delta, extra)
            return memo[signature]

        blocks = {name: eps(view, tuple(keys.get(name, ()))) for name, view in self._views.items()
                  if view.runs or name in keys}
        return Spent(eps(self._model, tuple(models)), self.delta, blocks, len(self.rounds) + len(events),
                     self.accountant, self.sampling)

    # -- state -------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The ledger as plain JSON data: its settings and every round, in order."""
        return {"version": STATE_VERSION, "accountant": self.accountant, "sampling": self.sampling,
                "delta": self.delta, "blocks": list(self.blocks), "rounds": [r.to_json() for r in self.rounds]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """The ledger :meth:`to_json` saved, with every round replayed in order (so its epsilons are
        those of the ledger that saved it)."""
        if not isinstance(data, Mapping) or data.get("version") != STATE_VERSION:
            raise LedgerError(f"not a privacy ledger of version {STATE_VERSION}")
        rounds = data.get("rounds")
        if not isinstance(rounds, list) or not isinstance(data.get("blocks"), list):
            raise LedgerError("a privacy ledger needs a list of blocks and a list of rounds")
        ledger = cls(data["blocks"], float(data.get("delta", 0)), accountant=str(data.get("accountant")),
                     sampling=str(data.get("sampling")))
        for r in rounds:
            ledger._add(RoundEvent.from_json(r))
        return ledger
