"""A demo's run folder keeps its report and final weights, not the ONNX chunks exported on the way
(each run used to leave hundreds of MiB in runs/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_demo_run_folder_stays_small(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "edgetrain", "demo", "--rounds", "2", "--out",
                          str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "metrics.json").is_file() and (run / "accuracy.png").is_file()
    assert not list((run / "store" / "chunks").glob("*.onnx*")), "exported chunks left behind"
    assert len(list((run / "store" / "checkpoints").iterdir())) == 1  # the final weights
    size = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    assert size < 64 << 20, f"{size / 2**20:.0f} MiB"
