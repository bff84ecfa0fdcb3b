"""A strategy of the test suite's own (tests/two_phase_strategy.py) drives real rounds: real device
processes (``python -m edge_sdk``) over websockets on 127.0.0.1, a recommender with embedding tables.

One round uses two phases whose reports decide who trains (evaluate, then train), per-device row
selections (each device downloads only its rows and returns row-sparse deltas), and a follow-up
instruction carrying a broadcast tensor (compare).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.data import load_dataset, partition
from edge_sdk.models import build_model
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator
from tests.factories import EXACT_TRANSFERS
from tests.two_phase_strategy import HEAD, TwoPhaseRows

ROOT = Path(__file__).resolve().parents[1]
DEVICES = 4
ROUNDS = 2
TABLES = ("blocks.embeddings.user.weight", "blocks.embeddings.item.weight")


async def _run(tmp_path: Path) -> tuple[Orchestrator, TwoPhaseRows, list[tuple[str, dict]], list[dict], dict]:
    config = ServerConfig(model="recommender", rounds=ROUNDS, min_devices=DEVICES, local_steps=5, batch_size=8,
                          lr=0.05, store_dir=tmp_path / "store", eval_data="synthetic_ratings", deadline_s=120,
                          **EXACT_TRANSFERS)  # the rows' bytes are counted as float32
    strategy = TwoPhaseRows()
    events: list[tuple[str, dict]] = []
    orch = Orchestrator(config, strategy=strategy, on_event=lambda kind, data: events.append((kind, data)))
    initial = {k: v.copy() for k, v in orch.global_state.items()}
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{orch.port}", "--id", f"dev-{i}",
            "--budget", "4GiB", "--data", "synthetic_ratings", "--client", str(i), "--num-clients", str(DEVICES),
            "--json-events", "--once", cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for i in range(DEVICES)
    ]
    history = await asyncio.wait_for(server, timeout=240)
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-2000:]
    device_events = [json.loads(line) for out, _ in outs for line in out.decode().splitlines() if line.startswith("{")]
    return orch, strategy, events, device_events, {"initial": initial, "history": history}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return asyncio.run(_run(tmp_path_factory.mktemp("two-phase")))


def _rows_of(client: int) -> dict[str, np.ndarray]:
    data = load_dataset("synthetic_ratings", split="train")
    idx = partition(data.y, DEVICES, "iid", seed=0)[client]
    x = data.x[idx]
    return {TABLES[0]: np.unique(x[:, 0]), TABLES[1]: np.unique(x[:, 1])}


def test_every_round_completes_with_the_strategys_phases(run):
    orch, strategy, events, device_events, extra = run
    history = extra["history"]
    assert [h["round"] for h in history] == list(range(1, ROUNDS + 1))
    for r in range(1, ROUNDS + 1):
        phases = [(d["device"], d["phase"]) for k, d in events if k == "update" and d["round"] == r]
        evaluated = {d for d, ph in phases if ph == "evaluate"}
        trained = {d for d, ph in phases if ph == "train"}
        compared = {d for d, ph in phases if ph == "compare"}
        assert evaluated == {f"dev-{i}" for i in range(DEVICES)}
        # Who trains was decided by the evaluate phase's losses: those at or above the median.
        round_losses = history[r - 1]["losses"]
        median = float(np.median(list(round_losses.values())))
        assert trained == {d for d, loss in round_losses.items() if loss >= median}
        assert 0 < len(trained) < DEVICES
        assert compared == trained
        # Every device evaluated before training: phase order per device.
        order = [(d, ph) for d, ph in phases]
        for d in trained:
            assert order.index((d, "evaluate")) < order.index((d, "train")) < order.index((d, "compare"))


def test_each_device_downloads_only_its_rows(run):
    orch, _, events, _, _ = run
    model = build_model("recommender")
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    table_bytes = sum(state[t].nbytes for t in TABLES)
    dense_bytes = sum(v.nbytes for k, v in state.items() if k not in TABLES)
    row_bytes = state[TABLES[0]].shape[1] * 4
    sent = [d for k, d in events if k == "sent" and d["kind"] == "model"]
    # A payload a device already holds (the evaluate phase's model, asked for again to train) is not sent again.
    assert all(d["bytes"] == 0 for d in sent if d.get("held"))
    sent = [d for d in sent if not d.get("held")]
    assert sent, "no model payloads were sent"
    for d in sent:
        rows = _rows_of(int(d["device"].split("-")[1]))
        n_rows = sum(len(r) for r in rows.values())
        # The payload holds the dense blocks, the rows (values and an int64 index each) and headers:
        # it grows with the rows, never with the tables (which are 40x larger here).
        assert d["bytes"] <= dense_bytes + n_rows * (row_bytes + 8) + 8 * 1024, d
        assert d["bytes"] >= dense_bytes + n_rows * row_bytes, d
        assert d["bytes"] < table_bytes / 20


def test_row_sparse_updates_touch_only_the_trainers_rows(run):
    orch, strategy, events, _, extra = run
    initial, final = extra["initial"], orch.global_state
    history = extra["history"]
    touched = {t: set() for t in TABLES}
    for h in history:
        for d in h["trainers"]:
            for t, rows in _rows_of(int(d.split("-")[1])).items():
                touched[t] |= set(rows.tolist())
    for t in TABLES:
        changed = set(np.flatnonzero(np.any(final[t] != initial[t], axis=1)).tolist())
        assert changed and changed <= touched[t]
        untouched = np.setdiff1d(np.arange(final[t].shape[0]), sorted(touched[t]))
        assert final[t][untouched].tobytes() == initial[t][untouched].tobytes()  # bit for bit


def test_the_broadcast_reached_the_devices_that_compared(run):
    _, strategy, _, _, _ = run
    b = strategy.broadcast
    assert b is not None and set(b.tensors) == set(HEAD)
    b_sq = sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in b.tensors.values())
    assert b_sq > 0
    assert set(strategy.compared) == set(strategy.trainers)
    for device, m in strategy.compared.items():
        # ||d - b||^2 = ||d||^2 - 2<d, b> + ||b||^2: the device measured against the broadcast it got.
        assert m["sq_distance"] == pytest.approx(m["sq_norm"] - 2 * m["dot"] + b_sq, rel=1e-6, abs=1e-9)
        assert m["sq_norm"] > 0
