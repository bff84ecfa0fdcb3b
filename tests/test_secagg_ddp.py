"""Distributed DP on a secure round, in one process with the real device and server code (keys,
shares, masks, the codec): each device adds a discrete Gaussian share to its quantised block
before masking, and the server's revealed sum carries noise of standard deviation
z_b C_b sqrt(s_b / n_min_b) for s_b survivors (Kairouz, Liu, Steinke 2021, Algorithm 1). The spread
is measured over the coordinates of one block whose input is fixed, so the test is the noise's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.protocol import ProtocolError
from edge_sdk.secagg import SecAggError, identity_public_key
from edge_sdk.secagg.fixedpoint import FixedPoint, ring_bits_for
from edge_sdk.secagg.round import DeviceRound
from orchestrator.aggregation.secure.round import NoisePlan, SecureRound
from tests.test_secagg_round import SCOPE, Fleet

SIZES = {0: 3000, 1: 3000}
CLIP, Z = 2.0, 1.5
SPLITS = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 1, "g": 0}  # block 0: 4 devices, block 1: 7; t = 4


class NoisedFleet(Fleet):
    """A fleet whose server sizes distributed noise for ``n_min`` survivors per block."""

    def __init__(self, n_min: dict[int, int], splits: dict[str, int] = SPLITS,
                 expected: dict[int, int] | None = None) -> None:
        self.splits = splits
        self.secrets = {d: f"secret-of-{d}" for d in splits}
        roster = {d: identity_public_key(s, d) for d, s in self.secrets.items()}
        self.server = SecureRound(SCOPE, 2, SIZES, clip=CLIP, identities=roster)
        self.weight_scale, self.noise_plan = 1e-9, NoisePlan(Z, n_min, expected or {})
        self.devices = {d: DeviceRound(d, self.secrets[d], SCOPE, k, 2) for d, k in splits.items()}
        rng = np.random.default_rng(7)
        self.updates = {d: [rng.normal(0, 0.01, SIZES[b]) for b in range(k, 2)] for d, k in splits.items()}
        self.samples = dict.fromkeys(splits, 10)
        self.uploads = {}

    def run(self, absent: set[str] = frozenset()):
        self.mask(self.shares(self.keys()), absent=absent)
        return {o.block: o for o in self.unmask()}

    def noise(self, out) -> np.ndarray:
        """The revealed sum minus the sum of the survivors' clipped updates (weights are all 1)."""
        expected = sum(self.updates[d][out.block - k] for d, k in self.splits.items()
                       if k <= out.block and d in self.server.masked)
        return out.values - expected


def spread_matches(noise: np.ndarray, std: float) -> bool:
    """The empirical standard deviation of ~3000 draws is within 6% of ``std`` (about 4 standard errors)."""
    return abs(float(np.std(noise)) / std - 1.0) < 0.06 and abs(float(np.mean(noise))) < 4 * std / math.sqrt(noise.size)


def test_survivors_equal_to_n_min_give_the_full_multiplier():
    fleet = NoisedFleet({0: 4, 1: 7})
    outs = fleet.run()
    for b, out in outs.items():
        assert out.reason == "" and out.multiplier == pytest.approx(Z)
        assert spread_matches(fleet.noise(out), Z * CLIP)
        assert out.weight == pytest.approx(out.cohort, abs=1e-6)  # the weight word is the count, not noised


def test_more_survivors_than_n_min_add_noise_and_the_multiplier_follows():
    fleet = NoisedFleet({0: 2, 1: 4})
    outs = fleet.run()
    for b, n_min in ((0, 2), (1, 4)):
        expected = Z * math.sqrt(outs[b].cohort / n_min)
        assert outs[b].multiplier == pytest.approx(expected)
        assert spread_matches(fleet.noise(outs[b]), expected * CLIP)


def test_a_dropout_removes_its_share_and_the_multiplier_follows_the_survivors():
    fleet = NoisedFleet({0: 2, 1: 4})
    outs = fleet.run(absent={"f"})  # "f" trained block 1 only; it drops after sharing its keys
    assert outs[1].cohort == 6 and outs[1].recovered == ["f"]
    assert outs[1].multiplier == pytest.approx(Z * math.sqrt(6 / 4))
    assert spread_matches(fleet.noise(outs[1]), Z * math.sqrt(6 / 4) * CLIP)


