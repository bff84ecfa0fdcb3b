"""The server's step schedule of the local learning rate (EmbracingFL appendix 6.2: CIFAR-10 decays it
by 10 after rounds 800 and 900): every instruction carries the round's rate, a resumed run continues
the schedule where it stopped, and ``edgetrain serve`` sets it (fleet files: tests/test_fleet.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edge_sdk import protocol as p
from edgetrain.cli import app
from edgetrain.cli import commands  # noqa: F401  (registers the commands)
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from tests.factories import server_config
from tests.scripted import scripted_device


def test_the_rate_of_a_round_is_the_base_rate_times_one_factor_per_milestone_passed():
    config = ServerConfig(lr=0.4, lr_decay_at=(800, 900))
    assert [config.lr_at(r) for r in (1, 800)] == [0.4, 0.4]
    assert config.lr_at(801) == pytest.approx(0.04) and config.lr_at(900) == pytest.approx(0.04)
    assert config.lr_at(901) == pytest.approx(0.004)
    assert ServerConfig(lr=0.05).lr_at(10_000) == 0.05  # no milestones: constant
    assert ServerConfig(lr=1.0, lr_decay_at=(2,), lr_decay=0.5).lr_at(3) == 0.5


def test_devices_are_sent_the_decayed_rate_and_a_resumed_run_continues_the_schedule(tmp_path: Path):
    store = tmp_path / "store"

    def run(rounds: int, resume: bool) -> list[p.Instruction]:
        seen: list[p.Instruction] = []

        async def main():
            config = server_config(store, rounds=rounds, deadline_s=30, lr=0.2, lr_decay_at=(1, 2), lr_decay=0.5,
                                   resume=resume)
            orch, server = await start_orchestrator(config, lambda kind, data: None)
            await asyncio.gather(scripted_device(f"ws://127.0.0.1:{orch.port}", orch, "d", {},
                                                 lambda n, shape: np.full(shape, 0.01, np.float32),
                                                 instructions=seen), server)

        asyncio.run(main())
        return seen

    first = run(3, resume=False)
    assert [(i.round, i.lr) for i in first] == [(1, 0.2), (2, 0.1), (3, 0.05)]
    again = run(4, resume=True)  # rounds 1-3 are journaled: only round 4 runs, still past both milestones
    assert [(i.round, i.lr) for i in again] == [(4, 0.05)]


def test_serve_refuses_a_bad_schedule_before_it_listens(tmp_path: Path):
    result = CliRunner().invoke(app, ["serve", "--lr-decay-at", "800,nine", "--store", str(tmp_path)])
    assert result.exit_code == 2 and "lr-decay-at" in result.output
    result = CliRunner().invoke(app, ["serve", "--lr-decay-at", "0,800", "--store", str(tmp_path)])
    assert result.exit_code == 2 and ">= 1" in result.output
    result = CliRunner().invoke(app, ["serve", "--lr-decay-at", "800", "--lr-decay", "3", "--store", str(tmp_path)])
    assert result.exit_code == 2 and "(0, 1]" in result.output
