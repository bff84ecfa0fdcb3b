"""Codecs on the wire (edge_sdk.wire_codecs): the server sends chunks, tails and training graphs
through the codec its settings name per payload kind, devices send updates through the update
codec their instruction names (with error feedback where the codec is biased), and the intake
decodes them; a bad encoded update is refused with an error frame."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.codecs import CODECS
from edge_sdk.data import load_dataset
from edge_sdk.downloads import DeviceRefused
from edge_sdk.wire_codecs import UpdateEncoder, decode_payload, decode_state, encode_payload, encode_state
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.config import ServerConfig
from tests.factories import EXACT_TRANSFERS

#: Every codec of the registry an update may travel through besides none (the parametrized runs add it).
UPDATE_CODECS = tuple(name for name in CODECS if name != "none")


def test_states_and_byte_payloads_round_trip_and_a_bad_record_is_a_protocol_error() -> None:
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal((64, 33)).astype(np.float32), "steps": np.array(7, dtype=np.int64)}
    for name in ("none", *UPDATE_CODECS):
        back = decode_state(encode_state(state, name))
        assert back["steps"].shape == () and int(back["steps"]) == 7
        err = np.abs(back["w"] - state["w"]).max()
        assert err == 0 if CODECS[name].lossless else 0 < err < 4 * np.abs(state["w"]).max(), (name, err)
    raw = p.encode_tensors(state)
    assert decode_payload(encode_payload(raw, "shuffle", "model"), "shuffle", "model") == raw
    assert decode_payload(encode_payload(b"onnx" * 999, "zlib", "chunk"), "zlib", "chunk") == b"onnx" * 999
    bad = p.encode_tensors({"w": np.frombuffer(b"EC\x01\x09" + bytes(40), dtype=np.uint8)})
    with pytest.raises(p.ProtocolError) as e:
        decode_state(bad)
    assert e.value.code == "malformed"
    nan = encode_state({"w": np.array([np.nan, 1.0], dtype=np.float32)}, "none")
    with pytest.raises(p.ProtocolError) as e:
        decode_state(nan)
    assert e.value.code == "non_finite"


def test_error_feedback_keeps_what_a_biased_codec_leaves_out() -> None:
    """EF-SGD (Karimireddy et al. 2019, Algorithm 2): over rounds, the sum of what was sent tracks
    the sum of the true deltas within one round's quantization error."""
    rng = np.random.default_rng(1)
    enc, sent, true = UpdateEncoder(), 0.0, 0.0
    config = {"update_codec": "int8", "update_feedback": True}
    for _ in range(20):
        delta = (rng.standard_normal(4096) * 1e-3).astype(np.float32)
        true = true + delta
        sent = sent + decode_state(enc.encode({"w": delta}, config))["w"]
    plain = decode_state(UpdateEncoder().encode({"w": delta}, {"update_codec": "int8"}))["w"]
    assert np.abs(sent - true).max() <= 2 * np.abs(plain - delta).max()


def _run(tmp_path: Path, config: ServerConfig, *, tamper: str = "",
         budgets: tuple[int, int] = (1 << 30, 1 << 30)) -> tuple[list[dict], list[tuple[str, dict]], list]:
    digits = load_dataset("digits")
    events: list[tuple[str, dict]] = []

    async def run() -> tuple[list[dict], list]:
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [DeviceClient(DeviceSettings(url, name, budgets[i], backend="torch", reconnect=False),
                                digits.x[i::2], digits.y[i::2]) for i, name in enumerate(("a", "b"))]
        if tamper:
            good = devices[1].work.updates.encode
            devices[1].work.updates.encode = lambda tensors, cfg: tamper_update(good(tensors, cfg), tamper)
        outcomes = await asyncio.gather(*(d.run() for d in devices), return_exceptions=True)
        return await asyncio.wait_for(server, timeout=300), outcomes

    history, outcomes = asyncio.run(run())
    return history, events, outcomes


