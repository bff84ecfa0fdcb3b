"""Central noise (orchestrator/aggregation/privacy/noise.py): noised sums of a fixed input have the standard deviation
the calibration says, sigma x clip on the sum and sigma x clip / cohort on the mean, per block, and
the noise is Gaussian and comes from os.urandom."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from scipy import stats

from orchestrator.aggregation.privacy.clipping import clip_blocks
from orchestrator.aggregation.privacy.noise import gaussian, noise_block_sum

#: Blocks with different clips and expected cohorts (the input side trained by few devices).
BLOCKS = {"stem": (0.3, 20), "middle": (2.5, 50), "head": (1.0, 200)}
MULTIPLIER, DIM, TRIALS = 1.1, 64, 3000


def clipped_sum(clip: float, cohort: int, rng: np.random.Generator) -> np.ndarray:
    """The sum of ``cohort`` devices' updates of one block, each clipped to ``clip`` (the fixed input)."""
    total = np.zeros(DIM, np.float32)
    for _ in range(cohort):
        update = {"w": rng.normal(0, 1, DIM).astype(np.float32)}
        total += clip_blocks(update, {"w": "b"}, {"b": clip}).tensors["w"]
    return total


def test_noised_sums_and_means_have_the_calibrated_std_per_block() -> None:
    rng = np.random.default_rng(0)  # the synthetic updates; the noise is the CSPRNG's
    for block, (clip, cohort) in BLOCKS.items():
        fixed = clipped_sum(clip, cohort, rng)
        sums = np.stack([noise_block_sum({"w": fixed}, MULTIPLIER * clip)["w"] for _ in range(TRIALS)])
        noise = sums.astype(np.float64) - fixed
        n = noise.size
        # Standard errors: of the std, sigma / sqrt(2 n); of the mean, sigma / sqrt(n). Five of each.
        std = noise.std(ddof=1)
        assert abs(std / (MULTIPLIER * clip) - 1) < 5 / math.sqrt(2 * n), (block, std)
        assert abs(noise.mean()) < 5 * MULTIPLIER * clip / math.sqrt(n), block
        means = sums.astype(np.float64) / cohort
        mean_std = (means - fixed / cohort).std(ddof=1)
        assert abs(mean_std / (MULTIPLIER * clip / cohort) - 1) < 5 / math.sqrt(2 * n), (block, mean_std)
        assert np.abs(means.mean(axis=0) - fixed / cohort).max() < 6 * MULTIPLIER * clip / cohort / math.sqrt(TRIALS)


def test_the_noise_is_gaussian() -> None:
    x = gaussian(200_001, 2.0)
    assert x.shape == (200_001,)
    assert stats.kstest(x / 2.0, "norm").pvalue > 1e-6
    assert stats.kstest(gaussian((300, 300), 1.0).ravel(), "norm").pvalue > 1e-6


def test_the_noise_comes_from_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: bytes((i * 13 + 5) % 256 for i in range(n)))
    assert np.array_equal(gaussian(1000, 1.0), gaussian(1000, 1.0))


def test_a_noised_sum_keeps_its_dtype_and_its_counters() -> None:
    tensors = {"w": np.zeros((3, 4), np.float32), "steps": np.array([10], np.int64)}
    out = noise_block_sum(tensors, 0.5)
    assert out["w"].dtype == np.float32 and out["w"].shape == (3, 4) and np.all(out["w"] != 0)
    assert out["steps"] is tensors["steps"]
    with pytest.raises(ValueError, match="stddev"):
        gaussian(3, -1.0)
