"""The device as a service: started from a config file before its server, it waits and joins; a
server killed mid-round and restarted with --resume gets every device back by itself and the run
finishes; the systemd unit is valid; and each user error prints one line and a non-zero status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml(values: dict[str, object]) -> str:
    """A flat TOML table (json.dumps writes strings, numbers and booleans as TOML reads them)."""
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _device(tmp: Path, device_id: str, port: int, **extra: object) -> tuple[subprocess.Popen, Path]:
    """A device started as a service would start it: ``python -m edge_sdk --config FILE``."""
    log = tmp / f"{device_id}.log"
    config = tmp / f"{device_id}.toml"
    config.write_text(_toml({"server": f"ws://127.0.0.1:{port}", "id": device_id, "budget": "1GiB",
                             "data": "synthetic", "num-clients": 2, "client": int(device_id[-1]),
                             "log-format": "json", "log-file": str(log), "reconnect-max-delay": 1.0, **extra}))
    proc = subprocess.Popen([sys.executable, "-m", "edge_sdk", "--config", str(config)], cwd=tmp, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, log


def _server(tmp: Path, port: int, store: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "edgetrain", "serve", "--model", "tiny", "--data", "synthetic", "--port",
         str(port), "--store", str(store), "--min-devices", "2", "--local-steps", "2", "--deadline", "60", "--json-events",
         *extra],
        cwd=tmp, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rounds_done(store: Path) -> int:
    with Store(store) as s:
        return sum(r["complete"] for r in s.rounds.all())


@pytest.mark.slow
def test_a_device_started_before_its_server_joins_when_it_comes(tmp_path: Path) -> None:
    port = _free_port()
    devices = [_device(tmp_path, f"dev-{i}", port) for i in range(2)]
    server = None
    try:
        # The board booted before its server: nobody answers yet. Its attempts (three each, the waits capped by
        # its config), not a fixed time, say it kept trying; a loaded machine may start the device slowly.
        for proc, log in devices:
            _wait_for(lambda: sum(e.get("event") == "reconnect" for e in _events(log)) >= 3, 120, "three attempts")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            tries = [e for e in _events(log) if e.get("event") == "reconnect"]
            assert len(tries) >= 3 and all(e["delay_s"] <= 1.0 for e in tries), tries  # capped by the config
            assert "refused" in tries[-1]["error"].lower() or "connect" in tries[-1]["error"].lower(), tries[-1]
        server = _server(tmp_path, port, tmp_path / "store", "--rounds", "2")
        out, _ = server.communicate(timeout=120)
        assert server.returncode == 0, out[-2000:]
        assert _rounds_done(tmp_path / "store") == 2
        for proc, log in devices:
            # The run is over, and the service waits for the next one instead of exiting.
            _wait_for(lambda: any(e.get("event") == "run_over" for e in _events(log)), 30, "run_over")
            assert proc.poll() is None
            done = [e for e in _events(log) if e.get("event") == "round_done"]
            assert {e["round"] for e in done} == {1, 2}, done
    finally:
        _stop(*(p for p, _ in devices), *([server] if server else []))


@pytest.mark.slow
def test_devices_rejoin_a_server_killed_mid_round_and_restarted(tmp_path: Path) -> None:
    port, store = _free_port(), tmp_path / "store"
    rounds = 6
    server = _server(tmp_path, port, store, "--rounds", str(rounds))
    devices = [_device(tmp_path, f"dev-{i}", port) for i in range(2)]
    restarted = None
    try:
        assert server.stdout is not None
        for line in server.stdout:  # the server's events, one JSON object a line
            if line.startswith("{") and json.loads(line).get("event") == "round_start" \
                    and json.loads(line)["round"] == 3:
                break
        server.kill()  # mid-round: no goodbye, no checkpoint of round 3
        server.wait()
        killed_at = _rounds_done(store)
        assert killed_at == 2  # rounds 1-2 done, round 3 cut off
        for proc, log in devices:
            _wait_for(lambda: any(e.get("event") == "reconnect" for e in _events(log)), 30, "a reconnect attempt")
            assert proc.poll() is None
        restarted = _server(tmp_path, port, store, "--rounds", str(rounds), "--resume")
        out, _ = restarted.communicate(timeout=180)
        assert restarted.returncode == 0, out[-2000:]
        assert _rounds_done(store) == rounds
        with Store(store) as s:
            late = {u["device_id"] for u in s.reports.all() if u["accepted"] and u["round"] > killed_at}
        assert late == {"dev-0", "dev-1"}  # both came back by themselves and trained after the restart
        for proc, log in devices:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert any(e.get("event") == "welcome" for e in _events(log))
    finally:
        _stop(*(p for p, _ in devices), server, *([restarted] if restarted else []))
    for proc, _ in devices:
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_install_service_writes_a_unit_systemd_accepts(tmp_path: Path) -> None:
    config = tmp_path / "device.toml"
    config.write_text(_toml({"server": "ws://10.0.0.2:8765", "id": "board-7", "budget": "300MiB"}))
    unit = tmp_path / "edgetrain-device.service"
    out = subprocess.run([sys.executable, "-m", "edge_sdk", "install-service", "--config", str(config), "--user",
                          "edgetrain", "-o", str(unit)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    text = unit.read_text()
    fields = {k: v for k, _, v in (line.partition("=") for line in text.splitlines() if "=" in line
                                   and not line.startswith("#"))}
    assert fields["User"] == "edgetrain"
    assert fields["Restart"] == "on-failure"
    assert fields["ExecStart"] == f"{Path(sys.executable).absolute()} -m edge_sdk --config {config}"
    assert fields["WantedBy"] == "multi-user.target" and "network-online.target" in fields["After"]
    assert fields["RestartPreventExitStatus"] == "2 3"
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stderr
    root = subprocess.run([sys.executable, "-m", "edge_sdk", "install-service", "--config", str(config), "--user",
                           "root"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert root.returncode == 2 and "unprivileged" in root.stderr and "Traceback" not in root.stderr
    # edgetrain device install-service is the same command.
    wrapper = subprocess.run([sys.executable, "-m", "edgetrain", "device", "install-service", "--config",
                              str(config)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert wrapper.returncode == 0 and "User=edgetrain" in wrapper.stdout, wrapper.stderr


def _run(*argv: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_sdk", *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) <= 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


@pytest.mark.slow
def test_user_errors_are_one_line_with_a_status(tmp_path: Path) -> None:
    base = ("--id", "d", "--budget", "1GiB")
    bad_url = _run(*base, "--server", "localhost:8765")
    assert bad_url.returncode == 2 and "--server" in _one_line(bad_url) and "ws://" in bad_url.stderr
    missing_root = _run(*base, "--data", "mnist", "--data-root", str(tmp_path / "nowhere"))
    assert missing_root.returncode == 2 and "--data-root" in _one_line(missing_root)
    assert "root=" not in missing_root.stderr.replace("(root= in Python)", "")
    missing_file = _run(*base, "--data", str(tmp_path / "samples.csv"))
    assert missing_file.returncode == 2 and "--data" in _one_line(missing_file) and "samples.csv" in missing_file.stderr
    (tmp_path / "bad.toml").write_text('id = "d\n')
    bad_toml = _run("--config", str(tmp_path / "bad.toml"))
    assert bad_toml.returncode == 2 and "bad.toml" in _one_line(bad_toml) and "TOML" in bad_toml.stderr
    (tmp_path / "typo.toml").write_text('id = "d"\nbugdet = "1GiB"\n')
    typo = _run("--config", str(tmp_path / "typo.toml"))
    assert typo.returncode == 2 and "bugdet" in _one_line(typo)
    (tmp_path / "wrong.toml").write_text('id = "d"\nbudget = "plenty"\n')
    wrong = _run("--config", str(tmp_path / "wrong.toml"))
    assert wrong.returncode == 2 and "wrong.toml: budget" in _one_line(wrong)
    missing_config = _run("--config", str(tmp_path / "none.toml"))
    assert missing_config.returncode == 2 and "--config" in _one_line(missing_config)
    no_id = _run("--budget", "1GiB")
    assert no_id.returncode == 2 and "--id" in _one_line(no_id)
    # --debug shows the traceback of the same error.
    debug = _run(*base, "--data", "mnist", "--data-root", str(tmp_path / "nowhere"), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_a_device_whose_server_is_down_keeps_trying_and_says_so(tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edge_sdk", "--id", "d", "--budget", "1GiB", "--data", "synthetic",
                             "--server", f"ws://127.0.0.1:{port}", "--reconnect-max-delay", "0.5"],
                            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        while len(lines) < 4:
            lines.append(proc.stderr.readline())
        assert proc.poll() is None  # still trying
    finally:
        _stop(proc)
    for n, line in enumerate(lines, 1):
        assert f"ws://127.0.0.1:{port} unreachable" in line and f"retry {n} in " in line, lines
    # Given a limit, it stops after it with one line and status 1.
    limited = _run("--id", "d", "--budget", "1GiB", "--data", "synthetic", "--server", f"ws://127.0.0.1:{port}",
                   "--reconnect-retries", "1", "--log-level", "error")
    assert limited.returncode == 1 and "lost the server" in _one_line(limited)


@pytest.mark.slow
def test_a_budget_too_small_is_the_servers_refusal_in_one_line(tmp_path: Path) -> None:
    port = _free_port()
    server = _server(tmp_path, port, tmp_path / "store", "--rounds", "1", "--model", "digits_mlp", "--data",
                     "digits")
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if '"listening"' in line:
                break
        out = _run("--id", "tiny-board", "--budget", "1MiB", "--data", "digits", "--server",
                   f"ws://127.0.0.1:{port}", timeout=120)
    finally:
        _stop(server)
    assert out.returncode == 3, out.stderr
    assert "the server refused this device" in _one_line(out) and "budget" in out.stderr.lower()
