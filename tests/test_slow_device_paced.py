"""A device much slower than its cohort is paced, not cut, from the first round it is selected
(orchestrator/server/pace.py).

Three real device processes against a real orchestrator under the default straggler policy (grace: once
half the cohort answered, 10 s more); one of them takes ``STEP_DELAY_S`` per local step (the
emulator's ``step_delay_s`` fault: its training backend sleeps per step, so fewer steps really make it
faster, and its hello's probe step is as much slower), ten steps being longer than the grace window.
Before any round is timed the server seeds each device's pace from its hello's ``probe_step_s``: with
pacing on (the default) the slow device is asked for the share of steps that fits from round 1 on, its
measured time replacing the seed after its first report, and its update is folded in every round; with
pacing off it is cut every time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from emulator.faults import Faults
from emulator.localfleet import DeviceLaunch, run_local_fleet
from orchestrator.store import Store
from tests.factories import server_config

pytestmark = pytest.mark.slow

LOCAL_STEPS = 10
STEP_DELAY_S = 3.0  # 10 steps: 30 s, far over the 10 s grace that follows the fast devices' answers
FAST_STEP_S = 0.3  # the cohort's rounds take about 3 s (the tiny model's alone take milliseconds)


def _run(tmp_path: Path, rounds: int, **settings: object) -> tuple[list[dict], list[dict], list[dict]]:
    """The run's round metrics, its journaled rounds and the slow device's events."""
    launches = [DeviceLaunch(f"fast-{i}", 2 << 30, client=i, num_clients=3, data="synthetic",
                             faults=Faults(step_delay_s=FAST_STEP_S)) for i in range(2)]
    launches.append(DeviceLaunch("slow", 2 << 30, client=2, num_clients=3, data="synthetic",
                                 faults=Faults(step_delay_s=STEP_DELAY_S)))
    config = server_config(tmp_path / "store", rounds=rounds, min_devices=3, fraction=1.0, local_steps=LOCAL_STEPS,
                           deadline_s=120.0, straggler_policy="grace", **settings)
    assert config.straggler_grace_s == 10.0 and config.straggler_quorum == 0.5  # the default policy
    run = asyncio.run(run_local_fleet(config, launches))
    journal = Store.open_readonly(config.store_dir).rounds.all()
    return run.history, journal, run.device_events["slow"]


def _folded(events: list[dict]) -> set[int]:
    return {e["round"] for e in events if e.get("event") == "round_done" and e["accepted"]}


def test_a_slow_device_is_folded_in_every_round_from_its_first(tmp_path: Path) -> None:
    history, journal, events = _run(tmp_path, rounds=4)
    selected = [j["round"] for j in journal if "slow" in j["selected"]]
    assert selected == [1, 2, 3, 4], journal  # never cut, so never held out
    assert _folded(events) == set(selected), (selected, history)  # folded in every one of them
    # Round 1, nothing timed yet: seeds from the probes (10 x 0.3 s, 10 x 3 s), a 13 s expected close,
    # floor(0.7 x 13 / 3) = 3 steps for the slow device.
    assert history[0]["paced"] == {"slow": 3}, history[0]
    for r in selected:
        m = history[r - 1]
        assert "slow" not in m["stragglers"] and m["closed_by"] == "all", m
        assert 1 <= m["paced"]["slow"] < LOCAL_STEPS, m  # its share of the steps, by its seed, then measured
        assert set(m["paced"]) == {"slow"}  # the fast devices keep every step
    done = {e["round"]: e for e in events if e.get("event") == "round_done"}
    for r in selected:  # fewer steps made it faster: inside the grace the fast devices' answers start
        assert done[r]["train_s"] < STEP_DELAY_S * LOCAL_STEPS, done[r]


def test_without_pacing_the_slow_device_is_cut_every_round_it_is_selected(tmp_path: Path) -> None:
    history, journal, events = _run(tmp_path, rounds=4, straggler_pacing=False)
    selected = [j["round"] for j in journal if "slow" in j["selected"]]
    assert selected[0] == 1
    for r in selected:
        assert "slow" in history[r - 1]["stragglers"] and "paced" not in history[r - 1]
    assert not _folded(events)  # never folded
