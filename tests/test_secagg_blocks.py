"""Properties of the secure-aggregation blocks (edge_sdk.secagg): masks cancel over any cohort
and any dropouts, decode(sum of encodes) stays within the stated bound, shares combine only when
they should, sealed shares and signed keys refuse every substitution, the graph is what it says."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pyshamir
import pytest
from hypothesis import given, settings, strategies as st

from edge_sdk.credentials import derive_key
from edge_sdk.secagg import (FixedPoint, Scope, SecAggError, agree, combine_shares, combined_mask, expand_words,
                             generate_keypair, identity_public_key, neighbour_graph, open_shares, pair_mask_seed,
                             pairwise_sign, remove_masks, seal_shares, self_mask_seed, share_key, sign_advertisement,
                             split_secret, verify_advertisement)
from edge_sdk.secagg.fixedpoint import BlockEncoder, l2_norm, slices
from edge_sdk.secagg.masks import MaskStream, add_mod, ring_mask

SCOPE = Scope("job", 4)
ids = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=6)


def fixed(tag: str) -> bytes:
    return hashlib.sha256(tag.encode()).digest()


def test_import_edge_sdk_loads_neither_secagg_nor_cryptography():
    code = ("import json, sys, edge_sdk, edge_sdk.protocol, edge_sdk.client\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('cryptography', 'pyshamir')"
            " or m.startswith('edge_sdk.secagg'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@settings(max_examples=40, deadline=None)
@given(members=st.lists(ids, min_size=2, max_size=7, unique=True), bits=st.integers(1, 32),
       count=st.integers(1, 40), data=st.data())
def test_pair_masks_cancel_over_any_cohort(members, bits, count, data):
    """Each device adds sum_v sign(u, v) PRG(s_uv): over the cohort the sum is zero mod 2^b."""
    seeds = {frozenset(p): fixed(f"{sorted(p)}") for p in itertools.combinations(members, 2)}
    total = np.zeros(count, np.uint32)
    for u in members:
        pairs = {v: seeds[frozenset((u, v))] for v in members if v != u}
        total = add_mod(total, combined_mask(count, bits, u, pair_seeds=pairs), bits)
    assert not total.any()
    u, v = data.draw(st.sampled_from(list(itertools.permutations(members, 2))))
    assert pairwise_sign(u, v) == -pairwise_sign(v, u)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 6), count=st.integers(1, 30), bits=st.integers(8, 32), data=st.data())
def test_unmasking_with_dropouts_leaves_the_survivors_sum(n, count, bits, data):
    members = [f"d{i}" for i in range(n)]
    dropped = data.draw(st.sets(st.sampled_from(members), max_size=n - 1))
    survivors = [m for m in members if m not in dropped]
    keys = {m: generate_keypair() for m in members}
    inputs = {m: np.frombuffer(fixed(f"in {m}") * (count // 8 + 1), np.uint32)[:count] & np.uint32(ring_mask(bits))
              for m in members}
    pair = {(u, v): pair_mask_seed(agree(keys[u].private, keys[v].public), SCOPE, 0, u, v)
            for u in members for v in members if u != v}
    total = np.zeros(count, np.uint32)
    for u in survivors:
        mask = combined_mask(count, bits, u, self_seed=fixed(f"self {u}"),
                             pair_seeds={v: pair[u, v] for v in members if v != u})
        total = add_mod(total, add_mod(inputs[u], mask, bits), bits)
    unmasked = remove_masks(total, bits, self_seeds={u: fixed(f"self {u}") for u in survivors},
                            dropped={d: {v: pair[d, v] for v in survivors} for d in dropped})
    expected = np.zeros(count, np.uint32)
    for u in survivors:
        expected = add_mod(expected, inputs[u], bits)
    assert unmasked.tolist() == expected.tolist()


finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), d=st.integers(1, 20), clip=st.floats(0.01, 50.0), frac=st.one_of(st.none(), st.integers(0, 24)),
       data=st.data())
def test_decoding_the_sum_of_encodes_is_within_the_stated_bound(n, d, clip, frac, data):
    try:
        fp = FixedPoint.plan(n, clip, frac)
    except SecAggError:
        return  # a ring wider than 32 bits is refused, never wrapped
    updates = [np.array(data.draw(st.lists(finite, min_size=d, max_size=d))) for _ in range(n)]
    weights = [data.draw(st.floats(0.0, 1.0)) for _ in range(n)]
    total = np.zeros(d + 1, np.uint32)
    reference = np.zeros(d)
    for x, w in zip(updates, weights):
        total = add_mod(total, fp.encode(x, w), fp.ring_bits)
        norm = np.linalg.norm(x)
        reference += w * x * (1.0 if norm <= clip else clip / norm)
    decoded = fp.decode(total)
    assert np.abs(decoded.values - reference).max() <= fp.error_bound
    assert abs(decoded.weight - sum(weights)) <= fp.weight_error_bound


def test_the_ring_holds_the_worst_case_sum_and_refuses_a_smaller_one():
    fp = FixedPoint.plan(9, 1.5, 10)
    worst = np.full(5, 1.5)
    total = np.zeros(6, np.uint32)
    for _ in range(9):
        total = add_mod(total, fp.encode(worst, 1.0), fp.ring_bits)
    assert np.allclose(fp.decode(total).values, 9 * worst / np.linalg.norm(worst) * 1.5, atol=fp.error_bound)
    with pytest.raises(SecAggError, match="could wrap"):
        FixedPoint(1.5, 10, fp.ring_bits - 1, 9)
    with pytest.raises(SecAggError, match="32-bit ring"):
        FixedPoint.plan(2**20, 1e9)
    with pytest.raises(SecAggError, match="more than 32: lower frac_bits"):
        FixedPoint.plan(1000, 1.0, 30)


def test_stochastic_rounding_is_unbiased_and_draws_fresh_randomness():
    fp = FixedPoint(1000.0, 2, ring_bits=32, cohort=1)
    x = np.full(20_000, 0.1)  # 0.1 * 2^2 = 0.4 units: 1 with probability 0.4, else 0
    first, second = fp.encode(x, 1.0)[:-1], fp.encode(x, 1.0)[:-1]
    assert set(first.tolist()) == {0, 1} and abs(first.mean() - 0.4) < 0.02  # 5.8 standard deviations
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("bad", [[np.nan], [np.inf]])
def test_encode_refuses_non_finite_updates_and_weights_outside_0_1(bad):
    fp = FixedPoint.plan(3, 1.0)
    with pytest.raises(SecAggError, match="NaN"):
        fp.encode(np.array(bad), 0.5)
    for weight in (-0.1, 1.5, float("nan")):
        with pytest.raises(SecAggError, match="weight"):
            fp.encode(np.zeros(2), weight)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5), slice_words=st.integers(1, 17),
       clip=st.floats(0.01, 10.0), weight=st.floats(0.0, 1.0), bits=st.integers(8, 32), data=st.data())
def test_a_block_encoded_and_masked_slice_by_slice_is_the_whole_blocks_words(sizes, slice_words, clip, weight, bits,
                                                                             data):
    """A device encodes and masks a block a slice at a time (edge_sdk.secagg.round): the same words
    as the whole block at once, whatever the slices and the entries' boundaries."""
    parts = [np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n)), dtype=np.float32)
             for n in sizes]
    whole = np.concatenate(parts).astype(np.float64)
    fp = FixedPoint.plan(3, clip)
    rounding = hashlib.sha256(b"rounding").digest()
    encoder = BlockEncoder(fp, l2_norm(slices(parts, slice_words)), weight, rounding)
    pieces = [encoder.values(piece) for piece in slices(parts, slice_words)] + [encoder.weight_word()]
    assert np.array_equal(np.concatenate(pieces), fp.encode(whole, weight, rounding))
    seeds = {v: hashlib.sha256(v.encode()).digest() for v in ("a", "a-0", "c")}
    stream = MaskStream(bits, "b", self_seed=bytes(32), pair_seeds=seeds)
    read = [stream.read(piece.size) for piece in pieces]
    assert np.array_equal(np.concatenate(read),
                          combined_mask(whole.size + 1, bits, "b", self_seed=bytes(32), pair_seeds=seeds))


