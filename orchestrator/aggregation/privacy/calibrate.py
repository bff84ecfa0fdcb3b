"""Choosing the noise before a run: the multiplier that reaches a target epsilon, what it costs per
coordinate, and the settings refused up front.

The multiplier. For R rounds at sampling rate q and a target (epsilon, delta), the smallest noise
multiplier z whose epsilon is at most the target, found by ``dp_accounting``'s own search
(``mechanism_calibration.calibrate_dp_mechanism``: Brent's method over the accountant, the result
checked to be within budget) in [:data:`Z_MIN`, :data:`Z_MAX`]. A target that z = :data:`Z_MAX` cannot
reach is refused: the noise would drown any update (sigma C per coordinate of the sum, 100 times a
whole clipped update's norm). Targets so loose that :data:`Z_MIN` meets them get :data:`Z_MIN`.

The noise it costs. The server averages a block's noised sum over the block's expected cohort m
(a fixed denominator, as DP-FedAvg does: McMahan et al., 2018, Algorithm 1, estimator f~_f), so the
noise on each coordinate of the mean update has standard deviation z C / m.

Per block, under partial training (:func:`plan_blocks`). The model's epsilon is that of the device
that trains every released block (``orchestrator.aggregation.privacy.accountant``). Per-layer clipping with
equal noise (McMahan et al., 2018, Section 3): with L released blocks, each block is clipped to
C_b = C / sqrt(L) and noised with standard deviation z C on its sum, i.e. multiplier z_b = z sqrt(L);
a device training all L blocks then has combined multiplier z, exactly the model's target, and a
device at split s training k of them has z sqrt(L / k): weak devices spend less. The noise on the
mean of block b is z C / m_b: the input-side blocks, which only strong devices train, have the
smaller cohort and the noisier mean.

The delta. min(:data:`DELTA_CAP`, 1 / N^1.1) by default (N devices): below 1 / N, so that a mechanism
that publishes one device's data whole with probability delta cannot meet it; the exponent puts it a
little further, and the cap keeps small fleets at the customary 1e-5. :func:`default_delta` is the one
owner of that rule: the server's plan (``central``) and ``edgetrain dp-plan`` both ask it, so a plan
printed before a run is the plan the server runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dp_accounting

from orchestrator.aggregation.privacy.accountant import (combined_multiplier, epsilon_for, fresh_accountant, sampled_gaussian,
                                                         tree_accountant, tree_epsilon, tree_event)
from orchestrator.strategies.base import Combines

__all__ = [
    "DELTA_CAP",
    "MIN_COHORT",
    "Z_MAX",
    "Z_MIN",
    "BlockPlan",
    "PrivacyPlanError",
    "SplitPlan",
    "check_cohort",
    "check_delta",
    "check_noise",
    "check_strategy",
    "default_delta",
    "noise_multiplier",
    "noise_per_coordinate",
    "plan_blocks",
    "plan_splits",
    "allocate_multipliers",
    "allocation_objective",
    "ftrl_epoch",
    "tree_multiplier",
    "trees",
]

#: The range of noise multipliers searched: below 0.3 one round's epsilon alone is large; above 100
#: the noise on a sum is 100 clipped updates' worth per coordinate.
Z_MIN, Z_MAX = 0.3, 100.0
#: The smallest expected cohort a noised block may have: with fewer devices the noise on the mean,
#: z C / m per coordinate, is (at z >= 1) over a tenth of a whole clipped update's norm on every
#: coordinate.
MIN_COHORT = 10


#: The largest default delta, whatever the fleet: 1 / N^1.1 is above it for fleets under about 35,000.
DELTA_CAP = 1e-5


class PrivacyPlanError(ValueError):
    """DP settings that cannot work, said in one line."""


def default_delta(devices: int) -> float:
    """min(1e-5, 1 / N^1.1) for a fleet of N devices (see the module docstring)."""
    if devices < 1:
        raise PrivacyPlanError(f"a fleet needs at least one device, got {devices}")
    return min(DELTA_CAP, float(devices) ** -1.1)


def check_delta(delta: float, devices: int) -> float:
    """Refuse a delta of 1 / N or more: it allows publishing a device's data outright."""
    if not 0 < delta < 1:
        raise PrivacyPlanError(f"delta must be in (0, 1), got {delta:g}")
    if delta >= 1.0 / devices:
        raise PrivacyPlanError(f"delta {delta:g} is not below 1/N = {1.0 / devices:.3g} for {devices} devices: "
                               f"it would allow publishing one device's data whole")
    return delta


