"""Secret cohorts: under DP and secure aggregation each round's cohort is drawn from ``os.urandom``,
so no public setting (the seed every device's initial weights reveal, the round number) predicts
it; plain runs keep a seeded, reproducible draw, its seed a setting apart from the model's.

Why it matters: the DP accountant's amplification by sampling assumes nobody knows who is in a
round. A cohort predicted from the rule with the public seed leaves a device known to be drawn
accounted at q = 1 for that round (for 1,000 devices / 100 a round / 10 rounds / epsilon 8, a device
drawn twice is at epsilon 11.96, not 8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.config import ServerConfig, SettingError
from orchestrator.rounds import sample_devices, secret_coins
from orchestrator.store import Store
from tests.test_dp_central import _serve, dp_config

DEVICES = [f"d{i:02d}" for i in range(12)]


def cohorts(store_dir: Path) -> list[list[str]]:
    store = Store(store_dir)
    try:
        return [r["selected"] for r in store.rounds.all()]
    finally:
        store.close()


def test_a_dp_run_draws_cohorts_no_public_setting_predicts(tmp_path: Path) -> None:
    """Two DP runs with identical settings (seed 0, the default) draw different cohorts of 3 of 12
    devices over 3 rounds (the chance that secret draws agree is 220^-3), and neither is the draw of
    the public rule (numpy seeded with (seed, round), what the server drew before), for the seed or
    any other small seed."""
    runs = []
    for name in ("a", "b"):
        config = dp_config(tmp_path / name, rounds=3, min_devices=12, fraction=0.25, dp_noise_multiplier=1.0)
        assert config.cohort_seed is None
        asyncio.run(_serve(config, DEVICES))
        runs.append(cohorts(config.store_dir))
    assert all(len(c) == 3 and set(c) <= set(DEVICES) for run in runs for c in run)
    assert runs[0] != runs[1]
    for seed in range(100):
        ruled = [sample_devices(DEVICES, 0.25, r, seed) for r in (1, 2, 3)]
        assert ruled != runs[0] and ruled != runs[1]


def test_the_cohort_seed_is_secret_under_dp_and_secure_aggregation_and_a_setting_in_plain_runs() -> None:
    assert ServerConfig(dp=True).cohort_seed is None and ServerConfig(secure_aggregation=True).cohort_seed is None
    assert ServerConfig(seed=5).cohort_seed == 5 and ServerConfig(seed=5, sample_seed=9).cohort_seed == 9
    for private in ({"dp": True}, {"secure_aggregation": True}):
        with pytest.raises(SettingError, match="sample_seed.*predictable"):
            ServerConfig(sample_seed=1, **private)


def test_secret_draws_are_uniform_and_differ_while_seeded_ones_repeat() -> None:
    """Without a seed: k of n each time, every device about equally often (8,000 draws of 3 of 12:
    each device 2,000 times expected, sd 39), two draws of a round different; Poisson coins at rate q.
    With a seed: the same draw every time, as research runs need."""
    counts = dict.fromkeys(DEVICES, 0)
    draws = [sample_devices(DEVICES, 0.25, 1, None) for _ in range(8000)]
    for d in draws:
        assert len(d) == 3 and d == sorted(set(d))
        for device in d:
            counts[device] += 1
    assert all(abs(c - 2000) < 200 for c in counts.values()), counts
    assert len({tuple(d) for d in draws}) > 200  # all 220 subsets of 3 turn up
    coins = secret_coins(100_000)
    assert 0 <= coins.min() and coins.max() < 1 and abs(coins.mean() - 0.5) < 0.005
    sizes = [len(sample_devices(DEVICES, 0.25, 1, None, poisson=True)) for _ in range(2000)]
    assert abs(sum(sizes) / len(sizes) - 3) < 0.15 and 0 in sizes
    assert sample_devices(DEVICES, 0.25, 4, 7) == sample_devices(DEVICES, 0.25, 4, 7)
