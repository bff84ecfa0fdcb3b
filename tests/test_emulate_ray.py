"""``edgetrain emulate --backend ray``: the lightweight mode's workers as Ray actors.

A small fleet runs through the real command on a local Ray instance (real orchestrator, two actors
each holding three devices with their own websocket connections, the real SQLite journal) to its
last round; an actor killed mid-run stops the run with an error naming it, as a dead local worker
does. Nothing but a ray run imports Ray. The Ray tests are skipped where the ``[ray]`` extra is not
installed (``make test`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emulator.fleet import load_fleet
from emulator.lightweight import WorkerFailed
from emulator.localfleet import device_env
from emulator.runner import run_emulation
from emulator.schedule import server_config
from orchestrator.store import Store

ROUNDS = 2
WORKERS = 2

FLEET = """
[fleet]
model = "tiny"
dataset = "synthetic"
seed = 0

[training]
rounds = 2
fraction = 1.0
local_steps = 2
batch_size = 8

[emulation]
mode = "lightweight"
memory_cap = "none"
throttle_cpu = false

[[groups]]
name = "full"
class = "mid-phone"
count = 3

[[groups]]
name = "last-block"
class = "entry-phone"
count = 3
force_split = 1
"""


def _ray_env() -> dict[str, str]:
    env = device_env()
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"})
    return env


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has ended (Ray reaps a killed actor's process shortly after the call returns)."""
    deadline = time.monotonic() + within_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
def test_a_fleet_runs_to_the_end_through_a_local_ray_instance(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    fleet = tmp_path / "ray.toml"
    fleet.write_text(FLEET)
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "edgetrain", "emulate", "--fleet", str(fleet), "--rounds", str(ROUNDS),
            "--workers", str(WORKERS), "--backend", "ray", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_ray_env(), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stdout = " ".join(proc.stdout.split())
    (run_dir,) = out.iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    with Store(run_dir / "store") as store:
        journal_devices = {d["device_id"] for d in store.devices.all()}
        journal_rounds = store.rounds.all()
        updates = store.reports.all()

    expected = {s.id for s in load_fleet(fleet).devices()}
    assert len(expected) == 6 and journal_devices == expected
    # Every round completed with every device: each was selected (fraction 1) and reported.
    assert [r["round"] for r in journal_rounds] == list(range(1, ROUNDS + 1))
    assert all(r["complete"] for r in journal_rounds)
    for r in journal_rounds:
        assert set(r["selected"]) == expected, r
        assert {u["device_id"] for u in updates if u["round"] == r["round"] and u["accepted"]} == expected
    assert [(r["round"], r["reported"], r["stragglers"]) for r in metrics["rounds"]] == [(1, 6, []), (2, 6, [])]
    assert all(r["workers_cpu_s"] > 0 for r in metrics["rounds"]), metrics["rounds"]

    # The same report as the local lightweight mode, saying it ran on Ray.
    assert metrics["backend"] == "ray" and metrics["ray_address"] is None
    assert metrics["mode"] == "lightweight" and metrics["workers"] == WORKERS
    for d in metrics["devices"]:
        assert d["role"] != "unregistered" and d["split"] == (1 if d["group"] == "last-block" else 0), d
        assert d["rounds_reported"] == ROUNDS and [life["ended"] for life in d["lives"]] == ["finished"], d
        assert d["mechanism"] == "none" and d["within_budget"] is None, d
    workers = metrics["worker_processes"]
    assert [w["index"] for w in workers] == list(range(WORKERS))
    assert sorted(d["worker"] for d in metrics["devices"]) == [0, 0, 0, 1, 1, 1]
    for w in workers:
        assert w["returncode"] == 0 and w["devices"] == 3 and w["host"] == socket.gethostname(), w
        assert w["peak_rss_bytes"] >= w["rss_ready_bytes"] > 0 and w["cpu_s"] > 0, w
        assert [r["round"] for r in w["rounds"]] == list(range(1, ROUNDS + 1)), w
        assert _gone(w["pid"]), f"actor process {w['pid']} outlived the run"
    assert len({w["pid"] for w in workers}) == WORKERS and os.getpid() not in {w["pid"] for w in workers}
    assert f"mode lightweight: {WORKERS} worker processes as Ray actors on a local Ray instance" in stdout
    assert f"mode: lightweight ({WORKERS} worker processes as Ray actors shared by 6 uncapped devices)" in stdout


@pytest.mark.slow
def test_an_actor_that_dies_stops_the_run_with_a_clear_error(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    for key, value in _ray_env().items():
        os.environ.setdefault(key, value)
    path = tmp_path / "ray.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    config = server_config(fleet, rounds=ROUNDS, store_dir=tmp_path / "store", deadline_s=60)
    pids: list[int] = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "emulator:worker_started":
            pids.append(data["pid"])
        elif kind == "round_start" and data["round"] == 1:
            os.kill(pids[0], signal.SIGKILL)

    with pytest.raises(WorkerFailed, match=r"worker 0 \(Ray actor, pid \d+ on \S+\) died during the run"):
        asyncio.run(run_emulation(fleet, config, workers=WORKERS, on_event=on_event, backend="ray",
                                  stderr_dir=tmp_path / "logs"))
    assert not ray.is_initialized()  # the local instance this run started is shut down
    assert len(pids) == WORKERS and all(_gone(pid) for pid in pids)  # the other actor was ended too
    assert "ActorDiedError" in (tmp_path / "logs" / "worker-0.log").read_text()  # what Ray said, for the user


def test_nothing_imports_ray_until_a_ray_run_starts() -> None:
    code = textwrap.dedent("""
        import json, sys
        import edge_sdk, edge_sdk.client
        import edgetrain.cli.commands, emulator.runner, emulator.ray_backend
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "ray")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_ray_options_are_checked() -> None:
    from edgetrain.cli import app
    from edgetrain.cli import commands  # noqa: F401  (registers the commands)

    runner = CliRunner()

    def refused(*argv: str) -> str:
        result = runner.invoke(app, ["emulate", *argv])
        assert result.exit_code != 0
        return " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message

    assert "applies to --backend ray" in refused("--fleet", "tiny-200", "--address", "10.0.0.5:6379")
    assert "applies to --backend ray" in refused("--fleet", "tiny-200", "--advertise-host", "10.0.0.2")
    assert "applies to --backend ray" in refused("--fleet", "tiny-200", "--port", "9000")
    assert "must be one of local, ray" in refused("--fleet", "tiny-200", "--backend", "spark")
    result = runner.invoke(app, ["emulate", "--fleet", "tiny-capped", "--backend", "ray"])
    shown = " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message
    assert result.exit_code != 0 and "runs emulation.mode 'lightweight', not 'processes'" in shown
