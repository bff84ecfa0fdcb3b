"""Pacing's arithmetic (orchestrator/server/pace.py): a device's measured round time, the round's
expected close, and the share of local steps that fits it. The end-to-end behaviour, a slow device
process folded every round it is selected, is tests/test_slow_device_paced.py (slow tier)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edge_sdk import protocol as p
from orchestrator.server.pace import PACE_MARGIN, DevicePace, Paces, fit_steps, measure, round_budget
from orchestrator.strategies import Instruction
from orchestrator.views.terminal import round_line
from tests.factories import server_config


def _report(round: int, **metrics: p.Scalar) -> p.Report:
    return p.Report(round, "train", 10, (0, 1), "", dict(metrics))


def _wire(round: int, steps: int, phase: str = "train") -> p.Instruction:
    return p.Instruction(round=round, phase=phase, model_version=round - 1, split=0, chunk_ids=[], model_id="m",
                         selection="tail", broadcast_id="", local_steps=steps, lr=0.1, deadline_s=10.0, config={})


def test_a_round_splits_into_overhead_and_seconds_per_step() -> None:
    assert measure(25.0, 10, {"train_s": 20.0, "steps": 10}) == DevicePace(5.0, 2.0)
    # Timings the device did not send, or that are not durations, or steps other than asked: all steps.
    for metrics in ({}, {"train_s": -1.0, "steps": 10}, {"train_s": math.nan, "steps": 10},
                    {"train_s": True, "steps": 10}, {"train_s": 20.0, "steps": 3}, {"train_s": 20.0}):
        assert measure(25.0, 10, metrics) == DevicePace(0.0, 2.5), metrics
    # A claimed training time longer than the round's wall time is held to it.
    assert measure(10.0, 5, {"train_s": 99.0, "steps": 5}) == DevicePace(0.0, 2.0)
    assert measure(10.0, 0, {}) is None


def test_the_budget_is_when_the_grace_closes_the_round() -> None:
    config = server_config(Path("unused"), straggler_grace_s=10.0, straggler_quorum=0.5, deadline_s=120.0)
    # Quorum 2 of 3: the second answer at 4 s, then 10 s of grace (more than 4).
    assert round_budget([3.0, 4.0, 200.0], config) == pytest.approx(14.0)
    # The quorum's own time when longer than the grace: t_q + t_q.
    assert round_budget([30.0, 40.0, 200.0], config) == pytest.approx(80.0)
    assert round_budget([100.0, 110.0], config) == 120.0  # never past the deadline
    # Too few devices measured to know the quorum's time: the deadline.
    assert round_budget([3.0, None, None], config) == 120.0
    deadline = server_config(Path("unused"), straggler_policy="deadline", deadline_s=60.0)
    assert round_budget([3.0, 4.0, 200.0], deadline) == 60.0


def test_a_slow_device_gets_the_steps_that_fit_and_at_least_one() -> None:
    assert fit_steps(DevicePace(1.0, 1.0), 10, budget=14.0) == 10  # 11 s fits in 14: every step
    # 1 + 10 x 2 = 21 s > 14 s: the steps that take 70% of it, floor((9.8 - 1) / 2) = 4.
    assert fit_steps(DevicePace(1.0, 2.0), 10, budget=14.0) == math.floor((PACE_MARGIN * 14 - 1) / 2) == 4
    assert fit_steps(DevicePace(20.0, 2.0), 10, budget=14.0) == 1  # not even one fits: one
    assert fit_steps(DevicePace(0.0, 2.0), 1, budget=1.0) == 1


def test_paces_are_measured_from_send_to_report_late_or_not_and_plan_the_next_round(tmp_path: Path) -> None:
    paces = Paces(server_config(tmp_path, local_steps=10, straggler_grace_s=10.0, deadline_s=120.0))
    for d in ("a", "b"):
        paces.sent(d, _wire(1, 10), now=0.0)
        assert paces.reported(d, _report(1, train_s=2.0, steps=10), now=3.0) == DevicePace(1.0, 0.2)
    paces.sent("slow", _wire(1, 10), now=0.0)
    paces.sent("slow", _wire(1, 10), now=5.0)  # resent after a reconnect: the first send counts
    paces.sent("slow", _wire(1, 0, phase="evaluate"), now=6.0)  # not a train instruction: not measured
    assert paces.reported("slow", _report(0, train_s=1.0, steps=10), now=7.0) is None  # another round's
    assert paces.reported("slow", _report(1, train_s=20.0, steps=10), now=21.0) == DevicePace(1.0, 2.0)
    assert paces.reported("slow", _report(1, train_s=20.0, steps=10), now=22.0) is None  # answered once

    asked = [Instruction("a"), Instruction("b"), Instruction("slow"), Instruction("new"),
             Instruction("slow", phase="evaluate"), Instruction("b", phase="train2"), Instruction("a", local_steps=30)]
    planned, paced = paces.plan(asked)
    # The budget: the second answer of four (one not measured yet counts as never) at 3 s, then 10 s of
    # grace: 13 s. The slow device (1 + 10 x 2 = 21 s) is asked for floor((0.7 x 13 - 1) / 2) = 4 steps.
    assert paced == {"slow": 4}
    assert [i.local_steps for i in planned] == [None, None, 4, None, None, None, 30]
    assert [(i.device_id, i.phase) for i in planned] == [(i.device_id, i.phase) for i in asked]


def test_the_round_line_names_the_devices_paced() -> None:
    line = round_line({"round": 3, "reported": 3, "selected": 3, "round_wall_s": 6.4, "paced": {"slow": 2}}, 10)
    assert line.endswith("paced slow (2 steps)")
    assert "paced" not in round_line({"round": 3, "reported": 3, "selected": 3}, 10)
