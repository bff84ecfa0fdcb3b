"""Messages: every type round-trips, and decode refuses every kind of bad field with the right code."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import (
    DEFAULT_LIMITS,
    MESSAGE_TYPES,
    PAYLOAD_KINDS,
    PHASES,
    PROTOCOL_VERSION,
    SELECTIONS,
    Ack,
    Bye,
    Error,
    ErrorCode,
    Fetch,
    Hello,
    Instruction,
    Limits,
    ProtocolError,
    Report,
    Resume,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    Welcome,
    decode,
    encode,
)

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
NAT = st.integers(0, (1 << 63) - 1)
TEXT = st.text(max_size=40)
ID = st.text(min_size=1, max_size=40)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALAR = st.one_of(TEXT, INT64, FINITE, st.booleans())
CONFIG = st.dictionaries(TEXT, SCALAR, max_size=6)
SHA = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
PHASE = st.one_of(st.sampled_from(sorted(PHASES)), ID)  # phases are open strings on the wire
ROWS = st.dictionaries(st.integers(0, 15).map(str),
                       st.sets(st.integers(0, (1 << 63) - 1), max_size=8).map(sorted), max_size=4)


def _blobs(size: int) -> st.SearchStrategy:
    return st.dictionaries(ID, st.binary(min_size=size, max_size=size), max_size=4)


def _disjoint(ids: list[str]) -> tuple[list[str], list[str]]:
    return ids[::2], ids[1::2]


def secagg_messages() -> dict[str, st.SearchStrategy]:
    """The secure aggregation messages (docs/protocol.md, "Secure aggregation")."""
    from edge_sdk.protocol import (SecAggInbox, SecAggKeys, SecAggPeers, SecAggReveal, SecAggShares,
                                   SecAggUnmask)

    key, ids = st.binary(min_size=32, max_size=32), st.lists(ID, max_size=6, unique=True)
    return {
        "secagg_keys": st.builds(SecAggKeys, round=NAT, cipher_public=key, mask_public=key,
                                 signature=st.binary(min_size=64, max_size=64)),
        "secagg_peers": st.builds(SecAggPeers, round=NAT, graph_seed=key, degree=st.integers(1, 254), members=ids,
                                  cipher_keys=_blobs(32), mask_keys=_blobs(32), signatures=_blobs(64),
                                  identities=_blobs(32), splits=st.dictionaries(ID, st.integers(0, 64), max_size=4),
                                  clip=st.floats(1e-3, 1e6), frac_bits=st.integers(0, 60), ring_bits=st.integers(1, 32),
                                  cohort=st.integers(2, 1 << 20), weight_scale=st.floats(1e-3, 1e9),
                                  threshold=st.integers(2, 255)),
        "secagg_shares": st.builds(SecAggShares, round=NAT, sealed=_blobs(94)),
        "secagg_inbox": st.builds(SecAggInbox, round=NAT, sealed=_blobs(94)),
        "secagg_unmask": ids.map(_disjoint).map(lambda pair: SecAggUnmask(0, *pair)),
        "secagg_reveal": st.builds(SecAggReveal, round=NAT, seed_shares=_blobs(33), key_shares=st.just({})),
    }


@st.composite
def welcomes(draw) -> Welcome:
    num_blocks = draw(st.integers(0, 50))
    split = draw(st.integers(0, num_blocks))
    chunks = [tuple(sorted(draw(st.lists(st.integers(0, num_blocks), min_size=2, max_size=2, unique=True))))
              for _ in range(draw(st.integers(0, 4)))] if num_blocks >= 1 else []
    return Welcome(device_id=draw(TEXT), role=draw(st.sampled_from(["strong", "moderate", "weak"])), split=split,
                   num_blocks=num_blocks, chunks=chunks, model=draw(TEXT), model_version=draw(NAT),
                   batch_size=draw(st.integers(1, 1 << 20)), local_steps=draw(NAT), config=draw(CONFIG))


@st.composite
def transfer_begins(draw) -> TransferBegin:
    total = draw(NAT)
    return TransferBegin(transfer_id=draw(ID), kind=draw(st.sampled_from(sorted(PAYLOAD_KINDS))),
                         total_size=total, sha256=draw(st.one_of(SHA, st.just(""))), frame_size=draw(st.integers(1, 1 << 40)),
                         offset=draw(st.integers(0, total)), meta=draw(CONFIG))


@st.composite
def reports(draw) -> Report:
    transfer_id = draw(st.one_of(st.just(""), ID))
    start = draw(st.integers(0, 1000)) if transfer_id else 0
    stop = draw(st.integers(start, 2000)) if transfer_id else 0
    return Report(round=draw(NAT), phase=draw(PHASE), num_samples=draw(NAT), trained=(start, stop),
                  transfer_id=transfer_id, metrics=draw(CONFIG))


MESSAGES = {
    "hello": st.builds(Hello, device_id=ID, token=TEXT, budget_bytes=NAT, cores=st.integers(0, 1024),
                       runtimes=st.lists(TEXT, max_size=4), num_samples=NAT, device_class=TEXT,
                       labels=st.dictionaries(TEXT, TEXT, max_size=4), resume_round=st.integers(-1, 1 << 40),
                       rows=ROWS, ext=st.dictionaries(
                           st.from_regex(r"[a-z0-9_-]{1,8}\.[a-z0-9_.-]{1,8}", fullmatch=True),
                           st.one_of(SCALAR, st.binary(max_size=64), st.lists(SCALAR, max_size=3),
                                     st.dictionaries(TEXT, st.one_of(SCALAR, st.binary(max_size=16)), max_size=3)),
                           max_size=4)),
    "welcome": welcomes(),
    "instruction": st.builds(Instruction, round=NAT, phase=PHASE, model_version=NAT, split=NAT,
                             chunk_ids=st.lists(ID, max_size=5), model_id=ID,
                             selection=st.sampled_from(sorted(SELECTIONS)), broadcast_id=st.one_of(st.just(""), ID),
                             local_steps=NAT, lr=st.floats(0, 10), deadline_s=st.floats(0, 1e6), config=CONFIG),
    "fetch": st.builds(Fetch, round=NAT, payload_id=ID, offset=NAT),
    "transfer_begin": transfer_begins(),
    "transfer_frame": st.builds(TransferFrame, transfer_id=st.text(min_size=1, max_size=300), offset=NAT,
                                data=st.binary(min_size=1, max_size=2000)),
    "transfer_end": st.builds(TransferEnd, transfer_id=ID, sha256=SHA),
    "report": reports(),
    "ack": st.builds(Ack, round=NAT, accepted=st.booleans(), reason=TEXT, phase=st.one_of(st.just(""), PHASE)),
    "error": st.builds(Error, code=st.sampled_from([c.value for c in ErrorCode] + ["from_the_future"]),
                       message=TEXT),
    "bye": st.builds(Bye, reason=TEXT),
    "resume": st.builds(Resume, transfer_id=ID, offset=NAT),
    **secagg_messages(),
}
any_message = st.one_of(*MESSAGES.values())


def assert_same(a: object, b: object) -> None:
    """Equality that also tells 1 from 1.0 from True (== does not)."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        assert bytes(a) == bytes(b)
        return
    assert type(a) is type(b), (a, b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_every_message_type_has_a_strategy():
    assert set(MESSAGES) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(name, data):
    msg = data.draw(MESSAGES[name])
    wire = encode(msg)
    assert isinstance(wire, bytes)
    back = decode(wire)
    assert back == msg
    assert_same(back, msg)
    raw = msgpack.unpackb(wire, raw=False)  # plain msgpack: any peer can read it
    assert raw["t"] == name and raw["v"] == PROTOCOL_VERSION


def _wire(msg) -> dict:
    return msgpack.unpackb(encode(msg), raw=False)


def _pack(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _code(data: bytes, limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(data, limits)
    return info.value.code


HELLO = Hello(device_id="pi-zero-1", token="secret", budget_bytes=512 << 20, cores=1, runtimes=["onnxruntime"],
              num_samples=600, device_class="rpi_zero2", labels={"site": "lab"}, rows={"0": [0, 3, 9], "1": []})
INSTRUCTION = Instruction(3, "train", 2, 2, ["c0", "c1"], "model-2-tail-2", "tail", "", 5, 0.1, 30.0,
                          {"mu": 0.01, "name": "x", "n": 3, "flag": False})


def test_version_4_message_set():
    assert PROTOCOL_VERSION == 4
    assert {"instruction", "report"} <= set(MESSAGE_TYPES) and not {"task", "update"} & set(MESSAGE_TYPES)
    assert PHASES == {"train", "evaluate", "compare"} and SELECTIONS == {"tail", "rows", "channels", "adapters"}
    assert PAYLOAD_KINDS == {"chunk", "model", "broadcast", "train_graph", "update"}
    # Every field is on the wire, defaults included, in declaration order.
    assert list(_wire(Fetch(1, "c0")))[2:] == ["round", "payload_id", "offset"]
    assert list(_wire(Ack(1, True)))[2:] == ["round", "accepted", "reason", "phase"]
    assert _wire(HELLO)["rows"] == {"0": [0, 3, 9], "1": []}
    assert _wire(Hello("d", "", 0, 0, [], 0))["rows"] == {}
    # Version 4: a strategy's per-device values travel in the hello's extension fields, not named ones.
    assert list(_wire(HELLO))[-2:] == ["rows", "ext"] and _wire(HELLO)["ext"] == {}
    assert list(_wire(INSTRUCTION))[2:] == ["round", "phase", "model_version", "split", "chunk_ids", "model_id",
                                            "selection", "broadcast_id", "local_steps", "lr", "deadline_s", "config"]
    assert list(_wire(Report(0, "evaluate", 5, (0, 0), "", {"loss": 0.5})))[2:] == [
        "round", "phase", "num_samples", "trained", "transfer_id", "metrics"]


def test_constructor_normalises_equivalent_spellings():
    w = Welcome("d", "weak", 2, 4, [[0, 1], (1, 2)], "resnet20", 0, 32, 1, {"x": 1})
    assert w.chunks == [(0, 1), (1, 2)]
    r = Report(0, "train", 10, [2, 4], "u-1", {})
    assert r.trained == (2, 4)
    assert decode(encode(r)) == r
    i = Instruction(0, "evaluate", 0, 1, ("c0",), "m", "tail", "", 1, 1, 0, {})
    assert i.chunk_ids == ["c0"] and type(i.lr) is float and type(i.deadline_s) is float
    assert decode(encode(i)) == i
    h = Hello("d", "", 0, 0, [], 0, rows={"0": (1, 2)})
    assert h.rows == {"0": [1, 2]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        HELLO.cores = 4  # type: ignore[misc]


def test_numpy_scalars_and_str_enums_become_plain_values():
    import numpy as np

    r = Report(np.int64(2), "train", np.int32(50), (np.int64(1), 3), "u-2",
               {"loss_before": np.float32(0.5), "clipped": np.bool_(True), "steps": np.int64(3)})
    assert_same(r, Report(2, "train", 50, (1, 3), "u-2", {"loss_before": 0.5, "clipped": True, "steps": 3}))
    assert_same(decode(encode(r)), r)
    h = Hello("d", "", 0, 0, [], 0, rows={"0": np.array([1, 5, 7], dtype=np.int64), np.str_("1"): [np.int32(2)]})
    assert_same(h.rows, {"0": [1, 5, 7], "1": [2]})  # np.unique of a data column goes straight in
    assert_same(decode(encode(h)), h)
    e = Error(ErrorCode.TOO_LARGE, "frame too big")
    assert type(e.code) is str and decode(encode(e)).code == "too_large"


def test_unknown_type_and_bad_version():
    body = _wire(HELLO)
    assert _code(_pack({**body, "t": "hack"})) == ErrorCode.UNKNOWN_TYPE
    assert _code(_pack({**body, "t": 7})) == ErrorCode.UNKNOWN_TYPE
    assert _code(_pack({**body, "v": PROTOCOL_VERSION + 1})) == ErrorCode.BAD_VERSION
    assert _code(_pack({**body, "v": PROTOCOL_VERSION - 1})) == ErrorCode.BAD_VERSION
    assert _code(_pack({**body, "v": True})) == ErrorCode.BAD_VERSION
    no_version = dict(body)
    del no_version["v"]
    assert _code(_pack(no_version)) == ErrorCode.BAD_VERSION


@pytest.mark.parametrize("change", [
    {"cores": True},  # bool is not int
    {"cores": 1.0},  # float is not int
    {"cores": "1"},
    {"cores": 1 << 63},  # a uint64 outside int64
    {"budget_bytes": -1},
    {"device_id": 5},
    {"device_id": ""},
    {"runtimes": "onnxruntime"},
    {"runtimes": [1]},
    {"labels": {"site": 1}},
    {"labels": [["a", "b"]]},
    {"resume_round": -2},
    {"rows": {"0": [3, 1]}},  # not sorted
    {"rows": {"0": [1, 1]}},  # not distinct
    {"rows": {"0": [-1, 2]}},  # a negative row
    {"rows": {"0": [1.0]}},
    {"rows": {"0": [True]}},
    {"rows": {"0": 1}},
    {"rows": {0: [1]}},
    {"rows": [["0", [1]]]},
])
def test_ill_typed_field_is_malformed(change):
    assert _code(_pack({**_wire(HELLO), **change})) == ErrorCode.MALFORMED


def test_missing_and_extra_fields_are_malformed():
    body = _wire(HELLO)
    missing = dict(body)
    del missing["labels"]  # even a field with a default must be on the wire
    assert _code(_pack(missing)) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "admin": True})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, b"cores": 1})) == ErrorCode.MALFORMED


