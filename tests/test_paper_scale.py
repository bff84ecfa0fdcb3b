"""EmbracingFL's CIFAR-10 command at the paper's scale (bench/embracing.py --paper-scale) runs end to
end on the CPU at a reduced scale: the paper's fleet (forced roles, whole shards, the whole test set,
lr 0.4 with the late decay), the real orchestrator and devices, and the paper's table with the
measured column and the final accuracy's bootstrap interval beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_data import REPO, SHARED, need


@pytest.mark.slow
@pytest.mark.heavy  # a benchmark's command: 4-5 minutes of CPU on 2 cores (ResNet20 over all 10,000 test images)
@pytest.mark.timeout(1800)
def test_the_paper_scale_command_prints_the_papers_table_beside_ours(tmp_path: Path):
    need("cifar10_jpg")
    out = tmp_path / "paper.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "EDGETRAIN_DATA": str(SHARED)}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "embracing.py"), "--paper-scale", "--device", "cpu",
                           "--devices", "4", "--samples", "32", "--rounds", "1", "--cases", "1", "--seeds", "0",
                           "--workers", "1", "--workdir", str(tmp_path / "runs"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())["report"]["datasets"]["cifar10"]
    setting = report["setting"]
    assert setting["lr"] == 0.4 and setting["fraction"] == 1.0 and setting["eval_limit"] is None
    case = report["cases"]["1"]
    assert case["methods"]["embracingfl"]["paper"] == [80.45, 0.2]
    interval = case["final_intervals"]["embracingfl"]
    assert interval["low"] <= interval["estimate"] <= interval["high"]
    result = json.loads(next((tmp_path / "runs").rglob("result.json")).read_text())
    assert len(result["final_correct"]) == 10_000  # the whole test set, one result per image
    assert "| 1 (allstrong) | 4 strong / 0 moderate / 0 weak | 1.00 |" in proc.stdout and "80.45 ± 0.2" in proc.stdout
