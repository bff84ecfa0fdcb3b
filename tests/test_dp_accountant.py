"""The privacy ledger (orchestrator/aggregation/privacy/accountant.py) against independent computations, per block
and for the model, and its JSON state: a resumed ledger is the uninterrupted one."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp
from scipy import optimize, stats

from orchestrator.aggregation.privacy.accountant import (
    RDP_ORDERS,
    BlockRelease,
    LedgerError,
    PrivacyLedger,
    RoundEvent,
    combined_multiplier,
    epsilon_for,
)

BLOCKS = ("fc1", "fc2", "fc3", "head")


def independent_rdp_epsilon(q: float, z: float, rounds: int, delta: float, orders) -> float:
    """The Poisson-subsampled Gaussian's RDP at integer orders (Mironov, Talwar, Zhang, 2019,
    Section 3.3: A_a = sum_k C(a, k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 z^2)), RDP = log A_a / (a - 1)),
    composed over the rounds, converted to (epsilon, delta) with Canonne, Kamath, Steinke (2020),
    Proposition 12: eps = rdp + log(1 - 1/a) - log(delta a) / (a - 1)."""
    best = math.inf
    for a in orders:
        terms = [math.lgamma(a + 1) - math.lgamma(k + 1) - math.lgamma(a - k + 1) + (a - k) * math.log1p(-q)
                 + k * math.log(q) + (k * k - k) / (2 * z * z) for k in range(a + 1)]
        top = max(terms)
        log_a = top + math.log(sum(math.exp(t - top) for t in terms))
        best = min(best, rounds * log_a / (a - 1) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
    return best


def analytic_gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    """Exact epsilon of ``rounds`` Gaussian mechanisms of multiplier z without sampling: one Gaussian
    of mu = sqrt(rounds) / z, delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Balle and
    Wang, 2018, Theorem 8), solved for eps."""
    mu = math.sqrt(rounds) / z
    gap = lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return optimize.brentq(gap, 0.0, 200.0)


def test_the_independent_rdp_computation_reproduces_opacus_published_output() -> None:
    # opacus.ai/api/compute_dp_sgd_privacy.html: sample rate 1%, noise multiplier 1.0, 300 steps,
    # delta 1e-5, alphas 2 5 10 20 100 -> "epsilon = 2.39 ... The optimal alpha is 5.0".
    assert round(independent_rdp_epsilon(0.01, 1.0, 300, 1e-5, [2, 5, 10, 20, 100]), 2) == 2.39


@pytest.mark.parametrize(("q", "z", "rounds", "delta"), [
    (0.002, 1.5, 2000, 1e-7), (0.01, 2.0, 500, 1e-6), (0.05, 3.0, 200, 1e-6), (0.001, 1.0, 1000, 1e-8)])
def test_rdp_ledger_equals_the_independent_computation(q: float, z: float, rounds: int, delta: float) -> None:
    """Where the best order is an integer (every order from 11 up is), both bounds are the same number."""
    ledger = PrivacyLedger(["all"], delta, accountant="rdp")
    for _ in range(rounds):
        ledger.record(RoundEvent(q, {"all": BlockRelease(z)}))
    assert ledger.spent().epsilon == pytest.approx(independent_rdp_epsilon(q, z, rounds, delta, range(2, 257)), rel=1e-9)


@pytest.mark.parametrize(("z", "rounds", "delta"), [(5.0, 200, 1e-5), (2.0, 10, 1e-6), (10.0, 1000, 1e-5)])
def test_pld_ledger_meets_the_exact_gaussian_epsilon_from_above(z: float, rounds: int, delta: float) -> None:
    exact = analytic_gaussian_epsilon(z, rounds, delta)
    pld_eps = epsilon_for(z, 1.0, rounds, delta)
    assert exact <= pld_eps <= exact * (1 + 1e-4)
    assert epsilon_for(z, 1.0, rounds, delta, accountant="rdp") > pld_eps  # RDP's conversion is looser


def test_pld_is_below_rdp_within_their_known_gap() -> None:
    """q = 0.1, z = 1, 100 rounds, delta 1e-5: PLD 7.05 against RDP 7.90 (dp-accounting 0.6.0); the
    ledger's coarser discretisation (1e-3) gives the library default's (1e-4) epsilon to 1e-3."""
    event = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    fine = pld.PLDAccountant().compose(event, 100).get_epsilon(1e-5)
    ours, rdp_eps = epsilon_for(1.0, 0.1, 100, 1e-5), epsilon_for(1.0, 0.1, 100, 1e-5, accountant="rdp")
    assert abs(ours - fine) < 1e-3
    assert 0.8 * rdp_eps < ours < rdp_eps
    assert round(ours, 2) == 7.05 and round(rdp_eps, 2) == 7.90


def test_the_model_combines_every_released_block_and_each_block_stands_alone() -> None:
    """Four blocks at z_b = 2: a device training all four meets one Gaussian of z = 1 (the same rule as
    dp-accounting's RDP accountant for composed Gaussians); each block alone is the z = 2 mechanism."""
    assert combined_multiplier([2.0] * 4) == pytest.approx(1.0)
    composed = rdp.RdpAccountant(RDP_ORDERS).compose(dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(2.0)] * 4)), 50)
    ledger = PrivacyLedger(BLOCKS, 1e-5, accountant="rdp")
    for _ in range(50):
        ledger.record(RoundEvent(0.1, {b: BlockRelease(2.0) for b in BLOCKS}))
    spent = ledger.spent()
    assert spent.epsilon == pytest.approx(composed.get_epsilon(1e-5), rel=1e-9)
    assert spent.blocks == pytest.approx({b: epsilon_for(2.0, 0.1, 50, 1e-5, accountant="rdp") for b in BLOCKS})
    assert spent.epsilon > max(spent.blocks.values())


