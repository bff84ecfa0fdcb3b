"""A real orchestrator and real device processes on 127.0.0.1 train together (issue: end to end)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.client import device_seed
from edge_sdk.data import load_dataset, partition
from edge_sdk.forward import ActivationCache, ChunkRunner
from edge_sdk.models import build_model
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, train_tail
from emulator.launch import DeviceLaunch, Faults, device_argv
from emulator.localfleet import device_env, role_budgets, run_local_fleet
from exporters.onnx_export import export_chunk
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.factories import EXACT_TRANSFERS, server_config

pytestmark = pytest.mark.slow


def _fleet(model: str, roles: list[str], *, partition_scheme: str = "iid", faults: dict[str, Faults] | None = None):
    budgets = role_budgets(model)
    n = len(roles)
    return [
        DeviceLaunch(f"{role}-{i}", budgets[role], client=i, num_clients=n, partition=partition_scheme,
                     faults=(faults or {}).get(f"{role}-{i}", Faults()))
        for i, role in enumerate(roles)
    ]


def test_mixed_fleet_learns_and_weak_devices_train_only_their_tail(tmp_path: Path) -> None:
    config = ServerConfig(model="digits_mlp", rounds=6, min_devices=4, local_steps=10, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120,
                          # every device in every round, however loaded the machine: the straggler grace
                          # (wall time) is tests/test_lifecycle.py's, and a cut device misses an update here
                          straggler_policy="deadline")
    launches = _fleet("digits_mlp", ["strong", "moderate", "weak", "weak"])
    run = asyncio.run(run_local_fleet(config, launches))
    assert [r["round"] for r in run.history] == list(range(1, 7))
    # Ten classes: chance is 0.1.
    assert run.history[-1]["accuracy"] > 0.6, run.history[-1]
    assert run.history[-1]["accuracy"] > run.history[0]["accuracy"] or run.history[0]["accuracy"] > 0.6

    names = build_model("digits_mlp", seed=None).block_names
    store = Store(tmp_path / "store")
    updates = store.reports.all()
    devices = {d["device_id"]: d for d in store.devices.all()}
    for launch in launches:
        plan = devices[launch.device_id]["plan"]
        expected_role = launch.device_id.split("-")[0]
        assert plan["role"] == expected_role, (launch.device_id, plan)
        mine = [u for u in updates if u["device_id"] == launch.device_id]
        assert len(mine) == 6 and all(u["accepted"] for u in mine)
        assert all(tuple(u["trained"]) == (plan["split"], len(names)) for u in mine)
        events = run.device_events[launch.device_id]
        welcome = next(e for e in events if e["event"] == "welcome")
        if expected_role == "weak":
            # A weak device streamed its frozen chunks every round and trained only the last block(s).
            assert plan["split"] >= len(names) - 2 and welcome["chunks"], welcome
            assert all(e["download_s"] > 0 and e["forward_s"] > 0 for e in events if e["event"] == "round_done")
        if expected_role == "strong":
            assert plan["split"] == 0 and welcome["chunks"] == []
    store.close()


def _replay_device(model_name: str, state: dict[str, np.ndarray], split: int, launch: DeviceLaunch,
                   round_seed: int, config: ServerConfig) -> tuple[dict[str, np.ndarray], int]:
    """Recompute one device's round outside the system: the same data, chunks, seed and trainer."""
    data = load_dataset(launch.data, split="train")
    idx = partition(data.y, launch.num_clients, launch.partition, seed=launch.seed)[launch.client]
    x, y = data.x[idx], data.y[idx]
    full = build_model(model_name, seed=None)
    full.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    cache = ActivationCache.from_array(x)
    if split > 0:
        runner = ChunkRunner(export_chunk(full, 0, split))
        cache = cache.apply(runner, batch_size=64, storage="memory")
    tail = build_tail(model_name, split)
    load_tail_state(tail, split, {n: state[n] for n in full.state_names(split)})
    cfg = TrainConfig(local_steps=config.local_steps, batch_size=config.batch_size, lr=config.lr,
                      momentum=config.momentum, weight_decay=config.weight_decay,
                      seed=device_seed(round_seed, launch.device_id))
    result = train_tail(tail, split, np.asarray(cache.array), y, cfg)
    return result.deltas, result.num_samples


