"""The benchmarks' bootstrap intervals (bench/intervals.py): the C-index over resampled patients is
Harrell's at unit counts, paired draws cancel what two methods share, test sets shared by seeds are
resampled together, and a win needs an interval that excludes zero."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edge_sdk.data.tcga_brca import concordance_index
from tests.shared_data import REPO

sys.path.insert(0, str(REPO))
from bench.intervals import (  # noqa: E402
    Interval, accuracy_of, cindex_of, difference, interval, paired_draws, seed_draws, verdict,
)


def test_the_cindex_of_unit_counts_is_harrells_and_a_patient_drawn_twice_is_no_pair():
    rng = np.random.default_rng(1)
    y = np.column_stack([rng.integers(0, 2, 30), rng.integers(1, 20, 30)]).astype(np.float32)  # ties in time
    risk = np.round(rng.normal(size=30), 1)  # ties in risk
    assert cindex_of(risk, y, np.ones((1, 30)))[0] == pytest.approx(concordance_index(risk, y))
    # Counts weigh pairs: patient 0 twice is the data set with patient 0 duplicated.
    counts = np.ones((1, 30))
    counts[0, 0] = 2
    dup = np.concatenate([[0], np.arange(30)])
    assert cindex_of(risk, y, counts)[0] == pytest.approx(concordance_index(risk[dup], y[dup]))
    # No comparable pair in a draw: NaN, not a score.
    alone = np.zeros((1, 30))
    alone[0, 3] = 5
    assert np.isnan(cindex_of(risk, y, alone)[0])


def test_paired_draws_cancel_what_two_methods_share():
    rng = np.random.default_rng(2)
    a = rng.random((3, 500)) < 0.7
    b = a.copy()
    b[:, :5] = ~b[:, :5]  # 5 examples per seed differ
    draws = paired_draws({"a": list(a), "b": list(b)}, ["t"] * 3, accuracy_of)
    same = difference(draws["a"], draws["a"], 0.7, 0.7)
    assert same.low == same.high == 0.0 and verdict(same) == "within noise"
    paired = difference(draws["a"], draws["b"], a.mean(), b.mean())
    alone = [interval(seed_draws(m.mean(axis=1), 500, rng_seed=i), m.mean()) for i, m in enumerate((a, b))]
    unpaired_width = (alone[0].high - alone[0].low) + (alone[1].high - alone[1].low)
    assert paired.high - paired.low < unpaired_width / 5  # what a and b share cancels


def test_seeds_of_one_test_set_move_together_and_other_test_sets_do_not():
    rng = np.random.default_rng(3)
    c = np.tile(rng.random(300) < 0.6, (4, 1))  # four seeds, the same answers: no seed noise
    one = paired_draws({"m": list(c)}, ["t"] * 4, accuracy_of)["m"]
    many = paired_draws({"m": list(c)}, ["t0", "t1", "t2", "t3"], accuracy_of)["m"]
    # One test set: its sampling noise is not averaged away by more seeds.
    assert np.std(one) > 1.5 * np.std(many)


def test_a_win_needs_an_interval_above_zero():
    assert verdict(Interval(0.02, 0.005, 0.04)) == "wins"
    assert verdict(Interval(-0.02, -0.04, -0.001)) == "loses"
    assert verdict(Interval(0.02, 0.0, 0.04)) == "within noise"
    assert Interval(0.5, 0.4, 0.6).scaled(100).text() == "50.00 [40.00, 60.00]"