def test_blocks_released_in_fewer_rounds_spend_less() -> None:
    """Rounds in which no device trained the input-side blocks add nothing to theirs."""
    ledger = PrivacyLedger(BLOCKS, 1e-5)
    for r in range(20):
        released = BLOCKS if r % 2 == 0 else BLOCKS[2:]
        ledger.record(RoundEvent(0.05, {b: BlockRelease(3.0) for b in released}))
    spent = ledger.spent()
    assert spent.blocks["fc1"] == pytest.approx(epsilon_for(3.0, 0.05, 10, 1e-5))
    assert spent.blocks["head"] == pytest.approx(epsilon_for(3.0, 0.05, 20, 1e-5))
    assert spent.blocks["fc1"] < spent.blocks["head"] < spent.epsilon


def test_an_adaptive_clip_count_is_accounted_with_the_sum() -> None:
    """Andrew et al. (2021): the count (sensitivity 1/2, noise sigma_b) and the sum compose into
    (z^-2 + (2 sigma_b)^-2)^-1/2."""
    release = BlockRelease(1.2, count_stddev=5.0)
    assert release.multiplier == pytest.approx((1.2**-2 + 10.0**-2) ** -0.5)
    with_count, without = PrivacyLedger(["b"], 1e-5), PrivacyLedger(["b"], 1e-5)
    for _ in range(30):
        with_count.record(RoundEvent(0.1, {"b": release}))
        without.record(RoundEvent(0.1, {"b": BlockRelease(1.2)}))
    assert with_count.spent().epsilon > without.spent().epsilon


def test_fixed_size_cohorts_are_accounted_without_replacement_under_replace_one() -> None:
    ledger = PrivacyLedger(["b"], 1e-5, sampling="fixed")
    assert ledger.accountant == "rdp"
    for _ in range(40):
        ledger.record(RoundEvent.fixed(1000, 50, {"b": BlockRelease(2.0)}))
    direct = rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.REPLACE_ONE).compose(
        dp_accounting.SampledWithoutReplacementDpEvent(1000, 50, dp_accounting.GaussianDpEvent(1.0)), 40)
    assert ledger.spent().epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(LedgerError, match="Poisson sampling in a ledger of fixed sampling"):
        ledger.record(RoundEvent(0.05, {"b": BlockRelease(2.0)}))


def rounds_with_changes() -> list[RoundEvent]:
    """Rounds whose rate, noise and released blocks change along the way."""
    out = []
    for r in range(9):
        q = 0.05 if r < 4 else 0.08
        blocks = BLOCKS if r not in (5, 6) else BLOCKS[1:]
        out.append(RoundEvent(q, {b: BlockRelease(2.5, count_stddev=4.0 if b == "head" else 0.0) for b in blocks}))
    return out


def test_a_resumed_ledger_is_the_uninterrupted_one() -> None:
    events = rounds_with_changes()
    whole = PrivacyLedger(BLOCKS, 1e-6)
    for e in events:
        whole.record(e)
        whole.spent()
    first = PrivacyLedger(BLOCKS, 1e-6)
    for e in events[:5]:
        first.record(e)
        assert first.spent_after(events[5]).rounds == len(first.rounds) + 1  # a look ahead changes nothing
    saved = json.dumps(first.to_json())
    resumed = PrivacyLedger.from_json(json.loads(saved))
    assert resumed.spent() == first.spent()
    for e in events[5:]:
        resumed.record(e)
    assert resumed.spent() == whole.spent()  # exactly: the same floats
    assert resumed.to_json() == whole.to_json()
    assert json.loads(json.dumps(whole.to_json()))["rounds"][0] == {
        "q": 0.05, "blocks": {"fc1": {"z": 2.5}, "fc2": {"z": 2.5}, "fc3": {"z": 2.5},
                              "head": {"z": 2.5, "count_stddev": 4.0}}}


