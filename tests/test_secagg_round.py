"""A secure round end to end in one process: the device side (edge_sdk.secagg.round) and the
server side (orchestrator.aggregation.secure.round) with real keys, signatures, shares, seals and masks, the
messages through the real codec. Nested cohorts (split k trains blocks k..L-1), dropouts after
the shares and after the upload, blindness of the uploads, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk import protocol as p
from edge_sdk.protocol import messages as m
from edge_sdk.secagg import (KEY_BYTES, SEALED_BYTES, SHARE_BYTES, SIGNATURE_BYTES, Scope, SecAggError,
                             identity_public_key)
from edge_sdk.secagg.round import DeviceRound, weight_of
from orchestrator.aggregation.secure.round import SecureRefusal, SecureRound

SCOPE = Scope("run-a/0", 3)
SIZES = {0: 40, 1: 25, 2: 7}  # coordinates per block
CLIP = 4.0


def wire(msg: p.Message) -> p.Message:
    """Through the real codec, as on a connection."""
    return p.decode(p.encode(msg))


class Fleet:
    """``splits``: device -> split. Each device has a credential secret and a float update per block."""

    def __init__(self, splits: dict[str, int], seed: int = 0, degree: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.splits = splits
        self.secrets = {d: f"secret-of-{d}" for d in splits}
        roster = {d: identity_public_key(s, d) for d, s in self.secrets.items()}
        self.server = SecureRound(SCOPE, 3, SIZES, clip=CLIP, identities=roster, degree=degree)
        self.weight_scale, self.noise_plan = 100.0, None  # what the server passes in when the key stage closes
        self.devices = {d: DeviceRound(d, self.secrets[d], SCOPE, k, 3) for d, k in splits.items()}
        self.updates = {d: [rng.normal(0, 0.3, SIZES[b]) for b in range(k, 3)] for d, k in splits.items()}
        self.samples = {d: int(rng.integers(20, 120)) for d in splits}
        self.uploads: dict[str, list[np.ndarray]] = {}

    def keys(self) -> dict[str, p.SecAggPeers]:
        for d, dev in self.devices.items():
            msg = wire(p.SecAggKeys(SCOPE.round, *dev.advertise()))
            self.server.advertise(d, self.splits[d], msg.cipher_public, msg.mask_public, msg.signature,
                                  msg.commitments)
        return {d: wire(p.SecAggPeers(round=SCOPE.round, **f)) for d, f in self.server.close_keys(
            weight_scale=self.weight_scale, noise=self.noise_plan).items()}

    def shares(self, peers: dict[str, p.SecAggPeers], absent: set[str] = frozenset()) -> dict[str, p.SecAggInbox]:
        for d, msg in peers.items():
            sealed = self.devices[d].share(msg)
            if d not in absent:
                self.server.take_shares(d, wire(p.SecAggShares(SCOPE.round, sealed)).sealed)
        return {d: wire(p.SecAggInbox(SCOPE.round, s)) for d, s in self.server.close_shares().items()}

    def mask(self, inbox: dict[str, p.SecAggInbox], absent: set[str] = frozenset()) -> None:
        for d, msg in inbox.items():
            self.devices[d].receive(msg.sealed)
            words = self.devices[d].mask(self.updates[d], self.samples[d])
            self.uploads[d] = words
            if d not in absent:
                self.server.take_masked(d, dict(enumerate(words, start=self.splits[d])))

    def consent(self, absent: set[str] = frozenset()) -> dict[str, p.SecAggUnmask]:
        """Close the uploads; each survivor not ``absent`` signs the survivor set (ConsistencyCheck). The
        second request of each: with the signatures it can check."""
        asks, survivors = self.server.close_uploads(), self.server.survivor_set()
        for d, ask in asks.items():
            msg = wire(p.SecAggUnmask(SCOPE.round, *ask, survivors))
            if d not in absent:
                answer = wire(p.SecAggReveal(SCOPE.round, {}, {}, self.devices[d].consent(msg.survivor_set)))
                self.server.take_consent(d, answer.consent)
        return {d: wire(p.SecAggUnmask(SCOPE.round, *ask, survivors, self.server.signatures_for(d)))
                for d, ask in asks.items() if d not in absent}

    def unmask(self, absent: set[str] = frozenset()):
        for d, msg in self.consent(absent).items():
            seeds, keys = self.devices[d].reveal(msg.survivors, msg.dropped, msg.blocks, msg.survivor_set,
                                                 msg.signatures)
            answer = wire(p.SecAggReveal(SCOPE.round, seeds, keys))
            self.server.take_reveal(d, answer.seed_shares, answer.key_shares)
        return self.server.finish()

    def plain_sum(self, block: int, members) -> tuple[np.ndarray, float]:
        """The float sum of the clipped, weighted updates of ``members`` that trained ``block``."""
        total, weight = np.zeros(SIZES[block]), 0.0
        for d in members:
            if self.splits[d] > block:
                continue
            x = self.updates[d][block - self.splits[d]]
            w = weight_of(self.samples[d], 100.0)
            total += x * min(1.0, CLIP / np.linalg.norm(x)) * w
            weight += w
        return total, weight


SPLITS = {"a": 0, "b": 0, "c": 1, "d": 0, "e": 2, "f": 0, "g": 0}  # 7 devices: t = 4; cohorts 5, 6, 7


def test_nested_cohorts_reveal_each_blocks_plain_sum_within_the_stated_error():
    fleet = Fleet(SPLITS)
    outcomes = fleet.unmask() if fleet.mask(fleet.shares(fleet.keys())) is None else None
    bound = fleet.server.fixed.error_bound
    for out in outcomes:
        expected, weight = fleet.plain_sum(out.block, SPLITS)
        assert out.reason == "" and out.cohort == sum(k <= out.block for k in SPLITS.values())
        assert np.max(np.abs(out.values - expected)) <= bound
        assert abs(out.weight - weight) <= fleet.server.fixed.weight_error_bound


def test_uploads_are_blind_to_the_server():
    """No upload equals, or correlates with, the device's own quantized update."""
    fleet = Fleet(SPLITS, seed=4)
    fleet.mask(fleet.shares(fleet.keys()))
    fixed = fleet.server.fixed

    def lifted(w: np.ndarray) -> np.ndarray:
        return np.where(w >= 2 ** (fixed.ring_bits - 1), w.astype(np.int64) - 2**fixed.ring_bits, w).astype(float)

    for d, words in fleet.uploads.items():
        plain = [fixed.encode(x, weight_of(fleet.samples[d], 100.0)) for x in fleet.updates[d]]
        for masked, own in zip(words, plain):
            assert not np.array_equal(masked, own)
            assert not np.isin(masked, own).mean() > 0.2  # no coordinate-wise copy either
        seen, own = np.concatenate(words), np.concatenate(plain)
        corr = np.corrcoef(lifted(seen), lifted(own))[0, 1]
        assert abs(corr) < 4 / np.sqrt(seen.size)  # |r| of independent data: about 1/sqrt(n)
    # Spread over the whole ring, not a scaled update: uniform words have a standard deviation of
    # 2^b / sqrt(12), about 0.29 x 2^b; over every upload's words (a device of the last block alone
    # sends 8, too few to judge one device by).
    every = np.concatenate([lifted(w) for words in fleet.uploads.values() for w in words])
    assert np.std(every) > 2 ** (fixed.ring_bits - 3)


