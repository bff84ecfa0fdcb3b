"""Delta downloads: a chunk's or tail's weights sent as Q(current - held), rebuilt bit for bit as the server did."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.codecs import CodecError
from edge_sdk.codecs.delta import apply_delta, encode_delta, region_floats
from edge_sdk.data import load_dataset
from edge_sdk.wire_codecs import tensor_regions
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.config import ServerConfig


def _tail(rng: np.random.Generator, step: int) -> bytes:
    return p.encode_tensors({"w": rng.standard_normal((300, 40)).astype(np.float32),
                             "count": np.array(step, dtype=np.int64), "b": np.linspace(-1, 1, 100, dtype=np.float32),
                             "tiny": np.ones(3, np.float32)})


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_a_delta_rebuilds_the_servers_bytes_within_half_a_grid_step(bits: int) -> None:
    rng = np.random.default_rng(bits)
    first = _tail(rng, 1)
    regions = tensor_regions(first)
    assert regions[:, 1].tolist() == [12000, 100]  # float32 tensors of 64+ values; "tiny" and "count" stay exact
    whole, rebuilt = encode_delta(first, regions, None, bits)
    assert apply_delta(whole, None) == rebuilt and len(whole) < len(first) * bits / 32 + 4096
    after = p.decode_tensors(rebuilt)
    second_state = {k: (np.asarray(v) + np.float32(0.01) * rng.standard_normal(np.shape(v)).astype(np.float32)
                        if v.dtype == np.float32 and v.size >= 64 else np.asarray(v)) for k, v in
                    p.decode_tensors(first).items()}
    second_state["count"] = np.array(2, dtype=np.int64)
    second = p.encode_tensors(second_state)
    delta, rebuilt2 = encode_delta(second, regions, rebuilt, bits)
    assert apply_delta(delta, rebuilt) == rebuilt2  # the device gets the server's bytes, so their sha256
    out = p.decode_tensors(rebuilt2)
    assert int(out["count"]) == 2 and np.array_equal(out["tiny"], second_state["tiny"])
    # Each float errs by at most half its block's grid step of the *difference* (256 per block).
    diff = (second_state["w"] - after["w"]).reshape(-1)
    blocks = np.pad(diff, (0, -diff.size % 256), mode="edge").reshape(-1, 256)
    half_step = ((blocks.max(1) - blocks.min(1)) / (2 * (2 ** bits - 1))).repeat(256)[:diff.size]
    err = np.abs(out["w"].reshape(-1) - second_state["w"].reshape(-1))
    assert (err <= half_step * 1.001 + 1e-7).all()
    # The delta also corrects the first payload's error: no error carries over from round to round.
    whole_err = np.abs(after["w"] - p.decode_tensors(first)["w"]).max()
    assert err.max() < whole_err / (5 if bits > 2 else 2)


def test_a_delta_refuses_a_base_of_another_size_and_a_damaged_payload() -> None:
    rng = np.random.default_rng(0)
    data = _tail(rng, 1)
    regions = tensor_regions(data)
    delta, rebuilt = encode_delta(data, regions, data, 4)
    with pytest.raises(CodecError):
        apply_delta(delta, rebuilt[:-64])
    with pytest.raises(CodecError):
        apply_delta(delta[: len(delta) // 2], rebuilt)
    with pytest.raises(ValueError):
        encode_delta(data, regions, None, 3)


def test_a_chunks_weights_are_found_in_its_onnx_bytes_and_the_rebuilt_chunk_runs_within_the_error() -> None:
    """The regions are the initializers' raw data (writing them back gives ONNX Runtime a chunk that
    loads), and the rebuilt chunk's outputs differ from the exact one's by what 8-bit weights cost."""
    import onnxruntime as ort
    import torch

    from edge_sdk.models import build_model
    from exporters.onnx_export import export_chunk
    from exporters.weights import onnx_regions

    torch.manual_seed(0)
    model = build_model("digits_mlp")
    data = export_chunk(model, 0, 2)
    regions = onnx_regions(data)
    assert len(regions) >= 2 and regions[:, 1].sum() * 4 > 0.95 * len(data)  # nearly every byte is a weight
    _, rebuilt = encode_delta(data, regions, None, 8)
    assert len(rebuilt) == len(data) and rebuilt != data
    floats = region_floats(rebuilt, regions)
    exact = region_floats(data, regions)
    assert np.abs(floats - exact).max() < np.abs(exact).max() / 200
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    outs = [ort.InferenceSession(b, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0] for b in (data, rebuilt)]
    assert np.abs(outs[0] - outs[1]).max() < 0.05 * np.abs(outs[0]).max()


@pytest.mark.slow
def test_devices_download_deltas_from_the_version_they_hold(tmp_path: Path) -> None:
    """A strong and a weak digits_mlp device, 3 rounds, 4-bit delta downloads: round 1 sends every
    chunk and tail whole, later rounds a delta from the round before's reconstruction (the device's
    Fetch.held), each an eighth of the float32 bytes; a device without a store is sent whole payloads."""
    budgets = role_budgets("digits_mlp")
    config = ServerConfig(model="digits_mlp", rounds=3, min_devices=3, local_steps=2, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120, download_delta="int4")
    digits = load_dataset("digits")
    server_events: list[tuple[str, dict]] = []
    device_events: list[tuple[str, dict]] = []

    async def run() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: server_events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [DeviceClient(DeviceSettings(url, name, int(budgets[role] * 1.01) + (4 << 20), backend="torch",
                                             payload_cache=tmp_path / name if name != "bare" else None),
                                digits.x[i::3], digits.y[i::3], on_event=lambda k, d: device_events.append((k, d)))
                   for i, (name, role) in enumerate((("strong", "strong"), ("weak", "weak"), ("bare", "weak")))]
        await asyncio.gather(*(d.run() for d in devices))
        return await asyncio.wait_for(server, timeout=300)

    history = asyncio.run(run())
    assert [h["round"] for h in history] == [1, 2, 3]
    applied = [(d["device"], d["round"], d["kind"], d["base"]) for k, d in device_events if k == "delta_applied"]
    for device in ("strong", "weak"):
        mine = [a for a in applied if a[0] == device]
        assert {a[3] for a in mine if a[1] == 1} == {False} and {a[3] for a in mine if a[1] > 1} == {True}, mine
    assert {a[3] for a in applied if a[0] == "bare"} == {False}
    for device in ("strong", "weak", "bare"):
        for h in history:
            down = h["bytes"][device]["down"]
            rebuilt = sum(d["rebuilt"] for k, d in device_events if k == "delta_applied" and d["device"] == device
                          and d["round"] == h["round"])
            assert 0 < down.get("model", 0) + down.get("chunk", 0) < rebuilt / 7.5  # 4 bits of 32, plus scales
    assert all(h["accuracy"] is None or h["accuracy"] > 0.1 for h in history)


def test_the_conformance_vectors_still_encode_and_rebuild_the_same_bytes() -> None:
    """tests/vectors/delta.json (tests/vectors/make_delta_vectors.py), which the JavaScript device checks too."""
    import base64
    import hashlib
    import json

    cases = json.loads((Path(__file__).parent / "vectors" / "delta.json").read_text())["cases"]
    assert {(c["payload"], c["bits"], c["base"] is None) for c in cases} == {
        (k, b, w) for k in ("tensors", "bytes") for b in (8, 4, 2) for w in (True, False)}
    for c in cases:
        base = None if c["base"] is None else base64.b64decode(c["base"])
        payload, rebuilt = encode_delta(base64.b64decode(c["current"]), np.array(c["regions"]), base, c["bits"])
        assert payload == base64.b64decode(c["delta"]), (c["payload"], c["bits"])
        assert hashlib.sha256(apply_delta(payload, base)).hexdigest() == hashlib.sha256(rebuilt).hexdigest() \
            == c["rebuilt_sha256"]


@pytest.mark.slow
def test_a_chunk_nobody_changed_costs_no_byte_and_the_tail_comes_as_a_delta(tmp_path: Path) -> None:
    """Two weak devices (nobody trains the frozen blocks): in round 2 each holds the chunk's rebuilt
    bytes under the digest its instruction names and is sent none of them; the tail is a delta."""
    budget = int(role_budgets("digits_mlp")["weak"] * 1.01) + (4 << 20)
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=2, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120, download_delta="int8")
    digits = load_dataset("digits")
    server_events: list[tuple[str, dict]] = []
    device_events: list[tuple[str, dict]] = []

    async def run() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: server_events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [DeviceClient(DeviceSettings(url, name, budget, backend="torch", payload_cache=tmp_path / name),
                                digits.x[i::2], digits.y[i::2], on_event=lambda k, d: device_events.append((k, d)))
                   for i, name in enumerate(("a", "b"))]
        await asyncio.gather(*(d.run() for d in devices))
        return await asyncio.wait_for(server, timeout=300)

    history = asyncio.run(run())
    sent = {(d["device"], d["round"], d["kind"]): d["bytes"] for k, d in server_events if k == "sent"}
    for device in ("a", "b"):
        assert sent[(device, 1, "chunk")] > 0 and sent[(device, 2, "chunk")] == 0, sent
        assert 0 < sent[(device, 2, "model")] < sent[(device, 1, "model")] * 1.01
        used = {(d["round"], d["kind"]) for k, d in device_events if k == "from_store" and d["device"] == device}
        assert used == {(2, "chunk")}, used
        bases = {(d["round"], d["kind"], d["base"]) for k, d in device_events if k == "delta_applied" and d["device"] == device}
        assert (2, "model", True) in bases and (1, "chunk", False) in bases, bases
    assert history[1]["bytes"]["a"]["held"]["chunk"] > 0
