"""Clipping on the server (orchestrator/aggregation/privacy/clipping.py): per-layer clips, adaptive clipping that
tracks a known quantile of synthetic norms (Andrew et al., 2021), and the noise split it implies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from edge_sdk import dp
from orchestrator.aggregation.privacy import clipping
from orchestrator.aggregation.privacy.accountant import BlockRelease
from orchestrator.aggregation.privacy.clipping import AdaptiveClip, AdaptiveClipping, equal_clips, sum_multiplier


def test_the_server_clips_with_the_devices_rule() -> None:
    assert clipping.clip_blocks is dp.clip_blocks


def test_per_layer_clips_share_the_overall_clip() -> None:
    clips = equal_clips(2.0, ["a", "b", "c", "d"])
    assert math.sqrt(sum(c * c for c in clips.values())) == pytest.approx(2.0)
    assert len(set(clips.values())) == 1


def track(gamma: float, rounds: int, rng: np.random.Generator, cohort: int = 100) -> np.ndarray:
    """An adaptive clip over ``rounds`` rounds of Poisson-sized cohorts with lognormal(0, 1) norms,
    the paper's settings (eta 0.2, sigma_b = m / 20), started 10 times too small."""
    clip = AdaptiveClip(0.1, target_quantile=gamma, learning_rate=0.2, count_stddev=cohort / 20)
    history = []
    for _ in range(rounds):
        norms = rng.lognormal(0.0, 1.0, size=rng.poisson(cohort))
        clip.update(sum(clip.bit(n) for n in norms), cohort)
        history.append(clip.clip)
    return np.array(history)


@pytest.mark.parametrize("gamma", [0.5, 0.8])
def test_adaptive_clipping_tracks_a_known_quantile_of_the_norms(gamma: float) -> None:
    """Lognormal(0, 1) norms: the median is 1, the 0.8 quantile exp(0.8416) = 2.32. Over rounds
    200-400 the clip's geometric mean is within 7% of it (40 runs at gamma 0.5: all within 3.5%,
    standard deviation 1.3%)."""
    quantile = math.exp(stats.norm.ppf(gamma))
    history = track(gamma, 400, np.random.default_rng(int(gamma * 10)))
    assert abs(math.exp(np.log(history[200:]).mean()) / quantile - 1) < 0.07
    assert history[0] < 0.2 * quantile  # it did have a long way to go


def test_an_update_moves_the_clip_geometrically_toward_the_target() -> None:
    clip = AdaptiveClip(2.0, target_quantile=0.5, learning_rate=0.2, count_stddev=5.0)
    # 100 devices, 80 within the clip: centred sum 80 * 0.5 - 20 * 0.5 = 30; already noised.
    below = clip.update(30.0, 100, noised=True)
    assert below == pytest.approx(0.8)
    assert clip.clip == pytest.approx(2.0 * math.exp(-0.2 * 0.3))
    assert clip.update(-1000.0, 100, noised=True) == 0.0  # clamped to [0, 1]


def test_adaptive_clipping_state_survives_json_and_uses_the_papers_count_noise() -> None:
    clips = AdaptiveClipping.start({"stem": 0.5, "head": 1.0}, {"stem": 40.0, "head": 400.0})
    assert clips.blocks["head"].count_stddev == 20.0 and clips.blocks["stem"].count_stddev == 2.0
    assert clips.bits({"stem": 0.7, "head": 0.2}) == {"stem": -0.5, "head": 0.5}
    clips.update({"stem": 3.0, "head": -40.0}, {"stem": 40.0, "head": 400.0}, noised=True)
    again = AdaptiveClipping.from_json(json.loads(json.dumps(clips.to_json())))
    assert again.clips == clips.clips and again.to_json() == clips.to_json()
    with pytest.raises(ValueError, match="target quantile"):
        AdaptiveClipping.from_json({"b": {"clip": 1.0, "target_quantile": 1.5, "learning_rate": 0.2,
                                          "count_stddev": 1.0}})


def test_the_sum_gets_the_noise_the_count_leaves() -> None:
    """Andrew et al. (2021), Section 3.1: z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2, and the ledger's
    release of both is z again."""
    z, sigma_b = 1.5, 5.0
    z_sum = sum_multiplier(z, sigma_b)
    assert z_sum == pytest.approx((z**-2 - 10.0**-2) ** -0.5)
    assert BlockRelease(z_sum, sigma_b).multiplier == pytest.approx(z)
    assert sum_multiplier(z, 0.0) == z
    with pytest.raises(ValueError, match="spends the whole budget"):
        sum_multiplier(3.0, 1.0)
