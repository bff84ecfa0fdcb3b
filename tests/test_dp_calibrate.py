"""Calibration (orchestrator/aggregation/privacy/calibrate.py): the multiplier meets its target and no less noise
would, settings that cannot work are refused in one line, and per-block plans under partial training
give the model exactly its target."""

from __future__ import annotations

import math

import pytest

from orchestrator.aggregation.privacy import calibrate as cal
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent, epsilon_for
from orchestrator.strategies import make_strategy


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_the_calibrated_multiplier_meets_the_target_and_no_less_noise_would(accountant: str) -> None:
    target, q, rounds, delta = 4.0, 0.02, 300, 1e-6
    z = cal.noise_multiplier(target, q, rounds, delta, accountant=accountant)
    assert epsilon_for(z, q, rounds, delta, accountant=accountant) <= target
    assert epsilon_for(z * 0.995, q, rounds, delta, accountant=accountant) > target
    # The ledger of the run it plans ends at that epsilon.
    ledger = PrivacyLedger(["all"], delta, accountant=accountant)
    for _ in range(rounds):
        ledger.record(RoundEvent(q, {"all": BlockRelease(z)}))
    assert ledger.spent().epsilon == pytest.approx(epsilon_for(z, q, rounds, delta, accountant=accountant))


def test_an_unreachable_target_is_refused_in_one_line() -> None:
    with pytest.raises(cal.PrivacyPlanError) as refused:
        cal.noise_multiplier(0.05, 1.0, 1000, 1e-5)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("target epsilon 0.05 cannot be reached in 1000 rounds at rate 1: even noise multiplier 100")


def test_too_little_noise_is_refused_with_the_multiplier_that_would_do() -> None:
    with pytest.raises(cal.PrivacyPlanError, match=r"noise multiplier 0.8 spends epsilon 11 in 100 rounds at rate "
                                                   r"0.1 \(delta 1e-05\), over the target 8: use at least 0.93"):
        cal.check_noise(0.8, 8.0, 0.1, 100, 1e-5)
    assert cal.check_noise(1.0, 8.0, 0.1, 100, 1e-5) == pytest.approx(7.05, abs=0.01)


def test_delta_cohort_and_strategy_refusals() -> None:
    assert cal.default_delta(1000) == 1e-5 and cal.default_delta(100_000) == pytest.approx(100_000**-1.1)
    with pytest.raises(cal.PrivacyPlanError, match="not below 1/N"):
        cal.check_delta(1e-3, 1000)
    with pytest.raises(cal.PrivacyPlanError, match="block stem expects 4 devices per round, under the 10"):
        cal.check_cohort(4.0, "block stem")
    assert cal.check_cohort(10.0) == 10.0
    for option in ("median", "krum", "multi_krum", "trimmed_mean", "centered_clip"):
        with pytest.raises(cal.PrivacyPlanError, match=f"not aggregation={option}"):
            cal.check_strategy("fedavg", make_strategy("fedavg", aggregation=option).combines)
    with pytest.raises(cal.PrivacyPlanError, match="not for strategy 'varsel'"):
        cal.check_strategy("varsel", make_strategy("varsel").combines)
    cal.check_strategy("embracingfl", make_strategy("embracingfl", aggregation="mean", max_weight_share=0.2).combines)


def test_per_block_plans_give_the_model_its_target_and_weak_devices_less() -> None:
    """digits_mlp-like: 4 blocks; 300 strong devices train all, 700 weak ones the last two."""
    q, rounds, delta, clip = 0.05, 50, 1e-6, 1.0
    z = cal.noise_multiplier(3.0, q, rounds, delta, accountant="rdp")
    per_block = [("fc1", 300), ("fc2", 300), ("fc3", 1000), ("head", 1000)]
    blocks = cal.plan_blocks(z, clip, per_block, q, rounds, delta, accountant="rdp")
    assert math.sqrt(sum(b.clip**2 for b in blocks)) == pytest.approx(clip)
    assert [b.noise_multiplier for b in blocks] == pytest.approx([2 * z] * 4)
    assert [b.cohort for b in blocks] == pytest.approx([15, 15, 50, 50])
    assert [b.mean_stddev for b in blocks] == pytest.approx([z * clip / 15] * 2 + [z * clip / 50] * 2)
    splits = {s.split: s for s in cal.plan_splits(z, 4, {0: 300, 2: 700}, q, rounds, delta, accountant="rdp")}
    assert splits[0].epsilon == pytest.approx(epsilon_for(z, q, rounds, delta, accountant="rdp"))
    assert splits[0].epsilon <= 3.0
    assert splits[2].noise_multiplier == pytest.approx(z * math.sqrt(2)) and splits[2].epsilon < splits[0].epsilon
    assert blocks[0].epsilon < splits[2].epsilon  # one block alone spends least
    # The ledger of a round released that way says the same for the model.
    ledger = PrivacyLedger([b for b, _ in per_block], delta, accountant="rdp")
    for _ in range(rounds):
        ledger.record(RoundEvent(q, {b.block: BlockRelease(b.noise_multiplier) for b in blocks}))
    assert ledger.spent().epsilon == pytest.approx(splits[0].epsilon)