def test_partial_average_matches_a_hand_computed_one(tmp_path: Path) -> None:
    """One round of a tiny model: the new global weights are the EmbracingFL partial average.

    Input-side entries (block fc1) average over the strong devices only, output-side entries
    (block head) over every device, each weighted by its sample count (section 3.1 update rules).
    """
    # The paper's rule exactly: no norm bound, weight cap or validation before commit (docs/security.md).
    config = server_config(tmp_path / "store", min_devices=3, local_steps=3, lr=0.1, norm_bound=0, max_loss_rise=0,
                           strategy_options={"max_weight_share": 1.0})
    # The tiny model fits anywhere; the weak device asks for split 1 (it trains only the head).
    launches = [
        DeviceLaunch(f"{role}-{i}", 512 << 20, client=i, num_clients=3, data="synthetic",
                     faults=Faults(force_split=1 if role == "weak" else None))
        for i, role in enumerate(["strong", "strong", "weak"])
    ]
    initial = {k: v.detach().numpy().copy() for k, v in build_model("tiny", seed=0).state_dict().items()}
    run = asyncio.run(run_local_fleet(config, launches))
    assert run.history[0]["reported"] == 3
    store = Store(tmp_path / "store")
    done, final = store.checkpoints.last()
    splits = {d["device_id"]: d["plan"]["split"] for d in store.devices.all()}
    store.close()
    assert done == 1 and splits == {"strong-0": 0, "strong-1": 0, "weak-2": 1}

    round_seed = config.seed * 100_003 + 1
    replays = {l.device_id: _replay_device("tiny", initial, splits[l.device_id], l, round_seed, config) for l in launches}
    for name, old in initial.items():
        block = name.split(".")[1]
        contributors = ["strong-0", "strong-1"] if block == "fc1" else ["strong-0", "strong-1", "weak-2"]
        weights = np.array([replays[d][1] for d in contributors], dtype=np.float64)
        deltas = np.stack([replays[d][0][name] for d in contributors]).astype(np.float64)
        expected = old + np.tensordot(weights / weights.sum(), deltas, axes=1)
        np.testing.assert_allclose(final[name], expected, rtol=0, atol=2e-6, err_msg=name)
        assert not np.allclose(final[name], old)


def test_device_killed_mid_round_does_not_stall_the_round(tmp_path: Path) -> None:
    deadline = 90.0
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=3, local_steps=5, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=deadline)
    launches = _fleet("digits_mlp", ["strong", "weak", "weak"], faults={"weak-2": Faults(drop_rounds=(1,))})
    run = asyncio.run(run_local_fleet(config, launches))
    first = run.history[0]
    assert first["reported"] == 2 and first["stragglers"] == ["weak-2"]
    # The round closed when the device vanished, not at the deadline.
    assert first["round_wall_s"] < deadline / 3
    assert run.returncodes["weak-2"] == 75
    assert [r["round"] for r in run.history] == [1, 2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, store: Path, rounds: int, *, resume: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "edgetrain", "serve", "--model", "digits_mlp", "--rounds", str(rounds),
            "--min-devices", "2", "--local-steps", "5", "--port", str(port), "--store", str(store), "--json-events"]
    return subprocess.Popen(argv + (["--resume"] if resume else []), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=device_env(), text=True)