@settings(max_examples=30, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), n=st.integers(2, 12), data=st.data())
def test_shamir_combines_any_t_shares_as_pyshamir_does(secret, n, data):
    t = data.draw(st.integers(2, n))
    shares = split_secret(secret, n, t)
    assert all(len(s) == 33 for s in shares)
    subset = data.draw(st.permutations(shares))[: data.draw(st.integers(t, n))]
    assert combine_shares(subset, t) == secret == bytes(pyshamir.combine([bytearray(s) for s in subset[:t]]))


def test_shamir_refuses_wrong_sizes_duplicates_and_an_altered_extra_share():
    secret = os.urandom(32)
    shares = split_secret(secret, 5, 3)
    with pytest.raises(SecAggError, match="33 bytes"):
        combine_shares([shares[0][:-2], *shares[1:3]], 3)
    with pytest.raises(SecAggError, match="same x-coordinate"):
        combine_shares([shares[0], shares[0], shares[1]], 3)
    with pytest.raises(SecAggError, match="between 3"):
        combine_shares(shares[:2], 3)
    altered = shares[3][:5] + bytes([shares[3][5] ^ 1]) + shares[3][6:]
    with pytest.raises(SecAggError, match="not on the polynomial"):
        combine_shares([*shares[:3], altered], 3)
    assert combine_shares(shares[:2], 2) != secret  # below the threshold: no error, and not the secret
    with pytest.raises(SecAggError, match="32 bytes"):
        split_secret(secret[:16], 5, 3)
    with pytest.raises(SecAggError, match="threshold"):
        split_secret(secret, 256, 3)


