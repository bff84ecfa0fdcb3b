"""Bundles online: a device provisioned with a bundle joins a server and trains with the bundle's
chunks and training graph instead of downloading them (the server's transfer counters show no byte of
either) from a server with the default (lossy) transfer settings, and downloads a chunk only once the
server's copy changed. ``edgetrain bundle`` plans the
split the server would, and says which it chose and why."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.bundle import HeldPayloads, load_bundle
from edge_sdk.codecs.delta import apply_delta
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset
from edge_sdk.models import build_model
from emulator.localfleet import role_budgets, start_orchestrator
from edge_sdk.wire_codecs import RECON_META, encode_payload
from exporters.bundle import served, write_bundle
from orchestrator.config import ServerConfig
from orchestrator.server.download_deltas import DeltaDownloads
from orchestrator.store import Store
from tests.refused_graphs import graphs_refusing

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph_dir(request: pytest.FixtureRequest) -> Path:
    """Training graphs shared with the other tests that export them (exported once per machine)."""
    return Path(request.config.cache.mkdir("edgetrain-train-graphs"))


def _edgetrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_held_payloads_are_found_by_id_or_block_range_and_used_under_the_servers_digest(tmp_path: Path) -> None:
    model = build_model("tiny", seed=0)
    manifest = write_bundle(model, 1, [(0, 1)], tmp_path / "b.tar", version=0)
    held = HeldPayloads.open(tmp_path / "b.tar")
    chunk = manifest.chunks[0]
    entry = held.find(chunk.id)
    assert entry is not None and (entry.kind, entry.size, entry.sha256) == ("chunk", chunk.size, chunk.sha256)
    assert held.find("chunk-of-a-later-version", (0, 1)) == entry  # the server's version moved: same range
    assert held.find("chunk-of-a-later-version") is None and held.find("x", (0, 2)) is None
    assert held.matches(entry, chunk.sha256) and entry.plain  # exact transfers: named by its own sha256
    assert not held.matches(entry, "0" * 64) and not held.matches(entry, "")
    assert held.read(entry) == held.bundle.chunk_bytes(0)


def test_a_held_chunk_is_kept_as_the_next_deltas_base_where_the_device_keeps_payloads(tmp_path: Path) -> None:
    """A bundle payload the server confirmed: kept in the device's store under its digest, in its slot
    (the base of the next round's delta download); with no store (payload-cache off), used all the same."""
    from edge_sdk import protocol as p
    from edge_sdk.downloads import Downloads
    from edge_sdk.payload_store import PayloadStore

    write_bundle(build_model("tiny", seed=0), 1, [(0, 1)], tmp_path / "b.tar", version=0)
    events: list[tuple[str, dict]] = []
    for store in (PayloadStore(tmp_path / "store", 1 << 20), None):
        downloads = Downloads("d", p.DEFAULT_LIMITS, lambda kind, data: events.append((kind, data)),
                              bundle=tmp_path / "b.tar", store=store)
        held = downloads.held.find("x", (0, 1))  # type: ignore[union-attr]
        assert held is not None and held.plain
        begin = p.TransferBegin("t", "chunk", held.size, held.served, 1 << 16, held.size, {})
        data = downloads._from_held(1, "x", begin, downloads.held.read(held), held, "1:chunk:0")  # type: ignore[union-attr]
        assert bytes(data) == downloads.held.bundle.chunk_bytes(0)  # type: ignore[union-attr]
        if store is not None:
            assert store.slot("1:chunk:0") == held.sha256 and store.get(held.sha256) == bytes(data)
    assert [k for k, _ in events] == ["from_bundle", "from_bundle"]


def test_a_bundle_holds_its_payloads_under_the_digests_the_default_server_names(tmp_path: Path) -> None:
    """Under the server's defaults a chunk travels as an int4 delta payload and the training graph
    through shuffle: the bundle holds the chunk as a device rebuilds it, and records the digests the
    server's payloads carry (computed here as the server computes them), so that they match."""
    model = build_model("digits_mlp", seed=0)
    defaults = {k: getattr(ServerConfig(model="digits_mlp"), k) for k in ("chunk_codec", "graph_codec", "download_delta")}
    assert defaults == {"chunk_codec": "shuffle", "graph_codec": "shuffle", "download_delta": "int4"}
    exact = write_bundle(model, 2, [(0, 1), (1, 2)], tmp_path / "exact.tar", version=0)
    lossy = write_bundle(model, 2, [(0, 1), (1, 2)], tmp_path / "b.tar", version=0, transfer=defaults)
    plain = load_bundle(tmp_path / "exact.tar")
    for i, chunk in enumerate(lossy.chunks):
        raw = plain.chunk_bytes(i)
        whole = DeltaDownloads(4, 2).whole(chunk.id, "chunk", raw, {})
        assert chunk.served_sha256 == whole.meta[RECON_META] == chunk.sha256 != exact.chunks[i].sha256
        rebuilt = apply_delta(whole.data, None)
        assert load_bundle(tmp_path / "b.tar").chunk_bytes(i) == rebuilt  # what a downloading device runs
    graph = b"\x08\x01" * 500
    assert served("train_graph", graph, defaults) == (graph, hashlib.sha256(encode_payload(graph, "shuffle",
                                                                                        "train_graph")).hexdigest())
    held = HeldPayloads.open(tmp_path / "b.tar")
    assert held.mismatch("chunk", {"codec": "delta", RECON_META: "x"}) is None  # the server it was written for
    message = held.mismatch("chunk", {"codec": "shuffle"})
    assert message is not None and "\n" not in message and "--download-delta" in message, message
    assert "delta int4" in message and held.mismatch("chunk", {"codec": "shuffle"}) is None  # said once
    exact_held = HeldPayloads.open(tmp_path / "exact.tar")
    assert "codec shuffle" in (exact_held.mismatch("train_graph", {"codec": "shuffle"}) or "")


def _bundled_run(tmp_path: Path, graph_dir: Path, rounds: int, *bundle_args: str) -> tuple[list[dict], list[tuple[str, dict]],
                                                                                    list[dict]]:
    """``edgetrain bundle`` (``bundle_args`` added) for a moderate ONNX Runtime device of digits_mlp, then
    a default server (``rounds``) with that device (a process started with the bundle) and a strong torch
    device: the server's history and events, and the bundle device's JSON events."""
    budget = role_budgets("digits_mlp", backend="onnxruntime")["moderate"]
    samples = len(load_shard("digits", client=0, num_clients=2)[0])
    out = _edgetrain("bundle", "--model", "digits_mlp", "--budget", str(budget), "--samples", str(samples),
                     "--backend", "onnxruntime", "--graph-dir", str(graph_dir), "--out", str(tmp_path / "b.tar"),
                     *bundle_args)
    assert out.returncode == 0, out.stderr
    assert "split 2/4, role moderate: the largest split" in out.stderr, out.stderr

    config = ServerConfig(model="digits_mlp", rounds=rounds, min_devices=2, local_steps=5, lr=0.1,
                          store_dir=tmp_path / "store", train_graph_dir=graph_dir, deadline_s=120)
    assert config.chunk_codec == "shuffle" and config.download_delta == "int4"  # the server's defaults
    digits = load_dataset("digits")
    events: list[tuple[str, dict]] = []

    async def run() -> tuple[list[dict], int, str, str]:
        orch, server = await start_orchestrator(config, lambda kind, data: events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edge_sdk", "--server", url, "--id", "bundled", "--budget", str(budget),
            "--backend", "onnxruntime", "--data", "digits", "--client", "0", "--num-clients", "2",
            "--bundle", str(tmp_path / "b.tar"), "--once", "--json-events", cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        strong = DeviceClient(DeviceSettings(url, "strong", 1 << 30, backend="torch"), digits.x[1::2], digits.y[1::2])
        await strong.run()
        history = await asyncio.wait_for(server, timeout=300)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
        return history, proc.returncode, stdout.decode(), stderr.decode()

    history, code, stdout, stderr = asyncio.run(run())
    assert code == 0, stderr[-2000:]
    assert [h["round"] for h in history] == list(range(1, rounds + 1))
    with Store(tmp_path / "store") as store:
        folded = {(u["device_id"], u["round"]) for u in store.reports.all() if u["accepted"]}
    assert folded == {(d, r) for d in ("bundled", "strong") for r in range(1, rounds + 1)}
    assert np.isfinite(history[-1]["test_loss"])
    return history, events, [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_device_provisioned_from_a_bundle_trains_without_downloading_its_chunks(
        tmp_path: Path, graph_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle is planned for the device's budget and samples as the server plans it (split 2 of
    digits_mlp on ONNX Runtime), and written for the server's default transfer settings, which the
    server runs (chunks as int4 deltas, the training graph through shuffle). Round 1: the bundle
    device and a strong torch device train; the bundle device takes its chunk and training graph
    from the bundle (0 bytes sent of either). The strong device trains the frozen blocks too, so in
    round 2 the server's chunk has changed: the bundle device downloads it as a delta from the
    bundle's copy, and still not the training graph. Both rounds' updates fold."""
    monkeypatch.setenv("EDGETRAIN_PAYLOAD_CACHE", str(tmp_path / "payloads"))
    _, events, device_events = _bundled_run(tmp_path, graph_dir, 2)
    sent = {(d["round"], d["kind"]): d["bytes"] for k, d in events if k == "sent" and d["device"] == "bundled"}
    assert sent[(1, "chunk")] == 0 and sent[(1, "train_graph")] == 0, sent
    assert sent[(2, "chunk")] > 0 and sent[(2, "train_graph")] == 0, sent  # only what changed
    assert sent[(1, "model")] > 0  # the trainable tail's current weights always come from the server
    used = {(e["round"], e["kind"]) for e in device_events if e["event"] == "from_bundle"}
    assert used == {(1, "chunk"), (1, "train_graph"), (2, "train_graph")}, used
    # The changed chunk came as a delta from the bundle's copy (the base the server sent nobody).
    assert any(e["event"] == "delta_applied" and e["round"] == 2 and e["kind"] == "chunk" and e["base"]
               for e in device_events), device_events
    assert not any(e["event"] == "bundle_mismatch" for e in device_events)


@pytest.mark.slow
def test_a_bundle_written_for_other_transfer_settings_is_downloaded_and_said_once(
        tmp_path: Path, graph_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle written for a server that sends everything exact, against the default server: the
    device downloads its chunk and training graph (the digests differ, so it never offers the
    bundle's bytes as the server's), trains, and says once per payload kind, in one line, why."""
    monkeypatch.setenv("EDGETRAIN_PAYLOAD_CACHE", str(tmp_path / "payloads"))
    _, events, device_events = _bundled_run(tmp_path, graph_dir, 1, "--chunk-codec", "none", "--graph-codec", "none",
                                            "--download-delta", "none")
    sent = {(d["round"], d["kind"]): d["bytes"] for k, d in events if k == "sent" and d["device"] == "bundled"}
    assert sent[(1, "chunk")] > 0 and sent[(1, "train_graph")] > 0, sent
    assert not any(e["event"] == "from_bundle" for e in device_events)
    told = [e for e in device_events if e["event"] == "bundle_mismatch"]
    assert sorted(e["kind"] for e in told) == ["chunk", "train_graph"], told
    for e in told:
        assert "\n" not in e["message"] and "b.tar" in e["message"] and "--download-delta" in e["message"], e


@pytest.mark.slow
def test_bundle_plans_the_next_split_when_a_training_graph_is_refused(tmp_path: Path, graph_dir: Path) -> None:
    """ResNet20 on a Pi Zero 2 W without torch: the whole model fits, but its training graph is refused
    (a refusal recorded in this test's graph folder, as a failed export check leaves one), so the
    bundle takes split 1, as the server would."""
    graphs = graphs_refusing(graph_dir, tmp_path / "graphs", "resnet20", 0)
    out = _edgetrain("bundle", "--model", "resnet20", "--device", "pi-zero-2w", "--backend", "onnxruntime",
                     "--graph-dir", str(graphs), "--out", str(tmp_path / "pi.tar"))
    assert out.returncode == 0, out.stderr
    assert "split 1/11" in out.stderr and "split 0: its training graph was refused" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_bundle_serves_only_its_own_model(tmp_path: Path) -> None:
    write_bundle(build_model("tiny", seed=0), 1, [(0, 1)], tmp_path / "b.tar", version=0)
    held = HeldPayloads.open(tmp_path / "b.tar")
    assert held.serves("tiny", 2) and held.serves("my_app.model:make_model", 2)
    assert not held.serves("digits_mlp", 2) and not held.serves("my_app.model:make_model", 4)
