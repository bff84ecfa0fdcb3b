"""Emulation backends are one table (emulator.backends.EMULATION_BACKENDS) of classes implementing
one interface (emulator.backend.EmulationBackend: start, wait, cancel), which ``run_emulation`` and
``edgetrain emulate`` choose from by the fleet's mode and ``--backend``.

A backend registered from outside the package (a class of this module: every device an asyncio task
of the emulator's own process) runs a real fleet: a real orchestrator, real websocket devices; options
a backend does not take are refused before anything starts, and the command line offers each
backend's options with the runs that take them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emulator import backends
from emulator.backend import EmulationBackend
from emulator.backends import (
    EMULATION_BACKENDS,
    backend_options,
    emulation_backend,
    register_emulation_backend,
    takers,
    where_choices,
)
from emulator.fleet import load_fleet
from emulator.lightweight import LightweightEmulator, WorkerHandle, WorkerSpec, run_worker, worker_devices
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

class InlineBackend(EmulationBackend):
    """Every device an asyncio task of the emulator's own process: the lightweight worker's loop
    (run_worker) run inline, recorded by the lightweight bookkeeping."""

    name = mode = "inline"
    summary = "every device a task of the emulator's own process"
    steps: list[str] = []

    async def prepare(self) -> None:
        devices = worker_devices(self.fleet, self.config, self.specs, self.schedule)
        self.handle = WorkerHandle(0, [devices[s.id] for s in self.specs])
        self.handle.stats.pid = os.getpid()
        self.book = LightweightEmulator(self.specs, [self.handle], self.recorder)
        self.stopping = asyncio.Event()
        self.steps.append("prepare")

    def on_server_event(self, kind: str, data: dict) -> None:
        self.book.on_server_event(kind, data)

    async def start(self, url: str) -> None:
        def emit(kind: str, data: dict) -> None:
            self.book.on_worker_event(self.handle, {"event": kind, **data})

        spec = WorkerSpec(0, tuple(self.handle.devices), self.data_root, stop_grace_s=5.0)
        self.task = asyncio.create_task(run_worker(spec, url, emit=emit, stop=self.stopping.wait))
        self.steps.append("start")

    async def cancel(self) -> None:
        self.book.finished = True
        self.stopping.set()
        await self.task
        self.steps.append("cancel")

    def result(self, history: list[dict]):
        return self.recorder.run(history, [s.id for s in self.specs], mode="lightweight",
                                 workers=[self.handle.to_dict()])


def test_the_table_names_every_backend_and_where_it_runs() -> None:
    assert backends.emulation_modes() == ("processes", "lightweight")
    assert {n: (b.mode, b.where) for n, b in EMULATION_BACKENDS.items()} == {
        "processes": ("processes", "local"), "lightweight": ("lightweight", "local"), "ray": ("lightweight", "ray")}
    assert all(issubclass(b, EmulationBackend) for b in EMULATION_BACKENDS.values())
    assert where_choices() == ("local", "ray")
    assert emulation_backend("processes").name == "processes"
    assert emulation_backend("lightweight", "ray").name == "ray"
    with pytest.raises(ValueError, match="backend 'ray' runs emulation.mode 'lightweight', not 'processes'"):
        emulation_backend("processes", "ray")
    with pytest.raises(ValueError, match="backend must be one of local, ray, got 'spark'"):
        emulation_backend("lightweight", "spark")
    with pytest.raises(ValueError, match="unknown emulation.mode 'inline'; known: processes, lightweight"):
        emulation_backend("inline")
    with pytest.raises(ValueError, match="workers do\\(es\\) not apply to the processes emulation backend"):
        EMULATION_BACKENDS["processes"].check({"workers": 2, "rss_guard": True})
    assert EMULATION_BACKENDS["processes"].check({"workers": None, "rss_guard": False}) == {"rss_guard": False}
    # What the command line offers, each option with the runs that take it.
    assert set(backend_options()) == {"rss_guard", "workers", "address", "host", "advertise_host", "port"}
    assert takers("workers") == "emulation.mode 'lightweight' or --backend ray"
    assert takers("address") == "--backend ray" and takers("rss_guard") == "emulation.mode 'processes'"


def test_a_registered_backend_runs_a_real_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "EMULATION_BACKENDS", dict(EMULATION_BACKENDS))
    register_emulation_backend(InlineBackend)
    with pytest.raises(ValueError, match="already registered"):
        register_emulation_backend(InlineBackend)
    with pytest.raises(TypeError, match="EmulationBackend subclass"):
        register_emulation_backend(object)  # type: ignore[arg-type]
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    config = server_config(fleet, store_dir=tmp_path / "store", deadline_s=60)
    run = asyncio.run(run_emulation(fleet, config, stderr_dir=tmp_path / "logs"))
    assert InlineBackend.steps == ["prepare", "start", "cancel"]
    assert [h["round"] for h in run.history] == [1, 2] and all(h["reported"] == 2 for h in run.history)
    assert sorted(d.device for d in run.devices) == ["phone-000", "phone-001"]
    assert all(len(d.rounds) == 2 and d.lives[-1].ended in ("finished", "stopped") for d in run.devices)
    with pytest.raises(ValueError, match="workers do\\(es\\) not apply to the inline emulation backend"):
        asyncio.run(run_emulation(fleet, config, workers=2))


def test_the_command_refuses_an_option_its_backend_does_not_take() -> None:
    from edgetrain.cli import app
    from edgetrain.cli import commands  # noqa: F401  (registers the commands)

    result = CliRunner().invoke(app, ["emulate", "--fleet", "tiny-200", "--no-rss-guard"])
    shown = " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message
    assert result.exit_code != 0 and "no memory caps to guard" in shown
    result = CliRunner().invoke(app, ["emulate", "--fleet", "tiny-capped", "--workers", "2"])
    shown = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code != 0 and "applies to emulation.mode 'lightweight' or --backend ray" in shown