def test_sealed_shares_open_only_for_their_pair_session_and_round():
    a, b = generate_keypair(), generate_keypair()
    key = share_key(agree(a.private, b.public), SCOPE, "u", "v")
    assert key == share_key(agree(b.private, a.public), SCOPE, "v", "u")
    s1, s2 = os.urandom(33), os.urandom(33)
    sealed = seal_shares(key, SCOPE, "u", "v", [s1], s2)
    assert open_shares(key, SCOPE, "u", "v", sealed) == ([s1], s2)
    assert sealed != seal_shares(key, SCOPE, "u", "v", [s1], s2)  # a fresh nonce each time
    three = seal_shares(key, SCOPE, "u", "v", [s1, s2, s1], s2)  # a sender that trained three blocks
    assert len(three) == 28 + 4 * 33 and open_shares(key, SCOPE, "u", "v", three, 3) == ([s1, s2, s1], s2)
    with pytest.raises(SecAggError, match="must be 127 bytes"):
        open_shares(key, SCOPE, "u", "v", three, 2)  # the receiver expects what the sender's split says
    for scope, sender, receiver in [(Scope("job", 5), "u", "v"), (Scope("other", 4), "u", "v"), (SCOPE, "v", "u"),
                                    (SCOPE, "u", "w")]:
        with pytest.raises(SecAggError, match="do not open"):
            open_shares(key, scope, sender, receiver, sealed)
    tampered = bytearray(sealed)
    tampered[20] ^= 1
    with pytest.raises(SecAggError, match="do not open"):
        open_shares(key, SCOPE, "u", "v", bytes(tampered))
    with pytest.raises(SecAggError, match="94 bytes"):
        open_shares(key, SCOPE, "u", "v", sealed + b"\0")


def test_a_key_advertisement_verifies_only_for_its_device_round_and_keys():
    secret = "device secret"
    c, s = generate_keypair().public, generate_keypair().public
    identity = identity_public_key(secret, "phone")
    commits = os.urandom(64)
    signature = sign_advertisement(secret, "phone", SCOPE, c, s, 1, commits)
    verify_advertisement(identity, "phone", SCOPE, c, s, 1, commits, signature)
    for device, scope, keys in [("phone", Scope("job", 5), (c, s, 1, commits)), ("phone", SCOPE, (s, c, 1, commits)),
                                ("tablet", SCOPE, (c, s, 1, commits)),
                                ("phone", SCOPE, (c, generate_keypair().public, 1, commits)),
                                ("phone", SCOPE, (c, s, 0, commits)), ("phone", SCOPE, (c, s, 1, os.urandom(64)))]:
        with pytest.raises(SecAggError, match="not signed"):
            verify_advertisement(identity, device, scope, *keys, signature)
    # What the server holds, sha256(secret), is not the credential: keys made from it do not verify.
    forged = sign_advertisement(derive_key(secret).hex(), "phone", SCOPE, c, generate_keypair().public, 1, commits)
    with pytest.raises(SecAggError, match="not signed"):
        verify_advertisement(identity, "phone", SCOPE, c, s, 1, commits, forged)
    assert identity != identity_public_key(secret, "tablet")


def test_the_neighbour_graph_is_regular_symmetric_and_a_function_of_its_inputs():
    members = [f"dev-{i}" for i in range(60)]
    graph = neighbour_graph(fixed("g"), SCOPE, 0, members)
    assert {len(v) for v in graph.neighbours.values()} == {18}  # 2^18 >= 60^3: k = 18
    assert all(u in graph.neighbours[v] for u in members for v in graph.neighbours[u])
    assert set(graph.threshold.values()) == {10}
    assert neighbour_graph(fixed("g"), SCOPE, 0, list(reversed(members))) == graph
    assert neighbour_graph(fixed("g"), SCOPE, 1, members).order != graph.order
    assert neighbour_graph(fixed("h"), SCOPE, 0, members).order != graph.order
    small = neighbour_graph(fixed("g"), SCOPE, 0, members[:5])
    assert all(len(v) == 4 for v in small.neighbours.values()) and set(small.threshold.values()) == {3}
    with pytest.raises(SecAggError, match="even degree"):
        neighbour_graph(fixed("g"), SCOPE, 0, members, 7)
    with pytest.raises(SecAggError, match="2 distinct"):
        neighbour_graph(fixed("g"), SCOPE, 0, ["a", "a"])


def test_sizes_are_checked_before_use():
    with pytest.raises(SecAggError, match="32 bytes"):
        expand_words(b"short", 4)
    with pytest.raises(SecAggError, match="words"):
        expand_words(bytes(32), -1)
    with pytest.raises(SecAggError, match="32 bytes"):
        agree(bytes(32), bytes(31))
    with pytest.raises(SecAggError, match="ring bits"):
        combined_mask(4, 33, "a")
    with pytest.raises(SecAggError, match="itself"):
        pairwise_sign("a", "a")
    with pytest.raises(SecAggError, match="2\\*\\*53"):
        Scope("s", 2**53)
    with pytest.raises(SecAggError, match="self-mask seed"):
        self_mask_seed(bytes(16), SCOPE, 0, "a")
