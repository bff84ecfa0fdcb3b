"""Block thresholds and checkable shares in a secure round, device and server side in one process
with real keys, signatures, shares, seals and masks (docs/security.md, "Block thresholds"):

- nothing of one device is unmasked unless at least t devices' contributions are summed: the
  server, taking the part of an attacker that keeps every answer it received, cannot rebuild a
  device's block from a cohort of two when its partner drops, nor from any sum below t;
- the devices enforce it (a round with a lower t is refused, a request that would leave a block
  below t gets no answer);
- a wrong unmasking share names its sender and the round completes without it; sealed shares that
  do not open never stop a device.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.secagg import (SHARE_BYTES, SecAggError, agree, pair_mask_seed, remove_masks, self_mask_seed,
                             split_secret)
from edge_sdk.secagg.round import weight_of
from edge_sdk.secagg.shamir import robust_combine
from orchestrator.aggregation.secure.round import SecureRefusal
from tests.secagg_attack import Advertised, rebuild_secrets, rebuilt
from tests.test_secagg_round import CLIP, SCOPE, Fleet, wire


def _clipped(fleet: Fleet, device: str, block: int) -> np.ndarray:
    x = fleet.updates[device][block - fleet.splits[device]]
    return x * min(1.0, CLIP / np.linalg.norm(x)) * weight_of(fleet.samples[device], 100.0)


def _received_shares(fleet: Fleet, owner: str) -> list[bytes]:
    """Every 33-byte share of ``owner``'s secrets the server received, whatever it was labelled."""
    return [s for (v, _), got in fleet.server.seed_shares.items() if v == owner for _, s in got] + \
        [s for _, s in fleet.server.key_shares.get(owner, [])]


def _unmasks(fleet: Fleet, device: str, block: int, seed: bytes, dropped_keys: dict[str, bytes]) -> bool:
    """Whether ``seed`` as ``device``'s seed of ``block``, with the dropped partners' mask keys,
    turns its masked upload into its own clipped, weighted update (the attack succeeded)."""
    fixed = fleet.server.fixed
    words = fleet.uploads[device][block - fleet.splits[device]]
    pairs = {d: {device: pair_mask_seed(agree(key, fleet.server.keys[device].mask), SCOPE, block, d, device)}
             for d, key in dropped_keys.items()}
    plain = remove_masks(words, fixed.ring_bits, self_seeds={device: self_mask_seed(seed, SCOPE, block, device)},
                         dropped=pairs)
    return bool(np.max(np.abs(fixed.decode(plain).values - _clipped(fleet, device, block))) <= fixed.error_bound)


def test_a_partner_dropping_out_of_a_cohort_of_two_exposes_nothing():
    """Issue 49's case: two strong devices alone train block 0, one is gone after its shares. The
    server asks for nothing of block 0 (below t), and every secret the shares it received rebuild
    leaves the other's block 0 masked, though the dropped one's mask key is rebuilt."""
    fleet = Fleet({"s1": 0, "s2": 0, "w1": 1, "w2": 1, "w3": 1}, seed=7)
    inbox = fleet.shares(fleet.keys())
    assert fleet.server.t == 3 and 0 in fleet.server.unsecured
    fleet.mask(inbox, absent={"s1"})
    outcomes = fleet.unmask()
    assert outcomes[0].values is None and "not trained securely" in outcomes[0].reason
    assert all(o.values is not None for o in outcomes[1:])  # blocks 1 and 2: four survivors
    assert not any(b == 0 for _, b in fleet.server.seed_shares)  # nothing of block 0 was asked for
    key = fleet.server.book.rebuild("s1", -1, fleet.server.graph)
    assert isinstance(key, bytes)  # the attacker holds the dropped partner's mask key
    t = fleet.server.graph.threshold["s2"]
    candidates = rebuilt(_received_shares(fleet, "s2"), t)
    assert candidates and not any(_unmasks(fleet, "s2", 0, seed, {"s1": key}) for seed in candidates)
    # The attack itself is sound: with s2's real seed of block 0 it rebuilds the update.
    assert _unmasks(fleet, "s2", 0, fleet.devices["s2"]._seeds[0], {"s1": key})


