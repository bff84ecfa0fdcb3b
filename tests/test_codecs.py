"""Transfer codecs (edge_sdk/codecs): round trips, the promised errors, unbiasedness, linearity, and
refusal of bad records. Randomness is the codecs' own seeded stream, so every run draws the same."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge_sdk.codecs import CODECS, CodecError, ErrorFeedback, codec, decode, decode_bytes, encode_bytes, linear_codes
from edge_sdk.codecs.blockwise import BlockwiseCodec
from edge_sdk.codecs import eden
from edge_sdk.codecs.bits import pack
from edge_sdk.codecs.eden import CENTROIDS, NMSE
from edge_sdk.codecs.record import DTYPES, parse_header
from edge_sdk.protocol.tensors import DTYPES as WIRE_DTYPES

LOSSLESS = [n for n, c in CODECS.items() if c.lossless]
LOSSY = [n for n, c in CODECS.items() if not c.lossless]
GRID = [n for n, c in CODECS.items() if isinstance(c, BlockwiseCodec)]

_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40)
_floats32 = hnp.arrays(np.float32, _shapes, elements=st.floats(-1e6, 1e6, width=32))


def test_dtype_codes_are_the_tensor_formats():
    assert DTYPES == WIRE_DTYPES


@pytest.mark.parametrize("name", list(CODECS))
def test_each_codec_keeps_the_properties_it_declares(name: str):
    """Measured, for every codec of the registry: a lossless one returns its input bit for bit and a lossy one
    does not; one that is not unbiased is deterministic (one record per input), and an unbiased lossy one
    averages back to its input over its randomness (64 draws: the error of the mean shrinks as 1/8 of one
    draw's); none is linear in its default setting (a per-block scale)."""
    c = CODECS[name]
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    once = decode(c.encode(x, seed=1))
    assert np.array_equal(once, x) == c.lossless
    if not c.unbiased:
        assert c.encode(x, seed=1) == c.encode(x, seed=2)
    elif not c.lossless:
        mean = np.mean([decode(c.encode(x, seed=s)) for s in range(64)], axis=0)
        assert np.abs(mean - x).mean() < np.abs(once - x).mean() / 4
    assert not c.linear


def test_a_shared_scale_makes_the_grid_linear():
    assert codec("sr8", scale=1e-3).linear and not codec("sr8", scale=1e-3).unbiased


@settings(max_examples=60, deadline=None)
@given(array=st.one_of(
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.float16]), _shapes,
               elements={"allow_nan": False}),  # the protocol refuses NaN; infinities are data here
    hnp.arrays(st.sampled_from([np.int64, np.int32, np.uint8, np.bool_]), _shapes)),
    name=st.sampled_from(LOSSLESS), stride=st.sampled_from([None, 1, 3, 4, 8]))
def test_lossless_codecs_round_trip_exactly(array, name, stride):
    c = codec(name, stride=stride) if name == "shuffle" else CODECS[name]
    back = decode(c.encode(array))
    assert back.dtype == array.dtype.newbyteorder("<") and back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()


def test_byte_payloads_through_lossless_codecs():
    payload = b"\x08\x01\x12\x04onnx" * 1000
    for name in LOSSLESS:
        record = encode_bytes(name, payload)
        assert decode_bytes(record) == payload
    assert len(encode_bytes("zlib", payload)) < len(payload) / 20
    with pytest.raises(ValueError, match="lossy"):
        encode_bytes("int8", payload)


@settings(max_examples=80, deadline=None)
@given(array=_floats32, name=st.sampled_from(["float16", *GRID]), seed=st.integers(0, 2 ** 64 - 1))
def test_lossy_errors_stay_within_the_elementwise_bound(array, name, seed):
    if name == "float16":
        array = np.clip(array, -60000, 60000)
    c = CODECS[name]
    back = decode(c.encode(array, seed=seed))
    assert back.dtype == np.float32 and back.shape == array.shape
    err = np.abs(back.astype(np.float64) - array)
    assert (err <= c.bound(array).max_abs).all()


