"""Robust aggregators per layer group under partial training, and the per-device weight cap.

Strategies are driven as the server drives them (configure, on_report, aggregate) with reports
built by hand: strong devices train fc1 and the head, weak ones the head only, so fc1 and the head
are two layer groups with different contributors.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.strategies import EmbracingFL, FedAvg, make_strategy
from orchestrator.strategies.robust import (
    AGGREGATIONS,
    RobustRound,
    capped_weights,
    centered_clip,
    krum,
    max_capped,
    trim_count,
)
from tests.test_strategies import F32, global_state, report, run

FC1 = ("blocks.fc1.weight", "blocks.fc1.bias")
HEAD = ("blocks.head.weight", "blocks.head.bias")


def strong_const(device_id: str, v: float, samples: int = 10, head: float | None = None):
    """A strong device whose delta is ``v`` at every fc1 element and ``head`` (default v) at the head's."""
    h = v if head is None else head
    return report(device_id, "strong", (0, 2), samples, {
        "blocks.fc1.weight": np.full((2, 2), v, F32), "blocks.fc1.bias": np.full(2, v, F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(1, np.int64),
        "blocks.head.weight": np.full((1, 2), h, F32), "blocks.head.bias": np.full(1, h, F32)})


def weak_const(device_id: str, v: float, samples: int = 10):
    return report(device_id, "weak", (1, 2), samples,
                  {"blocks.head.weight": np.full((1, 2), v, F32), "blocks.head.bias": np.full(1, v, F32)})


def moved(result, names) -> np.ndarray:
    old = global_state()
    return np.concatenate([(result.state[n].astype(np.float64) - old[n]).ravel() for n in names])


# -- trimmed mean --------------------------------------------------------------------------------
def test_trim_count_trims_one_from_each_side_once_three_contribute():
    assert [trim_count(n, 0.1) for n in (1, 2, 3, 4, 9, 10, 20, 21)] == [0, 0, 1, 1, 1, 1, 2, 2]
    assert trim_count(3, 0.49) == 1 and trim_count(5, 0.45) == 2 and trim_count(7, 0.0) == 0


@pytest.mark.parametrize("n", [3, 4])
def test_trimmed_mean_drops_the_extremes_with_three_and_four_contributors(n):
    values = [0.1, 0.2, 1000.0] if n == 3 else [-1000.0, 0.1, 0.2, 1000.0]
    result = run(FedAvg(aggregation="trimmed_mean", trim=0.1),
                 [strong_const(f"s{i}", v) for i, v in enumerate(values)])
    np.testing.assert_allclose(moved(result, FC1 + HEAD), 0.2 if n == 3 else 0.15, rtol=1e-6)
    assert all(g["method"] == "trimmed_mean" and "note" not in g for g in result.extra["groups"])


def test_trimmed_mean_per_group_under_partial_training():
    # fc1: strong s0..s2 (one hostile); head: s0..s2 and w0..w2 (six, one hostile).
    reports = [strong_const("s0", 0.1), strong_const("s1", 0.2), strong_const("s2", 500.0),
               weak_const("w0", 0.3), weak_const("w1", 0.4), weak_const("w2", 0.5)]
    result = run(EmbracingFL(aggregation="trimmed_mean", trim=0.1), reports)
    np.testing.assert_allclose(moved(result, FC1), 0.2, rtol=1e-6)  # (0.1, [0.2], 500): one dropped each side
    np.testing.assert_allclose(moved(result, HEAD), (0.2 + 0.3 + 0.4 + 0.5) / 4, rtol=1e-6)
    sizes = sorted((g["devices"], g["entries"]) for g in result.extra["groups"])
    assert sizes == [(3, 2), (6, 2)]


# -- Krum and multi-Krum -------------------------------------------------------------------------
def _rows(values: list[list[float]]) -> list[list[np.ndarray]]:
    return [[np.asarray(v, np.float64)] for v in values]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(5, 11), dim=st.integers(1, 6))
