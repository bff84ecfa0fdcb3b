"""bench/same_numbers.py's comparison and its fixed-randomness hook (seconds; the cases themselves are
not run here: they take minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import same_numbers as sn  # noqa: E402


def result(rows: list[dict], **case: object) -> dict:
    return {"label": "x", "commit": "0" * 40, "date": "2026-12-06",
            "cases": {"fleet-central-dp": {"runs": {"fleet": rows}, **case}}}


ROWS = [{"round": 1, "accuracy": 0.25, "test_loss": 2.0, "epsilon": 3.5},
        {"round": 2, "accuracy": 0.5, "test_loss": 1.5, "epsilon": 5.0}]


def test_identical_results_compare_equal(capsys):
    assert sn.compare(result(ROWS), result(json.loads(json.dumps(ROWS)))) == 0
    assert "identical" in capsys.readouterr().out


def test_any_changed_missing_or_failed_number_is_a_difference(capsys):
    changed = [dict(ROWS[0]), {**ROWS[1], "epsilon": 5.000000000000001}]
    assert sn.compare(result(ROWS), result(changed)) == 1
    out = capsys.readouterr().out
    assert "epsilon" in out and "test_loss" not in out  # only the number that differs is listed
    assert sn.compare(result(ROWS), result(ROWS[:1])) == 1  # a round fewer
    assert sn.compare(result(ROWS), result([{**r, "reported": 10} for r in ROWS])) == 1  # a number more
    assert sn.compare(result(ROWS), result(ROWS, error="exit 1: boom")) == 1
    assert sn.case_differences(result(ROWS)["cases"]["fleet-central-dp"], None)[0][3:] == ("ran", "missing")


def draw(tmp_path: Path, hooked: bool, name: str) -> tuple[str, str]:
    """secure_uniform in a fresh process, with or without the hook; its values and the hook's log."""
    log = tmp_path / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(sn.HOOK)} if hooked else dict(os.environ)
    env.update(SAME_NUMBERS_SEEDED=sn.NOISE if hooked else "", SAME_NUMBERS_HOOK_LOG=str(log))
    code = "from edge_sdk.dp import secure_uniform; print(secure_uniform(4).tolist(), secure_uniform(2).tolist())"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout, log.read_text() if log.is_file() else ""


def test_the_hook_fixes_the_noise_source_and_notes_it(tmp_path):
    first, log = draw(tmp_path, True, "a")
    second, _ = draw(tmp_path, True, "b")
    assert first == second  # the same draws in another process
    assert log == f"{sn.NOISE}\t\n"  # drawn outside a device: the process's own stream
    plain = [draw(tmp_path, False, n) for n in ("c", "d")]
    assert plain[0][0] != plain[1][0] and plain[0][1] == ""  # the OS's randomness, untouched


def test_a_case_whose_randomness_bypassed_the_hook_is_an_error(tmp_path):
    case = sn.CASES["fleet-distributed-dp"]
    log = tmp_path / "seeded.log"
    assert "drew no bytes" in sn.hook_problem(case, log)
    log.write_text(f"{sn.ROUNDING}\tstrong-000\n{sn.NOISE}\tstrong-000\n")
    assert sn.hook_problem(case, log) is None
    log.write_text(f"{sn.ROUNDING}\tstrong-000\n{sn.NOISE}\t\n")
    assert "no device object" in sn.hook_problem(case, log)