@pytest.mark.parametrize("cohort", [2, 3, 4])
def test_no_sum_below_t_is_unmasked_for_block_cohorts_of_2_3_4(cohort):
    """Block 0 trained by ``cohort`` devices of seven (t = 4), one of them gone after its shares:
    block 0 is revealed only when its survivors reach t, and never are its seeds asked for otherwise."""
    splits = {f"s{i}": 0 for i in range(cohort)} | {f"w{i}": 1 for i in range(7 - cohort)}
    fleet = Fleet(splits, seed=cohort)
    inbox = fleet.shares(fleet.keys())
    fleet.mask(inbox, absent={"s0"})
    outcomes = fleet.unmask()
    assert fleet.server.t == 4 and outcomes[0].values is None  # at most 3 survivors of block 0
    assert not any(b == 0 for _, b in fleet.server.seed_shares)
    assert all(o.values is not None for o in outcomes[1:])


def test_a_device_refuses_a_round_whose_t_is_below_its_own():
    fleet = Fleet({"a": 0, "b": 0, "c": 0, "d": 0})
    for dev in fleet.devices.values():
        dev.min_survivors = 5  # its own setting: no sum of fewer than 5
    peers = fleet.keys()
    assert peers["a"].min_survivors == 3
    with pytest.raises(SecAggError, match="fewer than this device's 5"):
        fleet.devices["a"].share(peers["a"])


def test_a_device_refuses_an_unmasking_that_would_leave_a_block_below_t():
    """A server asking for block 0's seeds though only two of its trainers survived gets no answer."""
    fleet = Fleet({"a": 0, "b": 0, "c": 1, "d": 1})
    inbox = fleet.shares(fleet.keys())
    fleet.mask(inbox)
    asks = fleet.consent()
    signed, sigs = asks["c"].survivor_set, asks["c"].signatures
    with pytest.raises(SecAggError, match="block 0 would be unmasked with 2 survivors"):
        fleet.devices["c"].reveal(["a", "b", "c", "d"], [], [0, 1], signed, sigs)
    dev = fleet.devices["d"]
    seeds, keys = dev.reveal(["a", "b", "c", "d"], [], [1, 2], signed, asks["d"].signatures)
    assert set(seeds) == {"a", "b", "c", "d"} and all(len(s) == 2 * SHARE_BYTES for s in seeds.values())


def test_a_wrong_unmasking_share_names_its_sender_and_the_round_completes():
    fleet = Fleet({d: 0 for d in "abcdef"}, seed=3)  # t = 4 of 6
    fleet.mask(fleet.shares(fleet.keys()))
    for d, ask in fleet.consent().items():
        seeds, keys = fleet.devices[d].reveal(ask.survivors, ask.dropped, ask.blocks, ask.survivor_set, ask.signatures)
        if d == "c":  # c garbles its share of a's seeds
            seeds["a"] = os.urandom(len(seeds["a"]) - 1) + seeds["a"][-1:]
        answer = wire(p.SecAggReveal(SCOPE.round, seeds, keys))
        fleet.server.take_reveal(d, answer.seed_shares, answer.key_shares)
    outcomes = fleet.server.finish()
    assert all(o.values is not None for o in outcomes), [o.reason for o in outcomes]
    for out in outcomes:
        expected, _ = fleet.plain_sum(out.block, fleet.splits)
        assert np.max(np.abs(out.values - expected)) <= fleet.server.fixed.error_bound
    assert list(fleet.server.blamed) == ["c"] and "wrong share of 'a'" in fleet.server.blamed["c"]


def test_sealed_shares_that_do_not_open_leave_the_device_in_the_round():
    """b's sealed shares to a are random bytes: a keeps masking with b (their masks cancel), leaves
    b out of its unmasking answer, and the round is revealed from the others' shares."""
    fleet = Fleet({d: 0 for d in "abcdef"}, seed=5)
    inbox = fleet.shares(fleet.keys())
    box = inbox["a"].sealed
    inbox["a"] = wire(p.SecAggInbox(SCOPE.round, {**box, "b": os.urandom(len(box["b"]))}))
    fleet.mask(inbox)
    assert "do not open" in fleet.devices["a"].unopened["b"]
    outcomes = fleet.unmask()
    assert all(o.values is not None for o in outcomes), [o.reason for o in outcomes]
    expected, _ = fleet.plain_sum(0, fleet.splits)
    assert np.max(np.abs(outcomes[0].values - expected)) <= fleet.server.fixed.error_bound
    assert fleet.server.unopened == {"a": ["b"]}


def test_robust_combine_finds_the_secret_and_the_wrong_shares():
    secret = os.urandom(32)
    shares = split_secret(secret, 7, 4)
    bad = list(shares)
    bad[1] = os.urandom(32) + bad[1][-1:]  # off the polynomial
    bad[5] = bad[5][:-1] + bytes([0])  # x = 0: malformed
    got, wrong = robust_combine(bad, 4, lambda s: s == secret)
    assert got == secret and wrong == [1, 5]
    with pytest.raises(SecAggError, match="rebuild the committed secret"):
        robust_combine(bad[:4], 4, lambda s: s == secret)


