"""docs/device-guide.md stays true: every Python snippet runs, every config file is one the device
accepts, and every option of the device command is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.settings import load_settings, option_flag, settings_fields

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "device-guide.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", GUIDE, flags=re.S | re.M)


@pytest.mark.parametrize("snippet", _blocks("python"), ids=lambda s: s.splitlines()[0][:40])
def test_python_snippets_run(snippet: str, tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]


def test_config_files_are_accepted(tmp_path: Path) -> None:
    files = _blocks("toml")
    assert files
    for n, text in enumerate(files):
        path = tmp_path / f"device-{n}.toml"
        path.write_text(text)
        settings = load_settings({}, path)
        assert settings.device_id


def test_every_option_is_documented() -> None:
    for f in settings_fields(wrapper=True):
        assert f"`{option_flag(f)}" in GUIDE or f", `{option_flag(f)}" in GUIDE, option_flag(f)
    assert "docs/device-guide.md" in (ROOT / "README.md").read_text()
