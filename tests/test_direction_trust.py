"""Direction trust per layer group (orchestrator/aggregation/trust.py): a report's weight in each block's mean is
its block's ReLU(cosine) with the server's reference update, carried to the strategy as
``DeviceReport.entry_weights``; a block no report was trusted for keeps its value; robust statistics
leave a zero-trust report out. The live fleets with each insider are in tests/test_attacks_trust.py
(slow tier)."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.models.zoo import tiny
from orchestrator.aggregation.trust import DirectionTrust, block_cosines
from orchestrator.strategies import DeviceReport
from orchestrator.strategies.base import RobustStack, WeightedSums
from orchestrator.strategies.robust import RobustRound
from orchestrator.strategies.selection import Selection

TEMPLATE = tiny()
STATE = {k: v.detach().numpy().copy() for k, v in TEMPLATE.state_dict().items()}
BLOCK_OF = {n: TEMPLATE.block_of(n) for n in STATE}
RNG = np.random.default_rng(0)
REFERENCE = {n: RNG.standard_normal(v.shape).astype(np.float32) for n, v in STATE.items()}


def _scaled(tensors, by_block):
    return {n: (t * by_block[BLOCK_OF[n]]).astype(np.float32) for n, t in tensors.items()}


def test_the_cosine_is_taken_per_block() -> None:
    update = _scaled(REFERENCE, {0: 2.0, 1: -0.5})  # block 0 aligned, block 1 flipped
    cos = block_cosines(update, REFERENCE, BLOCK_OF)
    assert cos[0] == pytest.approx(1.0) and cos[1] == pytest.approx(-1.0)
    # A block with no reference direction is not judged (nan); an update of no length has none (0).
    zero = {n: np.zeros_like(t) for n, t in REFERENCE.items()}
    assert all(np.isnan(c) for c in block_cosines(update, zero, BLOCK_OF).values())
    assert block_cosines(zero, REFERENCE, BLOCK_OF) == {0: 0.0, 1: 0.0}


def test_rows_and_channel_slices_are_compared_with_the_same_elements_of_the_reference() -> None:
    name = "blocks.fc1.weight"
    rows = p.RowSparse(np.array([0, 2]), REFERENCE[name][[0, 2]] * 3, 3)
    assert block_cosines({name: rows}, REFERENCE, BLOCK_OF)[0] == pytest.approx(1.0)
    sel = Selection.of_channels(0, {name: (2, 4)})
    assert block_cosines({name: -REFERENCE[name][:2, :4]}, REFERENCE, BLOCK_OF, sel)[0] == pytest.approx(-1.0)


def test_a_sign_flipped_block_gets_no_weight_and_the_floor_keeps_some() -> None:
    trust = DirectionTrust(TEMPLATE)
    trust.begin_round(REFERENCE)
    update = _scaled(REFERENCE, {0: 1.0, 1: -1.0})
    scores = trust.score("d", update, Selection.tail(0))
    assert scores == {0: pytest.approx(1.0), 1: 0.0}
    assert trust.entry_weights(update, scores) == {"blocks.head.weight": 0.0, "blocks.head.bias": 0.0}
    soft = DirectionTrust(TEMPLATE, floor=0.2)
    soft.begin_round(REFERENCE)
    assert soft.score("d", update, Selection.tail(0))[1] == 0.2
    # Without a reference this round, or with trust off, no weight changes.
    trust.begin_round(None)
    assert trust.score("d", update, Selection.tail(0)) == {}
    off = DirectionTrust(TEMPLATE, enabled=False)
    off.begin_round(REFERENCE)
    assert off.score("d", update, Selection.tail(0)) == {}


def test_a_block_every_report_distrusts_is_named() -> None:
    trust = DirectionTrust(TEMPLATE)
    trust.begin_round(REFERENCE)
    trust.score("a", _scaled(REFERENCE, {0: 1.0, 1: -1.0}), Selection.tail(0))
    trust.score("b", _scaled(REFERENCE, {0: 0.5, 1: -2.0}), Selection.tail(0))
    assert list(trust.untrusted()) == ["head"] and "keeps its previous value" in trust.untrusted()["head"]
    trust.score("c", _scaled(REFERENCE, {0: 1.0, 1: 1.0}), Selection.tail(0))
    assert trust.untrusted() == {}
    trust.discard("c")  # refused by the strategy after all: its trust does not count
    assert list(trust.untrusted()) == ["head"]


def _report(device: str, tensors, trust: dict[str, float], samples: int = 10) -> DeviceReport:
    return DeviceReport(device_id=device, round=1, phase="train", role="strong", num_samples=samples, trained=(0, 2),
                        metrics=MappingProxyType({}), tensors=MappingProxyType(tensors), selection=Selection.tail(0),
                        entry_weights=MappingProxyType(trust))


def test_the_weighted_mean_scales_each_entry_by_its_trust() -> None:
    ones = {n: np.ones_like(v) for n, v in STATE.items()}
    sums = WeightedSums(STATE)
    sums.add_report(_report("honest", ones, {}), 10.0)
    sums.add_report(_report("half", {n: 3 * v for n, v in ones.items()}, dict.fromkeys(STATE, 0.5)), 10.0)
    sums.add_report(_report("flipped", {n: -5 * v for n, v in ones.items()}, dict.fromkeys(STATE, 0.0)), 10.0)
    new = sums.new_state()
    for n in STATE:  # (10 x 1 + 5 x 3) / 15; the flipped report weighs nothing
        np.testing.assert_allclose(new[n] - STATE[n], 25 / 15, rtol=1e-5)


def test_a_block_whose_whole_cohort_has_zero_trust_keeps_its_value() -> None:
    sums = WeightedSums(STATE)
    head = {n: 0.0 for n in STATE if BLOCK_OF[n] == 1}
    for d in ("a", "b"):
        sums.add_report(_report(d, {n: np.full_like(v, 0.1) for n, v in STATE.items()}, head), 10.0)
    new = sums.new_state()
    for n in STATE:
        if BLOCK_OF[n] == 1:
            np.testing.assert_array_equal(new[n], STATE[n])
            assert sums.counts[n] == 0
        else:
            np.testing.assert_allclose(new[n] - STATE[n], 0.1, rtol=1e-5)


def test_a_robust_statistic_leaves_a_zero_trust_report_out() -> None:
    stack = RobustStack(STATE, RobustRound("median"))
    for d, v in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("flipped", -100.0)):
        trust = dict.fromkeys(STATE, 0.0) if d == "flipped" else {}
        stack.add_report(_report(d, {n: np.full_like(s, v) for n, s in STATE.items()}, trust), 1.0)
    new = stack.new_state()
    for n in STATE:
        np.testing.assert_allclose(new[n] - STATE[n], 2.0, rtol=1e-5)
    assert all(g["devices"] == 3 and "note" not in g for g in stack.extra()["groups"])


def test_a_robust_statistic_over_too_few_contributors_says_so() -> None:
    robust = RobustRound("median")
    for d in ("a", "b"):
        robust.add(d, "blocks.fc1.bias", np.ones(3))
    robust.aggregate()
    assert "median of 2 is their mean" in robust.summary()[0]["note"]


def test_each_block_is_normalised_to_the_references_norm_so_size_gives_no_leverage() -> None:
    """FLTrust, Eq. 4: a free rider's 0.01 x update and a x100 boosted one both come out at the
    reference's norm block by block (rows and slices against the same elements of the reference);
    their direction, and so their trust, is unchanged."""
    trust = DirectionTrust(TEMPLATE)
    trust.begin_round(REFERENCE)
    honest = _scaled(REFERENCE, {0: 0.8, 1: 1.2})
    for size in (0.01, 100.0):
        update = _scaled(honest, {0: size, 1: size})
        scaled, factors = trust.normalise(update, Selection.tail(0))
        for b in (0, 1):
            names = [n for n in STATE if BLOCK_OF[n] == b]
            norm = np.sqrt(sum(float(np.sum(np.square(scaled[n], dtype=np.float64))) for n in names))
            want = np.sqrt(sum(float(np.sum(np.square(REFERENCE[n], dtype=np.float64))) for n in names))
            assert norm == pytest.approx(want, rel=1e-5)
        assert factors[0] == pytest.approx(1 / (0.8 * size), rel=1e-5)
        assert trust.score("d", scaled, Selection.tail(0)) == pytest.approx(trust.score("d", honest, Selection.tail(0)))
    name = "blocks.fc1.weight"
    rows = p.RowSparse(np.array([0, 2]), REFERENCE[name][[0, 2]] * 0.01, 3)
    scaled, _ = trust.normalise({name: rows}, Selection.tail(0))
    np.testing.assert_allclose(scaled[name].values, REFERENCE[name][[0, 2]], rtol=1e-5)
    off = DirectionTrust(TEMPLATE, enabled=False)
    off.begin_round(REFERENCE)
    assert off.normalise(honest, Selection.tail(0)) == (honest, {})


def test_a_secure_groups_mean_is_scaled_down_to_the_references_norm_never_up() -> None:
    """``scales_up=False`` (a secure group's mean under ``secure_group_norm = "own"``): a block over the
    reference's norm comes down to it; a block under it keeps its own norm (the members' agreement),
    where a device's update would be scaled up; the trust is the same either way."""
    group, device = DirectionTrust(TEMPLATE, scales_up=False), DirectionTrust(TEMPLATE)
    for t in (group, device):
        t.begin_round(REFERENCE)
    mean = _scaled(REFERENCE, {0: 0.6, 1: 3.0})  # block 0 under the reference's norm, block 1 over it
    scaled, factors = group.normalise(mean, Selection.tail(0))
    assert 0 not in factors and factors[1] == pytest.approx(1 / 3.0, rel=1e-5)
    for n in STATE:
        want = REFERENCE[n] * (0.6 if BLOCK_OF[n] == 0 else 1.0)
        np.testing.assert_allclose(scaled[n], want, rtol=1e-5, atol=1e-6)
    as_device, _ = device.normalise(mean, Selection.tail(0))
    n0 = next(n for n in STATE if BLOCK_OF[n] == 0)
    np.testing.assert_allclose(as_device[n0], REFERENCE[n0], rtol=1e-5, atol=1e-6)  # scaled up from 0.6
    assert group.score("g", scaled, Selection.tail(0)) == pytest.approx(device.score("g", as_device, Selection.tail(0)))
