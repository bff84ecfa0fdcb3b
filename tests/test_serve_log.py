"""``edgetrain serve`` waits for its devices as a service does unless told a limit, and every line of
its log has one format: the handler's time and level, then the message (the server's records, a
library's and Python's ``warnings`` alike), never a level said twice."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_data import REPO

LEVELS = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
#: A level said twice: the view's own column, then the message's prefix (``WARNING  WARNING:edgetrain...``).
TWICE = re.compile(rf"\b{LEVELS}\b\W+{LEVELS}\b")


def _serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_serve_waits_for_its_devices_forever_by_default(tmp_path: Path) -> None:
    config = json.loads(_serve("--check", "--store", str(tmp_path)).stdout)["config"]
    assert math.isinf(config["wait_devices_s"])
    limited = json.loads(_serve("--check", "--store", str(tmp_path), "--wait-devices", "600").stdout)["config"]
    assert limited["wait_devices_s"] == 600


@pytest.mark.slow  # waits out its limit
def test_a_serve_that_waits_in_vain_says_so_in_one_format_and_gives_up_at_its_limit(tmp_path: Path) -> None:
    out = _serve("--port", "0", "--store", str(tmp_path / "store"), "--rounds", "1", "--min-devices", "1",
                 "--wait-devices", "10.5")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "only 0 of 1 devices were ready in time" in text, text
    said = [line for line in text.splitlines() if "waiting for devices: 0 of 1 ready" in line]
    assert said and all(re.search(rf"\] {LEVELS} ", line) for line in said), said  # time, level, message
    assert not TWICE.search(text), text


LOGS = """
import logging, sys, warnings
from pathlib import Path
from edgetrain.cli import console
from orchestrator.config import ServerConfig
from orchestrator.views.terminal import ServeOutput
output = ServeOutput(ServerConfig(store_dir=Path(sys.argv[1])), console(), json_events=sys.argv[2] == "json",
                     log_file=None)  # serve's logging, as serve sets it up
with output:
    logging.getLogger("edgetrain.server").warning("the server's own warning")
    logging.getLogger("websockets.server").error("a library's error")
    warnings.warn("a library's warning", UserWarning)
"""


def test_the_servers_a_librarys_and_pythons_warnings_print_in_one_format(tmp_path: Path) -> None:
    for mode in ("view", "json"):
        out = subprocess.run([sys.executable, "-c", LOGS, str(tmp_path), mode], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr[-3000:]
        text = out.stdout + out.stderr
        lines = {what: next(line for line in text.splitlines() if what in line)
                 for what in ("the server's own warning", "a library's error", "a library's warning")}
        for what, line in lines.items():
            level = re.findall(rf"\b{LEVELS}\b", line)
            assert len(level) == 1, (mode, line)  # the handler's level, once
            assert line.index(level[0]) < line.index(what), (mode, line)
        assert not TWICE.search(text), (mode, text)
