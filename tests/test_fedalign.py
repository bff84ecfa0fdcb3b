"""FedALIGN offline: the selection rule |F_k(w) - F(w)| <= epsilon_t (Section 3.1), applied once to
the device's evaluated loss; the threshold's forms (constant, relative to F(w), decayed); eq. 15's
data-weighted mean, warm-up rounds, and its two limits: epsilon = 0 is FedAvg on the priority
devices, epsilon = infinity FedAvg on all."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.protocol import RowSparse
from orchestrator.strategies import DeviceInfo, DeviceReport, FedALIGN, FedAvg, Instruction, Refused, make_strategy
from orchestrator.strategies.groups import PriorityRule
from orchestrator.strategies.selection import Selection
from tests.strategy_driver import context, drive

F32 = np.float32
BLOCKS = ("fc1", "head")


def state() -> dict[str, np.ndarray]:
    return {
        "blocks.fc1.weight": np.array([[1, -1], [0.5, 2]], F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(5, np.int64),
        "blocks.head.weight": np.array([[0, 0]], F32),
        "blocks.head.bias": np.array([1], F32),
    }


class Fleet:
    """Devices with fixed updates and losses: ``loss`` is the received model's loss on their data."""

    def __init__(self, spec: dict[str, dict]) -> None:
        rng = np.random.default_rng(7)
        self.spec = spec
        self.deltas = {}
        for d, s in spec.items():
            split = s.get("split", 0)
            names = [n for n in state() if n.split(".")[1] in BLOCKS[split:]]
            self.deltas[d] = {n: (np.array(3, np.int64) if state()[n].dtype.kind != "f"
                                  else rng.normal(size=state()[n].shape).astype(F32)) for n in names}

    def infos(self) -> dict[str, DeviceInfo]:
        return {d: DeviceInfo(d, "weak" if s.get("split", 0) else "strong", s.get("split", 0), s["n"],
                              tags=s.get("tags", {})) for d, s in self.spec.items()}

    def respond(self, ins: Instruction) -> DeviceReport:
        s = self.spec[ins.device_id]
        split = s.get("split", 0)
        common = dict(device_id=ins.device_id, round=1, phase=ins.phase, role="strong" if split == 0 else "weak",
                      num_samples=s["n"], selection=ins.selection or Selection.tail(split))
        if ins.phase == "evaluate":
            return DeviceReport(trained=(0, 0), metrics={"loss": s["loss"], "accuracy": s.get("acc", 0.5)},
                                tensors={}, **common)
        return DeviceReport(trained=(split, len(BLOCKS)),
                            metrics={"loss_before": s.get("train_loss", s["loss"]), "loss_after": s["loss"] / 2},
                            tensors=self.deltas[ins.device_id], **common)


SPEC = {
    "p0": {"n": 10, "loss": 1.0, "tags": {"priority": "1"}},
    "p1": {"n": 30, "loss": 2.0, "tags": {"priority": "true"}},  # F(w) = (10 + 60) / 40 = 1.75
    "a0": {"n": 20, "loss": 1.70, "acc": 0.8},  # |1.70 - 1.75| = 0.05
    "a1": {"n": 40, "loss": 2.05, "acc": 0.6},  # 0.30
    "b0": {"n": 50, "loss": 4.00, "acc": 0.1},  # 2.25
}


#: The first round after FedALIGN's default warm-up: the selection rule runs.
AFTER_WARMUP = FedALIGN().warmup + 1


def run(strategy, spec=SPEC, round=AFTER_WARMUP):
    fleet = Fleet(spec)
    ctx = context(state(), fleet.infos(), BLOCKS, round=round)
    return drive(strategy, ctx, fleet.respond)


def fedavg_on(devices):
    spec = {d: SPEC[d] for d in devices}
    return run(FedAvg(max_weight_share=1.0), spec)[0]  # the paper's FedAvg: uncapped


