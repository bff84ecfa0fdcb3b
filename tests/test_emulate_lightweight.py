"""``edgetrain emulate`` in the lightweight mode: 200 devices sharing a few worker processes.

One run of the real command on the shipped ``tiny-200`` fleet (real orchestrator, two real worker
processes, 200 real websocket connections, the real SQLite journal) serves the scale tests; a small
fleet run in-process shows that a device vanishing mid-round leaves its neighbours in the same
worker running and comes back; a worker killed mid-run stops the run with an error naming it; a
one-device process-mode run shows that reports name their mode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emulator.fleet import load_fleet
from emulator.launch import DeviceLaunch, Faults
from emulator.lightweight import (
    WorkerDevice,
    WorkerFailed,
    WorkerSpec,
    default_workers,
    split_devices,
)
from edge_sdk.payload_store import PAYLOAD_CACHE_ENV
from emulator.localfleet import device_env
from emulator.runner import run_emulation
from emulator.schedule import drop_schedule, server_config
from orchestrator.store import Store

pytestmark = pytest.mark.slow

ROUNDS = 2
WORKERS = 2


def _emulate(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> str:
    """Run the command; its console output with rich's line wrapping undone."""
    argv = [sys.executable, "-m", "edgetrain", "emulate", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env or device_env(), timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return " ".join(proc.stdout.split())


@pytest.fixture(scope="module")
def run200(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("lightweight") / "runs"
    # As a user runs it: no $EDGETRAIN_PAYLOAD_CACHE (the tests' conftest sets one), the user's cache a folder
    # of the test's own, to see what the run leaves in it.
    cache = tmp_path_factory.mktemp("user-cache")
    env = {k: v for k, v in device_env().items() if k != PAYLOAD_CACHE_ENV} | {"EDGETRAIN_CACHE": str(cache)}
    stdout = _emulate("--fleet", "tiny-200", "--rounds", str(ROUNDS), "--workers", str(WORKERS), "--out", str(out),
                      env=env)
    (run_dir,) = out.iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    with Store(run_dir / "store") as store:
        metrics["journal_devices"] = store.devices.all()
        metrics["journal_rounds"] = store.rounds.all()
        metrics["journal_updates"] = store.reports.all()
    metrics["stdout"] = stdout
    metrics["left_in_cache"] = sorted(str(f.relative_to(cache)) for f in (cache / "payloads").rglob("*"))
    metrics["by_id"] = {d["device"]: d for d in metrics["devices"]}
    return metrics


def test_200_devices_register_with_one_orchestrator(run200: dict) -> None:
    fleet = load_fleet("tiny-200")
    expected = {s.id for s in fleet.devices()}
    assert len(expected) == 200
    registered = [d["device_id"] for d in run200["journal_devices"]]
    assert len(registered) == 200 and set(registered) == expected
    assert set(run200["by_id"]) == expected
    # Every device got its own plan: the forced phones train the last block, the rest the whole model.
    for d in run200["devices"]:
        assert d["role"] != "unregistered", d
        assert d["split"] == (1 if d["group"] == "last-block-entry-phone" else 0), d


def test_every_round_completes_with_every_selected_device_that_did_not_vanish(run200: dict) -> None:
    fleet = load_fleet("tiny-200")
    schedule = drop_schedule(fleet, fleet.devices(), ROUNDS)
    assert [r["round"] for r in run200["rounds"]] == list(range(1, ROUNDS + 1))
    assert all(r["complete"] for r in run200["journal_rounds"])
    for journal, metrics in zip(run200["journal_rounds"], run200["rounds"]):
        r = journal["round"]
        selected = set(journal["selected"])
        vanished = {d for d in selected if r in schedule[d]}
        reporters = {u["device_id"] for u in run200["journal_updates"] if u["round"] == r and u["accepted"]}
        assert len(selected) >= 50, journal  # fraction 0.5 of the idle devices
        assert reporters == selected - vanished, (r, sorted(selected - vanished - reporters))
        assert metrics["reported"] == len(reporters) and set(metrics["stragglers"]) == vanished
        assert metrics["server_cpu_s"] > 0 and metrics["workers_cpu_s"] > 0, metrics
    # Devices vanished on purpose, each alone: its worker's other devices went on (the rounds above).
    dropped = [d for d in run200["devices"] if d["lives"] and d["lives"][0]["ended"] == "dropped"]
    assert dropped and all(d["lives"][0]["round"] in d["drop_rounds"] for d in dropped)


def test_the_devices_payloads_go_with_the_run(run200: dict) -> None:
    """200 emulated devices keep their payloads for the run (payload-cache auto), in a folder of the run's
    own, removed at its end: nothing in the user's cache, where a folder per server port and device id
    would pile up run after run."""
    assert run200["left_in_cache"] == []


def test_report_and_metrics_say_lightweight_with_the_worker_processes(run200: dict) -> None:
    assert run200["mode"] == "lightweight" and run200["workers"] == WORKERS
    workers = run200["worker_processes"]
    assert [w["index"] for w in workers] == list(range(WORKERS))
    assert len({w["pid"] for w in workers}) == WORKERS
    assert sum(w["devices"] for w in workers) == 200
    for w in workers:
        assert w["returncode"] == 0, w
        assert w["peak_rss_bytes"] >= w["rss_ready_bytes"] > 0, w
        assert w["cpu_s"] > 0 and [r["round"] for r in w["rounds"]] == list(range(1, ROUNDS + 1)), w
    assert Counter(d["worker"] for d in run200["devices"]) == {0: 100, 1: 100}
    for d in run200["devices"]:
        assert d["mechanism"] == "none" and d["within_budget"] is None and d["peak_bytes"] is None, d
    out = run200["stdout"]
    assert f"mode lightweight: {WORKERS} worker processes" in out
    assert f"mode: lightweight ({WORKERS} worker processes shared by 200 uncapped devices)" in out


LIGHT_FLEET = """
[fleet]
model = "tiny"
seed = {seed}

[training]
rounds = 3
fraction = 1.0
local_steps = 2
batch_size = 8

[emulation]
mode = "lightweight"
memory_cap = "none"
throttle_cpu = false

[behaviour]
latency_ms = 300

[[groups]]
name = "steady"
class = "mid-phone"
count = 5

[[groups]]
name = "flaky"
class = "mid-phone"
count = 1
dropout = 0.5
rejoin_after_s = 0.05
"""


def test_a_vanished_device_leaves_its_worker_running_and_rejoins(tmp_path: Path) -> None:
    # A seed for which the flaky device vanishes in round 1 only. Every device waits 300 ms before
    # its upload, so the flaky one is usually back (after 50 ms) before round 2 starts; on a busy
    # machine it may miss round 2, and then it is idle, so selected, in round 3. One device at a
    # time may be connecting (connect_at_once=1): the gate is let go at each welcome and at each
    # life's end, or the fleet would never connect, nor the flaky device rejoin.
    path = tmp_path / "fleet.toml"
    for seed in range(200):
        path.write_text(LIGHT_FLEET.format(seed=seed))
        fleet = load_fleet(path)
        if drop_schedule(fleet, fleet.devices(), 3)["flaky-000"] == (1,):
            break
    else:
        raise AssertionError("no seed drops flaky-000 in round 1 only")
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=30)
    run = asyncio.run(run_emulation(fleet, config, workers=1, connect_at_once=1, stderr_dir=tmp_path / "logs"))
    assert run.mode == "lightweight" and len(run.workers) == 1 and run.workers[0]["returncode"] == 0
    flaky = run.device("flaky-000")
    first, *later = flaky.lives
    assert first.ended == "dropped" and first.round == 1
    assert later and later[-1].ended == "finished"
    assert flaky.failed_rounds == [1] and "flaky-000" in run.history[0]["stragglers"]
    assert [r["round"] for r in flaky.rounds] in ([2, 3], [3]), flaky.rounds  # back with a fresh client
    for s in fleet.devices():
        if s.id != "flaky-000":  # its neighbours in the same process were untouched
            d = run.device(s.id)
            assert [life.ended for life in d.lives] == ["finished"], d.lives
            assert [r["round"] for r in d.rounds] == [1, 2, 3]


def test_a_worker_that_dies_stops_the_run_with_a_clear_error(tmp_path: Path) -> None:
    fleet = load_fleet("tiny-200")
    fleet = dataclasses.replace(fleet, groups=tuple(dataclasses.replace(g, count=4) for g in fleet.groups))
    config = server_config(fleet, rounds=ROUNDS, store_dir=tmp_path / "store", deadline_s=60)
    pids: list[int] = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "emulator:worker_started":
            pids.append(data["pid"])
        elif kind == "round_start" and data["round"] == 1:
            os.kill(pids[0], signal.SIGKILL)

    with pytest.raises(WorkerFailed, match=r"worker 0 \(pid \d+\) exited with -9 during the run"):
        asyncio.run(run_emulation(fleet, config, workers=2, on_event=on_event, stderr_dir=tmp_path / "logs"))
    for pid in pids:  # the other worker was stopped too, and both were reaped
        assert not Path(f"/proc/{pid}").exists()


def test_process_mode_reports_say_processes(tmp_path: Path) -> None:
    fleet = tmp_path / "one.toml"
    fleet.write_text(LIGHT_FLEET.format(seed=0).replace('"lightweight"', '"processes"')
                     .replace("rounds = 3", "rounds = 1").split("[[groups]]")[0]
                     + '[[groups]]\nname = "solo"\nclass = "mid-phone"\ncount = 1\n')
    out = tmp_path / "runs"
    stdout = _emulate("--fleet", str(fleet), "--out", str(out))
    (run_dir,) = out.iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["mode"] == "processes" and "workers" not in metrics
    assert metrics["rounds"][0]["reported"] == 1
    assert "mode processes: memory cap none" in stdout and "mode: processes" in stdout


def test_workers_option_is_checked() -> None:
    from edgetrain.cli import app
    from edgetrain.cli import commands  # noqa: F401  (registers the commands)

    runner = CliRunner()
    result = runner.invoke(app, ["emulate", "--fleet", "tiny-capped", "--workers", "2"])
    shown = " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message
    assert result.exit_code != 0 and "applies to emulation.mode 'lightweight'" in shown
    result = runner.invoke(app, ["emulate", "--fleet", "tiny-200", "--workers", "0"])
    assert result.exit_code != 0 and "between 1 and" in result.output


def test_devices_are_dealt_round_robin_and_specs_are_validated(tmp_path: Path) -> None:
    assert split_devices(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    with pytest.raises(ValueError, match="at most one worker per device"):
        split_devices([1, 2], 3)
    assert 2 <= default_workers(200) <= 4 and default_workers(1) == 1
    launch = DeviceLaunch("d-0", 1 << 30, client=0, num_clients=1, data="synthetic", device_class="mid-phone",
                          faults=Faults(drop_rounds=(2,), delay_s=0.3, force_split=1))
    device = WorkerDevice(launch, rejoin_after_s=0.5)
    spec = WorkerSpec(0, (device,))
    assert WorkerSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="not a worker spec"):
        WorkerSpec.from_json('{"index": 0}')
    with pytest.raises(ValueError, match="distinct"):
        WorkerSpec.from_json(WorkerSpec(0, (device, device)).to_json())
    with pytest.raises(ValueError, match="connect_at_once"):
        WorkerSpec.from_json(WorkerSpec(0, (device,), connect_at_once=0).to_json())
    bad = tmp_path / "spec.json"
    bad.write_text("[]")
    proc = subprocess.run([sys.executable, "-m", "emulator.lightweight", "--url", "ws://127.0.0.1:1",
                           "--spec-file", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a worker spec" in proc.stderr