def test_dropouts_after_shares_and_after_upload_are_recovered():
    fleet = Fleet(SPLITS, seed=2)
    inbox = fleet.shares(fleet.keys())
    fleet.mask(inbox, absent={"b"})  # b masked, never uploaded: its pair masks are rebuilt from its key shares
    outcomes = fleet.unmask(absent={"f"})  # f uploaded, then vanished before unmasking
    survivors = set(SPLITS) - {"b"}
    for out in outcomes:
        expected, _ = fleet.plain_sum(out.block, survivors)
        assert out.reason == "", out.reason
        assert np.max(np.abs(out.values - expected)) <= fleet.server.fixed.error_bound
    assert outcomes[0].recovered == ["b"]


def test_a_block_under_the_threshold_is_not_revealed():
    fleet = Fleet({"a": 0, "b": 0, "c": 0, "d": 2, "e": 2})
    inbox = fleet.shares(fleet.keys())
    fleet.mask(inbox, absent={"a", "b"})  # blocks 0 and 1 keep c alone; block 2 keeps c, d, e
    outcomes = fleet.unmask()
    assert outcomes[0].values is None and "fewer than the threshold t = 3" in outcomes[0].reason
    assert outcomes[1].values is None
    expected, _ = fleet.plain_sum(2, {"c", "d", "e"})
    assert np.max(np.abs(outcomes[2].values - expected)) <= fleet.server.fixed.error_bound


def test_a_device_alone_in_its_first_blocks_cohort_is_left_out():
    fleet = Fleet({"a": 2, "b": 1, "c": 2})
    peers = fleet.keys()
    assert "b" not in peers and "no neighbour" in fleet.server.left_out["b"]