def _two_sets(fleet: Fleet) -> dict[str, p.SecAggUnmask]:
    """A server that tells a the survivor set without c (c's upload quietly left out for a) and the
    others the true one, then relays the signatures it collected: each request as the server must send it."""
    asks, true = fleet.server.close_uploads(), fleet.server.survivor_set()
    told = {d: [v for v in true if v != "c"] if d == "a" else true for d in asks}
    signed = {d: fleet.devices[d].consent(told[d]) for d in asks}
    return {d: wire(p.SecAggUnmask(SCOPE.round, *asks[d], told[d], {v: signed[v] for v in asks if v != d}))
            for d in asks}


def test_a_server_that_gives_two_devices_different_survivor_sets_gets_no_reveal():
    """Bonawitz et al. 2017's ConsistencyCheck: a's set differs from b's and c's. With t = 3 of three,
    no device sees t signatures on the set it signed, and none answers with a share."""
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    fleet.mask(fleet.shares(fleet.keys()))
    for d, ask in _two_sets(fleet).items():
        with pytest.raises(SecAggError, match="did not sign this survivor set|not the signed survivor set's"):
            fleet.devices[d].reveal(ask.survivors, ask.dropped, ask.blocks, ask.survivor_set, ask.signatures)


def test_a_survivor_set_signature_that_does_not_verify_is_refused_by_the_server():
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    fleet.mask(fleet.shares(fleet.keys()))
    fleet.server.close_uploads()
    forged = fleet.devices["a"].consent(["a", "b"])  # a signs another set than the server's
    with pytest.raises(SecAggError, match="did not sign this survivor set"):
        fleet.server.take_consent("a", forged)
    with pytest.raises(SecureRefusal, match="did not sign the survivor set"):
        fleet.server.take_reveal("b", {}, {})  # shares before a signature: refused


def _attack(fleet: Fleet) -> tuple[set[tuple[str, int]], set[str]]:
    """What an attacker holding everything the server received rebuilds (tests/secagg_attack.py): each
    (device, block) whose committed seed some t of the shares it got of that device interpolate to
    (whatever the shares were labelled), and each device whose mask key they rebuild (checked against
    its public key)."""
    server = fleet.server
    advertised = {u: Advertised(d.split, d.mask, d.commitments) for u, d in server.keys.items() if u in server.shared}
    shares = {u: _received_shares(fleet, u) for u in advertised}
    seeds, keys = rebuild_secrets(advertised, shares, {u: server.graph.threshold[u] for u in advertised}, SCOPE)
    return set(seeds), set(keys)


@pytest.mark.parametrize("stage", ["keys", "shares", "upload"])
@pytest.mark.parametrize("cohort", [2, 3, 4])
def test_an_attacker_with_everything_the_server_received_rebuilds_no_update_nor_sum_below_t(cohort, stage):
    """Block 0 trained by ``cohort`` of seven devices (t = 4), one of its trainers gone after its keys,
    its shares or its masked upload: from every share the server received the attacker rebuilds a
    seed only of a block that was revealed in a sum of at least t, and never a survivor's mask key
    (which, with the seeds, would unmask a survivor's update or a sum of fewer than t)."""
    splits = {f"s{i}": 0 for i in range(cohort)} | {f"w{i}": 1 for i in range(7 - cohort)}
    fleet = Fleet(splits, seed=10 * cohort)
    gone = {"s0"}
    inbox = fleet.shares(fleet.keys(), absent=gone if stage == "keys" else set())
    fleet.mask({d: m for d, m in inbox.items() if not (stage == "keys" and d in gone)},
               absent=gone if stage == "shares" else set())
    outcomes = fleet.unmask(absent=gone if stage == "upload" else set())
    revealed = {o.block: o.cohort for o in outcomes if o.values is not None}
    assert all(n >= fleet.server.t for n in revealed.values())
    assert 1 in revealed and (0 in revealed) == (cohort == 4 and stage == "upload"), revealed
    seeds, keys = _attack(fleet)
    assert {b for _, b in seeds} <= set(revealed), seeds
    assert not keys & fleet.server.masked, keys  # only dropped devices' mask keys
    # The recording is enough to rebuild what was revealed: the attack is not vacuous.
    assert {(u, b) for u in fleet.server.masked for b in revealed if fleet.splits[u] <= b} <= seeds