def test_lossy_codecs_refuse_what_they_cannot_carry():
    for name in LOSSY:
        with pytest.raises(CodecError, match="NaN"):
            CODECS[name].encode(np.array([1.0, np.nan], np.float32))
        with pytest.raises(CodecError, match="float32"):
            CODECS[name].encode(np.ones(3, np.float64))
    with pytest.raises(CodecError, match="binary16"):
        CODECS["float16"].encode(np.array([65520.0], np.float32))


@settings(max_examples=12, deadline=None)
@given(array=hnp.arrays(np.float32, st.integers(1, 300), elements=st.floats(-10, 10, width=32)),
       name=st.sampled_from(["sr1", "sr2", "sr4", "sr8"]))
def test_stochastic_rounding_is_unbiased(array, name):
    """The mean of N draws converges to x: within 5 standard errors (variance <= scale^2 / 4 per element)."""
    c, draws = CODECS[name], 400
    mean = np.mean([decode(c.encode(array, seed=s)) for s in range(draws)], axis=0, dtype=np.float64)
    step = c.bound(array).max_abs
    assert (np.abs(mean - array) <= 5 * step / 2 / np.sqrt(draws) + 1e-6 * (1 + np.abs(array))).all()


def _eden_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    sparse = np.zeros(1024, np.float32)
    sparse[rng.choice(1024, 10, replace=False)] = rng.normal(size=10)
    return {"gaussian": rng.normal(size=1024).astype(np.float32), "sparse": sparse,
            "one_hot": np.eye(1, 1024, 3, dtype=np.float32)[0], "heavy_tailed": rng.standard_t(2, 1024).astype(np.float32),
            "padded_700": rng.normal(size=700).astype(np.float32)}


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("kind", list(_eden_inputs()))
def test_eden_is_unbiased_with_the_stated_error(bits, kind):
    """Over 400 rotation seeds: the mean is within 4 standard errors of x, and the mean squared error
    within 10% of the stated bound (NMSE sigma^2 / (1 - sigma^2), EDEN Section 4), on dense, sparse,
    one-hot, heavy-tailed and padded inputs."""
    x = _eden_inputs()[kind]
    c, draws = CODECS[f"eden{bits}"], 400
    out = np.array([decode(c.encode(x, seed=s)) for s in range(draws)], dtype=np.float64)
    sq = ((out - x) ** 2).sum(axis=1).mean()
    bound = c.bound(x).sq_l2
    assert 0.9 * bound <= sq <= 1.1 * bound
    assert np.linalg.norm(out.mean(axis=0) - x) <= 4 * np.sqrt(sq / draws)


def test_eden_centroids_are_lloyd_max_for_the_normal():
    """Each centroid is the mean of N(0, 1) over its cell (the centroid condition), within 1e-6."""
    from math import erf, exp, inf, pi, sqrt

    def pdf(t: float) -> float:
        return 0.0 if abs(t) == inf else exp(-t * t / 2) / sqrt(2 * pi)

    def cdf(t: float) -> float:
        return 0.5 * (1 + erf(t / sqrt(2))) if abs(t) != inf else float(t > 0)

    for bits, c in CENTROIDS.items():
        edges = [-inf, *((c[1:] + c[:-1]) / 2), inf]
        for k, centroid in enumerate(c):
            a, b = edges[k], edges[k + 1]
            assert abs((pdf(a) - pdf(b)) / (cdf(b) - cdf(a)) - centroid) < 1e-6
        assert len(c) == 2 ** bits and NMSE[bits] > 0


