"""DP-FTRL (the ``ftrl`` privacy mechanism): tree-aggregated noise, correlated across rounds as the
online binary tree says, accounted without sampling by dp-accounting's tree aggregation, each device
once per tree (refused a second time, and left out of the selection), in a real server with
websocket devices."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from edge_sdk.models import build_model
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.ftrl import FtrlMechanism, TreeNoise
from orchestrator.config import SettingError
from orchestrator.server import Orchestrator
from orchestrator.store import Store
from tests.test_dp_central import _serve, dp_config


def _dyadic(t: int) -> set[tuple[int, int]]:
    """The nodes covering [1, t]: one interval per set bit of t, largest first."""
    nodes, start = set(), 0
    for level in reversed(range(t.bit_length())):
        if t >> level & 1:
            nodes.add((start + 1, start + 2**level))
            start += 2**level
    return nodes


def test_the_noise_on_prefix_sums_has_the_trees_covariance() -> None:
    """Over 40,000 independent coordinates (each a draw of the whole tree), the noise on the prefix
    sums S_1..S_8 has covariance sigma^2 x (nodes the two prefixes share): Var S_t = sigma^2 popcount(t),
    S_4 and S_5 share [1, 4], S_3 and S_4 share nothing."""
    sigma, steps, n = 0.7, 8, 40_000
    rng = np.random.default_rng(5)  # the test's seed; a run's source is the OS CSPRNG
    tree = TreeNoise({"w": sigma}, {"w": (n,)}, lambda shape, sd: rng.normal(0.0, sd, shape))
    draws = np.stack([tree.step()["w"] for _ in range(steps)])
    got = np.cov(draws)
    expected = np.array([[sigma**2 * len(_dyadic(t) & _dyadic(s)) for s in range(1, steps + 1)]
                         for t in range(1, steps + 1)])
    assert expected[3, 4] == sigma**2 and expected[2, 3] == 0 and expected[6, 6] == 3 * sigma**2
    assert np.abs(got - expected).max() < 5 * 2 * sigma**2 / math.sqrt(n)
    assert len(tree.stack) == 1 and tree.stack[0][0] == 3  # after 8 leaves: the one root [1, 8]


def _independent_epsilon(z: float, trees: list[int], delta: float) -> float:
    acct = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    for t in trees:
        acct.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z, t))
    return acct.get_epsilon(delta)


def test_a_dp_ftrl_run_reports_the_tree_epsilon_and_takes_each_device_once_per_tree(tmp_path: Path) -> None:
    """Six devices, three a round, trees of two rounds (floor(6 / 3)), five rounds: trees [2, 2, 1].
    After every round the reported epsilon is dp-accounting's tree aggregation for the trees so far at
    the model's multiplier z; within a tree no device is selected twice, and the model moved."""
    devices, delta = [f"d{i}" for i in range(6)], 1e-5
    config = dp_config(tmp_path / "s", rounds=5, min_devices=6, fraction=0.5, dp_mechanism="ftrl",
                       dp_noise_multiplier=None, dp_target_epsilon=20.0)
    orch, history = asyncio.run(_serve(config, devices))
    mechanism = orch.intake.release.mechanism
    assert isinstance(mechanism, FtrlMechanism) and mechanism.ftrl.epoch == 2 and mechanism.ftrl.trees == (2, 2, 1)
    z = mechanism.plan.multiplier
    assert _independent_epsilon(z, [2, 2, 1], delta) <= 20.0
    so_far = [[1], [2], [2, 1], [2, 2], [2, 2, 1]]
    for r, h in enumerate(history):
        assert h["privacy"]["epsilon"] == pytest.approx(_independent_epsilon(z, so_far[r], delta), rel=1e-9)
        assert h["privacy"]["sampling"] == "tree" and h["privacy"]["tree_step"] == [1, 2, 1, 2, 1][r]
    store = Store(tmp_path / "s")
    try:
        reports = store.reports.all()
    finally:
        store.close()
    folded = [{r["device_id"] for r in reports if r["round"] == n and r["accepted"]} for n in range(1, 6)]
    assert all(len(f) == 3 for f in folded) and len(reports) == 15
    assert not folded[0] & folded[1] and not folded[2] & folded[3]  # once per tree
    assert history[-1]["privacy"]["mode"] == "ftrl"


def test_the_model_is_the_ftrl_iterate_of_the_noised_prefix_sum(tmp_path: Path) -> None:
    """Six devices, two a round, one tree of three rounds; the mechanism's normal source seeded here only.
    After round 3 the model is theta_0 + (S_3 + noise of node [1, 2] + noise of leaf 3) / m: the six
    clipped updates summed, the tree's two covering nodes (the first leaf's noise no longer in it)."""
    rng, draws = np.random.default_rng(11), []

    def normal(shape, sd):
        draws.append(rng.normal(0.0, sd, shape))
        return draws[-1]

    def seeded(orch) -> None:
        orch.intake.release.mechanism.normal = normal

    config = dp_config(tmp_path / "s", rounds=3, min_devices=6, fraction=1 / 3, dp_mechanism="ftrl",
                       dp_noise_multiplier=2.0, dp_clip=1.0)
    initial = {k: v.detach().numpy().astype(np.float64)
               for k, v in build_model(config.model, seed=config.seed).state_dict().items()}
    orch, history = asyncio.run(_serve(config, [f"d{i}" for i in range(6)], setup=seeded))
    assert [h["privacy"]["tree_step"] for h in history] == [1, 2, 3]
    names = [k for k, v in initial.items() if v.dtype.kind == "f"]
    node12, leaf3 = draws[len(names):2 * len(names)], draws[2 * len(names):]
    blocks = orch.model.block_names
    for i, name in enumerate(names):
        block = [k for k in names if orch.model.block_of(k) == orch.model.block_of(name)]
        size = sum(initial[k].size for k in block)
        clipped = (1.0 / math.sqrt(len(blocks))) / math.sqrt(size)  # a constant update clipped to C_b
        expected = initial[name] + (6 * clipped + node12[i] + leaf3[i]) / 2
        np.testing.assert_allclose(orch.global_state[name], expected, rtol=1e-5, atol=1e-6)
    assert len(draws) == 3 * len(names)  # one tree node per entry per round


@pytest.mark.parametrize("overrides, says", [
    ({"dp_ftrl_epoch": 3, "rounds": 5}, "3 rounds of 2 devices need 6 devices, each once per tree, and the fleet has 4"),
    ({"dp_sampling": "poisson"}, "samples nothing"),
    ({"dp_adaptive_clip": True}, "keeps a fixed clip"),
    ({"dp_noise_multiplier": 0.5, "dp_target_epsilon": 1.0}, "use at least"),
])
def test_ftrl_settings_that_cannot_work_are_refused_in_one_line(tmp_path: Path, overrides, says) -> None:
    config = dp_config(tmp_path / "s", **{"min_devices": 4, "fraction": 0.5, "dp_mechanism": "ftrl",
                                          "dp_noise_multiplier": 1.0, **overrides})
    with pytest.raises(PrivacyPlanError) as refused:
        Orchestrator(config)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_ftrl_under_secure_aggregation_is_refused_with_the_reason(tmp_path: Path) -> None:
    config = dp_config(tmp_path / "s", min_devices=4, fraction=0.5, dp_mechanism="ftrl", dp_noise_multiplier=1.0,
                       secure_aggregation=True, strategy="fedavg")
    with pytest.raises(SettingError) as refused:
        Orchestrator(config)
    assert "ftrl" in str(refused.value) and "a secure round reveals only its own round" in str(refused.value)
    assert "\n" not in str(refused.value)
