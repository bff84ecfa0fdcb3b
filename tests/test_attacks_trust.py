"""One insider in the demo's fleet, against the default settings (direction trust on): it moves the
final accuracy (the mean of the last five rounds) less than 2 points from the same fleet without it,
and the defaults cost the honest fleet less than 1 point against direction trust off.

The fleet (tests/attacks.py, :func:`run_demo_fleet`): digits_mlp, devices at splits 0, 0 and 2 on iid
shards 0-2 of 4, the insider on shard 3 at split 0, so blocks 0-1 are trained by three devices of which
one is hostile; seed 0, 8 rounds of 10 local steps, every device enrolled. The insiders of the kit:
sign-flipped at honest norm (within every norm bound: only its direction gives it away), a constant
+1.0 (clipped to honest size, then weighed by its direction), boosted x100, a sign-flip behind a
100-fold sample claim, and a x10 update alone at split 1. Seven live runs of 8 rounds: several
minutes on 2 cores.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from orchestrator.store import Store
from tests.attacks import ROUNDS_DEMO, FleetResult, run_demo_fleet

# Two fleets of several rounds per test, a measured margin of accuracy: the heavy tier (make test-heavy).
# One worker runs the module, so the honest fleet runs once.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1200), pytest.mark.xdist_group("attacks_trust")]

INSIDERS = ("sign_flip", "constant", "boost100", "inflated", "lone")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trust")


@functools.cache
def _run(attack: str | None, trust: bool, root: Path) -> FleetResult:
    name = f"{attack or 'honest'}-{'trust' if trust else 'off'}"
    return run_demo_fleet(root / name, attack, rounds=ROUNDS_DEMO, trust=trust)


@pytest.mark.parametrize("attack", INSIDERS)
def test_an_insider_moves_accuracy_less_than_two_points(attack: str, root: Path) -> None:
    honest, attacked = _run(None, True, root), _run(attack, True, root)
    assert [h["round"] for h in attacked.history] == list(range(1, ROUNDS_DEMO + 1))
    assert not any("failed" in h for h in attacked.history)
    assert not {d: e for d, e in attacked.errors.items() if d != "attacker"}, attacked.errors
    assert abs(attacked.mean_accuracy() - honest.mean_accuracy()) < 0.02, \
        (attack, honest.mean_accuracy(), attacked.mean_accuracy())
    with Store(root / f"{attack}-trust") as store:
        reports = [u for u in store.reports.all() if u["device_id"] == "attacker"]
    assert len(reports) == ROUNDS_DEMO and all("trust" in u for u in reports)
    if attack in ("sign_flip", "inflated"):  # pointing away from the reference in every block it trained
        assert all(v == 0.0 for u in reports for v in u["trust"].values()), [u["trust"] for u in reports]


def test_the_defaults_cost_the_honest_fleet_less_than_a_point(root: Path) -> None:
    on, off = _run(None, True, root), _run(None, False, root)
    assert on.mean_accuracy() > off.mean_accuracy() - 0.01, (on.mean_accuracy(), off.mean_accuracy())
    with Store(root / "honest-trust") as store:
        updates = store.reports.all()
    # Every honest report is scored, and honest blocks are trusted (a positive cosine) nearly always.
    scores = [v for u in updates for v in u["trust"].values()]
    assert scores and sum(s > 0 for s in scores) >= 0.9 * len(scores)
