"""A paper's fleet aggregates as the paper does: no norm bound, no direction trust, no validation before
commit, and the plain sample-weighted mean (``max_weight_share = 1``, no cap on one device's weight), for both
methods it compares (``edgetrain emulate --strategy width`` keeps the option)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.cli.emulate import _server_config
from emulator.fleet import load_fleet
from orchestrator.strategies import make_strategy, strategy_class
from orchestrator.strategies.base import DEFAULT_WEIGHT_SHARE
from orchestrator.strategies.options import option_specs

FLEETS = Path(__file__).resolve().parents[1] / "profiles" / "fleets"
#: Fleets that reproduce a paper's numbers: their [training] turns the server's influence bounds off.
PAPER_FLEETS = sorted(p for p in FLEETS.glob("*.toml") if "norm_bound = 0.0" in p.read_text())


def test_there_are_paper_fleets() -> None:
    assert len(PAPER_FLEETS) >= 20 and any(p.name == "femnist-75weak.toml" for p in PAPER_FLEETS)


@pytest.mark.parametrize("path", PAPER_FLEETS, ids=lambda p: p.stem)
def test_a_paper_fleet_averages_without_the_weight_cap(path: Path) -> None:
    fleet = load_fleet(path)
    assert fleet.training.max_loss_rise == 0.0 and not fleet.training.direction_trust
    if "max_weight_share" in option_specs(strategy_class(fleet.training.strategy)):
        assert fleet.strategy_options.get("max_weight_share") == 1.0
        assert make_strategy(fleet.training.strategy, **fleet.strategy_options).max_weight_share == 1.0


def test_width_reduction_takes_the_cap_and_defaults_to_the_servers() -> None:
    assert make_strategy("width").max_weight_share == DEFAULT_WEIGHT_SHARE
    assert make_strategy("width", max_weight_share=1.0).max_weight_share == 1.0


def test_another_strategy_on_the_command_line_keeps_the_options_it_takes(tmp_path: Path) -> None:
    fleet = load_fleet(FLEETS / "embracing-femnist-75weak.toml")
    config, _ = _server_config(fleet, tmp_path, rounds=2, data_root=None, deadline=60.0, strategy="width", resume=False)
    assert (config.strategy, dict(config.strategy_options)) == ("width", {"max_weight_share": 1.0})
    prioritized = load_fleet(FLEETS / "prioritized-mnist.toml")  # FedALIGN's options: FedAvg takes none of them
    assert prioritized.strategy_options and not set(prioritized.strategy_options) & set(option_specs(strategy_class("fedavg")))
    config, _ = _server_config(prioritized, tmp_path, rounds=2, data_root=None, deadline=60.0, strategy="fedavg",
                               resume=False)
    assert (config.strategy, dict(config.strategy_options)) == ("fedavg", {})