def test_scalar_maps_and_floats():
    body = _wire(INSTRUCTION)
    assert decode(_pack({**body, "lr": 1})).lr == 1.0  # an int where a float is expected is fine
    assert _code(_pack({**body, "lr": True})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "lr": float("nan")})) == ErrorCode.NON_FINITE
    assert _code(_pack({**body, "deadline_s": float("inf")})) == ErrorCode.NON_FINITE
    assert _code(_pack({**body, "config": {"mu": float("-inf")}})) == ErrorCode.NON_FINITE
    assert _code(_pack({**body, "config": {"nested": {"a": 1}}})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "config": {"none": None}})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "config": {"b": b"bytes"}})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "lr": -0.5})) == ErrorCode.MALFORMED


@pytest.mark.parametrize("msg", [
    Welcome("d", "weak", 5, 4, [], "m", 0, 32, 1, {}),  # split > num_blocks
    Welcome("d", "weak", 2, 4, [(2, 1)], "m", 0, 32, 1, {}),  # empty chunk range
    Welcome("d", "weak", 2, 4, [(0, 9)], "m", 0, 32, 1, {}),  # chunk past the model
    Welcome("d", "weak", 2, 4, [], "m", 0, 0, 1, {}),  # batch size 0
    Fetch(0, ""),  # no payload id
    Fetch(-1, "c0"),
    Fetch(0, "c0", offset=-1),
    Instruction(-1, "train", 0, 0, [], "m", "tail", "", 1, 0.1, 1.0, {}),
    Instruction(0, "", 0, 0, [], "m", "tail", "", 1, 0.1, 1.0, {}),  # no phase
    Instruction(0, "train", -1, 0, [], "m", "tail", "", 1, 0.1, 1.0, {}),
    Instruction(0, "train", 0, -1, [], "m", "tail", "", 1, 0.1, 1.0, {}),
    Instruction(0, "train", 0, 0, [], "", "tail", "", 1, 0.1, 1.0, {}),  # no model payload
    Instruction(0, "train", 0, 0, [], "m", "columns", "", 1, 0.1, 1.0, {}),  # not a selection
    Instruction(0, "train", 0, 0, [], "m", "", "", 1, 0.1, 1.0, {}),
    Instruction(0, "train", 0, 0, [], "m", "tail", "", -1, 0.1, 1.0, {}),
    Instruction(0, "train", 0, 0, [], "m", "tail", "", 1, -0.1, 1.0, {}),
    Instruction(0, "train", 0, 0, [], "m", "tail", "", 1, 0.1, -1.0, {}),
    Instruction(0, "train", 0, 0, [], "m", "tail", "", 1, float("inf"), 1.0, {}),
    Instruction(0, "train", 0, 0, [1], "m", "tail", "", 1, 0.1, 1.0, {}),  # chunk ids are strings
    TransferBegin("t", "chunk", 10, "0" * 64, 4, 11, {}),  # offset past the end
    TransferBegin("t", "chunk", 10, "A" * 64, 4, 0, {}),  # not lowercase hex
    TransferBegin("t", "chunk", 10, "0" * 64, 0, 0, {}),  # frame size 0
    TransferBegin("t", "chunk", 10, "0" * 63, 4, 0, {}),  # neither empty nor 64 digits
    TransferEnd("t", ""),  # the end always carries the digest
    TransferEnd("", "0" * 64),
    TransferFrame("t", 0, b""),
    Report(0, "train", 1, (3, 2), "u", {}),  # a bad block range
    Report(0, "train", 1, (-1, 2), "u", {}),
    Report(0, "", 1, (0, 2), "u", {}),  # no phase
    Report(-1, "train", 1, (0, 2), "u", {}),
    Report(0, "train", -1, (0, 2), "u", {}),
    Report(0, "train", 1, (0, 2), "u", {"loss_before": float("nan")}),
    Report(0, "train", 1, (0, 1, 2), "u", {}),  # not a pair
    Ack(-1, True),
    Ack(0, True, "", 5),  # the phase is a string
    Hello("d", "", 0, 0, [], 0, rows={"0": [2, 1]}),
    Hello("d", "", 0, 0, [], 0, rows={"0": [-3]}),
    Hello("d", "", 0, 0, [], 0, rows={"0": [1 << 63]}),  # outside int64
    Error("", "no code"),
    Resume("t", -5),
])
def test_encode_refuses_invalid_messages(msg):
    with pytest.raises(ProtocolError):
        encode(msg)


