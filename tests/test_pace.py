"""Pacing's arithmetic (orchestrator/server/pace.py): a device's measured round time, its seed from the
hello's probe step before it is timed, the round's expected close, and the share of local steps that
fits it; the paces a restarted server reads back from its store. The end-to-end behaviour, a slow
device process folded every round it is selected from its first, is tests/test_slow_device_paced.py
(slow tier)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from edge_sdk import protocol as p
from edge_sdk.backends import backend_class, measure_probe
from emulator.faults import slowed_backend
from orchestrator.server.pace import PACE_MARGIN, DevicePace, Paces, fit_steps, measure, probe_seed, round_budget
from orchestrator.server import Orchestrator
from orchestrator.store import Store
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


def test_a_probe_step_seeds_a_pace_only_when_it_is_one() -> None:
    assert probe_seed(0.3) == DevicePace(0.0, 0.3)  # uncalibrated: the probe taken as one step
    assert probe_seed(0.3, calibration=2.0) == DevicePace(0.0, 0.6)
    assert probe_seed(p.PROBE_STEP_MAX_S) == DevicePace(0.0, p.PROBE_STEP_MAX_S)
    for claim in (None, 0.0, 0, -1.0, math.nan, math.inf, True, "0.3", p.PROBE_STEP_MAX_S * 1.01):
        assert probe_seed(claim) is None, claim  # no seed: the device is not paced before it is timed
    for calibration in (0.0, -1.0, math.nan, math.inf):
        assert probe_seed(0.3, calibration) is None, calibration


def test_the_probe_step_is_an_optional_checked_hello_field() -> None:
    """An old device's hello has no probe (none is sent while 0); a claim outside (0, PROBE_STEP_MAX_S]
    is refused with a clear error before the hello is planned (docs/protocol.md, "Hello.probe_step_s")."""
    old = p.Hello(device_id="old", token="", budget_bytes=1 << 20, cores=1, runtimes=["torch"], num_samples=5)
    assert "probe_step_s" not in msgpack.unpackb(p.encode(old)) and p.decode(p.encode(old)).probe_step_s == 0.0
    probed = replace(old, probe_step_s=0.25)
    assert p.decode(p.encode(probed)) == probed
    body = msgpack.unpackb(p.encode(probed))
    for bad, code in ((p.PROBE_STEP_MAX_S + 1, "malformed"), (-0.5, "malformed"), ("0.2", "malformed"),
                      (math.inf, "non_finite"), (math.nan, "non_finite")):
        with pytest.raises(p.ProtocolError) as err:
            p.decode(msgpack.packb({**body, "probe_step_s": bad}))
        assert err.value.code == code and "probe_step_s" in str(err.value), (bad, err.value)


def test_a_probe_step_is_measured_once_per_backend_and_slowed_with_its_steps() -> None:
    backend = backend_class("onnxruntime")  # a device's backend is its class (DeviceClient.backend)
    first = measure_probe(backend)
    assert 0 < first < 1.0 and measure_probe(backend) == first  # a reconnect repeats the figure
    slowed = slowed_backend(backend_class("onnxruntime"), 0.2)  # the emulator's slow-step fault
    assert measure_probe(slowed) >= 0.2


def test_a_device_never_timed_is_paced_in_its_first_round_from_its_probe(tmp_path: Path) -> None:
    probes = {"a": 0.3, "b": 0.3, "slow": 3.0, "liar": 1e-9, "old": None}
    paces = Paces(server_config(tmp_path, local_steps=10, straggler_grace_s=10.0, deadline_s=120.0), probe=probes.get)
    planned, paced = paces.plan([Instruction("a"), Instruction("b"), Instruction("slow"), Instruction("old")])
    # Seeds: 10 x 0.3 = 3 s, 3 s, 30 s; an old device without a probe counts as never answering. The
    # second answer of four at 3 s, then 10 s of grace: 13 s. The slow device: floor(0.7 x 13 / 3) = 3.
    assert math.floor(PACE_MARGIN * 13.0 / 3.0) == 3
    assert paced == {"slow": 3} and [i.local_steps for i in planned] == [None, None, 3, None]
    # A claim of speed asks for no more steps than the round's (nor does a strategy's own count change).
    planned, paced = paces.plan([Instruction("liar"), Instruction("slow", local_steps=30)])
    assert paced == {} and [i.local_steps for i in planned] == [None, 30]


def test_the_first_measurement_replaces_the_seed_and_calibrates_the_others(tmp_path: Path) -> None:
    kept: list[tuple[str, DevicePace]] = []
    probes = {"a": 0.5, "new": 1.0, "js": 1.0}
    kinds = {"a": "onnxruntime", "new": "onnxruntime", "js": "onnxruntime-node"}  # the probe each ran
    paces = Paces(server_config(tmp_path, local_steps=10), probe=probes.get, keep=lambda d, pc: kept.append((d, pc)),
                  kind=kinds.__getitem__)
    assert paces.estimate("a") == DevicePace(0.0, 0.5) and paces.of("a") is None  # a seed, not a measurement
    paces.sent("a", _wire(1, 10), now=0.0)
    assert paces.reported("a", _report(1, train_s=10.0, steps=10), now=12.0) == DevicePace(2.0, 1.0)
    assert paces.estimate("a") == DevicePace(2.0, 1.0)  # replaced, not blended with the seed
    assert kept == [("a", DevicePace(2.0, 1.0))]  # each new estimate is handed on to be journaled
    # a's model step is 2x its probe step: a new device's probe is scaled by that median ratio.
    assert paces.calibration("onnxruntime") == 2.0 and paces.estimate("new") == DevicePace(0.0, 2.0)
    # Another SDK's probe is not scaled by it: none of its kind measured yet, its seed is uncalibrated.
    assert paces.calibration("onnxruntime-node") == 1.0 and paces.estimate("js") == DevicePace(0.0, 1.0)


def test_a_restarted_server_paces_from_the_store_as_before(tmp_path: Path) -> None:
    config = server_config(tmp_path / "store", local_steps=10, straggler_grace_s=10.0, deadline_s=120.0)
    asked = [Instruction("a"), Instruction("b"), Instruction("slow")]
    first = Orchestrator(config)
    try:  # the round loop's own calls: dispatch's send, then take_report's report
        for d, wall in (("a", 3.0), ("b", 3.0), ("slow", 21.0)):
            first.loop.pace.sent(d, _wire(1, 10), now=0.0)
            first.loop.pace.reported(d, _report(1, train_s=wall - 1.0, steps=10), now=wall)
        before = {d: first.loop.pace.of(d) for d in ("a", "b", "slow")}
        assert before["slow"] == DevicePace(1.0, 2.0) and first.loop.pace.plan(asked)[1] == {"slow": 4}
    finally:
        first.store.close()
    resumed = Orchestrator(replace(config, resume=True))  # a new server process: nothing but the store
    try:
        assert {d: resumed.loop.pace.of(d) for d in ("a", "b", "slow")} == before
        assert resumed.loop.pace.plan(asked)[1] == {"slow": 4}  # paced in its first round after the restart
    finally:
        resumed.store.close()
    with Store.open_readonly(config.store_dir) as store:
        assert store.paces.all()["slow"] == (1.0, 2.0)
