"""Bundles online: a device provisioned with a bundle joins a server and trains with the bundle's
chunks and training graph instead of downloading them (the server's transfer counters show no byte of
either), and downloads a chunk only once the server's copy changed. ``edgetrain bundle`` plans the
split the server would, and says which it chose and why."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.bundle import HeldPayloads
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset
from edge_sdk.models import build_model
from emulator.localfleet import role_budgets, start_orchestrator
from exporters.bundle import write_bundle
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.factories import EXACT_TRANSFERS
from tests.refused_graphs import graphs_refusing

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph_dir(request: pytest.FixtureRequest) -> Path:
    """Training graphs shared with the other tests that export them (exported once per machine)."""
    return Path(request.config.cache.mkdir("edgetrain-train-graphs"))


def _edgetrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_held_payloads_are_found_by_id_or_block_range_and_checked_by_content(tmp_path: Path) -> None:
    model = build_model("tiny", seed=0)
    manifest = write_bundle(model, 1, [(0, 1)], tmp_path / "b.tar", version=0)
    held = HeldPayloads.open(tmp_path / "b.tar")
    chunk = manifest.chunks[0]
    entry = held.find(chunk.id)
    assert entry is not None and (entry.kind, entry.size, entry.sha256) == ("chunk", chunk.size, chunk.sha256)
    assert held.find("chunk-of-a-later-version", (0, 1)) == entry  # the server's version moved: same range
    assert held.find("chunk-of-a-later-version") is None and held.find("x", (0, 2)) is None
    held.forget("chunk-of-a-later-version")  # asked: not found again until the server's bytes are confirmed
    assert held.find("chunk-of-a-later-version", (0, 1)) is None
    assert not held.confirm("chunk-of-a-later-version", entry, chunk.size, "0" * 64)
    assert held.find("chunk-of-a-later-version", (0, 1)) is None  # changed: downloaded from now on
    assert held.confirm(chunk.id, entry, chunk.size, chunk.sha256)
    assert held.read(entry) == held.bundle.chunk_bytes(0)


@pytest.mark.slow
def test_a_device_provisioned_from_a_bundle_trains_without_downloading_its_chunks(tmp_path: Path,
                                                                                    graph_dir: Path) -> None:
    """The bundle is planned for the device's budget and samples as the server plans it (split 2 of
    digits_mlp on ONNX Runtime). Round 1: the bundle device and a strong torch device train; the
    bundle device takes its chunk and training graph from the bundle (0 bytes sent of either). The
    strong device trains the frozen blocks too, so in round 2 the server's chunk has changed: the
    bundle device downloads that chunk, and still not the training graph. Both rounds' updates fold."""
    budget = role_budgets("digits_mlp", backend="onnxruntime")["moderate"]
    samples = len(load_shard("digits", client=0, num_clients=2)[0])
    out = _edgetrain("bundle", "--model", "digits_mlp", "--budget", str(budget), "--samples", str(samples),
                     "--backend", "onnxruntime", "--graph-dir", str(graph_dir), "--out", str(tmp_path / "b.tar"))
    assert out.returncode == 0, out.stderr
    assert "split 2/4, role moderate: the largest split" in out.stderr, out.stderr

    # A bundle holds its chunks as exported (float32): its device is served whole chunks, as a server
    # with the chunk codec off sends them (docs/device-guide.md, "A bundle").
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=5, lr=0.1,
                          store_dir=tmp_path / "store", train_graph_dir=graph_dir, deadline_s=120, **EXACT_TRANSFERS)
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
    assert [h["round"] for h in history] == [1, 2]
    sent = {(d["round"], d["kind"]): d["bytes"] for k, d in events if k == "sent" and d["device"] == "bundled"}
    assert sent[(1, "chunk")] == 0 and sent[(1, "train_graph")] == 0, sent
    assert sent[(2, "chunk")] > 0 and sent[(2, "train_graph")] == 0, sent  # only what changed
    assert sent[(1, "model")] > 0  # the trainable tail's current weights always come from the server
    device_events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    used = {(e["round"], e["kind"]) for e in device_events if e["event"] == "from_bundle"}
    assert used == {(1, "chunk"), (1, "train_graph"), (2, "train_graph")}, used
    with Store(tmp_path / "store") as store:
        folded = {(u["device_id"], u["round"]) for u in store.reports.all() if u["accepted"]}
    assert folded == {(d, r) for d in ("bundled", "strong") for r in (1, 2)}
    assert np.isfinite(history[-1]["test_loss"])


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
