"""The device's settings are declared once (edge_sdk.settings.DeviceSettings), and everything else
follows from the declaration: the key table the JavaScript device reads, ``--print-settings``, the
API's and the emulator's defaults and checks, and one error type shared with the server."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk import settings as declared
from edge_sdk.client import DeviceConfig
from edge_sdk.settings import (FOREVER, SDKS, TABLE_FILE, DeviceSettings, SettingError, check_setting, load_settings,
                               setting_default, settings_table)
from emulator.launch import SHARED_SETTINGS, DeviceLaunch
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
    fields = {f.name for f in dataclasses.fields(DeviceSettings)}
    assert [row["field"] for row in table["settings"]] == [f.name for f in dataclasses.fields(DeviceSettings)]
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
    assert by_key["budget"]["type"] == "size" and by_key["label"]["type"] == "list"
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


def test_the_api_and_the_emulator_take_the_declared_defaults_and_checks() -> None:
    api = {f.name: f for f in dataclasses.fields(DeviceConfig)}
    for name in ("device_class", "token", "storage", "threads", "reconnect_retries", "reconnect_max_delay", "backend"):
        assert api[name].default == setting_default(name), name
    for name in SHARED_SETTINGS:
        f = next(f for f in dataclasses.fields(DeviceLaunch) if f.name == name)
        assert f.default is dataclasses.MISSING or f.default == setting_default(name), name
    # One reconnect policy everywhere: a device is a service that retries forever, backing off to 30 s.
    assert setting_default("reconnect_retries") == FOREVER and setting_default("reconnect_max_delay") == 30.0
    assert DeviceConfig("ws://127.0.0.1:9", "d", 1).reconnect_retries == FOREVER
    # The same value is refused the same way by the API, the launch record and the command line.
    with pytest.raises(SettingError, match=r"^threads: must be >= 1, got 0$"):
        DeviceConfig("ws://127.0.0.1:9", "d", 1, threads=0)
    with pytest.raises(ValueError, match=r"^d: threads: must be >= 1, got 0$"):
        DeviceLaunch("d", 1, 0, 1, threads=0)
    with pytest.raises(SettingError, match=r"^--threads: must be >= 1, got 0$"):
        load_settings({"device_id": "d", "threads": "0"})
    with pytest.raises(ValueError, match="backend: must be one of auto, torch, onnxruntime"):
        DeviceLaunch("d", 1, 0, 1, backend="tflite")
    with pytest.raises(SettingError, match="not a websocket URL"):
        DeviceConfig("localhost:8765", "d", 1)


def test_device_and_server_share_one_converter_and_one_error_type() -> None:
    from orchestrator import values

    assert server_config.SettingError is SettingError and values.convert is declared.convert
    with pytest.raises(SettingError) as server:
        server_config.ServerConfig(rounds=0)
    with pytest.raises(SettingError) as device:
        check_setting("threads", 0)
    assert server.value.problem == device.value.problem == "must be >= 1, got 0"
    assert check_setting("budget", "1GiB", text=True) == 1 << 30
    assert check_setting("labels", "priority=1", text=True) == ["priority=1"]
    assert check_setting("label_column", 3, text=True) == "3"
