"""A real server process killed with SIGKILL mid-round and started again with ``resume``, with
real device processes (``python -m edge_sdk``) that reconnect to it.

- Under DP, every noised release is accounted before it leaves the server (journal first,
  ``PrivateRelease.release``): killed with a release in flight, the resumed run's ledger counts every
  release the two server processes made (each one logs its release once the noise is drawn).
- A resumed secure run selects every connected device again: the round cut by the kill is no
  device's miss.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from emulator.localfleet import device_env
from orchestrator.config import ServerConfig
from orchestrator.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEVICES = 3
RELEASED = "noised release"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(config: ServerConfig) -> subprocess.Popen:
    """The server process, its log lines and events (``tests/server_process.py``) on a pipe."""
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "server_process.py"), json.dumps(config.to_dict())],
                            cwd=ROOT, env=device_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def event(line: str) -> dict:
    """The event a line of the server's says, or {}."""
    return json.loads(line.removeprefix("EVENT ")) if line.startswith("EVENT ") else {}


def enroll(tmp_path: Path) -> list[str]:
    """Credentials of the devices (a secure round's identities), in files: the extra arguments."""
    with Store(tmp_path / "store") as store:
        for i in range(DEVICES):
            (tmp_path / f"dev-{i}.secret").write_text(store.credentials.enroll(f"dev-{i}") + "\n")
    return ["--secret-file", str(tmp_path / "dev-{i}.secret")]


@contextmanager
def devices(port: int, extra: list[str] = ()) -> Iterator[list[subprocess.Popen]]:
    procs = [subprocess.Popen(
        [sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{port}", "--id", f"dev-{i}", "--budget",
         "2GiB", "--data", "digits", "--client", str(i), "--num-clients", str(DEVICES), "--reconnect-retries", "-1",
         "--reconnect-max-delay", "1", "--once", *(a.format(i=i) for a in extra)], cwd=ROOT, env=device_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL) for i in range(DEVICES)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def kill_when(server: subprocess.Popen, moment: Callable[[str], bool], timeout_s: float = 300) -> list[str]:
    """SIGKILL the server at the first line of its (log or event) that ``moment`` accepts, read as it
    is written; the lines up to it."""
    deadline, lines = time.monotonic() + timeout_s, []
    try:
        for line in server.stderr:
            lines.append(line)
            if moment(line):
                os.killpg(server.pid, signal.SIGKILL)
                return lines
            if time.monotonic() > deadline:
                break
        pytest.fail("the server ended or stalled before the moment to kill it:\n" + "".join(lines[-30:]))
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def finish(server: subprocess.Popen, timeout_s: float = 300) -> list[str]:
    """Wait for the server's run to end; its lines."""
    try:
        _, err = server.communicate(timeout=timeout_s)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 0, err[-3000:]
    return err.splitlines()


def config(tmp_path: Path, port: int, **overrides: object) -> ServerConfig:
    return ServerConfig(**{"model": "digits_mlp", "eval_data": "digits", "rounds": 4, "min_devices": DEVICES,
                           "local_steps": 2, "store_dir": tmp_path / "store", "port": port, "deadline_s": 120,
                           "eval_every": 0, "max_loss_rise": 0, "wait_devices_s": 90, **overrides})


def test_a_dp_run_killed_with_a_release_in_flight_resumes_with_every_release_accounted(tmp_path: Path) -> None:
    """Killed the moment round 2's release is made (its noise drawn, the round not yet committed):
    the resumed run reruns round 2 and releases it again, and its ledger counts both releases of
    round 2 (the first may have left the server), so releases made == releases accounted."""
    port = free_port()
    dp = {"dp": True, "dp_noise_multiplier": 0.5, "dp_min_cohort": 1, "dp_delta": 1e-5}
    with devices(port):
        first = kill_when(start_server(config(tmp_path, port, **dp)), lambda line: f"round 2: {RELEASED}" in line)
        with Store(tmp_path / "store") as store:
            completed = store.rounds.completed()
        resumed = finish(start_server(config(tmp_path, port, resume=True, **dp)))
    made = [sum(RELEASED in line for line in lines) for lines in (first, resumed)]
    with Store(tmp_path / "store") as store:
        accounted = store.privacy.accounted()
        rounds = store.rounds.all()
    assert completed == 1, "the kill came after round 2's commit: no release was in flight"
    assert [r["round"] for r in rounds if r["complete"]] == [1, 2, 3, 4]
    assert made[0] == 2 and made[1] == 3  # rounds 1 and 2; then 2 again, 3 and 4
    assert len(accounted["ledger"]["rounds"]) == sum(made) == rounds[-1]["metrics"]["privacy"]["rounds"]


def test_a_resumed_secure_run_selects_every_connected_device_again(tmp_path: Path) -> None:
    """Killed while round 2's masked uploads come in, the resumed secure run starts round 2 again
    with the devices as they reconnect; a device whose round-2 task the new server itself cut (it
    came back into a secure round whose keys it had no part in) has missed nothing: every round
    after the restart selects all three."""
    port = free_port()
    secure = {"secure_aggregation": True, "secure_clip": 20.0, "rounds": 5, "require_credentials": True}
    with devices(port, enroll(tmp_path)):
        kill_when(start_server(config(tmp_path, port, **secure)),
                  lambda line: event(line).get("event") == "update" and event(line)["round"] == 2)
        resumed = finish(start_server(config(tmp_path, port, resume=True, **secure)))
    with Store(tmp_path / "store") as store:
        rounds = store.rounds.all()
    everyone = [f"dev-{i}" for i in range(DEVICES)]
    assert [r["round"] for r in rounds if r["complete"]] == [1, 2, 3, 4, 5]
    after = [r for r in rounds if r["round"] >= 3]
    assert all(r["selected"] == everyone for r in after), ([r["selected"] for r in rounds], resumed[-40:])
