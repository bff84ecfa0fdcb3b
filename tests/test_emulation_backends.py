"""Emulation backends are one table (emulator.backends.EMULATION_BACKENDS) that
``run_emulation`` and ``edgetrain emulate`` choose from by the fleet's mode and ``--backend``.

A backend registered from outside the package (one row, a run function of the documented shape that
delegates to the lightweight backend's) runs a real fleet: a real orchestrator, a real worker process,
real websocket devices; options a backend does not take are refused before anything starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emulator import backends
from emulator.backends import (
    EMULATION_BACKENDS,
    EmulationBackend,
    emulation_backend,
    register_emulation_backend,
    where_choices,
)
from emulator.fleet import load_fleet
from emulator.runner import run_emulation
from emulator.schedule import server_config

FLEET = """
[fleet]
model = "tiny"
seed = 0

[training]
rounds = 2
fraction = 1.0
local_steps = 1
batch_size = 8

[emulation]
mode = "inline"
memory_cap = "none"
throttle_cpu = false

[[groups]]
name = "phone"
class = "mid-phone"
count = 2
"""

CALLS: list[dict] = []


async def run_inline(fleet, config, **options):
    """A backend of the documented shape: here, the lightweight backend's run under another name."""
    from emulator.lightweight import run_lightweight

    CALLS.append(options)
    return await run_lightweight(fleet, config, workers=1, **options)


def test_the_table_names_every_backend_and_where_it_runs() -> None:
    assert backends.emulation_modes() == ("processes", "lightweight")
    assert {n: (b.mode, b.where) for n, b in EMULATION_BACKENDS.items()} == {
        "processes": ("processes", "local"), "lightweight": ("lightweight", "local"), "ray": ("lightweight", "ray")}
    assert where_choices() == ("local", "ray")
    assert emulation_backend("processes").name == "processes"
    assert emulation_backend("lightweight", "ray").name == "ray"
    with pytest.raises(ValueError, match="backend 'ray' runs emulation.mode 'lightweight', not 'processes'"):
        emulation_backend("processes", "ray")
    with pytest.raises(ValueError, match="backend must be one of local, ray, got 'spark'"):
        emulation_backend("lightweight", "spark")
    with pytest.raises(ValueError, match="workers do\\(es\\) not apply to the processes emulation backend"):
        EMULATION_BACKENDS["processes"].check({"workers": 2, "rss_guard": True})
    assert EMULATION_BACKENDS["processes"].check({"workers": None, "rss_guard": False}) == {"rss_guard": False}


def test_a_registered_backend_runs_a_real_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "EMULATION_BACKENDS", dict(EMULATION_BACKENDS))
    register_emulation_backend(EmulationBackend("inline", "inline", "local", f"{__name__}:run_inline",
                                                frozenset(), "two devices in one worker, for this test"))
    with pytest.raises(ValueError, match="already registered"):
        register_emulation_backend(backends.EMULATION_BACKENDS["inline"])
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=60)
    run = asyncio.run(run_emulation(fleet, config, stderr_dir=tmp_path / "logs"))
    assert [h["round"] for h in run.history] == [1, 2]
    assert sorted(d.device for d in run.devices) == ["phone-000", "phone-001"]
    assert CALLS and "stderr_dir" in CALLS[-1] and set(CALLS[-1]) <= backends.COMMON_OPTIONS  # only what it takes
    with pytest.raises(ValueError, match="workers do\\(es\\) not apply to the inline emulation backend"):
        asyncio.run(run_emulation(fleet, config, workers=2))


def test_the_command_refuses_an_option_its_backend_does_not_take() -> None:
    from edgetrain.cli import app
    from edgetrain.cli import commands  # noqa: F401  (registers the commands)

    result = CliRunner().invoke(app, ["emulate", "--fleet", "tiny-200", "--no-rss-guard"])
    shown = " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message
    assert result.exit_code != 0 and "no memory caps to guard" in shown
