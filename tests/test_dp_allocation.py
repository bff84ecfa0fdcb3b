"""Per-block noise for nested cohorts (``dp_allocation = "utility"``): the multipliers that minimise the
noise on the mean update under the model's budget; every role's composed epsilon within the target,
the allocation better than uniform noise on that objective, and a real server noising each block at
its allocated multiplier for the same model epsilon."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.aggregation.privacy.accountant import combined_multiplier, epsilon_for
from orchestrator.aggregation.privacy.calibrate import (PrivacyPlanError, allocate_multipliers, allocation_objective,
                                                        noise_multiplier, plan_splits)
from orchestrator.server import Orchestrator
from tests.test_dp_central import _serve, dp_config

#: EmbracingFL's mixed fleet in miniature: 1,000 devices, 100 a round; blocks 0-2 trained by the 250
#: strong devices (split 0), blocks 3-4 by every device too (the weak at split 3), coordinates per block.
SIZES = {"b0": 50_000, "b1": 20_000, "b2": 20_000, "b3": 5_000, "b4": 650}
SPLITS = {0: 250, 3: 750}


def _weights(clip_b: float, q: float) -> dict[str, float]:
    cohorts = {b: q * (1000 if i >= 3 else 250) for i, b in enumerate(SIZES)}
    return {b: SIZES[b] * clip_b**2 / cohorts[b] ** 2 for b in SIZES}


def test_every_role_spends_at_most_the_target_and_the_allocation_beats_uniform_noise() -> None:
    target, q, rounds, delta = 8.0, 0.1, 10, 1e-5
    z = noise_multiplier(target, q, rounds, delta, accountant="rdp", fleet=1000)
    weights = _weights(1 / math.sqrt(5), q)
    allocated = allocate_multipliers(z, weights)
    roles = plan_splits(z, 5, SPLITS, q, rounds, delta, accountant="rdp", fleet=1000,
                        multipliers=list(allocated.values()))
    for role in roles:  # each role's own composition, recomputed from the blocks it trains
        trained = list(allocated.values())[role.split:]
        assert role.noise_multiplier == pytest.approx(combined_multiplier(trained))
        assert role.epsilon == pytest.approx(epsilon_for(role.noise_multiplier, q, rounds, delta, accountant="rdp",
                                                         fleet=1000))
        assert role.epsilon <= target + 1e-6
    assert roles[0].epsilon == pytest.approx(target, abs=0.01) and roles[1].epsilon < roles[0].epsilon
    uniform = dict.fromkeys(SIZES, z * math.sqrt(5))
    assert allocation_objective(allocated, weights) < 0.9 * allocation_objective(uniform, weights)
    # The optimum: moving budget between two blocks along the constraint only adds noise.
    rng = np.random.default_rng(3)
    u = {b: allocated[b] ** -2 for b in SIZES}
    for _ in range(50):
        a, b = rng.choice(list(SIZES), 2, replace=False)
        shift = rng.uniform(-0.5, 0.5) * min(u[a], u[b])
        moved = {**u, a: u[a] + shift, b: u[b] - shift}
        other = {k: v**-0.5 for k, v in moved.items()}
        assert combined_multiplier(other.values()) == pytest.approx(z)
        assert allocation_objective(other, weights) >= allocation_objective(allocated, weights) * (1 - 1e-12)
    # Blocks that few devices train, or that have many coordinates, get the smaller multipliers.
    assert allocated["b0"] < allocated["b1"] < allocated["b3"] < allocated["b4"]


def test_a_run_noises_each_block_at_its_allocated_multiplier_for_the_same_model_epsilon(tmp_path: Path) -> None:
    """Two strong devices train both blocks of the 784-64-10 model, two weak ones the head only: the
    input block (50,240 coordinates, cohort 2) gets the smaller multiplier, the head (650, cohort 4) the
    larger; the model's epsilon is the uniform run's (its combined multiplier is z either way)."""
    z, clip = 1.0, 1.0
    labels = {"w0": {"force_split": "1"}, "w1": {"force_split": "1"}}
    runs = {}
    for allocation in ("uniform", "utility"):
        config = dp_config(tmp_path / allocation, min_devices=4, dp_noise_multiplier=z, dp_clip=clip,
                           allow_forced_split=True, dp_allocation=allocation)
        orch, history = asyncio.run(_serve(config, ["s0", "s1", "w0", "w1"], labels=labels))
        runs[allocation] = history[0]["privacy"]
    first, head = orch.model.block_names
    c_b = clip / math.sqrt(2)
    expected = allocate_multipliers(z, {first: 50_240 * c_b**2 / 2**2, head: 650 * c_b**2 / 4**2})
    got = runs["utility"]
    assert got["noise_stddev"] == pytest.approx({first: expected[first] * c_b / 2, head: expected[head] * c_b / 4})
    assert expected[first] < z * math.sqrt(2) < expected[head]
    assert got["epsilon"] == pytest.approx(runs["uniform"]["epsilon"], rel=1e-6)
    assert got["blocks"][head] < runs["uniform"]["blocks"][head] < runs["uniform"]["blocks"][first] * 1.000001
    assert got["blocks"][first] > runs["uniform"]["blocks"][first]


@pytest.mark.parametrize("overrides, says", [
    ({"dp_adaptive_clip": True}, "not with dp_adaptive_clip"),
])
def test_allocation_settings_that_cannot_work_are_refused_in_one_line(tmp_path: Path, overrides, says) -> None:
    config = dp_config(tmp_path / "s", **{"min_devices": 4, "dp_noise_multiplier": 1.0, "dp_allocation": "utility",
                                          **overrides})
    with pytest.raises(PrivacyPlanError) as refused:
        Orchestrator(config)
    assert says in str(refused.value) and "\n" not in str(refused.value)
