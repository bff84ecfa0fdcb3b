"""A run's central DP plan from its settings, checked before the first round: the noise multiplier,
the delta, the per-block clips and multipliers, and the settings refused in one line.

The planned schedule. The server waits for ``min_devices`` (N) before its first round and samples
K = ceil(fraction x N) of its idle devices each round, uniformly without replacement: fixed-size
sampling, which the ledger accounts as such (``orchestrator.aggregation.privacy.accountant``: replace-one, RDP);
with ``dp_sampling = "poisson"`` each idle device is in a round with probability q = fraction,
independently (``orchestrator.rounds.sample_devices``), accounted as Poisson-sampled Gaussians
(add/remove, PLD by default). Every round's actual N and K are accounted as they were; the plan's
are what the up-front checks (cohort, multiplier against the target) and the calibration from
``dp_target_epsilon`` use.

Per block (``orchestrator.aggregation.privacy.calibrate``, McMahan et al., 2018, Section 3): each of the model's
L blocks is clipped to C_b = C / sqrt(L) and its sum noised with multiplier z_b = z sqrt(L), so a
device that trains every block is clipped to C overall and released with multiplier z; a device
training fewer blocks spends less. With adaptive clipping each block's count gets standard deviation
sigma_c (default m_b / 20, Andrew et al., 2021) and the sum the multiplier that leaves the block's
total at z_b (``orchestrator.aggregation.privacy.clipping.sum_multiplier``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.aggregation.privacy.calibrate import (PrivacyPlanError, check_cohort, check_delta, check_noise,
                                                        default_delta, noise_multiplier)
from orchestrator.aggregation.privacy.clipping import sum_multiplier
from orchestrator.config import ServerConfig

__all__ = ["CentralPlan", "plan_central"]


@dataclass(frozen=True)
class CentralPlan:
    """What a DP run was planned with (see the module docstring)."""

    multiplier: float  # z: the model's, for a device training every block
    delta: float
    target_epsilon: float | None
    fleet: int  # N planned
    cohort: float  # K planned (Poisson sampling: expected, fraction x N)
    num_blocks: int  # L
    clip: float  # C, overall
    count_stddev: float | None  # adaptive clipping's count noise (None: the default m_b / 20)

    @property
    def block_multiplier(self) -> float:
        """z_b = z sqrt(L): everything released about one block each round."""
        return self.multiplier * math.sqrt(self.num_blocks)

    @property
    def block_clip(self) -> float:
        """C_b = C / sqrt(L)."""
        return self.clip / math.sqrt(self.num_blocks)

    def count_noise(self, expected_cohort: float) -> float:
        """Adaptive clipping's count noise for a block whose expected cohort is ``expected_cohort``."""
        return self.count_stddev if self.count_stddev is not None else expected_cohort / 20.0

    def sum_multiplier(self, count_stddev: float) -> float:
        """The multiplier of a block's sum next to a count of noise ``count_stddev`` (0: no count)."""
        try:
            return sum_multiplier(self.block_multiplier, count_stddev)
        except ValueError as exc:
            raise PrivacyPlanError(f"adaptive clipping: {exc}") from None

    def to_dict(self) -> dict[str, object]:
        return {"noise_multiplier": self.multiplier, "delta": self.delta, "target_epsilon": self.target_epsilon,
                "planned_fleet": self.fleet, "planned_cohort": self.cohort, "blocks": self.num_blocks,
                "clip": self.clip, "block_clip": self.block_clip, "block_multiplier": self.block_multiplier}


def plan_central(config: ServerConfig, num_blocks: int) -> CentralPlan:
    """The plan of a run with ``config.dp`` on over a model of ``num_blocks`` blocks; raises
    :class:`PrivacyPlanError` (one line) for settings that cannot work."""
    fleet, poisson = max(1, config.min_devices), config.dp_sampling == "poisson"
    cohort = config.fraction * fleet if poisson else min(fleet, max(1, math.ceil(config.fraction * fleet)))
    check_cohort(cohort, f"fraction {config.fraction:g} of --min-devices {fleet}", minimum=config.dp_min_cohort)
    delta = config.dp_delta if config.dp_delta is not None else default_delta(fleet)
    check_delta(delta, fleet)
    z, target = config.dp_noise_multiplier, config.dp_target_epsilon
    q, accounted = (config.fraction, None) if poisson else (cohort / fleet, fleet)
    if z is None and target is None:
        raise PrivacyPlanError("dp needs dp_noise_multiplier or dp_target_epsilon (or both)")
    if z is None:
        z = noise_multiplier(target, q, config.rounds, delta, accountant=config.dp_accountant, fleet=accounted)
    elif target is not None:
        check_noise(z, target, q, config.rounds, delta, accountant=config.dp_accountant, fleet=accounted)
    plan = CentralPlan(float(z), float(delta), target, fleet, cohort, num_blocks, config.dp_clip,
                       config.dp_count_stddev)
    if config.dp_adaptive_clip and config.dp_allocation != "uniform":
        raise PrivacyPlanError("dp_allocation utility keeps each block's clip fixed: not with dp_adaptive_clip")
    if config.dp_adaptive_clip:  # the count must be noised, and leave the sum some budget
        if plan.count_noise(cohort) <= 0:
            raise PrivacyPlanError("adaptive clipping needs dp_count_stddev > 0: an un-noised count is not private")
        plan.sum_multiplier(plan.count_noise(cohort))
    return plan