def assert_same_state(got, want):
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k


def test_epsilon_zero_is_fedavg_on_the_priority_devices():
    result, issued, refusals = run(FedALIGN(epsilon=0))
    assert_same_state(result.state, fedavg_on(["p0", "p1"]).state)
    assert set(result.devices) == {"p0", "p1"}
    assert result.extra["included"] == {} and result.extra["excluded"] == ["a0", "a1", "b0"]
    # Every non-priority device was asked for its loss, with F(w) and epsilon, and none trained.
    asked = {i.device_id: i.config for i in issued if i.phase == "evaluate" and i.device_id[0] != "p"}
    assert set(asked) == {"a0", "a1", "b0"}
    assert all(c["global_loss"] == pytest.approx(1.75) and c["epsilon"] == 0 for c in asked.values())
    assert not [i for i in issued if i.phase == "train" and i.device_id[0] != "p"]


def test_epsilon_infinity_is_fedavg_on_all_devices():
    result, _, _ = run(FedALIGN(epsilon=math.inf))
    assert_same_state(result.state, fedavg_on(list(SPEC)).state)
    assert result.extra["included"] == pytest.approx({"a0": 20 / 150, "a1": 40 / 150, "b0": 50 / 150})


def test_only_devices_within_epsilon_are_folded_with_eq15_weights():
    result, issued, _ = run(FedALIGN(epsilon=0.5))
    assert set(result.devices) == {"p0", "p1", "a0", "a1"}
    assert_same_state(result.state, fedavg_on(["p0", "p1", "a0", "a1"]).state)
    assert result.extra["included"] == pytest.approx({"a0": 20 / 100, "a1": 40 / 100})
    assert result.extra["excluded"] == ["b0"]
    assert result.extra["priority_loss"] == pytest.approx(1.75)
    assert result.extra["priority_accuracy"] == pytest.approx(0.5)
    assert result.extra["nonpriority_accuracy"] == pytest.approx((20 * 0.8 + 40 * 0.6 + 50 * 0.1) / 110)
    # The non-priority devices were asked only after F(w) was known.
    order = [(i.device_id, i.phase) for i in issued]
    assert order.index(("a0", "evaluate")) > order.index(("p1", "evaluate"))
    assert order.index(("a0", "train")) > order.index(("a0", "evaluate"))


def test_warmup_rounds_train_the_priority_devices_only():
    strategy = FedALIGN(epsilon=math.inf, warmup=2)
    result, issued, _ = run(strategy, round=2)
    assert {i.device_id for i in issued} == {"p0", "p1"} and result.extra["warmup"] is True
    result, issued, _ = run(strategy, round=3)
    assert set(result.devices) == set(SPEC) and result.extra["warmup"] is False


def test_a_device_the_rule_admits_is_admitted_whatever_its_training_batch_loss():
    # a0's loss of the received model on its data is within 0.5 of F(w) (the rule, Section 3.1); the
    # loss_before of its train report, one training batch, happens to be far off: not checked again.
    spec = dict(SPEC, a0={**SPEC["a0"], "train_loss": 3.0})
    result, _, refusals = run(FedALIGN(epsilon=0.5), spec)
    assert "a0" in result.devices and "a1" in result.devices and "b0" not in result.devices
    assert refusals == [] and result.rejected == 0
    assert result.extra["included"] == pytest.approx({"a0": 20 / 100, "a1": 40 / 100})


def test_a_train_report_from_a_device_the_rule_did_not_admit_is_refused():
    strategy = FedALIGN(epsilon=0.5)
    fleet = Fleet(SPEC)
    ctx = context(state(), fleet.infos(), BLOCKS, round=AFTER_WARMUP)
    strategy.configure(ctx)
    with pytest.raises(Refused, match="did not admit"):
        strategy.on_report(fleet.respond(Instruction("b0", "train")), ctx)


