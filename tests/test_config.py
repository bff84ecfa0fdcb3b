"""One typed configuration: ServerConfig's fields declare type, default, help and constraint once;
``edgetrain serve``'s options and a fleet file's ``[training]`` table follow from them, and each front end
names a bad value in its own spelling (``--lr-decay``, ``training.lr_decay``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import pytest
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.cli import commands  # noqa: F401  (registers the commands)
from edgetrain.cli.settings import cli_fields, option_spelling
from emulator.fleet import FleetError, parse_fleet
from orchestrator.config import TRAINING_SETTINGS, ServerConfig, SettingError
from orchestrator.values import Range, convert


def check(*argv: str) -> dict:
    result = CliRunner().invoke(app, ["serve", "--check", *argv])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["config"]


def test_serve_defaults_are_the_dataclass_defaults(tmp_path: Path):
    printed = check("--store", str(tmp_path))
    expected = json.loads(json.dumps(ServerConfig(store_dir=tmp_path, port=8765).to_dict(), default=str))
    assert printed == expected  # port: the one option with its own default (a fixed port to serve on)


def test_every_setting_has_help_and_every_option_sets_its_field(tmp_path: Path):
    assert all(f.metadata.get("help") for f in dataclasses.fields(ServerConfig))
    argv, want = [], {}
    for f in cli_fields():
        if f.type == "bool" and f.name != "secure_aggregation":  # refused beside --dp: below
            argv.append(option_spelling(f.name))
            want[f.name] = True
    assert {"resume", "require_credentials"} <= set(want)
    printed = check("--store", str(tmp_path), "--rounds", "7", "--deadline", "9.5", "--chunk-disk", "2MiB",
                    "--lr-decay-at", "900,800", "--norm-bound-action", "reject", *argv)
    assert (printed["rounds"], printed["deadline_s"], printed["chunk_disk_bytes"]) == (7, 9.5, 2 << 20)
    assert printed["lr_decay_at"] == [800, 900] and printed["norm_bound_action"] == "reject"
    assert all(printed[k] is True for k in want)


def test_serve_help_lists_every_strategy():
    from orchestrator.strategies import STRATEGY_NAMES

    result = CliRunner().invoke(app, ["serve", "--help"], terminal_width=400)
    assert result.exit_code == 0
    for name in STRATEGY_NAMES:
        assert name in result.output


@pytest.mark.parametrize("argv, line", [
    (["--lr-decay", "3"], "edgetrain serve: --lr-decay: must be in (0, 1], got 3.0"),
    (["--rounds", "0"], "edgetrain serve: --rounds: must be >= 1, got 0"),
    (["--fraction", "half"], "edgetrain serve: --fraction: must be a number in (0, 1], got 'half'"),
    (["--norm-bound-action", "drop"], "edgetrain serve: --norm-bound-action: must be one of clip, reject, got 'drop'"),
    (["--tls-key", "k.pem"], "edgetrain serve: --tls-key: a private key needs its certificate (tls_cert)"),
    (["-O", "trim"], "edgetrain serve: --strategy-option: a strategy option is KEY=VALUE, got 'trim'"),
    (["--secure-aggregation", "--strategy", "varsel"], "edgetrain serve: --secure-aggregation: strategy varsel combines "
     "by a rule of its own (external devices weighted to minimise the gradient variance, from compare reports); "
     "secure aggregation sums whole blocks and runs a strategy that declares a weighted mean (Strategy.combines)"),
    (["--secure-aggregation", "--dp", "--dp-adaptive-clip"], "edgetrain serve: --secure-aggregation: "
     "dp_adaptive_clip needs each update's norm in the clear; distributed noise keeps a fixed clip"),
    (["--strategy", "fedprox"], "edgetrain serve: unknown strategy 'fedprox'; known: fedavg, embracingfl, fedsubavg, "
                                "fedalign, varsel, width, or package.module:Class"),
])
def test_serve_refuses_a_bad_value_with_one_line_before_it_listens(argv: list[str], line: str, tmp_path: Path):
    # No --check: the command would listen on port 8765 if the value passed.
    out = subprocess.run([sys.executable, "-m", "edgetrain", "serve", "--store", str(tmp_path), *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [line], out.stderr
    assert out.stdout == "" and not (tmp_path / "journal.sqlite").exists()


FLEET = {"fleet": {"model": "tiny"}, "groups": [{"class": "pi-4-2gb", "count": 1}]}


@pytest.mark.parametrize("key, value, problem", [
    ("lr_decay", 2.0, "must be in (0, 1], got 2.0"),
    ("momentum", 1.0, "must be in [0, 1), got 1.0"),
    ("rounds", "5", "must be an integer (a whole number) >= 1, got '5'"),  # TOML gives types: text is not parsed
    ("strategy", 3, "must be a string, got 3"),
])
def test_a_fleet_names_the_same_setting_training_dot_name(key: str, value: object, problem: str):
    with pytest.raises(FleetError) as info:
        parse_fleet({**FLEET, "training": {key: value}})
    assert str(info.value) == f"<fleet>: training.{key}: {problem}"
    with pytest.raises(SettingError) as direct:
        ServerConfig(**{key: value})
    assert (direct.value.name, direct.value.problem) == (key, problem)


def test_a_fleet_training_table_gives_the_training_settings_only():
    fleet = parse_fleet({**FLEET, "training": {"rounds": 3, "lr_decay_at": [900, 800], "lr": 1}})
    assert isinstance(fleet.training, ServerConfig)
    assert (fleet.training.rounds, fleet.training.lr_decay_at, fleet.training.lr) == (3, (800, 900), 1.0)
    with pytest.raises(FleetError, match="training.port: unknown key"):
        parse_fleet({**FLEET, "training": {"port": 1}})
    assert set(TRAINING_SETTINGS) <= {f.name for f in dataclasses.fields(ServerConfig)}


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize("value, hint, expected", [
    ("On", bool, True), ("no", bool, False), (" 7 ", int, 7), ("-2", int, -2), ("1e-3", float, 1e-3),
    (3, float, 3.0), ("median", Literal["mean", "median"], "median"), ("BLUE", Colour, Colour.BLUE),
    ("red", Colour, Colour.RED), ("a, b,", tuple[str, ...], ("a", "b")), ([1, 2], tuple[int, ...], (1, 2)),
    ("none", Optional[int], None), ("4", Optional[int], 4), ("x", str, "x"), ("runs/a", Path, Path("runs/a")),
    ("0.5", Annotated[float, Range(0, 1)], 0.5),
])
def test_convert_types_text_and_typed_values(value, hint, expected):
    out = convert(value, hint)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize("value, hint, message", [
    ("maybe", bool, "must be true or false (also 1/0, yes/no, on/off), got 'maybe'"),
    ("2.5", int, "must be an integer (a whole number), got '2.5'"),
    (True, int, "must be an integer (a whole number), got True"),
    ("mode", Literal["mean", "median"], "must be one of mean, median, got 'mode'"),
    ("green", Colour, "must be one of RED, BLUE, got 'green'"),
    ("1,x", tuple[int, ...], "must be a list of integers (comma-separated in text), got '1,x'"),
    ("0.5", Annotated[float, Range(0, 0.5, high_open=True)], "must be in [0, 0.5), got 0.5"),
    ("nan", Annotated[float, Range(0)], "must be >= 0, got nan"),
])
def test_convert_says_what_it_accepts(value, hint, message):
    with pytest.raises(ValueError) as info:
        convert(value, hint)
    assert str(info.value) == message


def test_typed_values_are_not_parsed_from_text_when_told():
    with pytest.raises(ValueError, match="got '3'"):
        convert("3", int, text=False)
    assert convert(3, float, text=False) == 3.0
