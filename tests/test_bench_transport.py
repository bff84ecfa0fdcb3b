"""The transport benchmark runs end to end (a smoke run: it checks what the lanes deliver, not speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_transport_benchmark_runs_every_lane(tmp_path):
    out = tmp_path / "transport.json"
    # Each lane asserts inside the benchmark that it delivered the whole tensor (and the floor its digest).
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "transport.py"), "--sizes", "1", "--repeats", "1",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    (row,) = doc["report"]["rows"]
    assert row["size_mib"] == 1
    for lane in ("bare", "floor", "protocol", "cached"):
        assert row[f"{lane}_mib_s"] > 0 and len(row["seconds"][lane]) == 1
    assert row["ratio"] == row["protocol_mib_s"] / row["bare_mib_s"]
    # One run record per lane, and the protocol's ratio to bare websockets paired within the repeat.
    assert sorted(r["lane"] for r in doc["runs"]) == ["bare", "cached", "floor", "protocol"]
    (protocol,) = [r for r in doc["summary"]["mib_s_over_bare"] if r["lane"] == "protocol"]
    assert protocol["n"] == 1 and protocol["median"] == row["ratio"]
