"""The EmbracingFL reproduction's bookkeeping: accuracy measures, the gaps the issue checks, rounds to a
target, truncated reports, and the shipped case fleets (seconds; the benchmark itself is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import embracing as eb  # noqa: E402


def run(seed: int, accs: list[float], *, every: int = 2, wall: float = 10.0) -> dict:
    history = [{"round": r, "round_wall_s": 1.0} for r in range(1, every * len(accs) + 1)]
    for i, acc in enumerate(accs):
        history[every * (i + 1) - 1]["accuracy"] = acc
    return {"spec": {"seed": seed}, "rounds": len(history), "history": history, "wall_s": wall}


def test_end_accuracy_is_the_mean_over_the_last_tenth_of_the_rounds():
    # 20 rounds, evaluated every 2: the last tenth is rounds 19-20, one evaluation.
    r = run(0, [0.1 * i for i in range(1, 11)])
    assert eb.end_accuracy(r) == pytest.approx(1.0)
    # 40 rounds: the last 4 rounds hold two evaluations.
    r = run(0, [0.0] * 18 + [0.6, 0.8])
    assert eb.end_accuracy(r) == pytest.approx(0.7)


def test_summary_and_gaps_against_all_strong_and_width_reduction():
    runs = {
        (1, "embracingfl"): [run(0, [0.5] * 9 + [0.80]), run(1, [0.5] * 9 + [0.84])],
        (6, "embracingfl"): [run(0, [0.2, 0.79] + [0.7] * 7 + [0.78]), run(1, [0.2] + [0.75] * 9)],
        (6, "width"): [run(0, [0.2] * 9 + [0.70]), run(1, [0.2] * 9 + [0.72])],
    }
    setting = {"devices": 32, "rounds": 20, "eval_every": 2, "per_round": 4, "model": "leaf_cnn", "lr": 0.04}
    report = eb.build_report("femnist", setting, runs)
    emb = report["cases"][6]["methods"]["embracingfl"]
    assert emb["best"] == [0.79, 0.75] and emb["best_mean"] == pytest.approx(0.77)
    assert emb["end"] == [0.78, 0.75] and emb["final"] == [0.78, 0.75]
    gaps = report["cases"][6]["gaps_points"]
    assert gaps["embracingfl_minus_allstrong_best_mean"] == pytest.approx(-5.0)
    assert gaps["embracingfl_minus_width_best_mean"] == pytest.approx(6.0)
    assert gaps["embracingfl_minus_width_end_mean"] == pytest.approx(5.5)
    # Table 7: the target is the lower mean best (71%), floored; rounds of the first evaluation reaching it.
    assert report["cases"][6]["target"] == pytest.approx(0.71)
    assert emb["rounds_to_target"] == [4, 4]
    assert report["cases"][6]["methods"]["width"]["rounds_to_target"] == [None, 20]
    assert report["cases"][6]["methods"]["width"]["rounds_to_target_mean"] is None
    # Case 1 is one run for both methods, and the table says so.
    assert report["cases"][1]["methods"]["width"]["same_run_as"] == "embracingfl"
    md = eb.markdown("femnist", report)
    assert "(same run as EmbracingFL: all full width)" in md
    assert "EmbracingFL - width reduction +6.00 (best), +5.50 (end), +5.50 (final)" in md
    assert "| 6 | 71.00% | - (-, 20) | 4 (4, 4) |" in md


def test_a_report_for_fewer_rounds_reads_the_first_rounds_of_an_extended_run():
    r = run(0, [0.1, 0.2, 0.3, 0.9], wall=12.0)  # 8 rounds, 1 s each, 4 s of start-up
    cut = eb.truncate(r, 4)
    assert cut["rounds"] == 4 and cut["extended_to"] == 8
    assert eb.curve(cut) == ([2, 4], [0.1, 0.2])
    assert cut["wall_s"] == pytest.approx(8.0)


@pytest.mark.parametrize("dataset", sorted(eb.SETUPS))
def test_the_shipped_case_fleets_are_what_the_bench_renders(dataset):
    from emulator.fleet import load_fleet

    for case in eb.CASES.values():
        path = eb.FLEETS / f"{eb.fleet_name(dataset, case)}.toml"
        assert path.read_text() == eb.render_fleet(eb.SETUPS[dataset], case), f"{path.name}: run --write-fleets"
        fleet = load_fleet(path)
        counts = {g.name: g.count for g in fleet.groups}
        s, m, w = case.counts(eb.SETUPS[dataset].devices)
        assert counts == {k: v for k, v in (("strong", s), ("moderate", m), ("weak", w)) if v}


def test_a_decay_schedule_reaches_the_fleet_and_keeps_its_runs_apart(tmp_path: Path):
    import tomllib

    from emulator.fleet import parse_fleet

    setup, case = eb.SETUPS["cifar10"], eb.CASES[6]
    fleet = parse_fleet(tomllib.loads(eb.render_fleet(setup, case, lr_decay_at=(240, 260))), source="x")
    assert fleet == eb.case_fleet(setup, case, lr_decay_at=(240, 260))  # the file says what the bench runs
    assert (fleet.training.lr_decay_at, fleet.training.lr_decay) == ((240, 260), 0.1)
    spec = eb.RunSpec("cifar10", 6, "width", 0, 280, 8, 1.0, 0.01, 2, 1000, 1, None, str(tmp_path))
    decayed = eb.RunSpec(**{**spec.__dict__, "lr_decay_at": (240, 260)})
    assert decayed.folder != spec.folder and decayed.setting.endswith("-decay240_260")