def test_valid_edge_cases():
    for msg in (
        Report(0, "evaluate", 5, (0, 0), "", {"loss": 0.1, "accuracy": 0.9}),  # no tensors: no transfer
        Report(0, "compare", 5, (0, 0), "", {"sq_distance": 1.0, "dot": 0.0, "sq_norm": 1.0}),
        Instruction(0, "distill", 0, 0, [], "m", "channels", "b", 0, 0.0, 0.0, {"channels": 0.5}),  # open phases
        Hello("d", "", 0, 0, [], 0, rows={"0": [], "1": [0, (1 << 63) - 1]}),
        Ack(0, False, "round closed", ""),
    ):
        assert decode(encode(msg)) == msg


def test_invalid_message_from_a_peer_is_refused_by_decode():
    body = _wire(Fetch(1, "c0"))
    assert _code(_pack({**body, "payload_id": ""})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "kind": "chunk", "index": 0})) == ErrorCode.MALFORMED  # a version 2 fetch
    body = _wire(INSTRUCTION)
    assert _code(_pack({**body, "selection": "weights"})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "model_id": ""})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "t": "task"})) == ErrorCode.UNKNOWN_TYPE  # gone in version 3
    body = _wire(Report(0, "train", 1, (0, 2), "u", {}))
    assert _code(_pack({**body, "phase": ""})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "loss_before": 0.5})) == ErrorCode.MALFORMED  # a version 2 field
    assert _code(_pack({**_wire(Ack(0, True)), "phase": None})) == ErrorCode.MALFORMED
    no_phase = _wire(Ack(0, True))
    del no_phase["phase"]
    assert _code(_pack(no_phase)) == ErrorCode.MALFORMED
    body = _wire(Welcome("d", "weak", 2, 4, [(0, 2)], "m", 0, 32, 1, {}))
    assert _code(_pack({**body, "chunks": [[0, 2, 3]]})) == ErrorCode.MALFORMED
    assert _code(_pack({**body, "chunks": [[0, 9]]})) == ErrorCode.MALFORMED