def test_replayed_and_forged_advertisements_are_refused():
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    dev = fleet.devices["a"]
    c, mk, sig, com = dev.advertise()
    fleet.server.advertise("a", 0, c, mk, sig, com)
    with pytest.raises(SecureRefusal, match="twice"):
        fleet.server.advertise("a", 0, c, mk, sig, com)
    with pytest.raises(SecAggError, match="not signed"):
        fleet.server.advertise("b", 0, c, mk, sig, com)  # a's keys and signature under b's name
    with pytest.raises(SecAggError, match="not signed"):
        fleet.server.advertise("b", 0, *fleet.devices["b"].advertise()[:3], com)  # b's keys, a's commitments
    with pytest.raises(SecureRefusal, match="committed to"):
        fleet.server.advertise("c", 1, *fleet.devices["c"].advertise())  # a split the device did not sign
    other = SecureRound(Scope("run-a/0", 4), 3, SIZES, clip=CLIP, identities=fleet.server.identities)
    with pytest.raises(SecAggError, match="not signed"):
        other.advertise("a", 0, c, mk, sig, com)  # round 3's advertisement replayed in round 4


def test_shares_for_strangers_and_unmask_answers_for_peers_not_given_are_refused():
    fleet = Fleet({"a": 0, "b": 0, "c": 0, "d": 0}, degree=2)  # sparse: each has 2 neighbours of 3
    peers = fleet.keys()
    stranger = next(v for v in fleet.splits if v != "a" and v not in peers["a"].cipher_keys)
    sealed = fleet.devices["a"].share(peers["a"])
    with pytest.raises(SecureRefusal, match="other than its neighbours"):
        fleet.server.take_shares("a", {**sealed, stranger: bytes(SEALED_BYTES)})
    fleet.server.take_shares("a", sealed)
    with pytest.raises(SecureRefusal, match="twice"):
        fleet.server.take_shares("a", sealed)
    for d in ("b", "c", "d"):
        fleet.server.take_shares(d, fleet.devices[d].share(peers[d]))
    fleet.mask({d: wire(p.SecAggInbox(3, s)) for d, s in fleet.server.close_shares().items()})
    ask = fleet.consent()["a"]
    seeds, keys = fleet.devices["a"].reveal(ask.survivors, ask.dropped, ask.blocks, ask.survivor_set, ask.signatures)
    with pytest.raises(SecureRefusal, match="not given"):
        fleet.server.take_reveal("a", {**seeds, stranger: bytes(SHARE_BYTES)}, keys)
    with pytest.raises(SecureRefusal, match="not asked"):
        fleet.server.take_reveal("a", seeds, keys)  # the refused answer used up a's turn


def test_a_device_refuses_to_reveal_both_secrets_or_strangers():
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    fleet.mask(fleet.shares(fleet.keys()))
    asks = fleet.consent()
    dev, signed, sigs = fleet.devices["a"], asks["a"].survivor_set, asks["a"].signatures
    with pytest.raises(SecAggError, match="not the signed survivor set's"):
        dev.reveal(["a", "b", "c"], ["b"], [0], signed, sigs)  # b both survivor and dropped
    dev.step = "reveal"
    with pytest.raises(SecAggError, match="not the signed survivor set's"):
        dev.reveal(["a", "b", "zed"], [], [0], signed, sigs)
    dev.step = "reveal"
    with pytest.raises(SecAggError, match="did not sign"):
        dev.reveal(["a", "b"], ["c"], [0], ["a", "b"], sigs)  # another set than the one it signed
    dev.step = "reveal"
    with pytest.raises(SecAggError, match="2 devices signed the survivor set, fewer than t = 3"):
        dev.reveal(["a", "b", "c"], [], [0], signed, {"b": sigs["b"]})
    dev.step = "reveal"
    with pytest.raises(SecAggError, match="did not sign this survivor set"):
        dev.reveal(["a", "b", "c"], [], [0], signed, {**sigs, "b": sigs["c"]})  # c's signature under b's name
    dev.step = "reveal"
    dev.reveal(["a", "b", "c"], [], [0], signed, sigs)
    with pytest.raises(SecAggError, match="not 'reveal'"):
        dev.reveal(["a", "b", "c"], [], [0], signed, sigs)  # once per round


def test_a_presumed_dropped_device_returning_is_refused_for_the_round():
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    inbox = fleet.shares(fleet.keys())
    fleet.mask(inbox, absent={"c"})
    fleet.server.close_uploads()
    with pytest.raises(SecureRefusal, match="stage 'unmask'"):
        fleet.server.take_masked("c", dict(enumerate(fleet.uploads["c"])))
    with pytest.raises(SecureRefusal, match="not asked"):
        fleet.server.take_reveal("c", {}, {})
    with pytest.raises(SecureRefusal, match="not asked"):
        fleet.server.take_consent("c", bytes(64))


