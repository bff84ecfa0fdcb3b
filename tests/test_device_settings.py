"""The device's settings are one record (edge_sdk.settings.DeviceSettings), and everything else
follows from it: the key table the JavaScript device reads, ``--print-settings``, the API (the same
record, its own fields marked), the emulator's launch record (a typed subset of it), and one error
type shared with the server."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from edge_sdk import settings as declared
from edge_sdk.settings import (FOREVER, SDKS, TABLE_FILE, DeviceSettings, SettingError, check_setting, load_settings,
                               setting_default, settings_table)
from emulator.launch import LAUNCH_SETTINGS, DeviceLaunch
from orchestrator import config as server_config

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {"key", "field", "type", "default", "choices", "min", "help", "sdks"}


def _device(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_sdk", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_key_table_file_is_the_declaration() -> None:
    """edge_sdk/device_settings.json is what ``python -m edge_sdk.settings`` writes from the declaration."""
    table = json.loads(TABLE_FILE.read_text())
    assert table == settings_table() and TABLE_FILE.read_text() == declared.table_text()
    assert table["version"] == 1
    keyed = [f.name for f in dataclasses.fields(DeviceSettings) if not f.metadata["api"]]
    fields = set(keyed)
    assert [row["field"] for row in table["settings"]] == keyed  # every setting but the API's own, in order
    api = {f.name for f in dataclasses.fields(DeviceSettings) if f.metadata["api"]}
    assert {"secret", "warm_tails", "hello_ext", "trim_memory", "frame_size"} <= api
    for row in table["settings"]:
        assert set(row) == ROW_KEYS and row["field"] in fields, row
        assert row["type"] in ("str", "int", "float", "bool", "size", "list") and row["help"], row
        assert row["sdks"] and set(row["sdks"]) <= set(SDKS), row
        assert row["min"] is None or isinstance(row["min"], (int, float)), row
        if row["choices"]:
            assert row["default"] in row["choices"], row
    by_key = {row["key"]: row for row in table["settings"]}
    assert by_key["reconnect-retries"] == {**by_key["reconnect-retries"], "type": "int", "default": -1, "min": -1,
                                           "sdks": ["python", "javascript"]}
    assert by_key["budget"]["type"] == "size" and by_key["label"]["type"] == "list" and by_key["label"]["default"] == []
    # Threads and cores are two settings: the runtimes' threads, the cores declared to the planner.
    assert by_key["threads"]["default"] == 1 and by_key["cores"] == {**by_key["cores"], "default": None, "min": 1}
    assert by_key["budget"]["field"] == "budget_bytes" and by_key["payload-cache-size"]["field"] == "payload_cache_bytes"
    assert by_key["runtime"]["sdks"] == ["javascript"] and by_key["backend"]["sdks"] == ["python"]
    check = subprocess.run([sys.executable, "-m", "edge_sdk.settings", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_print_settings_resolves_defaults_file_and_command_line(tmp_path: Path) -> None:
    config = tmp_path / "device.toml"
    config.write_text('id = "board-7"\nbudget = "300MiB"\nlabel = ["site=lab"]\nreconnect_retries = 5\n'
                      'runtime = "web"\nthreads = 2\n')
    out = _device("--config", str(config), "--threads", "3", "--print-settings")
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert list(printed) == [row["key"] for row in settings_table()["settings"]]
    assert printed["id"] == "board-7" and printed["budget"] == 300 << 20 and printed["label"] == ["site=lab"]
    assert printed["threads"] == 3  # the command line wins over the file
    assert printed["reconnect-retries"] == 5 and printed["reconnect-max-delay"] == 30.0 and printed["backend"] == "auto"
    assert printed["runtime"] == "web"  # the JavaScript device's key: accepted, with a warning
    assert "runtime: a setting of the javascript device only; this device ignores it" in out.stderr
    bad = _device("--config", str(config), "--budget", "plenty", "--print-settings")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines()[-1].startswith("error: --budget: must be a size (bytes, or with a unit")
    config.write_text('id = "d"\nthreads = 0\n')
    bad = _device("--config", str(config), "--print-settings")
    assert bad.returncode == 2 and f"{config}: threads: must be >= 1, got 0" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_the_api_and_the_emulator_hold_the_one_record() -> None:
    # The launch record is a typed subset of the settings: the same fields, types and defaults, first.
    launch = dataclasses.fields(DeviceLaunch)
    assert tuple(f.name for f in launch[:len(LAUNCH_SETTINGS)]) == LAUNCH_SETTINGS == DeviceLaunch.SETTINGS
    hints = declared._HINTS
    for f in launch[:len(LAUNCH_SETTINGS)]:
        assert f.type is hints[f.name] and f.metadata == declared._FIELDS[f.name].metadata, f.name
        if f.name in ("device_id", "budget_bytes", "client", "num_clients"):  # a launch names these
            assert f.default is f.default_factory is dataclasses.MISSING, f.name
        else:
            assert f.default_factory is not dataclasses.MISSING or f.default == setting_default(f.name), f.name
    secret = DeviceLaunch("d", 1, 0, 1, secret="s3cr3t", labels={"priority": "1"}, cores=4)
    assert "s3cr3t" not in repr(secret)
    settings = DeviceSettings(**secret.settings(), server="ws://127.0.0.1:9")
    assert (settings.secret, settings.labels, settings.cores, settings.threads) == ("s3cr3t", {"priority": "1"}, 4, 1)
    with pytest.raises(TypeError, match="declares \\['threads'\\] again"):
        declared.settings_subset("threads")(type("Twice", (), {"__annotations__": {"threads": "int"}}))
    # The API's old name is the same record, with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from edge_sdk.client import DeviceConfig
    assert DeviceConfig is DeviceSettings and "DeviceSettings" in str(caught[-1].message)
    # What the machine offers, where the API leaves it: the budget and cores, resolved for the client.
    machine = DeviceSettings("ws://127.0.0.1:9", "d").resolved()
    assert machine.budget_bytes > 0 and machine.cores >= 1 and machine.threads == 1
    with pytest.warns(DeprecationWarning, match="budget_bytes"):
        assert machine.budget == machine.budget_bytes  # the field's earlier name
    # One reconnect policy everywhere: a device is a service that retries forever, backing off to 30 s.
    assert setting_default("reconnect_retries") == FOREVER and setting_default("reconnect_max_delay") == 30.0
    assert DeviceSettings("ws://127.0.0.1:9", "d", 1).reconnect_retries == FOREVER
    # The same value is refused the same way by the API, the launch record and the command line.
    with pytest.raises(SettingError, match=r"^threads: must be >= 1, got 0$"):
        DeviceSettings("ws://127.0.0.1:9", "d", 1, threads=0)
    with pytest.raises(ValueError, match=r"^d: threads: must be >= 1, got 0$"):
        DeviceLaunch("d", 1, 0, 1, threads=0)
    with pytest.raises(SettingError, match=r"^--threads: must be >= 1, got 0$"):
        load_settings({"device_id": "d", "threads": "0"})
    with pytest.raises(ValueError, match="backend: must be one of auto, torch, onnxruntime"):
        DeviceLaunch("d", 1, 0, 1, backend="tflite")
    with pytest.raises(SettingError, match="not a websocket URL"):
        DeviceSettings("localhost:8765", "d", 1)
    with pytest.raises(SettingError, match=r"^--label: expected KEY=VALUE, got 'priority'$"):
        load_settings({"device_id": "d", "labels": ["priority"]})


def test_device_and_server_share_one_converter_and_one_error_type() -> None:
    from orchestrator import values

    assert server_config.SettingError is SettingError and values.convert is declared.convert
    with pytest.raises(SettingError) as server:
        server_config.ServerConfig(rounds=0)
    with pytest.raises(SettingError) as device:
        check_setting("threads", 0)
    assert server.value.problem == device.value.problem == "must be >= 1, got 0"
    assert check_setting("budget", "1GiB", text=True) == 1 << 30
    assert check_setting("labels", "priority=1", text=True) == {"priority": "1"}
    assert load_settings({"device_id": "d", "budget": "1GiB"}).budget_bytes == 1 << 30  # by key, as a file says it
    assert check_setting("label_column", 3, text=True) == "3"
