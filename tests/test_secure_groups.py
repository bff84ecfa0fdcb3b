"""Secure groups (orchestrator.aggregation.secure.groups): the grouping arithmetic, a grouped round end to
end in one process (real keys, shares, seals and masks through the real codec, each group its own masking
graph, one sum per (group, block)), and the server-fixed weight: a device's weight word cannot move the
result, and the group whose word is wrong is named."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.secagg import Scope, identity_public_key
from edge_sdk.secagg.round import DeviceRound
from orchestrator.aggregation.secure.groups import GroupedRound, group_threshold, partition
from orchestrator.aggregation.secure.round import SecureRefusal

SCOPE = Scope("run-g/0", 2)
SIZES = {0: 30, 1: 12, 2: 5}
CLIP = 4.0


def wire(msg: p.Message) -> p.Message:
    return p.decode(p.encode(msg))


# -- the grouping arithmetic ---------------------------------------------------------------------------
def test_group_threshold_is_a_majority_of_the_group_and_at_least_three():
    assert [group_threshold(n) for n in (3, 4, 5, 6, 7, 8)] == [3, 3, 3, 4, 4, 5]
    assert group_threshold(4, min_survivors=4) == 4


def test_no_group_size_or_a_small_cohort_is_one_group():
    splits = {f"d{i}": 0 for i in range(9)}
    assert partition(list(splits), splits, 0, 3) == [sorted(splits)]
    small = {f"d{i}": 0 for i in range(5)}  # two groups of 3 need 6
    assert len(partition(list(small), small, 3, 3)) == 1


@pytest.mark.parametrize("n,size,groups", [(6, 3, 2), (7, 3, 2), (9, 3, 3), (12, 4, 3), (12, 5, 2), (10, 6, 1)])
def test_the_cohort_is_cut_into_the_most_groups_of_at_least_the_size(n, size, groups):
    splits = {f"d{i:02d}": 0 for i in range(n)}
    got = partition(list(splits), splits, size, 3, rng=random.Random(n))
    assert len(got) == groups
    assert sorted(m for g in got for m in g) == sorted(splits)  # every device in exactly one group
    assert all(len(g) >= max(size, group_threshold(len(g))) for g in got)


def test_groups_keep_every_securely_trained_block_at_t_in_each_group():
    # 6 devices train block 0, 2 more only blocks 2..: in 2 groups each gets 3 trainers of block 0 (t = 3
    # in a group of 4); 3 groups would leave block 0 with 2 trainers in a group, so 2 it is.
    splits = {**{f"s{i}": 0 for i in range(6)}, "w0": 2, "w1": 2}
    for seed in range(20):
        got = partition(list(splits), splits, 2, 3, rng=random.Random(seed))
        assert len(got) == 2
        assert all(sum(splits[m] == 0 for m in g) == 3 for g in got)
    # block 0 reaches t = 4 in one group of 7 (5 trainers), not t = 3 in each of two (2 and 3): one group
    few = {**{f"s{i}": 0 for i in range(5)}, **{f"w{i}": 2 for i in range(2)}}
    assert all(len(partition(list(few), few, 3, 3, rng=random.Random(seed))) == 1 for seed in range(10))


def test_min_survivors_raises_t_within_groups():
    splits = {f"d{i}": 0 for i in range(8)}
    assert len(partition(list(splits), splits, 3, 3, rng=random.Random(1))) == 2
    assert len(partition(list(splits), splits, 3, 3, min_survivors=5, rng=random.Random(1))) == 1


# -- a grouped round end to end ------------------------------------------------------------------------
class GroupFleet:
    """Devices on a :class:`GroupedRound`; ``lie``: device -> the weight it masks with instead of the server's."""

    def __init__(self, splits: dict[str, int], group_size: int, weights: dict[str, float], seed: int = 0,
                 lie: dict[str, float] | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.splits, self.weights, self.lie = splits, weights, lie or {}
        secrets = {d: f"secret-of-{d}" for d in splits}
        roster = {d: identity_public_key(s, d) for d, s in secrets.items()}
        self.server = GroupedRound(SCOPE, 3, SIZES, clip=CLIP, identities=roster, group_size=group_size,
                                   rng=random.Random(seed))
        self.devices = {d: DeviceRound(d, secrets[d], SCOPE, k, 3) for d, k in splits.items()}
        self.updates = {d: [rng.normal(0, 0.3, SIZES[b]) for b in range(k, 3)] for d, k in splits.items()}

    def run(self):
        for d, dev in self.devices.items():
            msg = wire(p.SecAggKeys(SCOPE.round, *dev.advertise()))
            self.server.advertise(d, self.splits[d], msg.cipher_public, msg.mask_public, msg.signature, msg.commitments)
        closed = self.server.close_keys(weight_scale=100.0, weights=self.weights)
        peers = {d: wire(p.SecAggPeers(round=SCOPE.round, **f)) for d, f in closed.items()}
        for d, msg in peers.items():
            if d in self.lie:
                msg = p.SecAggPeers(**{**msg.__dict__, "weight": self.lie[d]})
            self.server.take_shares(d, wire(p.SecAggShares(SCOPE.round, self.devices[d].share(msg))).sealed)
        for d, msg in self.server.close_shares().items():
            self.devices[d].receive(wire(p.SecAggInbox(SCOPE.round, msg)).sealed)
            words = self.devices[d].mask(self.updates[d], 50)
            self.server.take_masked(d, dict(enumerate(words, start=self.splits[d])))
        asks = self.server.close_uploads()
        for d, ask in asks.items():
            msg = wire(p.SecAggUnmask(SCOPE.round, *ask, self.server.survivor_set(d)))
            self.server.take_consent(d, self.devices[d].consent(msg.survivor_set))
        assert self.server.consistent() and self.server.abandon_inconsistent() == []
        for d, ask in asks.items():
            msg = wire(p.SecAggUnmask(SCOPE.round, *ask, self.server.survivor_set(d), self.server.signatures_for(d)))
            seeds, keys = self.devices[d].reveal(msg.survivors, msg.dropped, msg.blocks, msg.survivor_set,
                                                 msg.signatures)
            self.server.take_reveal(d, seeds, keys)
        return peers, self.server.finish()

    def plain_sum(self, block: int, members, weights) -> np.ndarray:
        total = np.zeros(SIZES[block])
        for d in members:
            if self.splits[d] <= block:
                x = self.updates[d][block - self.splits[d]]
                total += x * min(1.0, CLIP / np.linalg.norm(x)) * weights[d]
        return total


SPLITS = {**{f"s{i}": 0 for i in range(6)}, "w0": 2, "w1": 2}
WEIGHTS = {d: 0.25 + 0.09 * i for i, d in enumerate(SPLITS)}


def test_each_group_is_its_own_masking_graph_and_reveals_its_own_sums():
    fleet = GroupFleet(SPLITS, 3, WEIGHTS)
    peers, outcomes = fleet.run()
    groups = fleet.server.members
    assert len(groups) == 2 and sorted(m for g in groups for m in g) == sorted(SPLITS)
    for d, msg in peers.items():  # the device's graph is its group: it masks and shares with its group alone
        mine = next(g for g in groups if d in g)
        assert sorted(msg.members) == mine and set(msg.cipher_keys) == set(mine) - {d}
        assert msg.weight == WEIGHTS[d] and msg.min_survivors >= 3
    bound = max(g.fixed.error_bound for g in fleet.server.groups)
    assert {(o.group, o.block) for o in outcomes} == {(g, b) for g in range(2) for b in range(3)}
    for out in outcomes:
        members = groups[out.group]
        assert out.reason == "" and out.cohort == sum(fleet.splits[m] <= out.block for m in members) >= 3
        assert np.max(np.abs(out.values - fleet.plain_sum(out.block, members, WEIGHTS))) <= bound
        assert out.weight == pytest.approx(sum(WEIGHTS[m] for m in members if fleet.splits[m] <= out.block))
    assert fleet.server.weight_mismatch == {}


def test_a_devices_wrong_weight_word_cannot_move_the_weight_and_its_group_is_named():
    honest = GroupFleet(SPLITS, 3, WEIGHTS, seed=4)
    liar = GroupFleet(SPLITS, 3, WEIGHTS, seed=4, lie={"s1": 1.0})
    _, fair = honest.run()
    _, lied = liar.run()
    assert [o.weight for o in lied] == [o.weight for o in fair]  # the server's sums, whatever the words said
    groups = liar.server.members
    bad = next(i for i, g in enumerate(groups) if "s1" in g)
    assert set(liar.server.weight_mismatch) == {bad}
    assert "s1" in liar.server.weight_mismatch[bad] and "the server's sum is used" in liar.server.weight_mismatch[bad]


def test_one_group_is_the_whole_cohort_and_messages_outside_it_are_refused():
    fleet = GroupFleet({f"d{i}": 0 for i in range(4)}, 3, {f"d{i}": 1.0 for i in range(4)})
    _, outcomes = fleet.run()
    assert len(fleet.server.groups) == 1 and all(o.group == 0 and o.cohort == 4 for o in outcomes)
    with pytest.raises(SecureRefusal, match="no group"):
        fleet.server.take_shares("stranger", {})
    with pytest.raises(SecureRefusal, match="not 'keys'"):
        fleet.server.advertise("d0", 0, b"", b"", b"", b"")


def test_the_peers_weight_is_checked_and_optional_on_the_wire():
    fields = dict(round=1, graph_seed=bytes(32), degree=1, members=["a", "b"], cipher_keys={}, mask_keys={},
                  signatures={}, identities={}, splits={}, clip=1.0, frac_bits=8, ring_bits=20, cohort=2,
                  weight_scale=1.0, threshold=2)
    assert b"\xa6weight" not in p.encode(p.SecAggPeers(**fields))  # absent at its default: older peers unchanged
    assert b"\xa6weight" in p.encode(p.SecAggPeers(**fields, weight=0.5))
    assert wire(p.SecAggPeers(**fields, weight=0.5)).weight == 0.5
    assert wire(p.SecAggPeers(**fields)).weight == -1.0
    with pytest.raises(p.ProtocolError, match="weight"):
        p.encode(p.SecAggPeers(**fields, weight=1.5))


def test_groups_are_refused_with_distributed_noise_in_one_line():
    from edge_sdk.values import SettingError
    from orchestrator.aggregation.assembly import check_capabilities
    from orchestrator.config import ServerConfig
    from orchestrator.strategies import make_strategy

    strategy = make_strategy("embracingfl")
    check_capabilities(ServerConfig(secure_aggregation=True, secure_group_size=3), strategy)
    with pytest.raises(SettingError, match="secure_group_size"):
        check_capabilities(ServerConfig(secure_aggregation=True, secure_group_size=3, dp=True), strategy)


@pytest.mark.parametrize("norm", ["own", "reference"])
def test_the_groups_means_are_scaled_as_secure_group_norm_says_and_devices_updates_as_before(tmp_path, norm):
    """The sums' chain (each group's mean) scales up to the reference's norm only under "reference";
    a plain server's chain (each device's update) always does (FLTrust, Eq. 4)."""
    from orchestrator.aggregation.bounds import TrustStep
    from orchestrator.server import Orchestrator
    from tests.factories import server_config

    def trust_of(chain):
        return next(b.trust for b in chain if isinstance(b, TrustStep))

    secure = Orchestrator(server_config(tmp_path / "s", secure_aggregation=True, direction_trust=True,
                                        secure_group_size=3, secure_group_norm=norm))
    assert trust_of(secure.intake.sum_bounds).scales_up is (norm == "reference")
    plain = Orchestrator(server_config(tmp_path / "p", direction_trust=True, secure_group_norm=norm))
    assert trust_of(plain.intake.bounds).scales_up is True
