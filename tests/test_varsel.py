"""VaRSeL offline: the weight problems of eq. 8 (closed form) and eq. 4 against brute force, the
budget, and whole rounds in which aligned externals get large weights and noise gets none."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edge_sdk.phases import update_distance
from orchestrator.strategies import DeviceInfo, DeviceReport, Instruction, VaRSeL, make_strategy
from orchestrator.strategies.selection import Selection
from orchestrator.strategies.varsel import approx_weights, phi, phi_tilde, solve_weights
from tests.strategy_driver import context, drive

F32 = np.float32
BLOCKS = ("fc1", "head")


def _grid(n: int, budget: float, steps: int) -> np.ndarray:
    axis = np.linspace(0, 1, steps + 1)
    pts = np.array(list(itertools.product(axis, repeat=n)))
    return pts[pts.sum(1) <= budget + 1e-12]


@pytest.mark.parametrize("seed", range(6))
def test_eq8_closed_form_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, m = 3, int(rng.integers(1, 4))
    d = rng.exponential(1.0, n) * rng.choice([0.1, 1, 10], n)
    a = float(rng.exponential(2.0))
    budget = float(rng.choice([0.5, 1.0, 1.7, 3.0]))
    w = approx_weights(d, a, m, budget)
    assert np.all((w >= 0) & (w <= 1)) and w.sum() <= budget + 1e-9
    pts = _grid(n, budget, 40)
    tot = pts.sum(1)
    brute = float(np.min((a + tot * (pts @ d)) / (m + tot) ** 2))
    assert phi_tilde(w, d, a, m) <= brute + 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_eq4_solver_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n, m = int(rng.integers(2, 4)), int(rng.integers(1, 4))
    x = rng.normal(size=(n, 5)) * rng.choice([0.2, 1.0, 3.0], (n, 1))
    gram = x @ x.T
    a = float(rng.exponential(3.0))
    budget = float(rng.choice([0.8, 1.5, 2.0, 3.0]))
    w = solve_weights(gram, a, m, budget)
    assert np.all((w >= -1e-12) & (w <= 1 + 1e-12)) and w.sum() <= budget + 1e-9
    pts = _grid(n, budget, 30 if n == 3 else 200)
    brute = float(np.min((a + np.einsum("pi,ij,pj->p", pts, gram, pts)) / (m + pts.sum(1)) ** 2))
    assert phi(w, gram, a, m) <= brute * (1 + 1e-6) + 1e-12


def test_eq8_weights_the_nearest_first_and_zero_distances_fill_the_budget():
    w = approx_weights([5.0, 0.0, 0.0, 0.0], a=1.0, m=1, budget=2.0)
    assert w.sum() == pytest.approx(2.0) and w[0] == 0.0
    # Far externals are worth almost no weight (a little always helps: dPhi~/ds = -2A/M^3 at 0).
    far = approx_weights([100.0, 200.0], a=1.0, m=2, budget=2.0)
    assert far.sum() < 0.01 and far[1] == 0.0


def test_solver_inputs_are_checked():
    with pytest.raises(ValueError, match="internal"):
        approx_weights([1.0], a=1.0, m=0, budget=1)
    with pytest.raises(ValueError, match="non-negative"):
        approx_weights([-1.0], a=1.0, m=1, budget=1)
    with pytest.raises(ValueError, match="square"):
        solve_weights(np.ones((2, 3)), 1.0, 1, 1)
    with pytest.raises(ValueError, match="budget"):
        make_strategy("varsel", budget="-2")
    with pytest.raises(ValueError, match="true or false"):
        make_strategy("varsel", exact="maybe")


# -- whole rounds --------------------------------------------------------------------------------
SHAPES = {"blocks.fc1.weight": (8, 6), "blocks.fc1.bias": (8,), "blocks.head.weight": (3, 8)}


def state() -> dict[str, np.ndarray]:
    return {n: np.zeros(s, F32) for n, s in SHAPES.items()}


class Fleet:
    """Internal updates g + noise (0.1 of g's scale unless ``internal_noise``); aligned externals
    g + small noise; noisy externals pure noise; ``zero`` externals an update of exactly 0 (a
    device whose loss is constant on its data)."""

    def __init__(self, m: int, aligned: int, noisy: int, weak: tuple[str, ...] = (), seed: int = 0,
                 zero: int = 0, internal_noise: float = 0.1) -> None:
        rng = np.random.default_rng(seed)
        g = {n: rng.normal(size=s).astype(F32) for n, s in SHAPES.items()}
        self.deltas: dict[str, dict[str, np.ndarray]] = {}
        self.infos: dict[str, DeviceInfo] = {}
        for kind, count, noise in (("int", m, internal_noise), ("ali", aligned, 0.1), ("noi", noisy, None),
                                   ("zer", zero, 0.0)):
            for i in range(count):
                d = f"{kind}{i}"
                split = 1 if d in weak else 0
                names = [n for n in SHAPES if n.split(".")[1] in BLOCKS[split:]]
                self.deltas[d] = {n: (np.zeros(SHAPES[n]) if kind == "zer"
                                      else g[n] + noise * rng.normal(size=SHAPES[n]) if noise is not None
                                      else 3.0 * rng.normal(size=SHAPES[n])).astype(F32) for n in names}
                tags = {"internal": "1"} if kind == "int" else {}
                self.infos[d] = DeviceInfo(d, "weak" if split else "strong", split, 100, tags=tags)
        self.issued: list[Instruction] = []

    def respond(self, ins: Instruction) -> DeviceReport:
        info = self.infos[ins.device_id]
        sel = ins.selection or Selection.tail(info.split)
        base = dict(device_id=ins.device_id, round=1, phase=ins.phase, role=info.role, num_samples=100, selection=sel)
        if ins.phase == "evaluate":
            return DeviceReport(trained=(0, 0), metrics={"loss": 1.0, "accuracy": 0.5}, tensors={}, **base)
        delta = self.deltas[ins.device_id]
        if ins.phase == "compare":  # what every device reports (edge_sdk's compare phase)
            return DeviceReport(trained=(0, 0), metrics=update_distance(delta, ins.broadcast.tensors), tensors={},
                                **base)
        return DeviceReport(trained=(info.split, len(BLOCKS)), metrics={"loss_before": 1.0, "loss_after": 0.5},
                            tensors=delta, **base)


def run(strategy, fleet):
    return drive(strategy, context(state(), fleet.infos, BLOCKS), fleet.respond)


def test_aligned_externals_get_large_weights_and_noise_none():
    fleet = Fleet(m=3, aligned=4, noisy=4)
    strategy = VaRSeL(budget=3)
    result, issued, refusals = run(strategy, fleet)
    assert not refusals
    w_tilde = strategy._w_tilde
    assert sum(w_tilde.values()) <= 3 + 1e-9
    assert all(w_tilde[f"noi{i}"] == 0.0 for i in range(4))
    # Eq. 8 bounds the externals' spread by Cauchy-Schwarz, so its total stays near A / (d M).
    assert sum(w_tilde[f"ali{i}"] for i in range(4)) > 0.3
    included = result.extra["included"]
    assert included and set(included) <= {f"ali{i}" for i in range(4)}
    assert all(w > 0.5 for w in included.values())
    assert result.extra["external_weight_sum"] == pytest.approx(sum(included.values()))
    assert result.extra["external_weight_sum"] <= 3 + 1e-9
    # Line 15: (M g_I + sum_j w_j g_j) / (M + 1'w), computed by hand.
    m, total = 3, 3 + sum(included.values())
    for n in SHAPES:
        want = (sum(fleet.deltas[f"int{i}"][n].astype(np.float64) for i in range(m))
                + sum(w * fleet.deltas[d][n].astype(np.float64) for d, w in included.items())) / total
        np.testing.assert_allclose(result.state[n], want, rtol=1e-5, atol=1e-6)
    # Phases: internal train, then compare for every external, train only for the sampled ones.
    compared = {i.device_id for i in issued if i.phase == "compare"}
    assert compared == {d for d in fleet.infos if not d.startswith("int")}
    assert len({id(i.broadcast) for i in issued if i.phase == "compare"}) == 1
    assert {i.device_id for i in issued if i.phase == "train" and not i.device_id.startswith("int")} == set(
        strategy._sampled)


def test_eq4_gives_aligned_updates_full_weight_and_noise_none():
    rng = np.random.default_rng(4)
    g = rng.normal(size=200)
    internal = g + 0.3 * rng.normal(size=(3, 200))
    g_i = internal.mean(0)
    a = float(np.sum((internal - g_i) ** 2))
    externals = np.vstack([g + 0.3 * rng.normal(size=(4, 200)), 3.0 * rng.normal(size=(3, 200))])
    diff = externals - g_i
    w = solve_weights(diff @ diff.T, a, 3, budget=5)
    # Together the aligned externals count more than one more internal device; noise counts for nothing.
    assert w[:4].sum() > 1.0 and np.all(w[:4] > 0.15) and np.all(w[4:] < 0.02)
    assert w.sum() <= 5 + 1e-9
    w = solve_weights(diff @ diff.T, a, 3, budget=0.5)
    assert w.sum() == pytest.approx(0.5, abs=1e-6) and np.all(w[4:] < 0.02)


def test_only_noise_externals_leave_the_internal_mean():
    fleet = Fleet(m=2, aligned=0, noisy=5)
    result, _, _ = run(VaRSeL(budget=2), fleet)
    assert result.extra["external_weight_sum"] == 0.0 and result.extra["included"] == {}
    for n in SHAPES:
        want = (fleet.deltas["int0"][n].astype(np.float64) + fleet.deltas["int1"][n]) / 2
        np.testing.assert_allclose(result.state[n], want, rtol=1e-6)


def test_budget_holds_with_many_aligned_externals():
    fleet = Fleet(m=2, aligned=10, noisy=0, seed=3)
    strategy = VaRSeL(budget_fraction=0.3)  # K = 3 of 10
    result, _, _ = run(strategy, fleet)
    assert result.extra["budget"] == pytest.approx(3.0)
    assert sum(strategy._w_tilde.values()) <= 3 + 1e-9
    assert result.extra["external_weight_sum"] <= 3 + 1e-9


def test_approximate_mode_folds_with_w_tilde():
    fleet = Fleet(m=3, aligned=3, noisy=2, seed=5)
    strategy = VaRSeL(budget=2, exact=False)
    result, _, _ = run(strategy, fleet)
    assert result.extra["included"] == pytest.approx({d: strategy._w_tilde[d] for d in strategy._sampled})


def test_a_weak_external_is_compared_on_the_common_tail_and_averaged_where_it_trained():
    fleet = Fleet(m=2, aligned=2, noisy=1, weak=("ali0",), seed=1)
    for seed in range(20):  # externals are sampled with probability w~_j: find a round that drew ali0
        strategy = VaRSeL(budget=2, seed=seed)
        result, issued, _ = run(strategy, fleet)
        if "ali0" in result.extra["included"]:
            break
    b = next(i.broadcast for i in issued if i.phase == "compare")
    assert set(b.tensors) == {"blocks.head.weight"}  # the tail every participant trains
    assert "ali0" in result.extra["included"]
    assert result.contributors["blocks.fc1.weight"] == 2 + ("ali1" in result.extra["included"])


# -- one internal device, and the Section 4.1 variant ---------------------------------------------
def test_a_fleet_with_one_internal_device_is_refused_with_a_clear_error():
    fleet = Fleet(m=1, aligned=3, noisy=2)
    with pytest.raises(ValueError, match="one internal device.*internal_noise"):
        run(VaRSeL(budget=2), fleet)


def test_one_internal_device_with_internal_noise_estimates_the_scatter_from_assumption_1():
    fleet = Fleet(m=1, aligned=3, noisy=2, seed=2)
    strategy = VaRSeL(budget=2, internal_noise=0.5)
    result, _, refusals = run(strategy, fleet)
    assert not refusals
    g = fleet.deltas["int0"]
    want_a = 0.5 * sum(float(np.sum(g[n].astype(np.float64) ** 2)) for n in SHAPES)
    assert result.extra["internal_spread"] == pytest.approx(want_a, rel=1e-6)
    # With A > 0 the aligned externals get weight, the noisy ones none (not the silent zeros of A = 0).
    assert result.extra["external_weight_sum"] > 0
    assert set(result.extra["included"]) <= {"ali0", "ali1", "ali2"}


def test_a_round_left_with_one_internal_update_trains_it_alone_and_says_so():
    fleet = Fleet(m=2, aligned=3, noisy=1, seed=4)
    strategy = VaRSeL(budget=2)
    run(strategy, fleet)  # a round with both internal devices: the fleet has two
    infos = {d: i for d, i in fleet.infos.items() if d != "int1"}  # then int1 drops out
    result, issued, _ = drive(strategy, context(state(), infos, BLOCKS, round=2), fleet.respond)
    assert "one internal update" in result.extra["externals_skipped"]
    assert result.extra["included"] == {} and not [i for i in issued if i.phase == "compare"]
    for n in SHAPES:
        np.testing.assert_allclose(result.state[n], fleet.deltas["int0"][n], rtol=1e-6)


def test_the_section_4_1_variant_solves_eq4_over_every_external():
    fleet = Fleet(m=3, aligned=3, noisy=2, seed=6)
    strategy = VaRSeL(budget=3, variant="all_externals")
    result, issued, refusals = run(strategy, fleet)
    assert not refusals and result.extra["variant"] == "all_externals"
    externals = sorted(d for d in fleet.infos if not d.startswith("int"))
    assert sorted(i.device_id for i in issued if i.phase == "train" and i.device_id in externals) == externals
    assert not [i for i in issued if i.phase == "compare"]  # no eq. 8 step
    # The weights are eq. 4's optimum over all five updates, computed here from the same numbers.
    g_i = {n: sum(fleet.deltas[f"int{i}"][n].astype(np.float64) for i in range(3)) / 3 for n in SHAPES}
    a = sum(float(np.sum((fleet.deltas[f"int{i}"][n] - g_i[n]) ** 2)) for i in range(3) for n in SHAPES)
    diff = np.stack([np.concatenate([(fleet.deltas[d][n] - g_i[n]).ravel() for n in SHAPES]) for d in externals])
    want = solve_weights(diff @ diff.T, a, 3, 3)
    got = np.array([result.extra["included"].get(d, 0.0) for d in externals])
    np.testing.assert_allclose(got, np.where(want > 0, want, 0.0), atol=1e-6)
    assert got[:3].sum() > 0.5 and np.all(got[3:] < 0.02)
    with pytest.raises(ValueError, match="exact"):
        VaRSeL(variant="all_externals", exact=False)
    with pytest.raises(ValueError, match="variant must be one of algorithm1, all_externals"):
        VaRSeL(variant="other")


# -- an external whose update is identically zero -------------------------------------------------
def test_a_zero_update_external_gets_no_weight_though_eq8_alone_would_give_it_the_most():
    # Internal updates that scatter widely (A large) and externals that are noise: eq. 8 on the raw
    # distances prices the zero update as shrinking g_I, its distance ||0 - g_I||^2 the smallest.
    fleet = Fleet(m=3, aligned=0, noisy=3, zero=1, internal_noise=1.5, seed=7)
    m = 3
    g_i = {n: sum(fleet.deltas[f"int{i}"][n].astype(np.float64) for i in range(m)) / m for n in SHAPES}
    a = sum(float(np.sum((fleet.deltas[f"int{i}"][n] - g_i[n]) ** 2)) for i in range(m) for n in SHAPES)
    externals = ["noi0", "noi1", "noi2", "zer0"]
    d = [sum(float(np.sum((fleet.deltas[e][n] - g_i[n]) ** 2)) for n in SHAPES) for e in externals]
    by_hand = approx_weights(d, a, m, 2.0)
    assert by_hand[3] == 1.0 and by_hand[3] == by_hand.max()  # what the rule would do without it
    for exact in (True, False):
        strategy = VaRSeL(budget=2, exact=exact)
        result, issued, refusals = run(strategy, fleet)
        assert not refusals
        assert result.extra["zero_updates"] == ["zer0"]
        assert "zer0" not in strategy._w_tilde and "zer0" not in result.extra["included"]
        assert "zer0" not in {i.device_id for i in issued if i.phase == "train"}
        # The others are weighed by eq. 8 as if the zero update were not there.
        want = approx_weights(d[:3], a, m, 2.0)
        assert [strategy._w_tilde[e] for e in externals[:3]] == pytest.approx(list(want))


def test_the_section_4_1_variant_leaves_a_zero_update_out_of_eq4():
    fleet = Fleet(m=3, aligned=2, noisy=1, zero=1, internal_noise=0.5, seed=8)
    strategy = VaRSeL(budget=3, variant="all_externals")
    result, _, _ = run(strategy, fleet)
    assert result.extra["zero_updates"] == ["zer0"] and "zer0" not in result.extra["included"]
    g_i = {n: sum(fleet.deltas[f"int{i}"][n].astype(np.float64) for i in range(3)) / 3 for n in SHAPES}
    a = sum(float(np.sum((fleet.deltas[f"int{i}"][n] - g_i[n]) ** 2)) for i in range(3) for n in SHAPES)
    others = ["ali0", "ali1", "noi0"]
    diff = np.stack([np.concatenate([(fleet.deltas[e][n] - g_i[n]).ravel() for n in SHAPES]) for e in others])
    want = solve_weights(diff @ diff.T, a, 3, 3)
    got = np.array([result.extra["included"].get(e, 0.0) for e in others])
    np.testing.assert_allclose(got, np.where(want > 0, want, 0.0), atol=1e-6)