def test_encode_refuses_non_messages_and_bad_unicode():
    with pytest.raises(ProtocolError):
        encode({"t": "hello"})  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as info:
        encode(Bye(reason="\ud800"))
    assert info.value.code == ErrorCode.MALFORMED


def test_limits_bound_strings_lists_and_messages():
    limits = Limits(max_str_len=16, max_items=3)
    assert _code(encode(dataclasses.replace(HELLO, device_id="x" * 17)), limits) == ErrorCode.TOO_LARGE
    assert _code(encode(dataclasses.replace(HELLO, runtimes=["a"] * 4)), limits) == ErrorCode.TOO_LARGE
    assert decode(encode(dataclasses.replace(HELLO, runtimes=["a"] * 3)), limits).runtimes == ["a"] * 3
    assert _code(encode(dataclasses.replace(HELLO, rows={"0": [1, 2, 3, 4]})), limits) == ErrorCode.TOO_LARGE
    assert _code(encode(dataclasses.replace(HELLO, rows={str(i): [] for i in range(4)})), limits) == ErrorCode.TOO_LARGE
    assert decode(encode(dataclasses.replace(HELLO, rows={"0": [1, 2, 3]})), limits).rows == {"0": [1, 2, 3]}
    small = Limits(max_frame_bytes=1024, max_message_bytes=1024 + 4 * 4096 + 256)
    frame = encode(TransferFrame("t", 0, b"x" * 2048))
    assert _code(frame, small) == ErrorCode.TOO_LARGE
    assert _code(b"\x80" * (small.max_message_bytes + 1), small) == ErrorCode.TOO_LARGE
    with pytest.raises(ValueError):
        Limits(max_frame_bytes=1 << 20, max_message_bytes=1 << 20)  # no room for the frame header
    with pytest.raises(ValueError):
        Limits(max_rank=0)