def _with_verdict(fleet: Fleet, verdicts: dict[str, dict[str, int]]):
    """The fleet's reports, with ``within_epsilon`` set per device and phase as the device says it."""
    def respond(ins: Instruction) -> DeviceReport:
        report = fleet.respond(ins)
        said = verdicts.get(ins.device_id, {}).get(ins.phase)
        if said is not None:
            report.metrics["within_epsilon"] = said
        return report
    return respond


def test_a_device_whose_own_check_fails_declines_and_is_not_asked_to_train():
    # a0 is within 0.5 by the server's numbers, but its own check says no (Section 3.1, the device's incentive).
    fleet = Fleet(SPEC)
    result, issued, refusals = drive(FedALIGN(epsilon=0.5), context(state(), fleet.infos(), BLOCKS, round=AFTER_WARMUP),
                                     _with_verdict(fleet, {"a0": {"evaluate": 0}, "a1": {"evaluate": 1}}))
    assert ("a0", "train") not in [(i.device_id, i.phase) for i in issued]
    assert set(result.devices) == {"p0", "p1", "a1"} and refusals == []
    assert result.extra["declined"] == ["a0"] and result.extra["excluded"] == ["a0", "b0"]


def test_a_train_report_that_says_outside_is_refused_and_one_the_rule_admitted_is_folded():
    fleet = Fleet(dict(SPEC, b0={**SPEC["b0"], "loss": 1.7, "train_loss": 3.0}))
    # a0 trains but says it is outside; b0's evaluated loss is within (its training batch's is not).
    verdicts = {"a0": {"evaluate": 1, "train": 0}, "b0": {"evaluate": 1, "train": 1}}
    result, _, refusals = drive(FedALIGN(epsilon=0.5), context(state(), fleet.infos(), BLOCKS, round=AFTER_WARMUP),
                                _with_verdict(fleet, verdicts))
    assert "a0" not in result.devices and {"b0", "a1"} <= set(result.devices)
    assert [r.split(":")[0] for r in refusals] == ["the device declined"]


def test_the_devices_own_incentive_check():
    from edge_sdk.algorithms.fedalign import incentive_check

    assert incentive_check({"loss": 1.7}, {"global_loss": 1.75, "epsilon": 0.1}) is True
    assert incentive_check({"loss": 2.0}, {"global_loss": 1.75, "epsilon": 0.1}) is False
    assert incentive_check({"loss": float("nan")}, {"global_loss": 1.75, "epsilon": 0.1}) is False
    assert incentive_check({"loss": 1.7}, {"global_loss": 1.75}) is None  # no check asked (epsilon infinite)
    assert incentive_check({"loss": 1.7}, {}) is None


def test_epsilon_schedule_decays_after_warmup():
    s = FedALIGN(epsilon=1.0, warmup=2, epsilon_decay=0.5, epsilon_min=0.2)
    assert [s.epsilon_at(t) for t in (1, 3, 4, 5, 6)] == [1.0, 1.0, 0.5, 0.25, 0.2]
    assert [s.threshold(t, 7.0) for t in (3, 4)] == [1.0, 0.5]  # a loss gap: F(w) does not enter
    assert FedALIGN(epsilon=lambda t: 0.1 * t).epsilon_at(3) == pytest.approx(0.3)


def test_relative_epsilon_is_a_fraction_of_the_priority_loss():
    # F(w) = 1.75: c = 0.1 admits gaps up to 0.175 (a0's 0.05), c = 0.2 up to 0.35 (a1's 0.30 too).
    for c, admitted in ((0.1, {"a0"}), (0.2, {"a0", "a1"}), (1.0, {"a0", "a1"}), (2.0, {"a0", "a1", "b0"})):
        result, issued, _ = run(FedALIGN(relative_epsilon=c))
        assert set(result.extra["included"]) == admitted, c
        assert result.extra["epsilon"] == pytest.approx(c * 1.75) and result.extra["epsilon_form"] == "relative"
        # The devices get the round's threshold as a loss gap: their own check is unchanged.
        asked = [i.config for i in issued if i.phase == "evaluate" and i.device_id[0] != "p"]
        assert all(cfg["epsilon"] == pytest.approx(c * 1.75) for cfg in asked)
    s = FedALIGN(relative_epsilon=0.4, warmup=1, epsilon_decay=0.5)
    assert [s.threshold(t, 2.0) for t in (2, 3)] == [pytest.approx(0.8), pytest.approx(0.4)]
    assert math.isnan(s.threshold(2, None))  # no priority loss, nobody admitted


