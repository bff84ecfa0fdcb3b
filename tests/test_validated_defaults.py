"""Shipped defaults are the validated ones: ``make_strategy(name)`` gives exactly the settings
``bench/validated.toml`` records beside the benchmarks, and the benchmarks run those settings (they
set only their task's options, and the papers' aggregation where the record says so); so do the
server's transfer settings and the devices' payload store (``[defaults]``), which bench/round_bytes.py
ran."""

from __future__ import annotations

import inspect
import json
import tomllib
from pathlib import Path

import pytest

from orchestrator.strategies import STRATEGY_NAMES, make_strategy, strategy_class
from orchestrator.strategies.options import option_specs
from tests.shared_data import REPO

RECORD = tomllib.loads((REPO / "bench" / "validated.toml").read_text())


def _value(v: object) -> object:
    return None if v == "none" else v


def test_every_registered_strategy_has_a_validated_record():
    assert set(RECORD) - {"defaults"} == set(STRATEGY_NAMES)


def test_the_servers_transfer_defaults_are_the_validated_ones():
    from orchestrator.config import AUTO_UPDATE_CODEC, ServerConfig

    record = RECORD["defaults"]
    fields = ServerConfig.__dataclass_fields__
    for name, value in record["server"].items():
        assert fields[name].default == value, f"ServerConfig.{name} is {fields[name].default!r}; validated: {value!r}"
    assert AUTO_UPDATE_CODEC == record["auto_update_codec"]
    assert ServerConfig().update_codec == record["auto_update_codec"]
    assert ServerConfig(secure_aggregation=True).update_codec == "none"  # masked ring words: no codec


def test_the_rounds_defaults_are_the_validated_ones():
    """Pacing a slow device is on by default because bench/pacing.py ran it against cutting it."""
    from orchestrator.config import ServerConfig

    record = RECORD["defaults"]["rounds"]
    fields = ServerConfig.__dataclass_fields__
    settings = {k: v for k, v in record.items() if k not in ("benches", "evidence")}
    assert settings == {"straggler_pacing": True}
    for name, value in settings.items():
        assert fields[name].default == value, f"ServerConfig.{name} is {fields[name].default!r}; validated: {value!r}"
    source = (REPO / "bench" / "pacing.py").read_text()
    assert "straggler_pacing=lane == \"paced\"" in source  # both lanes: the default and its alternative


def test_a_secure_groups_mean_keeps_its_own_norm_by_default_as_validated():
    """bench/attacks.py ran both group norms on the same fleet; its --group-norm offers both and the
    server's default is the validated one."""
    from orchestrator.config import ServerConfig

    record = RECORD["defaults"]["secure_groups"]
    assert ServerConfig.__dataclass_fields__["secure_group_norm"].default == record["secure_group_norm"] == "own"
    source = (REPO / "bench" / "attacks.py").read_text()
    assert 'choices=("own", "reference")' in source and "group_norm=group_norm" in source


def test_the_devices_keep_their_payloads_by_default(tmp_path, monkeypatch):
    from edge_sdk.payload_store import PAYLOAD_CACHE_ENV, payload_folder
    from edge_sdk.settings import TABLE_FILE, setting_default

    for name, value in RECORD["defaults"]["device"].items():
        assert setting_default(name) == value
        row = next(r for r in json.loads(TABLE_FILE.read_text())["settings"] if r["field"] == name)
        assert row["default"] == value and "javascript" in row["sdks"]  # the Node device's default too
    monkeypatch.setenv(PAYLOAD_CACHE_ENV, str(tmp_path))
    folder = payload_folder("auto", "wss://Server.lan:8765", "board-7")
    assert folder == tmp_path / "server.lan-8765" / "board-7"
    assert payload_folder("off", "ws://h:1", "d") is None and payload_folder("/x", "ws://h:1", "d") == Path("/x")


def test_the_byte_benchmarks_ran_the_defaults():
    from bench import round_bytes

    record = RECORD["defaults"]
    server = {**record["server"], "update_codec": record["auto_update_codec"]}
    held, *codecs = round_bytes.SETTINGS[record["setting"]]
    assert held and dict(zip(("chunk_codec", "tail_codec", "graph_codec", "update_codec", "download_delta"),
                             codecs)) == server
    assert round_bytes.FLEET_SETTINGS["defaults"] == ("", "")  # the mixed fleet's defaults: no option at all
    serve, device = round_bytes.FLEET_SETTINGS["float32"]
    assert all(f"--{name.replace('_', '-')} none" in serve for name in server)  # its baseline turns each off
    assert device == "--payload-cache off"


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_make_strategy_defaults_are_the_validated_settings(name):
    record = RECORD[name]
    specs = option_specs(strategy_class(name))
    settings = {k: _value(v) for k, v in record["settings"].items()}
    # Every option is either a validated default or the task's own, never neither.
    assert set(specs) == set(settings) | set(record["task"]), name
    assert set(record["papers"]) <= set(settings)
    for option, value in settings.items():
        default = specs[option].default
        assert default is not inspect.Parameter.empty, f"{name}.{option} has no default"
        assert default == value, f"make_strategy({name!r}).{option} is {default!r}; validated: {value!r}"
    make_strategy(name)  # the defaults build


def test_fedalign_warms_up_by_default_and_its_threshold_is_the_validated_one():
    s = make_strategy("fedalign")
    assert s.warmup == 3 and s.relative and s.epsilon == 0.5 and s.eval_samples == 256


def _only(options: dict, allowed: set[str], what: str) -> None:
    assert set(options) <= allowed, f"{what} sets {sorted(set(options) - allowed)}, which are validated defaults"


def test_the_prioritized_benchmarks_run_the_defaults():
    from bench import natural_groups, prioritized
    from bench.prioritized_runner import ALGORITHMS, PAPERS_OPTIONS, STRATEGY

    mnist = prioritized.default_args()
    natural = natural_groups.build_parser().parse_args(["--task", "tcga"])
    for algorithm in ALGORITHMS:
        name = STRATEGY[algorithm]
        task = set(RECORD[name]["task"])
        _only(prioritized.bench_options(algorithm, mnist, 0), task, f"bench/prioritized.py ({algorithm})")
        _only(natural_groups.options(algorithm, natural, 0), task, f"bench/natural_groups.py ({algorithm})")
    for name, options in PAPERS_OPTIONS.items():
        _only(options, set(RECORD[name]["papers"]), "the papers' aggregation of bench/prioritized_runner.py")


def test_the_epsilon_grid_holds_the_default_and_runs_the_default_warmup():
    from bench import fedalign_epsilon
    from orchestrator.strategies.fedalign import DEFAULT_RELATIVE_EPSILON

    assert f"rel:{DEFAULT_RELATIVE_EPSILON:g}" in fedalign_epsilon.DEFAULT_GRID.split(",")
    args = fedalign_epsilon.build_parser().parse_args(["--task", "mnist"])
    for option, value in fedalign_epsilon.parse_grid(fedalign_epsilon.DEFAULT_GRID):
        _only(fedalign_epsilon.grid_options(args, option, value), {option}, "bench/fedalign_epsilon.py")


def test_the_embracing_fleets_set_only_the_papers_aggregation():
    from bench import embracing

    for setup in embracing.SETUPS.values():
        text = embracing.render_fleet(setup, embracing.CASES[6])
        options = tomllib.loads(text).get("strategy", {})
        for name in ("embracingfl", "width"):
            _only(options, set(RECORD[name]["papers"]), f"bench/embracing.py's {setup.dataset} fleets")