def test_multi_krum_stays_within_the_honest_rows_range(data, n, dim):
    f = data.draw(st.integers(1, (n - 3) // 2))  # n > 2f + 2, i.e. f < n/2 - 1
    honest = np.array(data.draw(st.lists(st.lists(st.floats(-1, 1), min_size=dim, max_size=dim),
                                         min_size=n - f, max_size=n - f)))
    # Byzantine rows of arbitrary magnitude (at least 100 away in some coordinate), colluding or not.
    offsets = data.draw(st.lists(st.floats(100, 1e12) | st.floats(-1e12, -100), min_size=f, max_size=f))
    coords = data.draw(st.lists(st.integers(0, dim - 1), min_size=f, max_size=f))
    bad = np.zeros((f, dim))
    for i, (off, c) in enumerate(zip(offsets, coords)):
        bad[i, c] = off
    rows = np.concatenate([honest, bad])
    order = data.draw(st.permutations(range(n)))
    rows = rows[list(order)]
    for m in (1, n - f):
        (out,), kept = krum(_rows(rows.tolist()), f, m)
        assert np.all(out >= honest.min(axis=0) - 1e-9) and np.all(out <= honest.max(axis=0) + 1e-9)
        assert all(order[i] < n - f for i in kept)  # only honest rows were selected


def test_krum_needs_more_than_2f_plus_2_and_the_strategy_falls_back_to_the_median():
    with pytest.raises(ValueError, match="more than 4"):
        krum(_rows([[0.0]] * 4), 1, 1)
    # fc1 has 3 contributors (median), the head 5 (multi-Krum with f = 1 keeps the 4 best).
    reports = [strong_const("s0", 0.1), strong_const("s1", 0.3), strong_const("s2", 900.0),
               weak_const("w0", 0.2), weak_const("w1", 0.4)]
    result = run(EmbracingFL(aggregation="multi_krum"), reports)
    np.testing.assert_allclose(moved(result, FC1), 0.3, rtol=1e-6)
    np.testing.assert_allclose(moved(result, HEAD), (0.1 + 0.3 + 0.2 + 0.4) / 4, rtol=1e-6)
    groups = {g["devices"]: g for g in result.extra["groups"]}
    assert groups[3]["method"] == "median" and "Krum needs more than 4" in groups[3]["note"]
    assert groups[5]["method"] == "multi_krum" and groups[5]["kept"] == ["s0", "s1", "w0", "w1"]


def test_krum_scores_a_layer_group_as_one_vector():
    # Each entry alone would pick a different device; over the group (both entries) s1 is central.
    rows = [[np.array([0.0]), np.array([3.0])], [np.array([1.0]), np.array([1.0])],
            [np.array([2.0]), np.array([0.0])], [np.array([1.1]), np.array([1.2])],
            [np.array([0.9]), np.array([0.8])]]
    out, kept = krum(rows, 1, 1)
    assert kept in ([1], [3], [4]) and out[0].shape == (1,)
    assert len(RobustRound("krum").groups()) == 0


# -- centered clipping ---------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), dim=st.integers(1, 5), tau=st.floats(0.01, 10))
def test_centered_clipping_bounds_each_devices_influence_by_tau(data, n, dim, tau):
    vec = st.lists(st.floats(-1e6, 1e6), min_size=dim, max_size=dim)
    rows = np.array(data.draw(st.lists(vec, min_size=n, max_size=n)))
    center = np.array(data.draw(vec))
    changed = rows.copy()
    changed[data.draw(st.integers(0, n - 1))] = data.draw(vec)
    (a,), _, _ = centered_clip(_rows(rows.tolist()), [center], tau)
    (b,), _, _ = centered_clip(_rows(changed.tolist()), [center], tau)
    # The result moves at most tau from the center: up to float64 rounding of a center as large as
    # 1e6 (a few of its ulps, 1e-10 each, more than tau's 1e-9 relative slack when tau is 0.01).
    assert np.linalg.norm(a - center) <= tau * (1 + 1e-9) + 4 * dim * np.spacing(np.abs(center).max())
    assert np.linalg.norm(a - b) <= 2 * tau / n * (1 + 1e-9) + 1e-9  # one device moves it by at most 2 tau / n


def test_centered_clipping_clips_an_outlier_to_the_median_distance_and_keeps_history():
    strategy = EmbracingFL(aggregation="centered_clip")
    first = run(strategy, [strong_const("s0", 0.1), strong_const("s1", 0.2), strong_const("s2", 0.3),
                           strong_const("s3", 100.0)])
    g = first.extra["groups"][0]
    assert g["method"] == "centered_clip" and "s3" in g["clipped"] and "s0" not in g["clipped"]
    # Round 1 centers on zero; one group of 9 elements (fc1 and the head): the radius is the median
    # norm, 0.25 x 3, so s2 (0.3) and s3 (100) are clipped to 0.25 per element.
    assert g["radius"] == pytest.approx(0.75) and g["clipped"] == ["s2", "s3"]
    got = moved(first, FC1 + HEAD)
    np.testing.assert_allclose(got, (0.1 + 0.2 + 0.25 + 0.25) / 4, rtol=1e-6)
    # Round 2: a lone strong device (fc1 has one contributor) is clipped around fc1's last aggregate
    # with fc1's share of the last radius (6 of the 9 elements: 0.25 x sqrt(6)).
    second = run(strategy, [strong_const("s3", 100.0), weak_const("w0", 0.1), weak_const("w1", 0.1),
                            weak_const("w2", 0.1)], state=first.state)
    lone = next(x for x in second.extra["groups"] if x["devices"] == 1)
    assert lone["note"] == "1 contributors: radius from earlier rounds"
    assert lone["radius"] == pytest.approx(0.25 * np.sqrt(6), rel=1e-6)
    step = np.concatenate([(second.state[n].astype(np.float64) - first.state[n]).ravel() for n in FC1])
    assert np.linalg.norm(step - got[:6]) <= lone["radius"] * (1 + 1e-6)


def test_centered_clipping_without_history_leaves_a_lone_device_unclipped_and_says_so():
    result = run(EmbracingFL(aggregation="centered_clip"),
                 [strong_const("s0", 50.0), weak_const("w0", 0.1), weak_const("w1", 0.2), weak_const("w2", 0.3)])
    lone = next(g for g in result.extra["groups"] if g["devices"] == 1)
    assert "not clipped" in lone["note"]
    np.testing.assert_allclose(moved(result, FC1), 50.0, rtol=1e-6)


# -- every aggregator: one hostile device among five, per group ----------------------------------
@pytest.mark.parametrize("aggregation", [a for a in AGGREGATIONS if a != "mean"])
def test_every_robust_aggregation_holds_one_boosted_device_per_group(aggregation):
    honest = [strong_const(f"s{i}", 0.1 * (i + 1)) for i in range(4)] + [weak_const(f"w{i}", 0.2) for i in range(3)]
    hostile = strong_const("x", 1e4)
    result = run(EmbracingFL(aggregation=aggregation, trim=0.1), honest + [hostile])
    assert np.all(np.abs(moved(result, FC1 + HEAD)) <= 0.4 + 1e-6), aggregation
    assert result.state["blocks.fc1.bn.num_batches_tracked"] == 5 + 1


def test_robust_options_are_checked():
    with pytest.raises(ValueError, match="byzantine"):
        FedAvg(aggregation="krum", byzantine=-1)
    with pytest.raises(ValueError, match="clip_radius"):
        FedAvg(aggregation="centered_clip", clip_radius=-1.0)
    with pytest.raises(ValueError, match="max_weight_share"):
        FedAvg(max_weight_share=0)
    assert make_strategy("embracingfl", aggregation="multi_krum", byzantine=2).byzantine == 2


# -- the weight cap ------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(w=st.lists(st.floats(1e-3, 1e9), min_size=1, max_size=12), share=st.floats(0.05, 1.0))
def test_capped_weights_meet_the_share_and_cap_only_the_heaviest(w, share):
    out = capped_weights(w, share)
    w = np.asarray(w)
    assert np.all(out <= w * (1 + 1e-12))
    if len(w) * share >= 1:
        assert out.max() <= share * out.sum() * (1 + 1e-9)
        c = out.max()
        np.testing.assert_allclose(out[w <= c], w[w <= c])  # below the cap, nothing changes
        assert np.sum(out < w * (1 - 1e-9)) <= max_capped(share)
    else:
        assert np.allclose(out, out[0])  # too few to meet the cap: equal weights


def test_the_cap_bounds_an_inflated_sample_claim_per_entry():
    # fc1: s0 (claims 10^6 samples), s1, s2; head: also w0, w1. Share 1/3.
    reports = [strong_const("s0", 1.0, samples=10**6), strong_const("s1", 0.0, 100), strong_const("s2", 0.0, 200),
               weak_const("w0", 0.0, 100), weak_const("w1", 0.0, 100)]
    capped = run(EmbracingFL(max_weight_share=1 / 3), reports)
    plain = run(EmbracingFL(max_weight_share=1.0), reports)
    assert moved(plain, FC1).min() > 0.99  # uncapped, s0 is nearly the whole average
    # fc1 weights 10^6, 100, 200: three contributors can meet a share of 1/3 only with equal weights (c = 100).
    np.testing.assert_allclose(moved(capped, FC1), 1 / 3, rtol=1e-6)
    # head weights 10^6, 100, 200, 100, 100 -> c = 500 / 2 = 250 -> 1/3 again.
    np.testing.assert_allclose(moved(capped, HEAD), 1 / 3, rtol=1e-6)
    # The fraction of its weight each capped device kept, at the entry where it kept the least.
    assert capped.extra["weight_capped"] == {"s0": pytest.approx(100 / 10**6), "s2": 0.5}


def test_below_three_contributors_the_cap_gives_equal_weights():
    reports = [strong_const("s0", 1.0, samples=1000), strong_const("s1", 0.0, 10)]
    np.testing.assert_allclose(moved(run(FedAvg(max_weight_share=1 / 3), reports), FC1 + HEAD), 0.5, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(samples=st.lists(st.integers(1, 10**6), min_size=3, max_size=9), share=st.sampled_from([0.25, 1 / 3, 0.5]))
def test_the_capped_running_sum_equals_the_capped_average(samples, share):
    assume(len(samples) * share >= 1)
    values = [float(i + 1) for i in range(len(samples))]
    result = run(FedAvg(max_weight_share=share), [strong_const(f"d{i}", v, samples=s)
                                                  for i, (v, s) in enumerate(zip(values, samples))])
    w = capped_weights(samples, share)
    np.testing.assert_allclose(moved(result, FC1 + HEAD), np.dot(w, values) / w.sum(), rtol=1e-5)