def test_the_default_threshold_is_relative():
    from orchestrator.strategies.fedalign import DEFAULT_RELATIVE_EPSILON

    s = FedALIGN()
    assert s.relative and s.epsilon == DEFAULT_RELATIVE_EPSILON
    assert s.threshold(5, 2.0) == pytest.approx(2.0 * DEFAULT_RELATIVE_EPSILON)
    assert not FedALIGN(epsilon=0.3).relative
    with pytest.raises(ValueError, match="not both"):
        FedALIGN(epsilon=0.3, relative_epsilon=0.1)


def test_the_default_warmup_trains_the_priority_devices_alone_first():
    # Round 1's model fits nobody: every loss is alike and the rule would admit everyone, so by
    # default the first rounds train the priority devices only (DEFAULT_WARMUP's docstring).
    for r in range(1, AFTER_WARMUP):
        result, issued, _ = run(FedALIGN(epsilon=math.inf), round=r)
        assert set(result.devices) == {"p0", "p1"} and {i.device_id for i in issued} == {"p0", "p1"}
    result, _, _ = run(FedALIGN(epsilon=math.inf), round=AFTER_WARMUP)
    assert set(result.devices) == set(SPEC)


def test_every_evaluate_asks_the_same_sample_count():
    _, issued, _ = run(FedALIGN(epsilon=0.5, eval_samples=64))
    evaluates = [i for i in issued if i.phase == "evaluate"]
    assert len(evaluates) == 5 and all(i.config["eval_samples"] == 64 for i in evaluates)
    _, issued, _ = run(FedALIGN(epsilon=0.5, eval_samples=0))  # all of each device's samples
    assert {i.device_id: i.config["eval_samples"] for i in issued if i.phase == "evaluate"} == {
        d: s["n"] for d, s in SPEC.items()}


def test_fedprox_variant_sends_mu_to_every_trainer():
    _, issued, _ = run(FedALIGN(epsilon=math.inf, prox_mu=0.01))
    trains = [i for i in issued if i.phase == "train"]
    assert len(trains) == 5 and all(i.config == {"prox_mu": 0.01} for i in trains)
    _, issued, _ = run(FedALIGN(epsilon=math.inf))
    assert all("prox_mu" not in i.config for i in issued)


def test_a_weak_nonpriority_device_counts_only_where_it_trained():
    spec = dict(SPEC, a0={**SPEC["a0"], "split": 1})
    fleet = Fleet(spec)
    result, _, _ = run(FedALIGN(epsilon=0.5), spec)
    old = state()
    head = "blocks.head.weight"
    want_head = old[head] + sum(fleet.deltas[d][head] * spec[d]["n"] for d in ("p0", "p1", "a0", "a1")) / 100
    np.testing.assert_allclose(result.state[head], want_head, rtol=1e-6)
    fc1 = "blocks.fc1.weight"  # a0 did not train fc1: averaged over p0, p1, a1 only
    want_fc1 = old[fc1] + sum(fleet.deltas[d][fc1] * spec[d]["n"] for d in ("p0", "p1", "a1")) / 80
    np.testing.assert_allclose(result.state[fc1], want_fc1, rtol=1e-6)
    assert result.contributors[fc1] == 3 and result.contributors[head] == 4


