"""A person's mistake at the ``edgetrain`` command line is one line and an exit status, not a
traceback; ``--debug`` shows the traceback. And ``serve`` without ``--store`` never meets an earlier
run's journal."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def edgetrain(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = edgetrain("serve", "--port", str(port), "--store", str(tmp_path / "s"), "--rounds", "1")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert "address already in use" in lines[-2] and lines[-2].startswith("edgetrain serve: ")
    assert "--debug" in lines[-1] and "Traceback" not in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--model", "nosuch", "--check"], "unknown model 'nosuch'"),
    (["serve", "--resume", "--check"], "--resume continues a run: give --store"),
    (["serve", "--model", "nosuch"], "unknown model 'nosuch'"),
])
def test_a_bad_choice_names_what_is_wrong(args: list[str], message: str, tmp_path: Path) -> None:
    out = edgetrain(*args, cwd=tmp_path)
    assert out.returncode in (1, 2) and message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = edgetrain("serve", "--port", str(taken.getsockname()[1]), "--store", str(tmp_path / "s"), "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr and "address already in use" in out.stderr


@pytest.mark.slow
def test_serve_without_a_store_takes_a_new_folder_per_run(tmp_path: Path) -> None:
    import json

    stores = {json.loads(edgetrain("serve", "--check", cwd=tmp_path).stdout)["config"]["store_dir"] for _ in range(2)}
    assert len(stores) == 2 and all(s.startswith("runs/serve-") for s in stores)


@pytest.mark.parametrize(("args", "status", "message"), [
    (["serve", "--model", "resnet20", "--data", "cifar10", "--data-root", "/nonexistent"], 1, "--data-root"),
    (["serve", "--eval-data", "nosuch.csv"], 1, "--eval-data nosuch.csv: no data file"),
    (["serve", "--no-such-option"], 2, "No such option: --no-such-option"),
    (["device", "--server", "127.0.0.1:9", "--id", "d"], 2, "write ws://HOST:PORT"),
    (["device", "--server", "ws://127.0.0.1:9", "--id", "d", "--reconnect-retries", "0", "--once"], 1,
     "lost the server ws://127.0.0.1:9"),
    (["device", "--id", "d", "--bundle", "nosuch.tar"], 2, "--bundle: nosuch.tar: no such bundle"),
    (["emulate", "--fleet", "nosuch.toml"], 2, "nosuch.toml: no such fleet file"),
    (["emulate"], 2, "Missing option '--fleet'"),
    (["profile", "--model", "nosuch"], 2, "unknown model 'nosuch'"),
    (["bundle", "--model", "digits_mlp", "--budget", "1MiB", "--out", "b.tar"], 2, "does not fit a budget of 1.0 MiB"),
    (["demo", "--rounds", "0"], 1, "rounds: must be >= 1"),
    (["nosuch"], 2, "No such command 'nosuch'"),
])
def test_every_command_says_a_user_error_in_one_or_two_lines(args: list[str], status: int, message: str,
                                                             tmp_path: Path) -> None:
    """What is wrong and what to do, a non-zero status, and no traceback (--debug shows it)."""
    out = edgetrain(*args, cwd=tmp_path)
    assert out.returncode == status, (out.returncode, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr
