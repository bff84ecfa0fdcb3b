"""The device side of differential privacy (edge_sdk/dp.py): the per-block clip, discrete Gaussian
noise shares with the moments and probabilities they should have, the ring arithmetic, the random
source, and a lean import."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from edge_sdk import dp


def exact_discrete_gaussian(sigma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Support, probabilities and variance of N_Z(0, sigma^2), summed over +-(40 sigma + 10)."""
    k = np.arange(-math.ceil(40 * sigma) - 10, math.ceil(40 * sigma) + 11, dtype=np.float64)
    w = np.exp(-k * k / (2 * sigma * sigma))
    p = w / w.sum()
    return k, p, float((p * k * k).sum())


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.7, 50.0, 2e4])
def test_discrete_gaussian_has_mean_zero_and_the_discrete_gaussians_variance(sigma: float) -> None:
    n = 400_000
    x = dp.discrete_gaussian(sigma, n)
    assert x.dtype == np.int64 and x.shape == (n,)
    if sigma < 1000:
        support, p, variance = exact_discrete_gaussian(sigma)
        fourth = float((p * support**4).sum())
    else:
        variance, fourth = sigma**2, 3 * sigma**4  # a Gaussian's moments, within far less than the error
    # Five standard errors: sqrt(var / n) for the mean, sqrt((mu4 - var^2) / n) for the variance (the
    # discrete Gaussian's own fourth moment: at sigma 0.4 it is mostly 0 with rare +-1, far from a
    # Gaussian's 3 var^2).
    assert abs(x.mean()) < 5 * math.sqrt(variance / n)
    assert abs(x.var() - variance) < 5 * math.sqrt((fourth - variance**2) / n)


def test_discrete_gaussian_frequencies_match_its_probabilities() -> None:
    from scipy import stats

    sigma, n = 1.3, 400_000
    support, p, _ = exact_discrete_gaussian(sigma)
    x = dp.discrete_gaussian(sigma, n)
    inner = np.abs(support) <= 5
    observed = np.array([np.sum(x == k) for k in support[inner]] + [np.sum(np.abs(x) > 5)])
    expected = n * np.concatenate([p[inner], [p[~inner].sum()]])
    assert stats.chisquare(observed, expected).pvalue > 1e-5


def test_any_n_min_survivors_shares_add_up_to_the_target_variance() -> None:
    sigma, n_min, n = 800.0, 6, 200_000
    shares = [dp.noise_share(n, sigma, n_min) for _ in range(n_min)]
    total = np.sum(shares, axis=0)
    assert abs(total.var() / sigma**2 - 1) < 5 * math.sqrt(2 / n)
    more = total + dp.noise_share(n, sigma, n_min)  # one more survivor only adds noise
    assert more.var() > total.var()
    assert dp.share_sigma(1.2, 0.5, 1000, 4) == pytest.approx(300.0)


def test_noise_in_the_ring_wraps_around_and_survives_the_modular_sum() -> None:
    bits = 20
    m = 1 << bits
    values = np.array([0, 1, m - 1, 12345], dtype=np.uint32)
    assert dp.add_in_ring(values, np.array([-1, -5, 3, 7 * m + 2]), bits).tolist() == [m - 1, m - 4, 2, 12347]
    shares = [dp.noise_share(4, 1000.0, 2) for _ in range(2)]
    noised = [dp.add_in_ring(values, s, bits) for s in shares]
    assert ((noised[0] + noised[1]) % m).tolist() == ((2 * values.astype(np.int64) + shares[0] + shares[1]) % m).tolist()
    assert dp.add_in_ring(np.array([2**63], dtype=np.uint64), np.array([2**62]), 64).tolist() == [2**63 + 2**62]


def test_the_noise_comes_from_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same OS random bytes, same noise: the bits come from os.urandom and nowhere else."""
    seen: list[int] = []

    def fixed(n: int) -> bytes:
        seen.append(n)
        return bytes((i * 7 + 3) % 256 for i in range(n))

    monkeypatch.setattr(os, "urandom", fixed)
    a, b = dp.discrete_gaussian(5.0, 1000), dp.discrete_gaussian(5.0, 1000)
    assert seen and np.array_equal(a, b)
    u = dp.secure_uniform(1000)
    assert u.min() > 0 and u.max() <= 1


def block_update(draw: st.DrawFn) -> tuple[dict, dict, dict]:
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    values = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    count = draw(st.integers(1, 4))
    tensors = {f"t{i}": draw(arrays(dtype, draw(st.integers(1, 40)), elements=values)) for i in range(count)}
    block_of = {name: draw(st.sampled_from(["a", "b"])) for name in tensors}
    clips = {"a": draw(st.floats(1e-3, 1e3)), "b": draw(st.floats(1e-3, 1e3))}
    return tensors, block_of, clips


@settings(max_examples=300, deadline=None)
@given(st.composite(block_update)())
def test_clipping_never_raises_a_norm_and_leaves_small_blocks_unchanged(case: tuple[dict, dict, dict]) -> None:
    tensors, block_of, clips = case
    out = dp.clip_blocks(tensors, block_of, clips)
    for block, norm_before in out.norms.items():
        names = [n for n in tensors if block_of[n] == block]
        norm = math.sqrt(sum(float(np.sum(np.square(out.tensors[n], dtype=np.float64))) for n in names))
        assert norm <= norm_before * (1 + 1e-12)
        assert norm <= clips[block]
        if norm_before <= clips[block]:
            assert out.factors[block] == 1.0
            assert all(out.tensors[n] is tensors[n] for n in names)
        else:
            assert norm >= clips[block] * (1 - 1e-5)  # clipped to the bound, not below it
        assert all(out.tensors[n].dtype == tensors[n].dtype for n in names)


def test_clipping_passes_counters_through_and_refuses_a_block_without_a_clip() -> None:
    tensors = {"w": np.full(4, 10.0, np.float32), "steps": np.array([7], np.int64)}
    out = dp.clip_blocks(tensors, {"w": "a", "steps": "a"}, {"a": 1.0})
    assert out.tensors["steps"] is tensors["steps"] and out.factors["a"] < 0.06
    with pytest.raises(ValueError, match="no clip for block 'b'"):
        dp.clip_blocks(tensors, {"w": "b", "steps": "b"}, {"a": 1.0})
    with pytest.raises(ValueError, match="norm is inf"):
        dp.clip_blocks({"w": np.array([np.inf], np.float32)}, {"w": "a"}, {"a": 1.0})


def test_the_device_module_is_lean_and_not_imported_by_edge_sdk() -> None:
    code = ("import json, sys, edge_sdk; before = 'edge_sdk.dp' in sys.modules; import edge_sdk.dp; "
            "print(json.dumps({'before': before, 'heavy': sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'onnx', 'dp_accounting', 'scipy'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == {"before": False, "heavy": []}
