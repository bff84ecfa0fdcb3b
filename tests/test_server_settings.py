"""A strategy's server settings (``Strategy.server_settings``): the prioritized strategies turn the norm
bound off where the user left the server's default, keep a value the user gave, and ``edgetrain
serve`` / ``edgetrain emulate`` say so in one line each."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.cli import commands  # noqa: F401  (registers the commands)
from orchestrator.config import ServerConfig
from orchestrator.strategies import FedALIGN, VaRSeL
from orchestrator.strategies.server_settings import apply_server_settings


def test_a_prioritized_strategy_turns_the_norm_bound_off_unless_the_user_set_it(tmp_path: Path):
    assert FedALIGN.server_settings is VaRSeL.server_settings
    base = ServerConfig(strategy="fedalign", store_dir=tmp_path)
    assert base.norm_bound == 1.0
    config, lines = apply_server_settings(base)
    assert config.norm_bound == 0.0 and len(lines) == 2 and "fedalign sets norm_bound 0.0" in lines[0]
    assert not config.direction_trust and "fedalign sets direction_trust False" in lines[1]
    kept, lines = apply_server_settings(base, given={"norm_bound"}, spell=lambda n: "--" + n.replace("_", "-"))
    assert kept.norm_bound == 1.0 and "keeping --norm-bound 1.0 as given" in lines[0]
    other, lines = apply_server_settings(ServerConfig(strategy="fedavg", store_dir=tmp_path))
    assert other.norm_bound == 1.0 and lines == []
    off, lines = apply_server_settings(ServerConfig(strategy="varsel", norm_bound=0.0, direction_trust=False,
                                                    store_dir=tmp_path))
    assert off.norm_bound == 0.0 and lines == []  # already what it needs: nothing to say


def test_serve_says_which_default_a_prioritized_strategy_turns_off(tmp_path: Path):
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--check", "--strategy", "fedalign", "--store", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["norm_bound"] == 0.0
    assert "fedalign sets --norm-bound 0.0 (the server's default: 1.0)" in result.stderr
    given = runner.invoke(app, ["serve", "--check", "--strategy", "varsel", "--norm-bound", "1.0",
                                "--store", str(tmp_path)])
    assert json.loads(given.stdout)["config"]["norm_bound"] == 1.0
    assert "keeping --norm-bound 1.0 as given" in given.stderr


def test_emulate_applies_them_where_the_fleet_left_the_default(tmp_path: Path, capsys):
    from edgetrain.cli.emulate import _strategy_settings
    from emulator.fleet import FLEETS_DIR, load_fleet
    from emulator.schedule import server_config

    text = (FLEETS_DIR / "prioritized-mnist.toml").read_text()
    assert "norm_bound = 0.0" in text
    for name, body, want in (("left", text.replace("norm_bound = 0.0\n", ""), 0.0),
                             ("given", text.replace("norm_bound = 0.0", "norm_bound = 1.0"), 1.0)):
        path = tmp_path / f"{name}.toml"
        path.write_text(body)
        fleet = load_fleet(path)
        config = _strategy_settings(fleet, server_config(fleet, store_dir=tmp_path / name))
        assert config.norm_bound == want
    err = capsys.readouterr().err
    assert "fedalign sets training.norm_bound 0.0" in err and "keeping training.norm_bound 1.0 as given" in err