def test_priority_by_id_glob_or_label_value():
    info = lambda d, **tags: DeviceInfo(d, "strong", 0, 1, tags=tags)  # noqa: E731
    assert PriorityRule(("hosp-*",), "").matches(info("hosp-3"))
    assert not PriorityRule(("hosp-*",), "").matches(info("ext-3", priority="1"))
    assert PriorityRule().matches(info("x", priority="yes")) and not PriorityRule().matches(info("x", priority="0"))
    assert PriorityRule((), "group=clinic").matches(info("x", group="clinic"))
    assert not PriorityRule((), "group=clinic").matches(info("x", group="home"))
    strategy = make_strategy("fedalign", epsilon="inf", priority="a0,a1", priority_label="")
    result, issued, _ = run(strategy)
    assert {i.device_id for i in issued if i.phase == "train" and not i.config} >= {"a0", "a1"}
    assert result.extra["priority_devices"] == 2


@pytest.mark.parametrize("options, fragment", [
    ({"epsilon": "-1"}, "epsilon"), ({"epsilon": "abc"}, "epsilon must be a number"),
    ({"warmup": "1.5"}, "whole number"), ({"epsilon_decay": "2"}, "epsilon_decay"),
    ({"weighting": "odd"}, "weighting must be one of samples, uniform"), ({"priority_label": "=x"}, "label name"),
    ({"relative_epsilon": -0.1}, "relative_epsilon"), ({"eval_samples": 2.5}, "eval_samples"),
    ({"nonsense": 1}, "option nonsense is not one of its options"),
])
def test_bad_options_are_refused_with_a_clear_error(options, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_strategy("fedalign", **options)


def test_row_sparse_reports_fold_per_row():
    # Not FedALIGN-specific, but the fold it uses: a RowSparse delta only moves its rows.
    st = {"blocks.emb.weight": np.zeros((4, 2), F32)}
    infos = {"p": DeviceInfo("p", "strong", 0, 2, tags={"priority": "1"})}
    sel = Selection.tail(0)

    def respond(ins):
        if ins.phase == "evaluate":
            return DeviceReport("p", 1, "evaluate", "strong", 2, (0, 0), {"loss": 1.0}, {}, sel)
        return DeviceReport("p", 1, "train", "strong", 2, (0, 1), {"loss_before": 1.0},
                            {"blocks.emb.weight": RowSparse(np.array([1]), np.ones((1, 2), F32), 4)}, sel)

    result, _, _ = drive(FedALIGN(), context(st, infos, ("emb",)), respond)
    assert result.state["blocks.emb.weight"][1].tolist() == [1.0, 1.0]
    assert not result.state["blocks.emb.weight"][[0, 2, 3]].any()


def test_a_fleet_selects_fedalign_with_options_and_tags_priority_groups():
    from emulator.fleet import FleetError, device_labels, load_fleet, parse_fleet
    from emulator.schedule import server_config

    fleet = load_fleet("prioritized-femnist")
    config = server_config(fleet, store_dir=Path("unused"))
    assert config.strategy == "fedalign" and config.strategy_options == {"epsilon": 0.3, "warmup": 2}
    strategy = make_strategy(config.strategy, **config.strategy_options)
    labels = {d.id: device_labels(d) for d in fleet.devices(runtime=1)}
    infos = {d: DeviceInfo(d, "strong", 0, 1, tags=lab) for d, lab in labels.items()}
    assert sum(strategy.rule.matches(i) for i in infos.values()) == 4
    assert labels["priority-000"] == {"priority": "1", "internal": "1"} and labels["other-000"] == {}
    raw = {"fleet": {"model": "tiny"}, "training": {"strategy": "fedalign"}, "strategy": {"epsilon": "x"},
           "groups": [{"class": "pi-4-2gb", "count": 1}]}
    with pytest.raises(FleetError, match="strategy.epsilon: must be a number"):
        parse_fleet(raw)
