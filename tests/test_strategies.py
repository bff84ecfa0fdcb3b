"""Aggregation strategies: exact hand-computed averages, refusal, order independence.

Strategies are driven here as the server drives them (configure, on_report per report, aggregate)
without sockets: :func:`run` builds the round context from the reports' devices.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import RowSparse
from orchestrator.rounds import RoundState
from orchestrator.strategies import (
    STRATEGY_NAMES,
    DeviceInfo,
    DeviceReport,
    EmbracingFL,
    FedAvg,
    Refused,
    RoundContext,
    WeightedSums,
    make_strategy,
)
from orchestrator.strategies.selection import Selection

F32 = np.float32
BLOCKS = ("fc1", "head")


def global_state() -> dict[str, np.ndarray]:
    return {
        "blocks.fc1.weight": np.array([[1, -1], [0.5, 2]], F32),
        "blocks.fc1.bias": np.array([0, 0], F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(5, np.int64),
        "blocks.head.weight": np.array([[0, 0]], F32),
        "blocks.head.bias": np.array([1], F32),
    }


def report(device_id, role, trained, samples, tensors, loss_before=1.0, loss_after=0.5, phase="train",
           selection=None) -> DeviceReport:
    return DeviceReport(device_id=device_id, round=1, phase=phase, role=role, num_samples=samples,
                        trained=tuple(trained), metrics={"loss_before": loss_before, "loss_after": loss_after},
                        tensors=tensors, selection=selection or Selection.tail(trained[0]))


def strong(device_id: str, samples: int, fc1_w, fc1_b, nbt: int, head_w, head_b) -> DeviceReport:
    return report(device_id, "strong", (0, 2), samples, {
        "blocks.fc1.weight": np.array(fc1_w, F32),
        "blocks.fc1.bias": np.array(fc1_b, F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(nbt, np.int64),
        "blocks.head.weight": np.array(head_w, F32),
        "blocks.head.bias": np.array(head_b, F32),
    }, 2.0, 1.0)


def weak(device_id: str, samples: int, head_w, head_b) -> DeviceReport:
    return report(device_id, "weak", (1, 2), samples,
                  {"blocks.head.weight": np.array(head_w, F32), "blocks.head.bias": np.array(head_b, F32)}, 3.0, 2.0)


S1 = strong("s1", 10, [[1, 0], [2, -4]], [1, 1], 3, [[1, 1]], [0.5])
S2 = strong("s2", 30, [[-1, 4], [2, 0]], [0, 0], 7, [[2, -2]], [0.5])
W1 = weak("w1", 60, [[4, 1]], [2])


def context(state, reports, blocks=BLOCKS, round=1) -> RoundContext:
    devices = {r.device_id: DeviceInfo(r.device_id, r.role, r.trained[0], r.num_samples) for r in reports}
    return RoundContext(round=round, global_state=state, devices=devices, state=RoundState(round, deadline=1e18),
                        blocks=tuple(blocks))


def run(strategy, reports, state=None, blocks=BLOCKS):
    """One round as the server runs it: configure, then every report in order, then aggregate."""
    state = global_state() if state is None else state
    ctx = context(state, reports, blocks)
    strategy.configure(ctx)
    for r in reports:
        ctx.state.issue(r.device_id, r.phase)
        try:
            strategy.on_report(r, ctx)
            ctx.state.on_report(r.device_id, r.phase, True)
        except Refused:
            ctx.state.on_report(r.device_id, r.phase, False)
    return strategy.aggregate(ctx)


def assert_state_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)


# -- EmbracingFL: exact numbers ------------------------------------------------------------------
def test_embracingfl_sample_weighted_two_strong_one_weak():
    result = run(EmbracingFL(max_weight_share=1.0), [S1, S2, W1])  # the paper's rule, uncapped
    # fc1 (input side, y): strong devices only, weights 10 and 30 (Section 3.1, 1/s rule with w_i).
    # head (output side, z): all three, weights 10, 30, 60.
    want = {
        "blocks.fc1.weight": np.array([[1 - 0.5, -1 + 3], [0.5 + 2, 2 - 1]], F32),  # (10 d1 + 30 d2) / 40
        "blocks.fc1.bias": np.array([0.25, 0.25], F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(5 + 7, np.int64),  # counters take the max
        "blocks.head.weight": np.array([[3.1, 0.1]], F32),  # (10*1 + 30*2 + 60*4) / 100, (10 - 60 + 60) / 100
        "blocks.head.bias": np.array([1 + 1.4], F32),  # (5 + 15 + 120) / 100
    }
    assert_state_equal(result.state, want)
    assert result.devices == ("s1", "s2", "w1")
    assert result.num_samples == 100
    assert result.contributors == {
        "blocks.fc1.weight": 2,
        "blocks.fc1.bias": 2,
        "blocks.fc1.bn.num_batches_tracked": 2,
        "blocks.head.weight": 3,
        "blocks.head.bias": 3,
    }
    assert result.roles == {"strong": 2, "weak": 1}
    assert result.rejected == 0
    assert result.mean_loss_before == pytest.approx((2.0 * 40 + 3.0 * 60) / 100)
    assert result.summary()["devices"] == 3


def test_embracingfl_uniform_is_the_papers_one_over_s_and_one_over_m():
    result = run(EmbracingFL(weighting="uniform"), [S1, S2, W1])
    want = {
        "blocks.fc1.weight": np.array([[1 + 0, -1 + 2], [0.5 + 2, 2 - 2]], F32),  # (d1 + d2) / s, s = 2
        "blocks.fc1.bias": np.array([0.5, 0.5], F32),
        "blocks.fc1.bn.num_batches_tracked": np.array(12, np.int64),
        "blocks.head.weight": np.array([[7 / 3, 0]], F32),  # (1 + 2 + 4) / m, m = 3
        "blocks.head.bias": np.array([1 + 1], F32),  # (0.5 + 0.5 + 2) / 3
    }
    assert_state_equal(result.state, want)


def test_entries_nobody_trained_keep_their_old_value():
    old = global_state()
    result = run(EmbracingFL(), [W1])
    for key in ("blocks.fc1.weight", "blocks.fc1.bias", "blocks.fc1.bn.num_batches_tracked"):
        np.testing.assert_array_equal(result.state[key], old[key])
    np.testing.assert_allclose(result.state["blocks.head.weight"], [[4, 1]])
    assert set(result.untouched) == {"blocks.fc1.weight", "blocks.fc1.bias", "blocks.fc1.bn.num_batches_tracked"}


def test_aggregate_does_not_modify_the_input_state_and_round_closes():
    state = global_state()
    before = {k: v.copy() for k, v in state.items()}
    strategy = EmbracingFL()
    result = run(strategy, [S1, W1], state=state)
    assert_state_equal(state, before)
    assert result.state["blocks.head.weight"] is not state["blocks.head.weight"]
    with pytest.raises(RuntimeError, match="before configure"):
        strategy.on_report(S1, context(state, [S1]))


def test_a_round_without_updates_keeps_the_model():
    result = run(EmbracingFL(), [])
    assert_state_equal(result.state, global_state())
    assert result.devices == () and result.mean_loss_after is None


def test_with_a_real_layered_model_state():
    torch = pytest.importorskip("torch")
    from edge_sdk.models.zoo import build_model

    model = build_model("digits_mlp", seed=0)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    L = len(model)
    rng = np.random.default_rng(0)

    def update(device_id, role, split, samples):
        names = model.state_names(split, L)
        deltas = {n: rng.normal(size=state[n].shape).astype(F32) for n in names}
        return report(device_id, role, (split, L), samples, deltas)

    updates = [update("a", "strong", 0, 10), update("b", "moderate", 2, 20), update("c", "weak", 3, 30)]
    result = run(EmbracingFL(max_weight_share=1.0), updates, state=state, blocks=model.block_names)
    head = "blocks.head.weight"
    want = state[head] + (10 * updates[0].tensors[head] + 20 * updates[1].tensors[head] + 30 * updates[2].tensors[head]) / 60
    np.testing.assert_allclose(result.state[head], want, rtol=1e-5, atol=1e-6)
    fc1 = "blocks.fc1.0.weight"
    np.testing.assert_allclose(result.state[fc1], state[fc1] + updates[0].tensors[fc1], rtol=1e-6, atol=1e-6)
    assert result.contributors[fc1] == 1 and result.contributors["blocks.fc3.0.bias"] == 2
    model.load_state_dict({k: torch.from_numpy(v) for k, v in result.state.items()})  # shapes/dtypes fit


# -- refusal -------------------------------------------------------------------------------
def _with(r: DeviceReport, **changes) -> DeviceReport:
    fields = dict(r.__dict__)
    fields.update(changes)
    return DeviceReport(**fields)


NAMES_S = list(global_state())
NAMES_W = ["blocks.head.weight", "blocks.head.bias"]
BAD_TENSORS = {
    "shape": (_with(S2, tensors={**S2.tensors, "blocks.head.weight": np.zeros((2, 1), F32)}), NAMES_S, "shape"),
    "dtype": (_with(S2, tensors={**S2.tensors, "blocks.head.bias": np.array([0.5], np.float64)}), NAMES_S, "dtype"),
    "unknown name": (_with(W1, tensors={**W1.tensors, "blocks.evil.weight": np.zeros(1, F32)}), NAMES_W, "not sent"),
    "not an array": (_with(W1, tensors={**W1.tensors, "blocks.head.bias": [1.0]}), NAMES_W, "not a dense tensor"),
    "outside the tail": (_with(W1, tensors={**W1.tensors, "blocks.fc1.bias": np.zeros(2, F32)}), NAMES_W, "not sent"),
    "empty": (_with(W1, tensors={}), NAMES_W, "missing"),
    "missing bias": (_with(W1, tensors={"blocks.head.weight": W1.tensors["blocks.head.weight"]}), NAMES_W,
                     "missing ['blocks.head.bias']"),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_the_server_check_refuses_tensors_outside_what_was_sent(case):
    # The server runs Selection.check on every report before a strategy sees it (NaN/Inf are
    # refused earlier, when the tensors are decoded).
    bad, names, fragment = BAD_TENSORS[case]
    reason = bad.selection.check(bad.tensors, global_state(), names)
    assert reason is not None and fragment in reason
    assert S1.selection.check(S1.tensors, global_state(), NAMES_S) is None
    assert W1.selection.check(W1.tensors, global_state(), NAMES_W) is None


@pytest.mark.parametrize("bad, fragment", [
    (_with(W1, role="admin"), "unknown role"),
    (_with(W1, trained=(0, 1)), "must end at the last block"),
    (_with(W1, trained=(0, 2)), "is not the tail"),
    (_with(W1, phase="evaluate"), "only train reports"),
])
def test_embracingfl_refuses_a_report_and_leaves_the_round_untouched(bad, fragment):
    reference = run(EmbracingFL(), [S1])
    strategy = EmbracingFL()
    ctx = context(global_state(), [S1, W1])
    strategy.configure(ctx)
    strategy.on_report(S1, ctx)
    with pytest.raises(Refused, match=fragment):
        strategy.on_report(bad, ctx)
    result = strategy.aggregate(ctx)
    assert_state_equal(result.state, reference.state)
    assert result.devices == ("s1",) and result.rejected == 1
    assert result.contributors == reference.contributors


def test_default_configure_trains_each_sampled_device_on_its_planned_tail():
    ctx = context(global_state(), [S1, S2, W1])
    ctx.fraction = 1.0
    instructions = EmbracingFL().configure(ctx)
    assert [(i.device_id, i.phase, i.selection.kind, i.selection.split) for i in instructions] == [
        ("s1", "train", "tail", 0), ("s2", "train", "tail", 0), ("w1", "train", "tail", 1)]
    ctx.fraction = 0.34
    assert len(EmbracingFL().configure(ctx)) == 2  # ceil(0.34 * 3)
    assert all(i.selection.split == 0 for i in FedAvg().configure(context(global_state(), [W1])))


def test_row_and_channel_deltas_are_averaged_over_their_own_contributors():
    state = {"t": np.arange(12, dtype=F32).reshape(6, 2), "w": np.zeros((3, 4), F32)}
    sums = WeightedSums(state)
    sums.add("t", RowSparse(np.array([1, 4]), np.array([[1, 1], [2, 2]], F32), 6), 1.0)
    sums.add("t", RowSparse(np.array([4, 5]), np.array([[4, 4], [3, 3]], F32), 6), 3.0)
    sums.add("w", np.ones((2, 2), F32), 1.0, (slice(0, 2), slice(0, 2)))
    sums.add("w", np.full((3, 4), 5, F32), 1.0)
    new = sums.new_state()
    want_t = state["t"].copy()
    want_t[1] += 1
    want_t[4] += (2 * 1 + 4 * 3) / 4
    want_t[5] += 3
    np.testing.assert_allclose(new["t"], want_t)
    for row in (0, 2, 3):  # untouched rows: bit for bit
        assert new["t"][row].tobytes() == state["t"][row].tobytes()
    want_w = np.full((3, 4), 5, F32)
    want_w[:2, :2] = 3  # (1 + 5) / 2 where both contributed
    np.testing.assert_allclose(new["w"], want_w)


# -- FedAvg ----------------------------------------------------------------------------------
def test_fedavg_averages_full_updates():
    result = run(FedAvg(max_weight_share=1.0), [S1, S2])  # the paper's sample-weighted mean, uncapped
    np.testing.assert_allclose(result.state["blocks.head.weight"], [[(10 * 1 + 30 * 2) / 40, (10 - 60) / 40]])
    np.testing.assert_allclose(result.state["blocks.fc1.weight"], [[0.5, 2], [2.5, 1]])
    result = run(FedAvg(weighting="uniform"), [S1, S2])
    np.testing.assert_allclose(result.state["blocks.head.weight"], [[1.5, -0.5]])
    np.testing.assert_allclose(result.state["blocks.fc1.weight"], [[1, 1], [2.5, 0]])


def test_fedavg_refuses_a_partial_update():
    strategy = FedAvg()
    ctx = context(global_state(), [S1, W1])
    strategy.configure(ctx)
    with pytest.raises(Refused, match="whole model"):
        strategy.on_report(W1, ctx)
    strategy.on_report(S1, ctx)
    result = strategy.aggregate(ctx)
    assert result.devices == ("s1",) and result.rejected == 1


# -- registry --------------------------------------------------------------------------------
def test_make_strategy_by_name():
    assert set(STRATEGY_NAMES) >= {"fedavg", "embracingfl"}
    s = make_strategy("embracingfl", weighting="uniform")
    assert isinstance(s, EmbracingFL) and s.weighting == "uniform"
    assert isinstance(make_strategy("fedavg"), FedAvg)
    with pytest.raises(ValueError, match="unknown strategy 'fedprox'; known: fedavg, embracingfl"):
        make_strategy("fedprox")
    assert isinstance(make_strategy("orchestrator.strategies:FedAvg"), FedAvg)
    with pytest.raises(ValueError, match="not a Strategy subclass"):
        make_strategy("orchestrator.strategies:make_strategy")
    with pytest.raises(ValueError, match="option momentum is not one of its options: weighting, aggregation, trim"):
        make_strategy("fedavg", momentum=0.9)
    with pytest.raises(ValueError, match="weighting must be one of samples, uniform, got .median."):
        make_strategy("fedavg", weighting="median")


# -- order independence ----------------------------------------------------------------------
SHAPES = {"blocks.a.w": (3, 2), "blocks.a.b": (3,), "blocks.b.w": (2, 2), "blocks.c.w": (4,), "blocks.c.n": ()}
BLOCK_OF = {"blocks.a.w": 0, "blocks.a.b": 0, "blocks.b.w": 1, "blocks.c.w": 2, "blocks.c.n": 2}


@st.composite
def rounds(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(1, 6))
    updates = []
    for i in range(n):
        split = draw(st.integers(0, 2))
        role = ("strong", "moderate", "weak")[split]
        deltas = {}
        for key, shape in SHAPES.items():
            if BLOCK_OF[key] >= split:
                if key.endswith(".n"):
                    deltas[key] = np.array(rng.integers(0, 100), np.int64)
                else:
                    deltas[key] = (rng.normal(size=shape) * 10 ** rng.uniform(-3, 3)).astype(F32)
        samples = draw(st.integers(1, 10_000))
        updates.append(report(f"d{i}", role, (split, 3), samples, deltas))
    order = draw(st.permutations(range(n)))
    return updates, order


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {k: (np.array(7, np.int64) if k.endswith(".n") else rng.normal(size=s).astype(F32)) for k, s in SHAPES.items()}


@settings(max_examples=60, deadline=None)
@given(rounds(), st.sampled_from(["samples", "uniform"]))
def test_fold_order_does_not_change_the_result(case, weighting):
    updates, order = case
    first = run(EmbracingFL(weighting=weighting, max_weight_share=1.0), updates, state=_state(), blocks=("a", "b", "c"))
    second = run(EmbracingFL(weighting=weighting, max_weight_share=1.0), [updates[i] for i in order], state=_state(), blocks=("a", "b", "c"))
    old = _state()
    for key in SHAPES:
        np.testing.assert_allclose(first.state[key], second.state[key], rtol=1e-6, atol=1e-6)
        # and both equal the direct formula: old + sum_{C_k} w_i d_i / sum_{C_k} w_i
        contrib = [u for u in updates if key in u.tensors]
        if not contrib:
            want = old[key]
        elif key.endswith(".n"):
            want = old[key] + max(int(u.tensors[key]) for u in contrib)
        else:
            w = np.array([u.num_samples if weighting == "samples" else 1 for u in contrib], np.float64)
            d = np.stack([u.tensors[key].astype(np.float64) for u in contrib])
            want = old[key] + np.tensordot(w, d, axes=1) / w.sum()
        np.testing.assert_allclose(first.state[key], want, rtol=1e-5, atol=1e-5)
        assert first.contributors[key] == len(contrib)


# -- robust aggregation ----------------------------------------------------------------------
@pytest.mark.parametrize("cls", [FedAvg, EmbracingFL])
def test_median_and_trimmed_mean_ignore_an_outlier(cls):
    values = [0.1, 0.2, 0.3, 0.4, 1000.0]  # one hostile device
    reports = [strong(f"s{i}", 10 * (i + 1), [[v, v], [v, v]], [v, v], 1, [[v, v]], [v]) for i, v in enumerate(values)]
    old = global_state()
    median = run(cls(aggregation="median"), reports)
    trimmed = run(cls(aggregation="trimmed_mean", trim=0.2), reports)
    for key in ("blocks.fc1.weight", "blocks.fc1.bias", "blocks.head.weight", "blocks.head.bias"):
        np.testing.assert_allclose(median.state[key], old[key] + 0.3, rtol=1e-6)
        np.testing.assert_allclose(trimmed.state[key], old[key] + (0.2 + 0.3 + 0.4) / 3, rtol=1e-6)
    assert median.state["blocks.fc1.bn.num_batches_tracked"] == 5 + 1  # counters: the largest, as for the mean


def test_robust_aggregation_is_per_entry_over_its_contributors():
    # The head has three contributors (s1, s2, w1); fc1 only the two strong ones.
    result = run(EmbracingFL(aggregation="median"), [S1, S2, W1])
    old = global_state()
    np.testing.assert_allclose(result.state["blocks.head.bias"], old["blocks.head.bias"] + 0.5)  # median(.5,.5,2)
    np.testing.assert_allclose(result.state["blocks.fc1.bias"], old["blocks.fc1.bias"] + 0.5)  # median(1, 0)
    with pytest.raises(ValueError, match="aggregation must be one of mean, median, trimmed_mean"):
        EmbracingFL(aggregation="mode")
    with pytest.raises(ValueError, match="trim"):
        FedAvg(aggregation="trimmed_mean", trim=0.5)
