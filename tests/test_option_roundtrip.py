"""Every option of every registered strategy, through each front end: ``edgetrain serve --check -O``,
a fleet file's ``[strategy]`` table, and the Python API (by name and by class). Each gives the same
typed value to the constructor and the same built strategy.

The cases are generated from the constructors' signatures (orchestrator.strategies.options), so an
option added to a strategy is covered here without editing this file; an option whose type this file
cannot make a sample value for fails the test, asking for one.
"""

from __future__ import annotations

import enum
import json
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.cli import commands  # noqa: F401  (registers the commands)
from emulator.fleet import load_fleet
from emulator.schedule import server_config
from orchestrator.strategies import STRATEGY_NAMES, make_strategy, strategy_class
from orchestrator.strategies.options import OptionSpec, option_specs
from orchestrator.values import Range, split_annotated


def _plain(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """The first convertible member of a union (None and callables left out), with its constraints."""
    base, extras = split_annotated(hint)
    if get_origin(base) in (Union, types.UnionType):
        return _plain(next(m for m in get_args(base) if m is not type(None) and get_origin(m) is not Callable))
    return base, extras


def sample(spec: OptionSpec) -> Any:
    """A value of the option's type, within its constraint, other than its default."""
    base, extras = _plain(spec.hint)
    ranges = [e for e in extras if isinstance(e, Range)]
    low = ranges[0].low if ranges and ranges[0].low is not None else 0
    high = ranges[0].high if ranges else None
    if base is bool:
        return not spec.default
    if base is int:
        return int(low) + 3 if int(low) + 3 != spec.default else int(low) + 4
    if base is float:
        value = (low + high) / 2 if high is not None else low + 0.75
        return value if value != spec.default else value / 2
    if base is str:
        return "alt-label"
    if get_origin(base) is Literal:
        return next(c for c in get_args(base) if c != spec.default)
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return next(m for m in base if m != spec.default)
    if get_origin(base) is tuple and split_annotated(get_args(base)[0])[0] is str:
        return ("dev-a", "dev-b")
    pytest.fail(f"no sample value for option {spec.name} ({spec.hint!r}): add one to tests/test_option_roundtrip.py")


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return value.name if isinstance(value, enum.Enum) else str(value)


def as_toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if isinstance(value, (str, enum.Enum)):
        return json.dumps(as_text(value))
    return repr(value)


def state(strategy: object) -> dict[str, str]:
    """What a built strategy holds, as ``edgetrain serve --check`` prints it."""
    return {k: repr(v) for k, v in sorted(vars(strategy).items())}


CASES = [(name, spec) for name in STRATEGY_NAMES for spec in option_specs(strategy_class(name)).values()]


def test_every_registered_strategy_has_its_options_covered():
    assert {name for name, _ in CASES} == set(STRATEGY_NAMES) >= {"fedavg", "embracingfl", "fedsubavg", "fedalign",
                                                                   "varsel", "width"}
    assert len(CASES) >= 30


@pytest.mark.parametrize("name, spec", CASES, ids=[f"{n}-{s.name}" for n, s in CASES])
def test_option_round_trips_through_cli_fleet_and_api(name: str, spec: OptionSpec, tmp_path: Path):
    value = sample(spec)
    api = make_strategy(name, **{spec.name: value})
    direct = strategy_class(name)(**{spec.name: value})
    assert state(api) == state(direct)
    assert state(api) != state(make_strategy(name)), f"{name}: option {spec.name}={value!r} changed nothing"

    result = CliRunner().invoke(app, ["serve", "--check", "--strategy", name, "-O", f"{spec.name}={as_text(value)}",
                                      "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["strategy"] == name and printed["state"] == state(api)
    assert printed["config"]["strategy_options"] == {spec.name: json.loads(json.dumps(value, default=as_text))}

    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        f'[fleet]\nmodel = "tiny"\n[training]\nstrategy = "{name}"\n[strategy]\n{spec.name} = {as_toml(value)}\n'
        '[[groups]]\nclass = "pi-4-2gb"\ncount = 1\n')
    fleet = load_fleet(fleet_file)
    typed = fleet.strategy_options[spec.name]
    assert typed == value and type(typed) is type(value)
    config = server_config(fleet, store_dir=tmp_path / "run")
    assert state(make_strategy(config.strategy, **config.strategy_options)) == state(api)


def test_text_values_of_every_option_match_their_typed_values():
    # -O gives text; a fleet may give the same text instead of a TOML value: both convert alike.
    for name, spec in CASES:
        value = sample(spec)
        from_text = make_strategy(name, **{spec.name: as_text(value)})
        assert state(from_text) == state(make_strategy(name, **{spec.name: value})), (name, spec.name)


def test_callable_epsilon_still_passes_through_the_python_api():
    schedule = lambda r: 1.0 / r  # noqa: E731
    strategy = make_strategy("fedalign", epsilon=schedule)
    assert strategy._epsilon_fn is schedule and math.isnan(strategy.epsilon)
