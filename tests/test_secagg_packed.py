"""Compressed secure uploads (edge_sdk.secagg.fixedpoint, ``Compression`` and ``pack_words``): the packed
encoding reproduces tests/vectors/secagg_packed.json (the JavaScript SDK reads the same file,
edge_sdk_js/test/secagg-packed.test.mjs), round-trips bit for bit, sums and unmasks to the sum of the
quantised values, and the server refuses a packed upload of the wrong length, padding or type."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.secagg import SecAggError, combined_mask, pairwise_sign, remove_masks
from edge_sdk.secagg.fixedpoint import SLICE_WORDS, Compression, FixedPoint, pack_words, packed_bytes, unpack_words
from edge_sdk.secagg.masks import add_mod
from edge_sdk.secagg.round import weight_of
from orchestrator.aggregation.secure.round import SecureRefusal
from tests.test_secagg_round import CLIP, SIZES, Fleet, wire

VECTORS = json.loads((Path(__file__).parent / "vectors" / "secagg_packed.json").read_text(encoding="utf-8"))
h = bytes.fromhex


def test_packing_matches_the_vectors():
    for case in VECTORS["packing"]:
        words = np.array(case["words"], dtype=np.uint32)
        packed = pack_words(words, case["bits"])
        assert packed.tobytes().hex() == case["packed"] and packed.size == packed_bytes(words.size, case["bits"])
        assert unpack_words(np.frombuffer(h(case["packed"]), np.uint8), words.size, case["bits"]).tolist() == case["words"]


def test_compressed_plans_and_encodings_match_the_vectors():
    for case in VECTORS["plans"]:
        fp = Compression(case["value_bits"], case["spread"]).fixed(case["cohort"], case["clip"], case["dimension"])
        assert (fp.frac_bits, fp.ring_bits, fp.bound) == (case["frac_bits"], case["ring_bits"], case["bound"])
    for case in VECTORS["encodings"]:
        fp = Compression(case["value_bits"]).fixed(case["cohort"], case["clip"], len(case["update"]))
        assert (fp.frac_bits, fp.ring_bits, fp.bound) == (case["frac_bits"], case["ring_bits"], case["bound"])
        words = fp.encode(np.array(case["update"]), case["weight"], h(case["rounding_seed"]))
        assert words.tolist() == case["words"]
        assert pack_words(words, fp.ring_bits).tobytes().hex() == case["packed"]


@pytest.mark.parametrize("bits", [1, 5, 9, 10, 13, 16, 24, 31, 32])
def test_packing_round_trips_bit_for_bit_across_slices(bits):
    rng = np.random.default_rng(bits)
    for count in (0, 1, 7, SLICE_WORDS, SLICE_WORDS + 3, 3 * SLICE_WORDS - 1):
        words = rng.integers(0, 2**bits, size=count, dtype=np.uint64).astype(np.uint32)
        packed = pack_words(words, bits)
        assert packed.dtype == np.uint8 and packed.size == (count * bits + 7) // 8
        assert np.array_equal(unpack_words(packed, count, bits), words)


def test_unpacking_refuses_a_wrong_length_padding_or_type():
    words = np.arange(11, dtype=np.uint32)
    packed = pack_words(words, 9)  # 99 bits: 13 bytes, 5 padding bits
    with pytest.raises(SecAggError, match="13 bytes"):
        unpack_words(packed[:-1], 11, 9)
    with pytest.raises(SecAggError, match="13 bytes"):
        unpack_words(np.concatenate([packed, [0]]).astype(np.uint8), 11, 9)
    with pytest.raises(SecAggError, match="13 bytes"):
        unpack_words(packed.view(np.int8), 11, 9)
    bad = packed.copy()
    bad[-1] |= 0x80
    with pytest.raises(SecAggError, match="padding"):
        unpack_words(bad, 11, 9)


def test_a_cohorts_ring_is_sized_to_its_values_and_fits_32_bits():
    assert Compression(8).ring_bits(256) == 16  # 8-bit values in 16-bit words for 256 devices
    assert Compression(7).ring_bits(8) == 10  # a third of float32, less the weight word
    with pytest.raises(SecAggError, match="more than 32"):
        Compression(24).fixed(300, 1.0, 10)
    assert Compression(24).fitting(300).value_bits == 23 and Compression(7).fitting(8) == Compression(7)
    with pytest.raises(SecAggError, match="noise"):
        FixedPoint(1.0, 8, 12, 4, noise=0.1, bound=0.5)


def _lift(words: np.ndarray, bits: int) -> np.ndarray:
    v = words.astype(np.int64)
    v[v >= 2 ** (bits - 1)] -= 2**bits
    return v


def test_the_sum_of_masked_encodings_unmasks_to_the_sum_of_the_quantised_values():
    rng = np.random.default_rng(5)
    devices, d = ["u1", "u2", "u3", "u4", "u5"], 5000
    fp = Compression(6).fixed(len(devices), 1.0, d)
    seeds = {u: bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for u in devices}
    pair = {frozenset((u, v)): bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for u in devices for v in devices if u < v}
    total, quantised, exact = np.zeros(d + 1, np.uint32), np.zeros(d + 1, np.int64), np.zeros(d)
    for u in devices:
        x = rng.normal(0, 1, d)
        x *= rng.uniform(0.3, 2.0) / np.linalg.norm(x)
        words = fp.encode(x, 0.5)
        assert int(words.max()) < 2**fp.ring_bits
        quantised += _lift(words, fp.ring_bits)
        exact += np.clip(x * min(1.0, 1.0 / np.linalg.norm(x)), -fp.bound, fp.bound) * 0.5
        mask = combined_mask(d + 1, fp.ring_bits, u, self_seed=seeds[u],
                             pair_seeds={v: pair[frozenset((u, v))] for v in devices if v != u})
        wire_words = unpack_words(pack_words(add_mod(words, mask, fp.ring_bits), fp.ring_bits), d + 1, fp.ring_bits)
        total = add_mod(total, wire_words, fp.ring_bits)
    assert all(pairwise_sign(u, v) == -pairwise_sign(v, u) for u in devices for v in devices if u != v)
    unmasked = remove_masks(total, fp.ring_bits, self_seeds=seeds, dropped={})
    assert np.array_equal(_lift(unmasked, fp.ring_bits), quantised)  # exact: no wrap in b bits
    decoded = fp.decode(unmasked)
    assert np.max(np.abs(decoded.values - exact)) <= len(devices) * 2.0**-fp.frac_bits
    assert abs(decoded.weight - 2.5) <= fp.weight_error_bound


def test_a_compressed_round_reveals_each_blocks_sum_and_refuses_bad_packed_uploads():
    splits = {"a": 0, "b": 0, "c": 1, "d": 0, "e": 2, "f": 0, "g": 0}
    fleet = Fleet(splits)
    fleet.server.compression = Compression(7)
    peers = fleet.keys()
    assert {(m.value_bits, m.value_spread, m.ring_bits) for m in peers.values()} == {(7, 4.0, 10)}
    fleet.mask(fleet.shares(peers), absent=set(splits))
    ring = fleet.server.fixed.ring_bits
    packed = {d: dict(enumerate((pack_words(w, ring) for w in fleet.uploads[d]), start=splits[d])) for d in splits}
    first = packed["a"]
    with pytest.raises(SecureRefusal, match="bytes"):
        fleet.server.take_masked("a", {**first, 2: first[2][:-1]})
    with pytest.raises(SecureRefusal, match="bytes"):
        fleet.server.take_masked("a", {**first, 0: fleet.uploads["a"][0]})  # int32-sized words in a packed round
    bad = first[1].copy()
    bad[-1] |= 0x80  # 26 words of 10 bits: 4 padding bits
    with pytest.raises(SecureRefusal, match="padding"):
        fleet.server.take_masked("a", {**first, 1: bad})
    for d in splits:
        fleet.server.take_masked(d, packed[d])
    for out in fleet.unmask():
        fixed = fleet.server.fixed_for(out.block)
        expected, weight = fleet.plain_sum(out.block, splits)
        clamped = sum(np.clip(fleet.updates[d][out.block - k] * min(1.0, CLIP / np.linalg.norm(fleet.updates[d][out.block - k])),
                              -fixed.bound, fixed.bound) * weight_of(fleet.samples[d], 100.0) for d, k in splits.items() if k <= out.block)
        assert out.reason == "" and out.values.shape == (SIZES[out.block],)
        assert np.max(np.abs(out.values - clamped)) <= fixed.error_bound  # the clamped sum, within n 2^-f
        assert abs(out.weight - weight) <= fixed.weight_error_bound
        assert fixed.bound < CLIP or np.allclose(clamped, expected)  # B = C: nothing clamped


def test_a_device_refuses_a_compressed_round_with_a_ring_its_cohort_does_not_need():
    fleet = Fleet({"a": 0, "b": 0, "c": 0})
    fleet.server.compression = Compression(7)
    peers = fleet.keys()
    with pytest.raises(SecAggError, match="which need 9"):
        fleet.devices["a"].share(wire(p.SecAggPeers(**{**peers["a"].__dict__, "ring_bits": 8})))
    with pytest.raises(p.ProtocolError, match="value_bits"):
        wire(p.SecAggPeers(**{**peers["b"].__dict__, "value_spread": 0.0}))
