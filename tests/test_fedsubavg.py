"""FedSubAvg (orchestrator/strategies/fedsubavg.py) and row heat (orchestrator/strategies/heat.py), driven as the
server drives a strategy (configure, on_report per report, aggregate), without sockets.

- the paper's Example 1 (hot-and-cold Section 3): FedAvg's cold parameter decays like (1 - 1/N)^r,
  FedSubAvg's like (1 - 2 gamma)^r;
- Algorithm 1, line 9 and appendix D.4's weighted form against a hand computation, untouched rows
  bit for bit;
- heat follows registrations and departures; EmbracingFL roles: a device whose plan freezes the
  table is not in its heat;
- private heat (appendix F): the randomized-response estimate is unbiased, and the strategy never
  holds a true index set.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np
import pytest

from edge_sdk.privacy import PrivateHeat, private_hello_fields, randomized_response
from edge_sdk.protocol import RowSparse
from orchestrator.rounds import RoundState
from orchestrator.strategies import DeviceInfo, DeviceReport, Instruction, RoundContext, make_strategy
from orchestrator.strategies.fedsubavg import ROW_BITS, ROW_EPSILON, FedSubAvg, RowSums
from orchestrator.strategies.heat import RowHeat, TableHeat, rr_probabilities

TABLE = "blocks.emb.weight"
BIAS = "blocks.head.bias"
BLOCKS = ("emb", "head")


def info(device_id: str, rows, samples: int = 1, split: int = 0, role: str = "strong", **kw) -> DeviceInfo:
    return DeviceInfo(device_id, role, split, samples, rows={TABLE: np.asarray(rows, np.int64)}, **kw)


def run_round(strategy, state, devices: dict[str, DeviceInfo], delta_of, round: int = 1, fraction: float = 1.0):
    """configure, one train report per instruction (``delta_of(device, instruction)`` gives the
    tensors; table entries as dense rows of the selection), aggregate."""
    ctx = RoundContext(round=round, global_state=state, devices=devices,
                       state=RoundState(round, deadline=1e18), blocks=BLOCKS, fraction=fraction)
    instructions = list(strategy.configure(ctx))
    for ins in instructions:
        sel = ins.selection
        tensors = {}
        for name, value in delta_of(ins.device_id, ins).items():
            if name in sel.rows:
                value = RowSparse(sel.rows[name], np.asarray(value, state[name].dtype), state[name].shape[0])
            tensors[name] = value
        rep = DeviceReport(ins.device_id, round, "train", devices[ins.device_id].role,
                           devices[ins.device_id].num_samples, (sel.split, len(BLOCKS)),
                           {"loss_before": 1.0, "loss_after": 0.5}, tensors, sel)
        ctx.state.issue(ins.device_id, "train")
        strategy.on_report(rep, ctx)
        ctx.state.on_report(ins.device_id, "train", True)
    return instructions, strategy.aggregate(ctx)


# -- Example 1 -----------------------------------------------------------------------------------
def example1(strategy, n: int, rounds: int, lr: float) -> list[float]:
    """w1 involves client 0 only, w2 every client; f_0 = w1^2 + w2^2, f_i = w2^2: one exact local
    gradient step, dx = -2 lr w on the rows the client holds. Returns w1 after each round."""
    devices = {f"c{i:03d}": info(f"c{i:03d}", [0, 1] if i == 0 else [1]) for i in range(n)}
    state = {TABLE: np.array([[1.0], [1.0]], np.float64)}
    w1 = []
    for r in range(1, rounds + 1):
        def delta(d, ins, state=state):
            rows = ins.selection.rows[TABLE]
            return {TABLE: -2 * lr * state[TABLE][rows]}
        _, result = run_round(strategy, state, devices, delta, round=r)
        state = result.state
        w1.append(float(state[TABLE][0, 0]))
        assert state[TABLE][1, 0] == pytest.approx((1 - 2 * lr) ** r)  # w2 is hot: both alike
    return w1


def test_example1_fedavg_decays_like_one_minus_one_over_n_fedsubavg_reaches_the_optimum():
    n, rounds = 100, 10
    fedavg = example1(FedSubAvg(correction=False), n, rounds, lr=0.5)
    fedsub = example1(FedSubAvg(), n, rounds, lr=0.25)
    # FedAvg, eta = 0.5: (w1^r, w2^r) = ((1 - 1/N)^r w1^0, 0).
    for r, w in enumerate(fedavg, 1):
        assert w == pytest.approx((1 - 1 / n) ** r, rel=1e-12)
    assert fedavg[-1] > 0.9  # ten rounds later the cold parameter has barely moved
    # FedSubAvg, gamma = 0.25: w1^r = (1 - 2 gamma)^r w1^0 = 0.5^r; gamma = 0.5 hits 0 in one round.
    for r, w in enumerate(fedsub, 1):
        assert w == pytest.approx(0.5**r, rel=1e-12)
    assert fedsub[-1] < 1e-3
    assert example1(FedSubAvg(), n, 1, lr=0.5) == [0.0]


# -- line 9 against a hand computation -------------------------------------------------------------
HAND_DEVICES = {
    "a": info("a", [0, 1], samples=10), "b": info("b", [1, 2], samples=30),
    "c": info("c", [1, 2], samples=20), "d": info("d", [1, 3], samples=40),
}
HAND_ROWS = {  # device -> its deltas for its rows, in row order
    "a": [[1, 2], [1, 1]], "b": [[2, 0], [4, 4]], "c": [[1, -1], [0, 2]], "d": [[0, 4], [-2, 2]],
}
HAND_BIAS = {"a": [1, 0], "b": [0, 1], "c": [2, 2], "d": [1, 1]}


def hand_state() -> dict[str, np.ndarray]:
    table = np.arange(12, dtype=np.float32).reshape(6, 2) * np.float32(0.1) + np.float32(1e-3)
    return {TABLE: table, BIAS: np.array([0.5, -0.5], np.float32)}


def hand_delta(d: str, ins: Instruction) -> dict[str, object]:
    return {TABLE: np.array(HAND_ROWS[d], np.float32), BIAS: np.array(HAND_BIAS[d], np.float32)}


@pytest.mark.parametrize("weighting, rows_step, bias_step", [
    # n = [1, 4, 2, 1, 0, 0], N = K = 4: row m moves by N / (n_m K) * sum of its deltas.
    ("uniform", {0: [1, 2], 1: [1, 1], 2: [2, 3], 3: [-2, 2]}, [1, 1]),
    # w = 10, 30, 20, 40 (W = 100); W_m = 10, 100, 50, 40; row m moves by
    # (W / W_m) * sum_i w_i dx_i / sum_i w_i, e.g. row 1: (10[1,1] + 30[2,0] + 20[1,-1] + 40[0,4]) / 100.
    ("samples", {0: [1, 2], 1: [0.9, 1.5], 2: [2.4, 3.2], 3: [-2, 2]}, [0.9, 1.1]),
])
def test_row_update_matches_a_hand_computation(weighting, rows_step, bias_step):
    state = hand_state()
    strategy = FedSubAvg(weighting=weighting)
    instructions, result = run_round(strategy, state, HAND_DEVICES, hand_delta)
    assert {i.device_id: i.selection.rows[TABLE].tolist() for i in instructions} == {
        d: HAND_DEVICES[d].rows[TABLE].tolist() for d in HAND_DEVICES}
    new = result.state[TABLE]
    for row, step in rows_step.items():
        want = state[TABLE][row].astype(np.float64) + np.array(step)
        np.testing.assert_allclose(new[row], want, rtol=1e-6, err_msg=f"row {row}")
    # Rows 4 and 5 belong to nobody: bit for bit the same.
    assert new[4:].tobytes() == state[TABLE][4:].tobytes()
    assert new.dtype == np.float32
    # The dense bias is involved by everyone: FedAvg's (weighted) mean.
    np.testing.assert_allclose(result.state[BIAS], state[BIAS] + np.array(bias_step), rtol=1e-6)
    assert result.contributors == {TABLE: 4, BIAS: 4}
    assert result.extra["touched_rows"] == {TABLE: 4}


def test_untouched_rows_are_bit_identical_and_the_old_state_is_not_modified():
    state = hand_state()
    before = {k: v.copy() for k, v in state.items()}
    devices = {"a": HAND_DEVICES["a"]}
    _, result = run_round(FedSubAvg(), state, devices, hand_delta)
    assert result.state[TABLE][2:].tobytes() == state[TABLE][2:].tobytes()
    assert all(state[k].tobytes() == before[k].tobytes() for k in state)
    # a alone: N = 1, n_0 = n_1 = 1, K = 1: its own deltas.
    np.testing.assert_allclose(result.state[TABLE][:2], before[TABLE][:2] + np.array(HAND_ROWS["a"]), rtol=1e-6)


def test_partial_participation_scales_by_n_over_n_m_k():
    # Five registered devices, K = 2 sampled: row m moves by N / (n_m K) * sum over the sampled.
    devices = {**HAND_DEVICES, "e": info("e", [0, 5], samples=5)}
    strategy = FedSubAvg(k=2, weighting="uniform")
    state = hand_state()
    instructions, result = run_round(strategy, state, devices, lambda d, ins: {
        TABLE: np.ones((len(ins.selection.rows[TABLE]), 2), np.float32), BIAS: np.zeros(2, np.float32)})
    chosen = [i.device_id for i in instructions]
    assert len(chosen) == 2
    n = np.zeros(6)
    for dev in devices.values():
        n[dev.rows[TABLE]] += 1
    held = np.zeros(6)
    for d in chosen:
        held[devices[d].rows[TABLE]] += 1
    for m in range(6):
        step = 5 / (n[m] * 2) * held[m] if held[m] else 0.0
        np.testing.assert_allclose(result.state[TABLE][m], state[TABLE][m] + step, rtol=1e-6, err_msg=f"row {m}")


# -- heat bookkeeping --------------------------------------------------------------------------------
def test_heat_follows_registrations_and_departures():
    state = hand_state()
    strategy = FedSubAvg(weighting="uniform")
    run_round(strategy, state, HAND_DEVICES, hand_delta)
    assert strategy.heat is not None
    np.testing.assert_array_equal(strategy.heat[TABLE].counts, [1, 4, 2, 1, 0, 0])
    assert strategy.heat[TABLE].total == 4
    left = {d: v for d, v in HAND_DEVICES.items() if d != "b"}
    left["f"] = info("f", [4, 5])
    run_round(strategy, state, left, lambda d, ins: {
        TABLE: np.zeros((len(ins.selection.rows[TABLE]), 2), np.float32), BIAS: np.zeros(2, np.float32)}, round=2)
    np.testing.assert_array_equal(strategy.heat[TABLE].counts, [1, 3, 1, 1, 1, 1])
    assert strategy.heat[TABLE].total == 4


def test_embracingfl_roles_a_device_that_freezes_the_table_is_not_in_its_heat():
    devices = {"a": HAND_DEVICES["a"], "b": HAND_DEVICES["b"],
               "w": info("w", [1, 2, 3], split=1, role="weak")}  # plan freezes block 0, the table
    strategy = FedSubAvg(weighting="uniform")
    state = hand_state()

    def delta(d, ins):
        out = {BIAS: np.array([3, 3] if d == "w" else [0, 0], np.float32)}
        if ins.selection.split == 0:
            out[TABLE] = np.ones((len(ins.selection.rows[TABLE]), 2), np.float32)
        return out

    instructions, result = run_round(strategy, state, devices, delta)
    by_device = {i.device_id: i.selection for i in instructions}
    assert by_device["w"].split == 1 and TABLE not in by_device["w"].rows
    np.testing.assert_array_equal(strategy.heat[TABLE].counts, [1, 2, 1, 0, 0, 0])
    assert strategy.heat[TABLE].total == 2  # N of the table: the devices that train it
    # Row 1: N / (n_1 K) * (1 + 1) = 2 / (2 * 2) * 2 = 1; row 3 (only the weak device's data) untouched.
    np.testing.assert_allclose(result.state[TABLE][1], state[TABLE][1] + 1, rtol=1e-6)
    assert result.state[TABLE][3].tobytes() == state[TABLE][3].tobytes()
    np.testing.assert_allclose(result.state[BIAS], state[BIAS] + 1, rtol=1e-6)  # (0 + 0 + 3) / 3


def test_bad_options_and_reports_are_refused_clearly():
    with pytest.raises(ValueError, match="weighting must be one of samples, uniform"):
        FedSubAvg(weighting="median")
    with pytest.raises(ValueError, match="split must be one of planned, zero"):
        FedSubAvg(split="half")
    with pytest.raises(ValueError, match="k must be an integer .* >= 1"):
        FedSubAvg(k=0)
    assert isinstance(make_strategy("fedsubavg", k=3, weighting="samples"), FedSubAvg)
    with pytest.raises(ValueError, match="not a table of the model"):
        run_round(FedSubAvg(), hand_state(), {"x": DeviceInfo("x", "strong", 0, 1, rows={"nope": np.array([0])})},
                  hand_delta)


def test_row_sums_work_only_on_the_rows_of_each_update():
    acc = RowSums(1_000_000, (4,))
    acc.add(RowSparse(np.array([5, 999_999], np.int64), np.ones((2, 4), np.float32), 1_000_000), 2.0)
    acc.add(RowSparse(np.array([5, 7], np.int64), np.ones((2, 4), np.float32), 1_000_000), 1.0)
    assert acc.rows.tolist() == [5, 999_999, 7]
    np.testing.assert_array_equal(acc.sums[:, 0], [3.0, 2.0, 1.0])
    assert acc.sums.shape[0] == 3 and acc._acc.shape[0] < 10_000  # slots for touched rows, not the table


# -- private heat (appendix F) ---------------------------------------------------------------------
def test_randomized_response_estimate_is_unbiased():
    rng = np.random.default_rng(0)
    num_rows, n, eps, seeds = 40, 60, 1.0, 400
    sets = [np.unique(rng.choice(num_rows, size=rng.integers(1, 12), replace=False)) for _ in range(n)]
    truth = np.zeros(num_rows)
    for s in sets:
        truth[s] += 1
    raw = np.zeros((seeds, num_rows))
    for seed in range(seeds):
        table = TableHeat(num_rows)
        dev_rng = np.random.default_rng([1, seed])
        for i, s in enumerate(sets):
            table.add_private(f"d{i}", randomized_response(s, num_rows, eps, dev_rng), eps)
        raw[seed] = table.counts
        clipped = table.heat()
        assert clipped.min() >= 1 and clipped.max() <= n
    p, q = rr_probabilities(eps)
    sd_mean = math.sqrt(n * p * q) / (p - q) / math.sqrt(seeds)  # per row, of the mean over seeds
    # Unbiased: the mean over seeds is within 4.5 standard errors of the true count, on every row.
    assert np.abs(raw.mean(axis=0) - truth).max() < 4.5 * sd_mean, (raw.mean(axis=0) - truth, sd_mean)
    # And not trivially so: a single seed is off by far more than the mean is.
    assert np.abs(raw[0] - truth).mean() > 3 * np.abs(raw.mean(axis=0) - truth).mean()


def test_private_mode_never_holds_a_true_index_set():
    rng = np.random.default_rng(3)
    num_rows, eps = 6, 2.0
    settings = PrivateHeat(eps, {"0": num_rows}, decoy_rate=0.5)
    true_sets = {"a": [0, 1], "b": [1, 2], "c": [1, 2], "d": [1, 3]}
    devices = {}
    for d, rows in true_sets.items():
        for _ in range(100):  # a device's download set is a strict superset of its rows (decoys)
            padded, bits = private_hello_fields({"0": rows}, settings, rng)
            if len(padded["0"]) > len(rows):
                break
        assert set(rows) < set(padded["0"])
        devices[d] = DeviceInfo(d, "strong", 0, 1, rows={TABLE: np.asarray(padded["0"], np.int64)},
                                ext=MappingProxyType({ROW_BITS: {TABLE: bits["0"]}, ROW_EPSILON: eps}))
    strategy = FedSubAvg()
    instructions, result = run_round(strategy, hand_state(), devices, lambda d, ins: {
        TABLE: np.zeros((len(ins.selection.rows[TABLE]), 2), np.float32), BIAS: np.zeros(2, np.float32)})
    # What the strategy holds per device is the randomized bits (and the padded download set the
    # server saw), never the true set; the heat is the debiased estimate, clipped to [1, N].
    table = strategy.heat[TABLE]
    for d, rows in true_sets.items():
        held = table._devices[d]
        assert held.rows is None and held.bits == devices[d].ext[ROW_BITS][TABLE]
        assert set(instructions[[i.device_id for i in instructions].index(d)].selection.rows[TABLE].tolist()) \
            != set(rows)
    heat = table.heat()
    assert heat.min() >= 1 and heat.max() <= 4
    with pytest.raises(ValueError, match="bytes of row bits"):
        TableHeat(num_rows).add_private("x", b"\x00\x00", eps)
    with pytest.raises(ValueError, match="epsilon"):
        PrivateHeat(0.0)


def test_row_heat_weighted_private_and_exact_mix():
    heat = RowHeat({TABLE: 8})
    heat.add("x", [TABLE], 3.0, rows={TABLE: np.array([1, 2])})
    heat.add("y", [TABLE], 5.0, rows={TABLE: np.array([2])})
    np.testing.assert_array_equal(heat[TABLE].heat(), [3, 3, 8, 3, 3, 3, 3, 3])  # clipped to [min w, W]
    np.testing.assert_array_equal(heat[TABLE].counts, [0, 3, 8, 0, 0, 0, 0, 0])
    heat.remove("x")
    np.testing.assert_array_equal(heat[TABLE].counts, [0, 0, 5, 0, 0, 0, 0, 0])
    assert heat.devices == {"y"}
