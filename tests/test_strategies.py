"""Aggregation strategies: exact hand-computed averages, rejection, order independence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.strategies import (
    STRATEGY_NAMES,
    DeviceUpdate,
    EmbracingFL,
    FedAvg,
    UpdateRejected,
    make_strategy,
)

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


def strong(device_id: str, samples: int, fc1_w, fc1_b, nbt: int, head_w, head_b) -> DeviceUpdate:
    return DeviceUpdate(
        device_id=device_id,
        role="strong",
        trained=(0, 2),
        num_samples=samples,
        deltas={
            "blocks.fc1.weight": np.array(fc1_w, F32),
            "blocks.fc1.bias": np.array(fc1_b, F32),
            "blocks.fc1.bn.num_batches_tracked": np.array(nbt, np.int64),
            "blocks.head.weight": np.array(head_w, F32),
            "blocks.head.bias": np.array(head_b, F32),
        },
        loss_before=2.0,
        loss_after=1.0,
    )


def weak(device_id: str, samples: int, head_w, head_b) -> DeviceUpdate:
    return DeviceUpdate(
        device_id=device_id,
        role="weak",
        trained=(1, 2),
        num_samples=samples,
        deltas={"blocks.head.weight": np.array(head_w, F32), "blocks.head.bias": np.array(head_b, F32)},
        loss_before=3.0,
        loss_after=2.0,
    )


S1 = strong("s1", 10, [[1, 0], [2, -4]], [1, 1], 3, [[1, 1]], [0.5])
S2 = strong("s2", 30, [[-1, 4], [2, 0]], [0, 0], 7, [[2, -2]], [0.5])
W1 = weak("w1", 60, [[4, 1]], [2])


def run(strategy, updates, state=None):
    strategy.begin_round(1, global_state() if state is None else state)
    for u in updates:
        strategy.fold(u)
    return strategy.finish()


def assert_state_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)


# -- EmbracingFL: exact numbers ------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [None, BLOCKS])
def test_embracingfl_sample_weighted_two_strong_one_weak(blocks):
    result = run(EmbracingFL(blocks=blocks), [S1, S2, W1])
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


def test_finish_does_not_modify_the_input_state_and_round_closes():
    state = global_state()
    before = {k: v.copy() for k, v in state.items()}
    strategy = EmbracingFL()
    result = run(strategy, [S1, W1], state=state)
    assert_state_equal(state, before)
    assert result.state["blocks.head.weight"] is not state["blocks.head.weight"]
    assert strategy.round is None
    with pytest.raises(RuntimeError, match="begin_round"):
        strategy.fold(S1)


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
        return DeviceUpdate(device_id, role, (split, L), samples, deltas, 1.0, 0.5)

    updates = [update("a", "strong", 0, 10), update("b", "moderate", 2, 20), update("c", "weak", 3, 30)]
    result = run(EmbracingFL(blocks=model.block_names), updates, state=state)
    head = "blocks.head.weight"
    want = state[head] + (10 * updates[0].deltas[head] + 20 * updates[1].deltas[head] + 30 * updates[2].deltas[head]) / 60
    np.testing.assert_allclose(result.state[head], want, rtol=1e-5, atol=1e-6)
    fc1 = "blocks.fc1.0.weight"
    np.testing.assert_allclose(result.state[fc1], state[fc1] + updates[0].deltas[fc1], rtol=1e-6, atol=1e-6)
    assert result.contributors[fc1] == 1 and result.contributors["blocks.fc3.0.bias"] == 2
    model.load_state_dict({k: torch.from_numpy(v) for k, v in result.state.items()})  # shapes/dtypes fit


# -- rejection -------------------------------------------------------------------------------
def _with(update: DeviceUpdate, **changes) -> DeviceUpdate:
    fields = dict(update.__dict__)
    fields.update(changes)
    return DeviceUpdate(**fields)


BAD_UPDATES = {
    "nan": (_with(S2, deltas={**S2.deltas, "blocks.head.bias": np.array([np.nan], F32)}), "NaN"),
    "inf": (_with(S2, deltas={**S2.deltas, "blocks.fc1.weight": np.full((2, 2), np.inf, F32)}), "NaN or Inf"),
    "shape": (_with(S2, deltas={**S2.deltas, "blocks.head.weight": np.zeros((2, 1), F32)}), "shape"),
    "dtype": (_with(S2, deltas={**S2.deltas, "blocks.head.bias": np.array([0.5], np.float64)}), "dtype"),
    "unknown name": (_with(W1, deltas={**W1.deltas, "blocks.evil.weight": np.zeros(1, F32)}), "unknown state entry"),
    "not an array": (_with(W1, deltas={**W1.deltas, "blocks.head.bias": [1.0]}), "not numpy.ndarray"),
    "role": (_with(W1, role="admin"), "unknown role"),
    "no samples": (_with(W1, num_samples=0), "num_samples"),
    "nan loss": (_with(W1, loss_after=float("nan")), "loss_after"),
    "range": (_with(W1, trained=(2, 1)), "trained range"),
    "empty": (_with(W1, deltas={}), "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
@pytest.mark.parametrize("cls", [EmbracingFL, FedAvg])
def test_bad_update_is_rejected_and_leaves_the_round_untouched(cls, case):
    bad, fragment = BAD_UPDATES[case]
    reference = run(cls(), [S1])
    strategy = cls()
    strategy.begin_round(1, global_state())
    strategy.fold(S1)
    reason = strategy.accept(bad)
    assert reason is not None and fragment in reason
    with pytest.raises(UpdateRejected, match=fragment) as info:
        strategy.fold(bad)
    assert isinstance(info.value, ValueError) and info.value.device_id == bad.device_id
    result = strategy.finish()
    assert_state_equal(result.state, reference.state)
    assert result.devices == ("s1",) and result.rejected == 1
    assert result.contributors == reference.contributors


def test_the_same_device_cannot_be_folded_twice_in_a_round():
    strategy = EmbracingFL()
    strategy.begin_round(3, global_state())
    strategy.fold(W1)
    with pytest.raises(UpdateRejected, match="already folded in round 3"):
        strategy.fold(W1)
    strategy.finish()
    strategy.begin_round(4, global_state())
    strategy.fold(W1)  # a new round: welcome again
    assert strategy.finish().devices == ("w1",)


def test_with_blocks_the_deltas_must_match_the_trained_range():
    strategy = EmbracingFL(blocks=BLOCKS)
    strategy.begin_round(1, global_state())
    claims_head_only = _with(S1, trained=(1, 2))  # sends fc1 entries too
    assert "outside the range" in strategy.accept(claims_head_only)
    missing_bias = _with(W1, deltas={"blocks.head.weight": W1.deltas["blocks.head.weight"]})
    assert "missing ['blocks.head.bias']" in strategy.accept(missing_bias)
    not_a_suffix = _with(W1, trained=(0, 1))
    assert "must end at the last block" in strategy.accept(not_a_suffix)
    assert strategy.accept(W1) is None


# -- FedAvg ----------------------------------------------------------------------------------
def test_fedavg_averages_full_updates():
    result = run(FedAvg(), [S1, S2])
    np.testing.assert_allclose(result.state["blocks.head.weight"], [[(10 * 1 + 30 * 2) / 40, (10 - 60) / 40]])
    np.testing.assert_allclose(result.state["blocks.fc1.weight"], [[0.5, 2], [2.5, 1]])
    result = run(FedAvg(weighting="uniform"), [S1, S2])
    np.testing.assert_allclose(result.state["blocks.head.weight"], [[1.5, -0.5]])
    np.testing.assert_allclose(result.state["blocks.fc1.weight"], [[1, 1], [2.5, 0]])


@pytest.mark.parametrize("blocks", [None, BLOCKS])
def test_fedavg_rejects_a_partial_update(blocks):
    strategy = FedAvg(blocks=blocks)
    strategy.begin_round(1, global_state())
    reason = strategy.accept(W1)
    assert reason is not None and "whole model" in reason
    with pytest.raises(UpdateRejected, match="whole model"):
        strategy.fold(W1)
    strategy.fold(S1)
    assert strategy.finish().devices == ("s1",)


# -- registry --------------------------------------------------------------------------------
def test_make_strategy_by_name():
    assert set(STRATEGY_NAMES) >= {"fedavg", "embracingfl"}
    s = make_strategy("embracingfl", weighting="uniform")
    assert isinstance(s, EmbracingFL) and s.weighting == "uniform"
    assert isinstance(make_strategy("fedavg"), FedAvg)
    with pytest.raises(ValueError, match="unknown strategy 'fedprox'; known: fedavg, embracingfl"):
        make_strategy("fedprox")
    with pytest.raises(ValueError, match="bad options"):
        make_strategy("fedavg", momentum=0.9)
    with pytest.raises(ValueError, match="unknown weighting 'median'"):
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
        updates.append(DeviceUpdate(f"d{i}", role, (split, 3), samples, deltas, 1.0, 0.5))
    order = draw(st.permutations(range(n)))
    return updates, order


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {k: (np.array(7, np.int64) if k.endswith(".n") else rng.normal(size=s).astype(F32)) for k, s in SHAPES.items()}


@settings(max_examples=60, deadline=None)
@given(rounds(), st.sampled_from(["samples", "uniform"]))
def test_fold_order_does_not_change_the_result(case, weighting):
    updates, order = case
    first = run(EmbracingFL(weighting=weighting, blocks=("a", "b", "c")), updates, state=_state())
    second = run(EmbracingFL(weighting=weighting, blocks=("a", "b", "c")), [updates[i] for i in order], state=_state())
    old = _state()
    for key in SHAPES:
        np.testing.assert_allclose(first.state[key], second.state[key], rtol=1e-6, atol=1e-6)
        # and both equal the direct formula: old + sum_{C_k} w_i d_i / sum_{C_k} w_i
        contrib = [u for u in updates if key in u.deltas]
        if not contrib:
            want = old[key]
        elif key.endswith(".n"):
            want = old[key] + max(int(u.deltas[key]) for u in contrib)
        else:
            w = np.array([u.num_samples if weighting == "samples" else 1 for u in contrib], np.float64)
            d = np.stack([u.deltas[key].astype(np.float64) for u in contrib])
            want = old[key] + np.tensordot(w, d, axes=1) / w.sum()
        np.testing.assert_allclose(first.state[key], want, rtol=1e-5, atol=1e-5)
        assert first.contributors[key] == len(contrib)