def check_cohort(expected_cohort: float, what: str = "the round", minimum: int = MIN_COHORT) -> float:
    """Refuse an expected cohort under ``minimum`` devices: its noised mean is mostly noise."""
    if expected_cohort < minimum:
        raise PrivacyPlanError(f"{what} expects {expected_cohort:.3g} devices per round, under the {minimum} "
                               f"a noised mean needs: sample more devices (a larger rate or fleet)")
    return expected_cohort


def _check_schedule(q: float, rounds: int, fleet: int | None) -> None:
    if not 0 < q <= 1:
        raise PrivacyPlanError(f"the sampling rate must be in (0, 1], got {q:g}")
    if rounds < 1:
        raise PrivacyPlanError(f"rounds must be >= 1, got {rounds}")
    if fleet is not None and fleet < 1:
        raise PrivacyPlanError(f"a fleet needs at least one device, got {fleet}")


def noise_multiplier(target_epsilon: float, q: float, rounds: int, delta: float, *, accountant: str = "pld",
                     fleet: int | None = None) -> float:
    """The smallest multiplier whose epsilon after ``rounds`` rounds at rate ``q`` (Poisson; with
    ``fleet``, fixed cohorts of round(q * fleet)) is at most ``target_epsilon`` at ``delta``."""
    _check_schedule(q, rounds, fleet)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise PrivacyPlanError(f"the target epsilon must be a finite number > 0, got {target_epsilon:g}")
    at_most = epsilon_for(Z_MAX, q, rounds, delta, accountant=accountant, fleet=fleet)
    if at_most > target_epsilon:
        raise PrivacyPlanError(f"target epsilon {target_epsilon:g} cannot be reached in {rounds} rounds at rate {q:g}: "
                               f"even noise multiplier {Z_MAX:g} spends {at_most:.3g}; plan fewer rounds or a "
                               f"smaller rate")
    if epsilon_for(Z_MIN, q, rounds, delta, accountant=accountant, fleet=fleet) <= target_epsilon:
        return Z_MIN
    cohort = None if fleet is None else max(1, round(q * fleet))
    sampling = "poisson" if fleet is None else "fixed"
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: fresh_accountant(accountant, sampling),
        lambda z: dp_accounting.SelfComposedDpEvent(sampled_gaussian(q, z, fleet, cohort), rounds),
        target_epsilon, delta, dp_accounting.ExplicitBracketInterval(Z_MIN, Z_MAX), tol=1e-4))