def tamper_update(payload: bytes, how: str) -> bytes:
    """A device's encoded update spoiled: a record cut short, or a NaN encoded in float16."""
    tensors = p.decode_tensors(payload)
    name = next(iter(tensors))
    record = np.asarray(tensors[name])
    if how == "cut":
        tensors[name] = record[: len(record) // 2]
    else:  # a float16 record whose last value is +inf (0x7C00): the encoder itself refuses to write one
        spoiled = bytearray(CODECS["float16"].encode(np.ones(4, np.float32)))
        spoiled[-2:] = b"\x00\x7c"
        tensors[name] = np.frombuffer(bytes(spoiled), dtype=np.uint8)
    return p.encode_tensors(tensors)


@pytest.mark.slow
@pytest.mark.parametrize("update_codec", UPDATE_CODECS)
def test_each_update_codec_round_trips_in_a_real_run(tmp_path: Path, update_codec: str) -> None:
    """One round of two digits_mlp devices: both updates travel through the codec, the intake
    decodes and folds them; a lossy codec's bytes up are those of its bits per coordinate."""
    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=2, local_steps=2, lr=0.1,  # float32 downloads:
                          store_dir=tmp_path / "store", deadline_s=120,  # the model's bytes count its floats
                          **{**EXACT_TRANSFERS, "update_codec": update_codec})
    history, events, outcomes = _run(tmp_path, config)
    assert all(not isinstance(o, BaseException) for o in outcomes), outcomes
    assert history[0]["reported"] == 2 and history[0]["rejected"] == 0 and np.isfinite(history[0]["test_loss"])
    up = [history[0]["bytes"][d]["up"]["update"] for d in ("a", "b")]
    floats = history[0]["bytes"]["a"]["down"]["model"] / 4  # the float32 tail the update is a delta of
    bits = None if CODECS[update_codec].lossless else CODECS[update_codec].bits  # type: ignore[attr-defined]
    if bits is not None:  # the codec's bits a coordinate, plus the grid's block scales (64 bits a 256-block)
        assert all(u <= floats * (bits + 0.25) / 8 * 1.05 + 8192 for u in up), (up, floats)


@pytest.mark.slow
@pytest.mark.parametrize("chunk_codec,tail_codec", [("zlib", "float16"), ("shuffle", "int8"), ("none", "shuffle")])
def test_downloads_travel_through_the_codec_of_their_kind(tmp_path: Path, chunk_codec: str, tail_codec: str) -> None:
    """The server sends a moderate device's chunk and both devices' tails encoded; the devices decode
    and train on them: the lossy tails are smaller than float32, and the run learns."""
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=3, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120, chunk_codec=chunk_codec, tail_codec=tail_codec,
                          update_codec="sr8", download_delta="none")  # whole tails: their codec shows
    budgets = (role_budgets("digits_mlp")["moderate"], 1 << 30)
    plain = _run(tmp_path, replace(config, store_dir=tmp_path / "plain", chunk_codec="none", tail_codec="none",
                                   update_codec="none"), budgets=budgets)[0]
    history, events, outcomes = _run(tmp_path, config, budgets=budgets)
    assert all(not isinstance(o, BaseException) for o in outcomes), outcomes
    assert [h["reported"] for h in history] == [2, 2]
    tails = [h["bytes"][d]["down"]["model"] for h in history for d in ("a", "b")]
    plain_tails = [h["bytes"][d]["down"]["model"] for h in plain for d in ("a", "b")]
    ratio = {"float16": 0.55, "int8": 0.3, "shuffle": 1.0}[tail_codec]
    assert all(t <= ratio * pt for t, pt in zip(tails, plain_tails)), (tails, plain_tails)
    assert history[-1]["test_loss"] < history[0]["loss_before"]
    chunks = {h["round"]: h["bytes"]["a"]["down"]["chunk"] for h in history}
    plain_chunks = {h["round"]: h["bytes"]["a"]["down"]["chunk"] for h in plain}
    assert chunks[1] > 0 and (chunks[1] == plain_chunks[1]) == (chunk_codec == "none"), (chunks, plain_chunks)


@pytest.mark.slow
@pytest.mark.parametrize("how,code", [("cut", "malformed"), ("inf", "malformed")])  # the record decoder refuses inf
def test_a_bad_encoded_update_is_refused_with_an_error_frame(tmp_path: Path, how: str, code: str) -> None:
    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=2, local_steps=2, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=60, update_codec="float16")
    history, events, outcomes = _run(tmp_path, config, tamper=how)
    assert not isinstance(outcomes[0], BaseException)
    assert isinstance(outcomes[1], DeviceRefused) and str(outcomes[1]).startswith(code), outcomes[1]
    assert history[0]["reported"] == 1  # the other device's update folded; the server went on