def test_frame_fast_path_matches_the_general_decoder():
    frame = TransferFrame("chunk-3", 1 << 20, bytes(range(256)) * 8)
    wire = encode(frame)
    fast = decode(wire)
    assert isinstance(fast.data, memoryview) and fast.data.readonly
    assert fast.data.obj is wire  # a view of the received message, not a copy
    general = decode(_pack(_wire(frame)))  # same map, written by plain msgpack (other int and bin widths)
    assert general == fast == frame
    long_id = TransferFrame("é" * 200, 0, b"abc")  # a str 16 header: the general path
    assert decode(encode(long_id)) == long_id
    # The fast path checks what the general one checks.
    assert _code(encode(TransferFrame("t", 0, b"abc"))[:-1]) == ErrorCode.MALFORMED
    assert _code(_pack({**_wire(frame), "offset": -1})) == ErrorCode.MALFORMED


def test_decode_accepts_bytes_like_inputs():
    wire = encode(HELLO)
    assert decode(bytearray(wire)) == HELLO
    assert decode(memoryview(wire)) == HELLO
    assert _code("not bytes") == ErrorCode.MALFORMED  # type: ignore[arg-type]


def test_importing_the_protocol_does_not_import_torch_or_onnx():
    code = ("import sys, edge_sdk.protocol, edge_sdk.transport; "
            "bad = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_protocol_error_codes_are_stable_and_picklable():
    import pickle

    assert {c.value for c in ErrorCode} >= {"malformed", "unknown_type", "bad_version", "too_large", "bad_dtype",
                                             "bad_shape", "non_finite", "out_of_order", "checksum", "unexpected",
                                             "unauthorized", "refused"}
    err = ProtocolError(ErrorCode.CHECKSUM, "boom", remote=True)
    assert err.code == "checksum" and err.message == "boom" and str(err) == "checksum: boom"
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.message, back.remote) == ("checksum", "boom", True)
