"""An app's own data trains on devices without torch, through every kind of source: arrays and a
batch generator handed over by an app's Python code, a folder of PNGs and a CSV and an .npz table
named on the device command line. Each device runs in the core-install virtual environment (plus
Pillow for the images), trains from ONNX training graphs, and the server folds every update."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.data import load_dataset, partition
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: An app that hands a device its data from Python: arrays, or a generator function of batches.
APP = """
import asyncio, sys
import numpy as np
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data.sources import BatchSource
from edge_sdk.logs import configure_logging, event_logger

server, device_id, kind, folder, budget = sys.argv[1:]
x, y = np.load(folder + "/x.npy"), np.load(folder + "/y.npy")

def batches():
    for i in range(0, len(x), 50):  # e.g. read from a sensor log, a database, the network
        yield x[i:i + 50], y[i:i + 50]

data = (x, y) if kind == "arrays" else (BatchSource(batches, spool_dir=folder + "/spool"),)
config = DeviceSettings(server=server, device_id=device_id, budget_bytes=int(budget), backend="onnxruntime")
configure_logging("json", stream=sys.stdout)
asyncio.run(DeviceClient(config, *data, on_event=event_logger()).run())
"""


def _write_sources(tmp: Path, shards: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, list[str]]:
    """Each device's data in its own form; returns each device's command (after the interpreter)."""
    from PIL import Image

    commands: dict[str, list[str]] = {}
    for name, (x, y) in zip(("arrays", "batches"), shards[:2]):
        folder = tmp / name
        folder.mkdir()
        np.save(folder / "x.npy", x)
        np.save(folder / "y.npy", y)
        commands[name] = ["-c", APP, "SERVER", f"app-{name}", name, str(folder), "BUDGET"]
    x, y = shards[2]
    for i, (sample, label) in enumerate(zip(x, y)):
        (tmp / "images" / f"digit-{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray((sample.reshape(8, 8) * 255).round().astype(np.uint8), mode="L").save(
            tmp / "images" / f"digit-{label}" / f"{i:04d}.png")
    # Subfolder names sort as the labels do (digit-0 ... digit-9): label k is class k.
    commands["images"] = ["--data", str(tmp / "images"), "--image-mode", "L", "--flatten"]
    x, y = shards[3]
    header = ",".join([f"p{i}" for i in range(64)] + ["digit"])
    (tmp / "table.csv").write_text(header + "\n" + "\n".join(
        ",".join(f"{v:.6g}" for v in (*xi, yi)) for xi, yi in zip(x, y)) + "\n")
    commands["csv"] = ["--data", str(tmp / "table.csv"), "--label-column", "digit"]
    x, y = shards[4]
    np.savez(tmp / "table.npz", x=x, y=y)
    commands["npz"] = ["--data", str(tmp / "table.npz")]
    for name in ("images", "csv", "npz"):
        commands[name] = ["-m", "edge_sdk", "--server", "SERVER", "--id", f"cli-{name}", "--budget", "BUDGET",
                          "--backend", "onnxruntime", "--json-events", "--once", *commands[name]]
    return commands


def test_own_data_from_every_source_trains_without_torch(tmp_path: Path, no_torch_pillow_python: str) -> None:
    digits = load_dataset("digits")
    parts = partition(digits.y, 5, "iid", seed=0)
    shards = [(digits.x[idx], digits.y[idx]) for idx in parts]
    commands = _write_sources(tmp_path, shards)
    budget = role_budgets("digits_mlp", backend="onnxruntime")["moderate"]
    config = ServerConfig(model="digits_mlp", rounds=3, min_devices=5, local_steps=10, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))

    async def run() -> tuple[list[dict], dict[str, tuple[int, str, str]]]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        procs = {}
        for name, argv in commands.items():
            argv = [url if a == "SERVER" else str(budget) if a == "BUDGET" else a for a in argv]
            procs[name] = await asyncio.create_subprocess_exec(
                no_torch_pillow_python, *argv, cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
        history = await asyncio.wait_for(server, timeout=300)
        outs = {}
        for name, proc in procs.items():
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
            outs[name] = (proc.returncode, out.decode(), err.decode())
        return history, outs

    history, outs = asyncio.run(run())
    assert [h["round"] for h in history] == [1, 2, 3]
    assert all(h["reported"] == 5 for h in history), history
    for name, (code, out, err) in outs.items():
        assert code == 0, (name, err[-2000:])
        done = [e for e in map(json.loads, filter(None, out.splitlines())) if e.get("event") == "round_done"]
        assert [e["round"] for e in done] == [1, 2, 3], (name, out[-2000:])
        assert all(e["backend"] == "onnxruntime" and e["torch_loaded"] is False for e in done), done[-1]
    with Store(tmp_path / "store") as store:
        folded = {(u["device_id"], u["round"]) for u in store.reports.all() if u["accepted"]}
    ids = ["app-arrays", "app-batches", "cli-images", "cli-csv", "cli-npz"]
    assert folded == {(d, r) for d in ids for r in (1, 2, 3)}
    assert history[-1]["accuracy"] > history[0]["accuracy"] or history[-1]["accuracy"] > 0.5, history
    assert any((tmp_path / "batches" / "spool").iterdir())  # the generator's samples went to disk


def test_torch_free_profile_measures_the_board(no_torch_python: str) -> None:
    """``edgetrain profile --measure`` on the core install: the ONNX Runtime figures, no torch."""
    import subprocess

    out = subprocess.run([no_torch_python, "-m", "edgetrain", "profile", "--measure"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "[runtime]" in lines
    keys = {line.split(" = ")[0] for line in lines if " = " in line}
    assert keys == {"python", "onnxruntime", "onnxruntime_training"}, out.stdout
    assert "Traceback" not in out.stderr and sys.executable not in out.stdout