def test_killed_server_resumes_from_its_journal(tmp_path: Path) -> None:
    port, store_dir = _free_port(), tmp_path / "store"
    budgets = role_budgets("digits_mlp")
    server = _serve(port, store_dir, rounds=5, resume=False)
    devices = [
        subprocess.Popen(device_argv(DeviceLaunch(f"d{i}", budgets["strong" if i == 0 else "weak"], client=i, num_clients=2),
                                     f"ws://127.0.0.1:{port}"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=device_env())
        for i in range(2)
    ]
    try:
        # Kill the server (SIGKILL: no clean shutdown) once round 2 is in its journal.
        deadline = time.monotonic() + 120
        for line in server.stdout:
            event = json.loads(line)
            if event.get("event") == "round_end" and event["round"] == 2:
                break
            assert time.monotonic() < deadline
        server.send_signal(signal.SIGKILL)
        server.wait()
        store = Store(store_dir)
        done, state2 = store.checkpoints.last()
        store.close()
        assert done >= 2

        restarted = _serve(port, store_dir, rounds=5, resume=True)
        out, _ = restarted.communicate(timeout=180)
        assert restarted.returncode == 0
        events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        started = [e["round"] for e in events if e.get("event") == "round_start"]
        assert started[0] == done + 1 and started[-1] == 5
        store = Store(store_dir)
        rounds = [r["round"] for r in store.rounds.all() if r["complete"]]
        store.close()
        assert rounds == [1, 2, 3, 4, 5]
        for d in devices:
            assert d.wait(timeout=60) == 0
    finally:
        for proc in [server, *devices]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_resume_starts_from_the_checkpointed_weights(tmp_path: Path) -> None:
    from orchestrator.server import Orchestrator

    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=3, store_dir=tmp_path / "store")
    asyncio.run(run_local_fleet(config, _fleet("digits_mlp", ["strong", "weak"])))
    store = Store(tmp_path / "store")
    done, state = store.checkpoints.last()
    store.close()
    config.resume, config.rounds = True, 4

    async def make() -> Orchestrator:
        return Orchestrator(config)

    orch = asyncio.run(make())
    assert orch.start_round == done + 1 == 3
    for name, value in state.items():
        np.testing.assert_array_equal(orch.global_state[name], value)
    orch.store.close()
    config.resume = False
    with pytest.raises(ValueError, match="--resume"):
        asyncio.run(make())


def test_transfers_cut_by_the_network_resume_where_they_stopped(tmp_path: Path) -> None:
    """In round 1 the strong device's link drops half-way through its update, and the weak device's
    half-way through its first chunk. Each reconnects: the server asks the strong device for the rest
    of its update from the bytes it holds (Resume), the weak device fetches the rest of its chunk
    from the bytes it holds (Fetch.offset), and both updates count without training again."""
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=3, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120, **EXACT_TRANSFERS)  # whole chunks to cut
    # The strong device uploads 3 s late: the round is still open when the weak device comes back (a
    # device that vanishes mid-download is not waited for; one whose upload was cut is).
    launches = _fleet("digits_mlp", ["strong", "weak"], faults={"strong-0": Faults(cut_upload_rounds=(1,), delay_s=3),
                                                                "weak-1": Faults(cut_download_rounds=(1,))})
    server_events: list[tuple[str, dict]] = []
    run = asyncio.run(run_local_fleet(config, launches, on_event=lambda kind, data: server_events.append((kind, data))))
    assert [r["round"] for r in run.history] == [1, 2]
    assert run.history[0]["reported"] == 2 and run.history[0]["stragglers"] == []

    device = {e["event"]: e for e in run.device_events["strong-0"] if e["event"] in ("upload_cut", "upload_resumed")}
    cut = next(data for kind, data in server_events if kind == "upload_cut")
    resumed = next(data for kind, data in server_events if kind == "upload_resumed")
    # The server held what reached it before the link dropped (bytes in flight are lost in a reset),
    # and asked for the rest from there.
    assert cut["device"] == resumed["device"] == "strong-0" and cut["round"] == resumed["round"] == 1
    assert 0 < cut["offset"] == resumed["offset"] <= device["upload_cut"]["sent"] < cut["total"]
    assert device["upload_resumed"]["offset"] == cut["offset"] and device["upload_resumed"]["round"] == 1
    # The weak device went on from the bytes of its first chunk it held when its link dropped.
    weak = {e["event"]: e for e in run.device_events["weak-1"] if e["event"] in ("download_cut", "download_resumed")}
    assert weak["download_cut"]["kind"] == "chunk" and weak["download_cut"]["round"] == 1
    assert 0 < weak["download_cut"]["held"] == weak["download_resumed"]["offset"] < weak["download_resumed"]["total"]
    assert weak["download_resumed"]["round"] == 1 and weak["download_resumed"]["payload"]
    for device in ("strong-0", "weak-1"):
        # One accepted update per round, after one reconnect: nothing was done twice.
        done = [e for e in run.device_events[device] if e["event"] == "round_done"]
        assert [(e["round"], e["accepted"]) for e in done] == [(1, True), (2, True)]
        assert sum(1 for e in run.device_events[device] if e["event"] == "reconnect") == 1
    store = Store(tmp_path / "store")
    assert sorted(u["device_id"] for u in store.reports.all(1) if u["accepted"]) == ["strong-0", "weak-1"]
    store.close()
