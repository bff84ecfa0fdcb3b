"""``edgetrain dp-plan``: the multiplier and the noise it costs, for people and for scripts, per block
from a fleet file, and one-line refusals of plans that cannot work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.aggregation.privacy.accountant import epsilon_for

ROOT = Path(__file__).resolve().parent.parent

FLEET = """
[fleet]
model = "digits_mlp"

[training]
strategy = "embracingfl"
rounds = 50
fraction = 0.05

[[groups]]
name = "strong"
class = "mid-phone"
count = 30
force_split = 0

[[groups]]
name = "weak"
class = "entry-phone"
count = 70
force_split = 2
"""


def edgetrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", "dp-plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_the_plan_for_scripts_names_the_multiplier_and_the_noise_on_the_mean() -> None:
    out = edgetrain("--devices", "10000", "--per-round", "500", "--rounds", "100", "--target-epsilon", "4",
                    "--clip", "0.5", "--accountant", "rdp", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    z = plan["noise_multiplier"]
    assert plan["rate"] == 0.05 and plan["expected_cohort"] == 500 and plan["delta"] == 1e-5  # 1/N^1.1 is larger
    assert plan["delta_is_default"] is True and plan["refusals"] == []
    assert plan["epsilon"] == pytest.approx(epsilon_for(z, 0.05, 100, 1e-5, accountant="rdp"))
    assert plan["epsilon"] <= 4 < epsilon_for(z * 0.995, 0.05, 100, 1e-5, accountant="rdp")
    assert plan["mean_stddev"] == pytest.approx(z * 0.5 / 500) and plan["sum_stddev"] == pytest.approx(z * 0.5)


@pytest.mark.parametrize(("devices", "sampling"), [(1000, "poisson"), pytest.param(1000, "fixed", marks=pytest.mark.slow),
                                                   pytest.param(100_000, "poisson", marks=pytest.mark.slow)])
def test_the_plan_is_the_one_the_server_runs(devices: int, sampling: str) -> None:
    """dp-plan with its default delta prints the multiplier and delta the server calibrates for the
    same fleet, cohort, rounds and target (min(1e-5, 1/N^1.1) on both sides: 1e-5 for 1,000 devices,
    1/N^1.1 for 100,000); for 1,000 / 100 a round / 10 rounds / epsilon 8, Poisson: 0.6121."""
    from orchestrator.aggregation.privacy.central import plan_central
    from orchestrator.config import ServerConfig

    out = edgetrain("--devices", str(devices), "--per-round", str(devices // 10), "--rounds", "10",
                    "--target-epsilon", "8", "--sampling", sampling, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    server = plan_central(ServerConfig(dp=True, dp_target_epsilon=8.0, min_devices=devices, fraction=0.1, rounds=10,
                                       dp_sampling=sampling), num_blocks=4)
    assert (plan["noise_multiplier"], plan["delta"]) == (server.multiplier, server.delta)
    assert server.delta == min(1e-5, devices**-1.1)
    if (devices, sampling) == (1000, "poisson"):
        assert f"{server.multiplier:.4f}" == "0.6121"
        shown = edgetrain("--devices", "1000", "--per-round", "100", "--rounds", "10", "--target-epsilon", "8")
        assert "noise multiplier 0.6121" in shown.stdout and "delta 1e-05 (min(1e-5, 1/N^1.1))" in shown.stdout


def test_per_block_from_a_fleet_file(tmp_path: Path) -> None:
    from edgetrain.cli.dp_plan import fleet_blocks, privacy_plan

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    plan = privacy_plan(devices=10000, per_round=None, rate=None, rounds=None, target_epsilon=4.0, delta=None,
                        clip=1.0, fleet=fleet_blocks(str(fleet)), accountant="rdp")
    assert (plan["rate"], plan["rounds"], plan["fleet"]) == (0.05, 50, "fleet")  # from the fleet file
    blocks = {b["block"]: b for b in plan["blocks"]}
    assert {b: blocks[b]["devices"] for b in blocks} == {"fc1": 3000, "fc2": 3000, "fc3": 10000, "head": 10000}
    assert blocks["fc1"]["cohort"] == pytest.approx(150) and blocks["head"]["cohort"] == pytest.approx(500)
    assert blocks["fc1"]["mean_stddev"] / blocks["head"]["mean_stddev"] == pytest.approx(500 / 150)
    splits = {s["split"]: s for s in plan["splits"]}
    assert (splits[0]["devices"], splits[2]["devices"]) == (3000, 7000)  # the fleet's 30/70, scaled to 10,000
    assert splits[0]["epsilon"] == pytest.approx(plan["epsilon"]) and splits[2]["epsilon"] < plan["epsilon"]
    assert plan["refusals"] == [] and json.loads(json.dumps(plan)) == plan


def test_dp_ftrl_is_planned_with_the_servers_trees_and_multiplier(tmp_path: Path) -> None:
    """--mechanism ftrl: the server's rounds per tree (floor(N / K)), its trees, its multiplier per node,
    and the epsilon dp-accounting's tree aggregation gives it; the per-split spends follow."""
    from edgetrain.cli.dp_plan import fleet_blocks, privacy_plan
    from orchestrator.aggregation.privacy.accountant import tree_epsilon
    from orchestrator.aggregation.privacy.ftrl import plan_ftrl
    from tests.factories import server_config

    out = edgetrain("--devices", "1000", "--per-round", "100", "--rounds", "25", "--target-epsilon", "4",
                    "--delta", "1e-5", "--mechanism", "ftrl", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    server = plan_ftrl(server_config(tmp_path / "s", min_devices=1000, fraction=0.1, rounds=25, dp=True,
                                     dp_mechanism="ftrl", dp_target_epsilon=4.0, dp_delta=1e-5), 2)
    assert plan["ftrl"] == {"cohort": 100, "rounds_per_tree": server.epoch, "trees": list(server.trees)}
    assert server.trees == (10, 10, 5) and plan["sampling"] == "tree"
    assert plan["noise_multiplier"] == pytest.approx(server.central.multiplier, rel=1e-9)
    assert plan["epsilon"] == pytest.approx(tree_epsilon(plan["noise_multiplier"], [10, 10, 5], 1e-5))
    assert plan["epsilon"] <= 4
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    per_block = privacy_plan(devices=10000, per_round=None, rate=None, rounds=None, target_epsilon=4.0, delta=None,
                             clip=1.0, fleet=fleet_blocks(str(fleet)), mechanism="ftrl")
    splits = {s["split"]: s for s in per_block["splits"]}
    assert splits[0]["epsilon"] == pytest.approx(per_block["epsilon"]) and splits[2]["epsilon"] < per_block["epsilon"]
    assert per_block["ftrl"]["rounds_per_tree"] == 20 and json.loads(json.dumps(per_block)) == per_block


def test_the_per_block_allocation_is_planned_with_each_roles_spend(tmp_path: Path) -> None:
    """--allocation utility: each block's multiplier, the objective against uniform noise's, and every
    split's epsilon within the target (the strongest at it), as the server would allocate them."""
    from edgetrain.cli.dp_plan import fleet_blocks, privacy_plan
    from orchestrator.aggregation.privacy.calibrate import allocate_multipliers

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    blocks = fleet_blocks(str(fleet))
    plan = privacy_plan(devices=10000, per_round=None, rate=None, rounds=None, target_epsilon=4.0, delta=None,
                        clip=1.0, fleet=blocks, accountant="rdp", allocation="utility")
    alloc = plan["allocation"]
    assert alloc["objective"] < alloc["uniform_objective"]
    c_b, cohorts = 0.5, {"fc1": 150, "fc2": 150, "fc3": 500, "head": 500}
    expected = allocate_multipliers(plan["noise_multiplier"], {b: blocks.sizes[b] * c_b**2 / cohorts[b] ** 2
                                                               for b in cohorts})
    assert alloc["multipliers"] == pytest.approx(expected)
    assert {b["block"]: b["noise_multiplier"] for b in plan["blocks"]} == pytest.approx(expected)
    splits = {s["split"]: s for s in plan["splits"]}
    assert splits[0]["epsilon"] == pytest.approx(plan["epsilon"], rel=1e-6) and splits[0]["epsilon"] <= 4.0 + 1e-9
    assert splits[2]["epsilon"] < splits[0]["epsilon"]


def test_distributed_noise_names_each_device_share_and_the_multiplier_as_survivors_vary(tmp_path: Path) -> None:
    """--noise distributed: the same multiplier z; shares sized for 90% of each cohort give z sqrt(s / 0.9)
    with a share s surviving, so all surviving spends less than the target and the floor (70%) more."""
    from edgetrain.cli.dp_plan import fleet_blocks, privacy_plan

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    kw = dict(devices=10000, per_round=None, rate=None, rounds=None, target_epsilon=4.0, delta=None, clip=1.0,
              fleet=fleet_blocks(str(fleet)), accountant="rdp")
    central = privacy_plan(**kw)
    plan = privacy_plan(**kw, noise="distributed", min_survivors=0.7, expected_survivors=0.9)
    z, d = plan["noise_multiplier"], plan["distributed"]
    assert z == central["noise_multiplier"] and central["noise"] == "central" and "distributed" not in central
    cases = {c["survivors"]: c for c in d["cases"]}
    assert set(cases) == {1.0, 0.9, 0.7}
    for share, case in cases.items():
        assert case["noise_multiplier"] == pytest.approx(z * (share / 0.9) ** 0.5)
        assert case["epsilon"] == pytest.approx(epsilon_for(case["noise_multiplier"], 0.05, 50, 1e-5,
                                                            accountant="rdp"))
    assert cases[1.0]["epsilon"] < plan["epsilon"] <= 4.0 < cases[0.7]["epsilon"]
    blocks = {b["block"]: b for b in plan["blocks"]}
    assert d["share_stddev"]["fc1"] == pytest.approx(blocks["fc1"]["sum_stddev"] / (0.9 * 150) ** 0.5)
    out = edgetrain("--devices", "1000", "--per-round", "100", "--rounds", "10", "--target-epsilon", "8",
                    "--noise", "distributed", "--expected-survivors", "0.5")
    assert out.returncode != 0 and "--expected-survivors" in out.stderr + out.stdout


@pytest.mark.slow
def test_plans_that_cannot_work_are_refused_in_one_line(tmp_path: Path) -> None:
    out = edgetrain("--devices", "1000", "--rate", "1", "--rounds", "1000", "--target-epsilon", "0.05")
    assert out.returncode == 1
    first = out.stderr.splitlines()[0]
    assert first.startswith("edgetrain dp-plan: target epsilon 0.05 cannot be reached in 1000 rounds at rate 1")
    assert "Traceback" not in out.stderr

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.replace("fraction = 0.05", "fraction = 0.1"))  # 100 devices: 10 a round, 3 of them strong
    small = edgetrain("--blocks-from-fleet", str(fleet), "--target-epsilon", "8", "--accountant", "rdp")
    assert small.returncode == 1
    assert small.stderr.splitlines()[0].startswith(
        "edgetrain dp-plan: block fc1 expects 3 devices per round, under the 10 a noised mean needs")
    # The plan is printed for people first: the multiplier, the table per block and per split, the refusals.
    assert "noise multiplier" in small.stdout and "per coordinate of the mean update" in small.stdout
    assert "fc1" in small.stdout and "Per split" in small.stdout and "refused:" in small.stdout

    delta = edgetrain("--devices", "100", "--rate", "0.5", "--rounds", "10", "--target-epsilon", "8", "--delta", "0.05")
    assert delta.returncode == 1 and "delta 0.05 is not below 1/N = 0.01" in delta.stderr