def test_shares_sized_for_the_expected_survivors_reach_the_multiplier_when_they_survive():
    """n_exp_b = the whole cohort: all surviving, the sum carries z_b exactly (not z_b sqrt(s / n_min));
    one dropping, z_b sqrt(6 / 7), below the plan, which is what the ledger then accounts."""
    sent = NoisedFleet({0: 2, 1: 4}, expected={0: 4, 1: 7})
    msg = sent.keys()["d"]  # the share's variance sigma^2 / n_min is (z C 2^f)^2 / n_exp
    assert msg.noise_survivors == {"0": 2, "1": 4}
    assert msg.noise_sigma["1"] == pytest.approx(Z * CLIP * math.sqrt(4 / 7) * 2.0**msg.frac_bits)
    fleet = NoisedFleet({0: 2, 1: 4}, expected={0: 4, 1: 7})
    outs = fleet.run()
    for out in outs.values():
        assert out.multiplier == pytest.approx(Z)
        assert spread_matches(fleet.noise(out), Z * CLIP)
    dropped = NoisedFleet({0: 2, 1: 4}, expected={0: 4, 1: 7})
    out = dropped.run(absent={"f"})[1]
    assert out.multiplier == pytest.approx(Z * math.sqrt(6 / 7))
    assert spread_matches(dropped.noise(out), Z * math.sqrt(6 / 7) * CLIP)


def test_expected_survivors_below_the_floor_are_refused():
    with pytest.raises(SecAggError, match="at least its n_min"):
        NoisedFleet({0: 2, 1: 4}, expected={0: 1, 1: 6})


def test_a_block_with_fewer_survivors_than_n_min_is_not_revealed():
    fleet = NoisedFleet({0: 5, 1: 4})
    outs = fleet.run()  # block 0's 4 survivors reach t = 4, not the 5 its noise is sized for
    assert outs[0].values is None and "under-noised" in outs[0].reason
    assert outs[1].values is not None and outs[1].multiplier == pytest.approx(Z * math.sqrt(7 / 4))


def test_the_ring_holds_ten_standard_deviations_of_the_summed_noise():
    plain, noised = FixedPoint.plan(6, CLIP), FixedPoint.plan(6, CLIP, noise=Z * CLIP * math.sqrt(6 / 3))
    assert noised.frac_bits < plain.frac_bits and noised.ring_bits <= 32
    room = 2 ** (noised.ring_bits - 1) - 1 - 6 * math.ceil(CLIP * 2**noised.frac_bits)
    assert room >= 10 * Z * CLIP * math.sqrt(2) * 2**noised.frac_bits


def test_the_device_refuses_a_ring_with_no_room_for_the_noise():
    fleet = NoisedFleet({0: 3, 1: 6})
    peers = fleet.keys()
    msg = peers["a"]
    bare = ring_bits_for(msg.cohort, msg.clip, msg.frac_bits)  # room for the values, none for the noise
    with pytest.raises(SecAggError, match="need a ring"):
        fleet.devices["a"].share(p.SecAggPeers(**{**msg.__dict__, "ring_bits": bare}))


def test_the_device_refuses_noise_that_leaves_a_trained_block_bare():
    fleet = NoisedFleet({0: 3, 1: 6})
    msg = fleet.keys()["a"]
    fields = {**msg.__dict__, "noise_sigma": {"1": msg.noise_sigma["1"]}, "noise_survivors": {"1": 6}}
    with pytest.raises(SecAggError, match="not every block"):
        fleet.devices["a"].share(p.SecAggPeers(**fields))


def test_peers_noise_fields_round_trip_and_are_checked():
    fleet = NoisedFleet({0: 3, 1: 6})
    msg = fleet.keys()["d"]
    assert msg.noise_survivors == {"0": 3, "1": 6}
    assert msg.noise_sigma["1"] == pytest.approx(Z * CLIP * 2.0**msg.frac_bits)
    bad = p.SecAggPeers(**{**msg.__dict__, "noise_survivors": {"0": 3}})
    with pytest.raises(ProtocolError, match="different blocks"):
        p.decode(p.encode(bad))
    assert b"noise_sigma" not in p.encode(p.SecAggPeers(**{**msg.__dict__, "noise_sigma": {}, "noise_survivors": {}}))