def _eden_at_once(x: np.ndarray, bits: int, segment: int, seed: int) -> tuple[bytes, np.ndarray]:
    """EDEN's body (scales, packed codes) and its decoding with every segment rotated at once, as the
    codec did before it worked a slice at a time: the reference the sliced codec must equal bit for bit."""
    whole, rest, padded = eden.segments(x.size, segment)
    (fw, fl), (sw, sl) = eden.signs(seed, whole, segment, padded)
    codes, scales = eden._quantize(x[:whole * segment].reshape(whole, segment), (fw, sw), bits)
    out = eden._restore(codes, scales, (fw, sw), bits).reshape(-1)
    if rest:
        last = np.zeros((1, padded), dtype=np.float32)
        last[0, :rest] = x[whole * segment:]
        c, s = eden._quantize(last, (fl, sl), bits)
        out = np.concatenate((out, eden._restore(c, s, (fl, sl), bits).reshape(-1)[:rest]))
        codes, scales = np.concatenate((codes.reshape(-1), c.reshape(-1))), np.concatenate((scales, s))
    return scales.astype("<f4").tobytes() + pack(codes.reshape(-1), bits), out


@pytest.mark.parametrize("n,segment", [(1, 4), (13, 1), (77, 2), (1001, 4), (4099, 8), (70_001, 16),
                                       (3 * 2**16 + 5, 2**16), (2**17 + 2**16, 2**16), (300_001, 2**18),
                                       (2**16 - 3, 2**16)])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_eden_a_slice_at_a_time_is_bit_identical_to_all_segments_at_once(n, segment, bits):
    x = np.random.default_rng(n + bits).normal(size=n).astype(np.float32)
    record = eden.EdenCodec(bits, segment).encode(x, seed=n * 31 + bits)
    body, restored = _eden_at_once(x, bits, segment, n * 31 + bits)
    assert record[parse_header(memoryview(record)).offset + eden._PARAMS.size:] == body  # after the parameters
    assert decode(record).tobytes() == restored.tobytes()


def test_eden_workspace_is_fixed_whatever_the_tensor_size():
    """Encoding and decoding take ``workspace_bytes()`` beside the tensor, the record and the packed
    sign stream (2 bits a coordinate), for a tensor of a quarter million or of four million values:
    the rotation runs a slice of segments at a time."""
    import tracemalloc

    for n in (2**18, 2**22 + 999):
        x = np.random.default_rng(0).normal(size=n).astype(np.float32)
        fixed = eden.workspace_bytes() + (2 * n + 7) // 8
        tracemalloc.start()
        record = eden.EdenCodec(2).encode(x, seed=1)
        encode_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        tracemalloc.start()
        decode(record)
        decode_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert encode_peak - len(record) <= fixed, (n, encode_peak - len(record), fixed)
        assert decode_peak - 4 * n <= fixed, (n, decode_peak - 4 * n, fixed)


def test_eden_segments_pad_and_cut():
    x = np.random.default_rng(3).normal(size=(3, 1000)).astype(np.float32)
    small = codec("eden2", segment=256)
    record = small.encode(x, seed=9)
    assert decode(record).shape == x.shape
    # 11 whole segments of 256 and one of 184 padded to 256: 12 scales, 3072 codes of 2 bits
    assert len(record) == 8 + 16 + 16 + 12 * 4 + 3072 * 2 // 8
    assert decode(record).tobytes() == decode(small.encode(x, seed=9)).tobytes()
    assert decode(record).tobytes() != decode(small.encode(x, seed=10)).tobytes()


def test_shared_grid_is_linear_across_devices():
    """Devices on one shared scale: the sum of their integer codes times the scale is the sum of their
    decoded values (what secure aggregation's masked sum returns), and its mean is unbiased."""
    rng = np.random.default_rng(5)
    updates = (rng.normal(size=(50, 400)) * 1e-3).astype(np.float32)
    c = codec("sr8", scale=4e-5)
    records = [c.encode(u, seed=i) for i, u in enumerate(updates)]
    codes = [linear_codes(r) for r in records]
    assert {s for _, s in codes} == {np.float32(4e-5)}
    summed = np.sum([q for q, _ in codes], axis=0) * codes[0][1]
    assert np.allclose(summed, np.sum([decode(r) for r in records], axis=0, dtype=np.float64), rtol=0, atol=1e-9)
    assert np.abs(summed / 50 - updates.mean(axis=0)).max() < 4 * 4e-5 / np.sqrt(50)
    with pytest.raises(CodecError, match="per-block"):
        linear_codes(CODECS["sr8"].encode(updates[0], seed=0))


