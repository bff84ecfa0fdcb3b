"""``edgetrain emulate --resume RUN_DIR``: a run killed after round k continues at round k + 1.

The real command (orchestrator, lightweight worker processes, websocket devices, SQLite journal) on a
tiny fleet is killed with SIGKILL, process group and all, once its store has completed a round; the
same command with ``--resume`` then runs the rounds after the last completed one in the same store
and reports every round once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.localfleet import device_env
from emulator.runner import completed_rounds
from orchestrator.store import Store

pytestmark = pytest.mark.slow

ROUNDS = 5

FLEET = """
[fleet]
name = "resume-tiny"
model = "tiny"
dataset = "synthetic"
seed = 3

[training]
strategy = "embracingfl"
rounds = 5
fraction = 1.0
local_steps = 2
batch_size = 8
lr = 0.1
momentum = 0.0
weight_decay = 0.0

[partition]
scheme = "iid"

[emulation]
mode = "lightweight"
memory_cap = "none"
timeout_s = 60
throttle_cpu = false

[behaviour]
latency_ms = 60

[[groups]]
name = "strong"
class = "mid-phone"
count = 2

[[groups]]
name = "partial"
class = "entry-phone"
count = 2
force_split = 1
"""


def _argv(fleet: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "edgetrain", "emulate", "--fleet", str(fleet), "--rounds", str(ROUNDS),
            "--workers", "1", *args]


def test_killed_run_resumes_after_its_last_completed_round(tmp_path: Path) -> None:
    fleet = tmp_path / "resume-tiny.toml"
    fleet.write_text(FLEET)
    out = tmp_path / "runs"
    # Its console (a device that ended unexpectedly is a line there) to a file, for a failure's message.
    console = (tmp_path / "stdout.txt").open("wb")
    proc = subprocess.Popen(_argv(fleet, "--out", str(out)), stdout=console, stderr=subprocess.PIPE,
                            env=device_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        killed_after = 0
        while time.monotonic() < deadline and proc.poll() is None:
            dirs = list(out.iterdir()) if out.is_dir() else []
            if dirs and (killed_after := completed_rounds(dirs[0] / "store")) >= 2:
                os.killpg(proc.pid, signal.SIGKILL)  # the emulator and its workers, mid-run
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the run ended or stalled before round 2 completed: {proc.stderr.read()[-2000:]!r}; "
                        f"its console: {(tmp_path / 'stdout.txt').read_bytes()[-3000:]!r}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        console.close()
    (run_dir,) = out.iterdir()
    done = completed_rounds(run_dir / "store")
    assert 2 <= done < ROUNDS, f"killed after round {killed_after}, the store completed {done}"
    assert not (run_dir / "metrics.json").exists()  # it never got to write its report
    with Store(run_dir / "store") as store:
        before = {r["round"]: r for r in store.rounds.all() if r["complete"]}

    resumed = subprocess.run(_argv(fleet, "--resume", str(run_dir)), capture_output=True, text=True,
                             env=device_env(), timeout=180)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming after round {done}" in " ".join(resumed.stdout.split())

    with Store(run_dir / "store") as store:
        rounds = store.rounds.all()
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    assert all(r["complete"] for r in rounds)
    # Completed rounds were kept as they were; the resumed run started at round done + 1.
    for r in rounds[:done]:
        assert r["finished"] == before[r["round"]]["finished"] and r["sha256"] == before[r["round"]]["sha256"]
    first_new = rounds[done]
    assert first_new["started"] > before[done]["finished"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [m["round"] for m in metrics["rounds"]] == list(range(1, ROUNDS + 1))
    assert metrics["config"]["resume"] is True
    # Every device of the resumed run registered again and took part after the restart.
    resumed_rounds = {d["device"]: d["rounds_reported"] for d in metrics["devices"]}
    assert len(resumed_rounds) == 4 and all(n == ROUNDS - done for n in resumed_rounds.values()), resumed_rounds


def test_resume_needs_a_run_folder(tmp_path: Path) -> None:
    fleet = tmp_path / "resume-tiny.toml"
    fleet.write_text(FLEET)
    proc = subprocess.run(_argv(fleet, "--resume", str(tmp_path / "nothing")), capture_output=True, text=True,
                          env=device_env(), timeout=120)
    assert proc.returncode != 0
    words = (proc.stdout + proc.stderr).replace("│", " ").split()  # rich boxes the message
    assert "holds no run" in " ".join(words)