def trees(rounds: int, epoch: int) -> list[int]:
    """The trees of ``rounds`` rounds restarted every ``epoch``: their sizes in rounds."""
    if rounds < 1 or epoch < 1:
        raise PrivacyPlanError(f"DP-FTRL needs rounds >= 1 and rounds per tree >= 1, got {rounds} and {epoch}")
    return [epoch] * (rounds // epoch) + ([rounds % epoch] if rounds % epoch else [])


def ftrl_epoch(fleet: int, cohort: int, rounds: int, configured: int = 0) -> int:
    """DP-FTRL's rounds per tree: ``configured`` (``dp_ftrl_epoch``), or by default floor(N / K),
    the most rounds in which K of N devices can each take part once, at most the run's rounds; a
    schedule whose tree needs a device twice (b K > N) is refused. The server's plan and
    ``dp-plan`` both ask here."""
    epoch = min(rounds, configured or fleet // max(1, cohort))
    if epoch < 1 or epoch * cohort > fleet:
        raise PrivacyPlanError(f"dp_ftrl_epoch {epoch}: {epoch} rounds of {cohort} devices need {epoch * cohort} "
                               f"devices, each once per tree, and the fleet has {fleet}; use at most "
                               f"{fleet // max(1, cohort)} rounds per tree")
    return epoch


def tree_multiplier(target_epsilon: float, rounds: int, epoch: int, delta: float) -> float:
    """The smallest multiplier per tree node whose DP-FTRL epsilon after ``rounds`` rounds, trees
    restarted every ``epoch``, is at most ``target_epsilon`` at ``delta`` (``dp_accounting``'s search,
    as :func:`noise_multiplier`); refused when even :data:`Z_MAX` cannot reach it."""
    sizes = trees(rounds, epoch)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise PrivacyPlanError(f"the target epsilon must be a finite number > 0, got {target_epsilon:g}")
    if tree_epsilon(Z_MAX, sizes, delta) > target_epsilon:
        raise PrivacyPlanError(f"target epsilon {target_epsilon:g} cannot be reached by DP-FTRL in {rounds} rounds "
                               f"(trees of {epoch}): even noise multiplier {Z_MAX:g} spends more; plan fewer rounds")
    if tree_epsilon(Z_MIN, sizes, delta) <= target_epsilon:
        return Z_MIN
    return float(dp_accounting.calibrate_dp_mechanism(
        tree_accountant, lambda z: tree_event(z, sizes), target_epsilon, delta,
        dp_accounting.ExplicitBracketInterval(Z_MIN, Z_MAX), tol=1e-4))


def check_noise(multiplier: float, target_epsilon: float, q: float, rounds: int, delta: float, *,
                accountant: str = "pld", fleet: int | None = None) -> float:
    """The epsilon a configured multiplier spends in the planned rounds; refused, naming the
    multiplier that would do, when it is over ``target_epsilon``."""
    _check_schedule(q, rounds, fleet)
    if not (multiplier > 0 and math.isfinite(multiplier)):
        raise PrivacyPlanError(f"the noise multiplier must be a finite number > 0, got {multiplier:g}")
    spent = epsilon_for(multiplier, q, rounds, delta, accountant=accountant, fleet=fleet)
    if spent > target_epsilon:
        try:
            needed = noise_multiplier(target_epsilon, q, rounds, delta, accountant=accountant, fleet=fleet)
            hint = f"use at least {needed:.4g}"
        except PrivacyPlanError:
            hint = "no multiplier up to 100 reaches it: plan fewer rounds or a smaller rate"
        raise PrivacyPlanError(f"noise multiplier {multiplier:g} spends epsilon {spent:.3g} in {rounds} rounds at rate "
                               f"{q:g} (delta {delta:g}), over the target {target_epsilon:g}: {hint}")
    return spent


def noise_per_coordinate(multiplier: float, clip: float, expected_cohort: float) -> float:
    """Standard deviation of the noise on each coordinate of a mean update: z C / m."""
    return multiplier * clip / expected_cohort


@dataclass(frozen=True)
class BlockPlan:
    """One block under per-layer clipping: the devices able to train it, its expected cohort, its
    clip, multiplier and noise (on the sum, and per coordinate of the mean), and its epsilon."""

    block: str
    devices: int
    cohort: float
    clip: float
    noise_multiplier: float
    sum_stddev: float
    mean_stddev: float
    epsilon: float


@dataclass(frozen=True)
class SplitPlan:
    """The devices at one split (training blocks [split, L)): how many, how many released blocks
    they train, their combined multiplier and their epsilon."""

    split: int
    devices: int
    blocks: int
    noise_multiplier: float
    epsilon: float


def plan_blocks(multiplier: float, clip: float, block_devices: Sequence[tuple[str, int]], q: float, rounds: int,
                delta: float, *, accountant: str = "pld", fleet: int | None = None,
                spend: Callable[[float], float] | None = None,
                multipliers: Mapping[str, float] | None = None) -> list[BlockPlan]:
    """Per-layer clipping of the blocks some device trains (``block_devices``: block name and the
    number of devices able to train it, in model order), for a model multiplier ``multiplier``.
    With ``fleet`` (fixed-size cohorts of the whole fleet), each block's release is accounted as
    that sample of the fleet: devices that do not train a block add a zero vector to its sum.
    ``spend``: a multiplier's epsilon over the run when it is not sampled rounds (DP-FTRL's trees);
    ``multipliers``: each block's z_b (a per-block allocation), else z sqrt(L) each."""
    released = [(b, n) for b, n in block_devices if n > 0]
    if not released:
        raise PrivacyPlanError("no device trains any block")
    scale = math.sqrt(len(released))
    c_b = clip / scale
    z = multipliers or dict.fromkeys((b for b, _ in released), multiplier * scale)
    eps = {zb: spend(zb) if spend else epsilon_for(zb, q, rounds, delta, accountant=accountant, fleet=fleet)
           for zb in {z[b] for b, _ in released}}  # equal multipliers: one accountant's answer
    return [BlockPlan(b, n, q * n, c_b, z[b], z[b] * c_b, noise_per_coordinate(z[b], c_b, q * n), eps[z[b]])
            for b, n in released]


def plan_splits(multiplier: float, num_blocks: int, splits: Mapping[int, int], q: float, rounds: int, delta: float,
                *, accountant: str = "pld", fleet: int | None = None,
                spend: Callable[[float], float] | None = None,
                multipliers: Sequence[float] | None = None) -> list[SplitPlan]:
    """Each split's devices (``splits``: split -> devices) under :func:`plan_blocks`'s per-layer
    clipping of a model of ``num_blocks`` blocks: a device at split s composes the blocks [s, L),
    each at its z_b (``multipliers``, by block index; else z sqrt(L') for the L' released blocks), into
    one Gaussian of multiplier (sum_b z_b^-2)^-1/2."""
    low = min(splits)
    z_b = list(multipliers) if multipliers is not None else \
        [math.inf] * low + [multiplier * math.sqrt(num_blocks - low)] * (num_blocks - low)
    out = []
    for s in sorted(splits):
        z = combined_multiplier(z_b[s:])
        eps = spend(z) if spend else epsilon_for(z, q, rounds, delta, accountant=accountant, fleet=fleet)
        out.append(SplitPlan(s, splits[s], num_blocks - s, z, eps))
    return out


def allocation_objective(multipliers: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """sum_b w_b z_b^2: with w_b = d_b C_b^2 / m_b^2, the expected squared norm of the noise on the
    mean update (block b: d_b coordinates, noise z_b C_b / m_b on each)."""
    return sum(weights[b] * multipliers[b] ** 2 for b in weights)


def allocate_multipliers(multiplier: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Per-block multipliers for nested cohorts (``dp_allocation = "utility"``): the z_b that
    minimise the noise on the mean update, sum_b w_b z_b^2 with w_b = d_b C_b^2 / m_b^2
    (:func:`allocation_objective`; d_b the block's coordinates, C_b its clip, m_b its expected
    cohort: a block with many coordinates or few devices weighs more), under the model's budget:
    sum_b z_b^-2 = z^-2. That constraint is every role's: the device at the lowest split trains every
    released block, and its round is one Gaussian of multiplier (sum_b z_b^-2)^-1/2 = z, the model's
    (so its epsilon is the target's, as under uniform noise); a device at split s trains the blocks
    b >= s, a partial sum, so its multiplier is larger and it spends less.

    With u_b = z_b^-2 the problem is: minimise sum_b w_b / u_b subject to sum_b u_b = z^-2, convex;
    the Lagrangian's stationarity gives w_b / u_b^2 = lambda, so u_b = z^-2 sqrt(w_b) / sum_c sqrt(w_c),
    i.e. z_b = z sqrt(sum_c sqrt(w_c) / sqrt(w_b)), at objective z^2 (sum_b sqrt(w_b))^2. Uniform noise
    (z_b = z sqrt(L)) costs z^2 L sum_b w_b, never less (Cauchy-Schwarz; equal only when every w_b is
    equal). Per-layer clipping with equal noise (McMahan et al., 2018, Section 3) is the uniform case;
    the allocation keeps its clips and moves only the noise."""
    if not weights or any(not (w > 0 and math.isfinite(w)) for w in weights.values()):
        raise PrivacyPlanError(f"a per-block allocation needs each block's weight > 0, got {dict(weights)}")
    roots = {b: math.sqrt(w) for b, w in weights.items()}
    total = sum(roots.values())
    return {b: multiplier * math.sqrt(total / r) for b, r in roots.items()}


def check_strategy(name: str, combines: Combines) -> None:
    """Refuse DP for a strategy whose rule is not a clipped sum (``combines``: what strategy ``name``
    declares, ``Strategy.combines``): a median, Krum, a trimmed mean or centered clipping reads
    individual updates, whose sensitivity the Gaussian's calibration does not cover (and secure
    aggregation hides them); a rule of a strategy's own (rows scaled by their heat, a loss test, a
    second phase) is not the sum the ledger accounts."""
    if combines.rule == "robust":
        raise PrivacyPlanError(f"differential privacy needs a clipped sum, not aggregation={combines.detail}: a robust "
                               f"statistic reads individual updates")
    if not combines.is_sum:
        raise PrivacyPlanError(f"differential privacy is accounted for the clipped sums of a strategy that declares a "
                               f"weighted mean of whole blocks, not for strategy {name!r}, which combines by "
                               f"{combines.describe()}")
