"""The Python blocks of secure aggregation reproduce tests/vectors/secagg.json (the JavaScript SDK
reads the same file, edge_sdk_js/test/secagg.test.mjs), and combine the shares JavaScript split."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.secagg import (FixedPoint, Scope, SecAggError, advertisement_message, agree, combine_shares,
                             combined_mask, default_degree, expand_mask, hkdf, identity_public_key, label,
                             neighbour_graph, open_shares, pair_mask_seed, public_key, remove_masks, seal_shares,
                             seed_commitment, self_mask_seed, share_key, sign_advertisement, sign_survivors,
                             survivors_message, verify_advertisement, verify_survivors)
from edge_sdk.secagg.masks import add_mod

VECTORS = json.loads((Path(__file__).parent / "vectors" / "secagg.json").read_text(encoding="utf-8"))
SCOPE = Scope(**VECTORS["scope"])
h = bytes.fromhex


def field(typed: dict) -> str | int | bytes:
    (kind, value), = typed.items()
    return h(value) if kind == "hex" else value


def test_labels_have_the_documented_layout():
    for case in VECTORS["labels"]:
        assert label(case["purpose"], *map(field, case["fields"])).hex() == case["bytes"]
    first = VECTORS["labels"][0]
    assert h(first["bytes"]) == b"edgetrain/secagg/v1\x00identity\x00\x00\x08phone-17"


def test_x25519_matches_rfc_7748_and_the_vectors():
    rfc = VECTORS["x25519"]["rfc7748"]
    assert public_key(h(rfc["alice_private"])).hex() == rfc["alice_public"]
    assert public_key(h(rfc["bob_private"])).hex() == rfc["bob_public"]
    assert agree(h(rfc["alice_private"]), h(rfc["bob_public"])).hex() == rfc["shared"]
    keys = {k["id"]: k for k in VECTORS["x25519"]["keys"]}
    for k in keys.values():
        assert public_key(h(k["private"])).hex() == k["public"]
    for pair in VECTORS["x25519"]["agreements"]:
        a, b = keys[pair["a"]], keys[pair["b"]]
        assert agree(h(a["private"]), h(b["public"])).hex() == pair["shared"]
        assert agree(h(b["private"]), h(a["public"])).hex() == pair["shared"]


@pytest.mark.parametrize("point", VECTORS["x25519"]["small_order"])
def test_x25519_refuses_small_order_points(point):
    with pytest.raises(SecAggError, match="small order"):
        agree(h(VECTORS["x25519"]["keys"][0]["private"]), h(point))


def test_hkdf_matches_rfc_5869_and_the_derivations():
    rfc = VECTORS["hkdf"]["rfc5869_case3"]
    assert hkdf(h(rfc["ikm"]), h(rfc["info"]), rfc["length"]).hex() == rfc["okm"]
    sk = VECTORS["hkdf"]["share_key"]
    assert share_key(h(sk["shared"]), SCOPE, sk["a"], sk["b"]).hex() == sk["key"]
    assert share_key(h(sk["shared"]), SCOPE, sk["b"], sk["a"]).hex() == sk["key"]
    for case in VECTORS["hkdf"]["pair_mask_seed"]:
        assert pair_mask_seed(h(case["shared"]), SCOPE, case["block"], case["b"], case["a"]).hex() == case["seed"]
    for case in VECTORS["hkdf"]["self_mask_seed"]:
        assert self_mask_seed(h(case["seed"]), SCOPE, case["block"], case["device"]).hex() == case["out"]
    for case in VECTORS["hkdf"]["seed_commitment"]:
        assert seed_commitment(h(case["seed"]), SCOPE, case["block"], case["device"]).hex() == case["out"]


def test_identity_keys_and_advertisement_signatures():
    for case in VECTORS["identity"]:
        keys = (h(case["cipher_public"]), h(case["mask_public"]), case["split"], h(case["commitments"]))
        assert identity_public_key(case["secret"], case["device"]).hex() == case["public"]
        assert advertisement_message(SCOPE, case["device"], *keys).hex() == case["message"]
        assert sign_advertisement(case["secret"], case["device"], SCOPE, *keys).hex() == case["signature"]
        verify_advertisement(h(case["public"]), case["device"], SCOPE, *keys, h(case["signature"]))
        assert survivors_message(SCOPE, case["survivors"]).hex() == case["survivors_message"]
        assert sign_survivors(case["secret"], case["device"], SCOPE, case["survivors"]).hex() == case["survivors_signature"]
        verify_survivors(h(case["public"]), case["device"], SCOPE, case["survivors"][::-1], h(case["survivors_signature"]))
        with pytest.raises(SecAggError, match="did not sign"):  # another set
            verify_survivors(h(case["public"]), case["device"], SCOPE, case["survivors"][1:], h(case["survivors_signature"]))
        with pytest.raises(SecAggError, match="not signed"):  # another split: the signature binds it
            verify_advertisement(h(case["public"]), case["device"], SCOPE, *keys[:2], case["split"] + 1, keys[3],
                                 h(case["signature"]))


def test_mask_expansion():
    for case in VECTORS["masks"]:
        words = expand_mask(h(case["seed"]), 1000, case["bits"])
        assert words[:8].tolist() == case["first"]
        assert hashlib.sha256(words.astype("<u4").tobytes()).hexdigest() == case["sha256_1000"]


@pytest.mark.parametrize("origin", ["python_shares", "javascript_shares"])
def test_shares_from_either_sdk_combine_here(origin):
    case = VECTORS["shamir"]
    shares = [h(s) for s in case[origin]]
    for subset in (shares[:3], shares[2:], shares[::2], shares):
        assert combine_shares(subset, case["threshold"]).hex() == case["secret"]


def test_sealed_shares():
    for case in VECTORS["sealing"]:
        args = (h(case["key"]), SCOPE, case["sender"], case["receiver"])
        seeds = [h(s) for s in case["seed_shares"]]
        assert seal_shares(*args, seeds, h(case["mask_key_share"]), nonce=h(case["nonce"])).hex() == case["sealed"]
        assert open_shares(*args, h(case["sealed"]), len(seeds)) == (seeds, h(case["mask_key_share"]))


def test_neighbour_graphs():
    for case in VECTORS["graph"]["graphs"]:
        graph = neighbour_graph(h(case["seed"]), SCOPE, case["block"], case["members"], case["degree"])
        assert list(graph.order) == case["order"]
        assert {k: list(v) for k, v in graph.neighbours.items()} == case["neighbours"]
        assert graph.threshold == case["threshold"]
    assert {str(n): default_degree(int(n)) for n in VECTORS["graph"]["default_degree"]} \
        == VECTORS["graph"]["default_degree"]


def test_fixed_point_encodings_and_plans():
    for case in VECTORS["fixed_point"]["encodings"]:
        fp = FixedPoint(case["clip"], case["frac_bits"], case["ring_bits"], case["cohort"])
        words = fp.encode(np.array(case["update"]), case["weight"], h(case["rounding_seed"]))
        assert words.tolist() == case["words"]
    for case in VECTORS["fixed_point"]["plans"]:
        planned = FixedPoint.plan(case["cohort"], case["clip"], case["frac_bits"]).__dict__
        # no distributed noise in these plans, and the float ring (no compressed round's bound)
        assert planned.pop("noise") == 0.0 and planned.pop("bound") == 0.0 and planned == case["planned"]


def test_a_round_masks_and_unmasks_over_nested_cohorts_with_a_dropout():
    scenario = VECTORS["round"]
    fp = FixedPoint(**scenario["fixed_point"])
    sk = {d: h(k) for d, k in scenario["mask_private"].items()}
    own = {d: h(s) for d, s in scenario["self_seed"].items()}
    dropped = scenario["dropped"]
    for block in scenario["blocks"]:
        b, count, total = block["block"], block["size"] + 1, np.zeros(block["size"] + 1, np.uint32)
        for d, up in block["uploads"].items():
            pairs = {v: pair_mask_seed(agree(sk[d], public_key(sk[v])), SCOPE, b, d, v) for v in block["cohort"] if v != d}
            encoded = fp.encode(np.array(up["update"]), up["weight"], hashlib.sha256(
                f"edgetrain secagg vector rounding {d} {b}".encode()).digest())
            assert encoded.tolist() == up["encoded"]
            mask = combined_mask(count, fp.ring_bits, d, self_seed=self_mask_seed(own[d], SCOPE, b, d), pair_seeds=pairs)
            assert add_mod(encoded, mask, fp.ring_bits).tolist() == up["masked"]
            if d != dropped:
                total = add_mod(total, np.array(up["masked"], np.uint32), fp.ring_bits)
        assert total.tolist() == block["masked_sum"]
        survivors = block["survivors"]
        lost = {dropped: {v: pair_mask_seed(agree(sk[dropped], public_key(sk[v])), SCOPE, b, dropped, v)
                          for v in survivors}} if dropped in block["cohort"] else {}
        unmasked = remove_masks(total, fp.ring_bits, dropped=lost,
                                self_seeds={v: self_mask_seed(own[v], SCOPE, b, v) for v in survivors})
        expected = np.zeros(count, np.uint32)
        for v in survivors:
            expected = add_mod(expected, np.array(block["uploads"][v]["encoded"], np.uint32), fp.ring_bits)
        assert unmasked.tolist() == block["unmasked"] == expected.tolist()
        decoded = fp.decode(unmasked)
        assert decoded.values.tolist() == block["decoded"]["values"]
        assert decoded.weight == block["decoded"]["weight"] == sum(block["uploads"][v]["weight"] for v in survivors)
