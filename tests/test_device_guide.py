"""docs/device-guide.md stays true: every Python snippet runs, every config file is one the device
accepts, and its key table is the declaration of the device's settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.settings import load_settings, setting_key, settings_fields, settings_markdown

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


def test_the_key_table_is_the_declaration() -> None:
    """The guide's table is what ``python -m edge_sdk.settings --markdown`` prints: every option of
    the device command, with its type, default and the devices that honour it."""
    start = GUIDE.index("<!-- the key table: python -m edge_sdk.settings --markdown -->\n")
    end = GUIDE.index("<!-- end of the key table -->")
    table = GUIDE[GUIDE.index("\n", start) + 1:end]
    assert table == settings_markdown()
    for f in settings_fields(wrapper=True):
        assert f"| `{setting_key(f)}` |" in table
    assert "docs/device-guide.md" in (ROOT / "README.md").read_text()
