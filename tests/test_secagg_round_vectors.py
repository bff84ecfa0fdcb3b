"""A Python device's secure round reproduces tests/vectors/secagg_round.json (the JavaScript SDK's
test, edge_sdk_js/test/secagg-round.test.mjs, reads the same file): the server's messages decode,
the advertisement is the same bytes, the masked words of each block and the reveal of the
neighbours' shares are the same, and the shares the device seals (random by design) open for
their neighbours and rebuild its secrets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.secagg import Scope, SecAggError, agree, combine_shares, open_shares, public_key, share_key
from edge_sdk.secagg.keys import KeyPair
from edge_sdk.secagg.layout import block_vectors
from edge_sdk.secagg.round import DeviceRound, weight_of

V = json.loads((Path(__file__).parent / "vectors" / "secagg_round.json").read_text(encoding="utf-8"))
SCOPE = Scope(V["scope"]["session"], V["scope"]["round"])


def message(name: str) -> p.Message:
    return p.decode(bytes.fromhex(V[name]))


def device_round() -> DeviceRound:
    rnd = DeviceRound(V["device"], V["secret"], SCOPE, V["split"], len(V["blocks"]))
    cipher, mask = (bytes.fromhex(V["secrets"][k]) for k in ("cipher_private", "mask_private"))
    rnd._cipher, rnd._mask = KeyPair(cipher, public_key(cipher)), KeyPair(mask, public_key(mask))
    rnd._seeds = {b: bytes.fromhex(s) for b, s in enumerate(V["secrets"]["seeds"], start=V["split"])}
    return rnd


def update() -> dict[str, np.ndarray]:
    return {n: np.asarray(t["values"], dtype=np.float32).reshape(t["shape"]) for n, t in V["update"].items()}


def test_the_server_messages_decode_and_encode_to_the_same_bytes():
    for name, kind in (("secagg_peers", p.SecAggPeers), ("secagg_inbox", p.SecAggInbox),
                       ("secagg_unmask", p.SecAggUnmask), ("secagg_keys", p.SecAggKeys),
                       ("secagg_unmask_sign", p.SecAggUnmask), ("consent", p.SecAggReveal)):
        msg = message(name)
        assert isinstance(msg, kind)
        assert p.encode(msg).hex() == V[name]


def test_a_python_device_round_reproduces_the_vectors():
    rnd = device_round()
    cipher, mask, signature, commitments = rnd.advertise()
    assert p.encode(p.SecAggKeys(SCOPE.round, cipher, mask, signature, commitments)).hex() == V["secagg_keys"]
    sealed = rnd.share(message("secagg_peers"))
    assert list(rnd.neighbours) == V["neighbours"] and set(sealed) == set(V["neighbours"])
    rnd.receive(message("secagg_inbox").sealed)
    assert {str(b): rnd.partners(b) for b in range(V["split"], len(V["blocks"]))} == V["partners"]
    words = rnd.mask(block_vectors(update(), V["blocks"], V["split"]), V["num_samples"])
    assert {str(b): w.tolist() for b, w in enumerate(words, start=V["split"])} == V["masked"]
    sign = message("secagg_unmask_sign")
    assert p.encode(p.SecAggReveal(SCOPE.round, {}, {}, rnd.consent(sign.survivor_set))).hex() == V["consent"]
    unmask = message("secagg_unmask")
    seeds, keys = rnd.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, unmask.signatures)
    assert {v: s.hex() for v, s in keys.items()} == V["reveal"]["key_shares"]
    assert {v: s.hex() for v, s in seeds.items() if v != V["device"]} == V["reveal"]["seed_shares"]
    # The random shares: each neighbour opens its own; the device's share and theirs rebuild each b_u^k and s_u^SK.
    trained = len(V["blocks"]) - V["split"]
    opened = {v: open_shares(share_key(agree(bytes.fromhex(k), cipher), SCOPE, v, V["device"]), SCOPE, V["device"], v,
                             sealed[v], trained) for v, k in V["neighbour_cipher_private"].items()}
    t = message("secagg_peers").threshold
    for i, seed in enumerate(V["secrets"]["seeds"]):
        assert combine_shares([o[0][i] for o in opened.values()][:t], t).hex() == seed
    assert combine_shares([seeds[V["device"]], *[o[0][1] for o in opened.values()]][:t], t).hex() \
        == V["secrets"]["seeds"][1]  # the device's own share of its block-2 seed, as it revealed it
    assert combine_shares([o[1] for o in opened.values()][:t], t).hex() == V["secrets"]["mask_private"]


def test_an_unmasking_below_t_is_refused():
    """Block 1 has two survivors (the device and n-alpha): a request for its seeds is refused."""
    rnd = device_round()
    rnd.advertise()
    rnd.share(message("secagg_peers"))
    rnd.receive(message("secagg_inbox").sealed)
    rnd.mask(block_vectors(update(), V["blocks"], V["split"]), V["num_samples"])
    unmask = message("secagg_unmask")
    rnd.consent(unmask.survivor_set)
    with pytest.raises(SecAggError, match="block 1 would be unmasked with 2 survivors"):
        rnd.reveal(unmask.survivors, unmask.dropped, [1, 2], unmask.survivor_set, unmask.signatures)


def test_a_tampered_inbox_leaves_the_device_in_the_round():
    rnd = device_round()
    rnd.advertise()
    rnd.share(message("secagg_peers"))
    sealed = dict(message("secagg_inbox").sealed)
    v = next(iter(sealed))
    sealed[v] = bytes([sealed[v][0] ^ 1]) + sealed[v][1:]
    rnd.receive(sealed)  # a peer's box that does not open: noted, the device stays in the round
    assert "do not open" in rnd.unopened[v] and v in rnd.partners(2)


def test_the_servers_weight_in_the_peers_message_is_the_weight_the_device_masks_with():
    # Both SDKs (edge_sdk_js/test/secagg-round.test.mjs): the server's weight, sent in secagg_peers, is
    # what the device multiplies by, whatever sample count the device itself holds.
    peers = message("secagg_peers")
    fixed = dataclasses.replace(peers, weight=weight_of(V["num_samples"], peers.weight_scale))
    rnd = device_round()
    rnd.advertise()
    rnd.share(p.decode(p.encode(fixed)))
    rnd.receive(message("secagg_inbox").sealed)
    words = rnd.mask(block_vectors(update(), V["blocks"], V["split"]), 10**6)
    assert {str(b): w.tolist() for b, w in enumerate(words, start=V["split"])} == V["masked"]
    other = device_round()
    other.advertise()
    other.share(dataclasses.replace(peers, weight=0.5 * fixed.weight))
    other.receive(message("secagg_inbox").sealed)
    assert [w.tolist() for w in other.mask(block_vectors(update(), V["blocks"], V["split"]), V["num_samples"])] \
        != [w.tolist() for w in words]