def test_would_exceed_stops_before_the_round_that_passes_the_target() -> None:
    target, event = 3.0, RoundEvent(0.3, {b: BlockRelease(3.0) for b in BLOCKS})  # model z = 1.5
    ledger = PrivacyLedger(BLOCKS, 1e-5)
    while not ledger.would_exceed(target, event):
        ledger.record(event)
    assert ledger.spent().epsilon <= target < ledger.spent_after(event).epsilon
    assert ledger.spent().epsilon == pytest.approx(epsilon_for(1.5, 0.3, len(ledger.rounds), 1e-5))
    assert epsilon_for(1.5, 0.3, len(ledger.rounds) + 1, 1e-5) > target


def test_a_look_ahead_answers_the_rounds_questions_without_the_accountant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server computes a round's look-ahead in a worker thread; then whether it would pass the
    target, what it spent once recorded, and whether the next like it would pass the target are
    answered from what was computed, with the same numbers as a ledger without the look-ahead."""
    from orchestrator.aggregation.privacy import accountant

    event = RoundEvent.fixed(1000, 100, {b: BlockRelease(3.0) for b in BLOCKS})
    plain, ahead = PrivacyLedger(BLOCKS, 1e-5, sampling="fixed"), PrivacyLedger(BLOCKS, 1e-5, sampling="fixed")
    for ledger in (plain, ahead):
        ledger.record(event)
    answers = []
    for r in range(2):
        answers.append((plain.would_exceed(3.0, event), plain.spent_after(event)))
        plain.record(event)
        answers.append(plain.spent())
    calls = []
    epsilon = accountant._View.epsilon
    monkeypatch.setattr(accountant._View, "epsilon", lambda view, *a: calls.append(1) or epsilon(view, *a))
    ahead.look_ahead(event)
    computed = len(calls)
    assert computed > 0
    got = [(ahead.would_exceed(3.0, event), ahead.spent_after(event))]
    ahead.record(event)
    got.append(ahead.spent())
    got.append((ahead.would_exceed(3.0, event), ahead.spent_after(event)))  # the next round's check
    ahead.record(event)
    got.append(ahead.spent())  # the round the check asked about, recorded
    assert len(calls) == computed, "answered from the look-ahead"
    assert got == answers
    ahead.spent_after(RoundEvent.fixed(1000, 100, {b: BlockRelease(2.0) for b in BLOCKS}))
    assert len(calls) > computed  # a round not looked ahead asks the accountant


@pytest.mark.parametrize(("state", "message"), [
    ({"version": 2}, "not a privacy ledger of version 1"),
    ({"version": 1, "blocks": ["a"], "rounds": {}}, "a list of rounds"),
    ({"version": 1, "blocks": ["a"], "delta": 1e-5, "accountant": "pld", "sampling": "poisson",
      "rounds": [{"q": 0.1, "blocks": {"b": {"z": 1.0}}}]}, "blocks the model does not have: b"),
    ({"version": 1, "blocks": ["a"], "delta": 1e-5, "accountant": "pld", "sampling": "poisson",
      "rounds": [{"q": 1.5, "blocks": {"a": {"z": 1.0}}}]}, "sampling rate must be in"),
    ({"version": 1, "blocks": ["a"], "delta": 1e-5, "accountant": "pld", "sampling": "poisson",
      "rounds": [{"q": 0.1, "blocks": {"a": {"z": "nan"}}}]}, "finite number > 0"),
    ({"version": 1, "blocks": ["a"], "delta": 1e-5, "accountant": "pld", "sampling": "poisson",
      "rounds": [{"q": 0.1, "blocks": {"a": {"z": 1.0, "count_stddev": "x"}}}]}, "count_stddev must be a number"),
    ({"version": 1, "blocks": ["a"], "delta": 2, "accountant": "pld", "sampling": "poisson", "rounds": []},
     "delta must be in"),
    ({"version": 1, "blocks": ["a"], "delta": 1e-5, "accountant": "exact", "sampling": "poisson", "rounds": []},
     "accountant must be one of pld, rdp"),
])
def test_a_bad_state_is_refused_in_one_line(state: dict, message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        PrivacyLedger.from_json(state)