def test_error_feedback_carries_the_residual():
    """EF-SGD (Karimireddy et al. 2019, Algorithm 2): what was sent over T rounds plus the residual held
    is T times the delta, so a biased codec (nearest int8 on a tiny delta: all zeros) still delivers it."""
    delta = np.linspace(-1, 1, 512).astype(np.float32) * 1e-3
    delta[0] = 10.0  # one large value: the block's grid step swamps the rest
    ef, sent = ErrorFeedback(), np.zeros(512)
    for _ in range(50):
        sent += decode(ef.encode("w", delta, CODECS["int8"]))
    assert np.allclose(sent + ef.residuals["w"], 50 * delta, atol=1e-4)
    plain = decode(CODECS["int8"].encode(delta))
    assert np.abs(plain[1:256] - delta[1:256]).max() > 5e-4  # without feedback the small values are lost
    # the mean of what was sent is off by the residual over T, at most one grid step's error over T
    assert np.abs(sent / 50 - delta).max() <= CODECS["int8"].bound(delta).max_abs * 1.01 / 50
    ef.reset("w")
    assert "w" not in ef.residuals


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_bad_records_raise_codec_error_only(data):
    """Truncations, bit flips and garbage never escape as anything but CodecError (or decode to a
    finite array of the declared shape)."""
    name = data.draw(st.sampled_from(list(CODECS)))
    x = np.random.default_rng(0).normal(size=300).astype(np.float32)
    record = bytearray(CODECS[name].encode(x, seed=1))
    how = data.draw(st.sampled_from(["cut", "flip", "append", "garbage"]))
    if how == "cut":
        record = record[:data.draw(st.integers(0, len(record) - 1))]
    elif how == "flip":
        at = data.draw(st.integers(0, len(record) - 1))
        record[at] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "append":
        record += data.draw(st.binary(min_size=1, max_size=8))
    else:
        record = bytearray(data.draw(st.binary(max_size=64)))
    try:
        out = decode(bytes(record), max_bytes=1 << 20)
    except CodecError:
        return
    assert out.nbytes <= 1 << 20 and (out.dtype.kind != "f" or np.isfinite(out).all())


def test_sizes_are_checked_before_allocation():
    record = bytearray(CODECS["none"].encode(np.zeros(4, np.float32)))
    record[8:16] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(CodecError, match="exceeds"):
        decode(bytes(record))
    bomb = CODECS["zlib"].encode(np.zeros(10, np.uint8))[:16] + zlib.compress(bytes(1 << 20))
    with pytest.raises(CodecError, match="inflates past"):
        decode(bomb)


def test_codec_names_and_settings_are_checked():
    with pytest.raises(ValueError, match="unknown codec"):
        codec("lz4")
    with pytest.raises(ValueError):
        codec("eden2", segment=1000)
    with pytest.raises(ValueError):
        codec("sr1", scale=1.0)
    with pytest.raises(ValueError):
        CODECS["eden1"].encode(np.ones(3, np.float32), seed=-1)


def test_codecs_are_lean_and_not_loaded_by_the_sdk():
    """``import edge_sdk`` does not load the codecs; the codecs load numpy and the standard library only."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; import edge_sdk; before = 'edge_sdk.codecs' in sys.modules; import edge_sdk.codecs; "
            "print(json.dumps([before, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'onnx', 'onnxruntime', 'msgpack', 'websockets'))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert before is False
    assert heavy == []


def test_every_codec_is_in_the_protocol_table():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    section = text[text.index("## Codecs"):text.index("## Transfers")]
    for name in CODECS:
        assert f"`{name}`" in section, name