def test_malformed_masked_updates_are_refused():
    fleet = Fleet({"a": 0, "b": 1, "c": 1})
    fleet.mask(fleet.shares(fleet.keys()), absent={"a", "b", "c"})
    words = dict(enumerate(fleet.uploads["b"], start=1))
    with pytest.raises(SecureRefusal, match="covers blocks"):
        fleet.server.take_masked("b", {0: words[1], **words})
    with pytest.raises(SecureRefusal, match="ring words"):
        fleet.server.take_masked("b", {**words, 2: words[2][:-1]})
    with pytest.raises(SecureRefusal, match="ring words"):
        fleet.server.take_masked("b", {**words, 2: words[2].astype(np.int64)})


def test_protocol_sizes_agree_with_the_blocks():
    assert (m._KEY_BYTES, m._SIGNATURE_BYTES, m._SEALED_BYTES, m._SHARE_BYTES) == (
        KEY_BYTES, SIGNATURE_BYTES, SEALED_BYTES, SHARE_BYTES)


def test_oversized_and_malformed_shares_are_refused_by_the_codec():
    with pytest.raises(p.ProtocolError):
        p.decode(p.encode(p.SecAggShares(1, {"b": bytes(SEALED_BYTES + 1)})))
    with pytest.raises(p.ProtocolError):
        p.decode(p.encode(p.SecAggReveal(1, {"b": bytes(SHARE_BYTES)}, {"b": bytes(SHARE_BYTES)})))
    with pytest.raises(p.ProtocolError):
        p.decode(p.encode(p.SecAggShares(1, {f"d{i}": bytes(SEALED_BYTES) for i in range(256)})))


_fields = st.dictionaries(st.text(max_size=8), st.binary(max_size=100), max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(p.SECAGG_MESSAGES), blob=st.binary(max_size=300), a=_fields, b=_fields,
       ids=st.lists(st.text(max_size=6), max_size=4), n=st.integers(-3, 2**40))
def test_fuzzed_secagg_messages_decode_or_are_refused(kind, blob, a, b, ids, n):
    """Random bytes, and fields of random sizes in the new messages' shapes: either a message that
    passes its checks or a ProtocolError, never anything else."""
    for data in (blob, _raw(kind, a, b, ids, n)):
        try:
            msg = p.decode(data)
        except p.ProtocolError:
            continue
        assert isinstance(msg, p.Message)


def _raw(kind, a, b, ids, n) -> bytes:
    import msgpack

    values = {"round": n, "cipher_public": next(iter(a.values()), b""), "mask_public": bytes(32), "signature": bytes(64),
              "sealed": a, "survivors": ids, "dropped": ids[:1], "seed_shares": a, "key_shares": b, "members": ids,
              "graph_seed": bytes(32), "degree": n, "cipher_keys": a, "mask_keys": b, "signatures": a,
              "identities": b, "splits": {}, "clip": 1.0, "frac_bits": 3, "ring_bits": 20, "cohort": 3,
              "weight_scale": 1.0, "threshold": 2, "noise_sigma": {}, "noise_survivors": {},
              "commitments": a if kind is p.SecAggPeers else bytes(32 * (n % 3)), "min_survivors": 3, "weight": 0.5, "blocks": [],
              "value_bits": 6 * (n % 2), "value_spread": 4.0 * (n % 2),
              "survivor_set": ids, "signatures": b, "consent": next(iter(b.values()), b"")}
    fields = [name for name, _ in m.schema(kind)]
    return msgpack.packb({"v": p.PROTOCOL_VERSION, "t": kind.TYPE, **{f: values[f] for f in fields}})


def test_the_terminal_line_and_status_json_say_a_round_was_secure():
    from orchestrator.views.terminal import round_line
    from orchestrator.views.web.status import _secure

    metrics = {"round": 2, "reported": 4, "selected": 5, "secure": {
        "blocks": {"fc1": {"cohort": 1, "revealed": False, "reason": "1 masked updates"},
                   "head": {"cohort": 4, "revealed": True}}, "cohort": 5, "masked": 4, "recovered": ["d"],
        "presumed_dropped": ["d"], "messages_in": 14, "bytes_in": 5120, "unmask_s": 0.2}}
    assert "secure: 1 of 2 blocks revealed, 1 dropouts recovered" in round_line(metrics, 3)
    shown = _secure(metrics)["secure"]
    assert shown["blocks"]["fc1"]["cohort"] == 1 and shown["recovered"] == ["d"] and shown["bytes_in"] == 5120
    assert _secure({"round": 1}) == {} and "secure" not in round_line({"round": 1}, 3)
