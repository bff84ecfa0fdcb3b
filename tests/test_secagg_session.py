"""The session's rules for a secure round's messages (docs/protocol.md, "Secure aggregation"):
both ends agree at every step, and a step out of turn is refused on either side, changing nothing."""

from __future__ import annotations

import dataclasses

from edge_sdk.protocol import (Ack, Report, SecAggInbox, SecAggKeys, SecAggPeers, SecAggReveal,
                               SecAggShares, SecAggUnmask)
from tests.test_protocol_session import TRAIN, Pair, both_refuse

SECURE = dataclasses.replace(TRAIN, config={"secagg_session": "run/1"})
KEYS = SecAggKeys(0, bytes(32), bytes(32), bytes(64))
PEERS = SecAggPeers(round=0, graph_seed=bytes(32), degree=2, members=["pi-1", "pi-2", "pi-3"],
                    cipher_keys={"pi-2": bytes(32)}, mask_keys={"pi-2": bytes(32)}, signatures={"pi-2": bytes(64)},
                    identities={"pi-2": bytes(32)}, splits={"pi-2": 0}, clip=1.0, frac_bits=20, ring_bits=24,
                    cohort=3, weight_scale=50.0, threshold=2)
SHARES = SecAggShares(0, {"pi-2": bytes(94)})
INBOX = SecAggInbox(0, {"pi-2": bytes(94)})


def secure_pair() -> Pair:
    pair = Pair().working(SECURE)
    pair.download("c0", b"chunk zero")
    pair.download("c1", b"chunk one!")
    pair.download("m0", b"model bytes")
    return pair


def test_a_secure_round_from_keys_to_reveal():
    pair = secure_pair()
    for msg, up in ((KEYS, True), (PEERS, False), (SHARES, True), (INBOX, False)):
        (pair.up if up else pair.down)(msg)
        pair.agree()
    pair.up(Report(0, "train", 50, (2, 4), "u0", {}))
    pair.upload("u0", b"masked words")
    pair.down(Ack(0, True, "", "train"))
    pair.agree()
    pair.down(SecAggUnmask(0, ["pi-1", "pi-2"], []))
    pair.up(SecAggReveal(0, {"pi-1": bytes(33), "pi-2": bytes(33)}, {}))
    both_refuse(pair, SecAggReveal(0, {}, {}), from_device=True)  # once per request


def test_steps_out_of_turn_are_refused():
    plain = Pair().working(TRAIN)
    both_refuse(plain, KEYS, from_device=True)  # not a secure instruction
    pair = secure_pair()
    both_refuse(pair, PEERS, from_device=False)  # no advertisement to answer
    both_refuse(pair, SHARES, from_device=True)  # the keys come first: then the peers are awaited
    pair.up(KEYS)
    both_refuse(pair, KEYS, from_device=True)  # one step at a time
    both_refuse(pair, Report(0, "train", 50, (2, 4), "u0", {}), from_device=True)  # not while a step is unanswered
    both_refuse(pair, INBOX, from_device=False)  # the peers answer the keys
    both_refuse(pair, dataclasses.replace(PEERS, round=1), from_device=False)
    both_refuse(pair, SecAggReveal(0, {}, {}), from_device=True)  # no unmasking asked


def test_a_refused_device_is_told_by_a_negative_ack_that_ends_its_instruction():
    pair = secure_pair()
    pair.up(KEYS)
    both_refuse(pair, Ack(0, True, "", "train"), from_device=False)
    pair.down(Ack(0, False, "secure round: the key stage is closed", "train"))
    pair.agree()
    assert pair.device.instruction is None
    both_refuse(pair, SHARES, from_device=True)


def test_keys_of_another_round_are_refused():
    pair = secure_pair()
    both_refuse(pair, dataclasses.replace(KEYS, round=3), from_device=True)
    pair.up(KEYS)
    pair.down(PEERS)
    pair.up(SHARES)
    pair.down(INBOX)
    both_refuse(pair, KEYS, from_device=True)  # a round has one advertisement: a second is a replay
