"""Width reduction (static HeteroFL / FjORD ordered dropout, orchestrator/strategies/width.py).

Checked here: the narrow zoo models are leading slices of the full ones (shapes, and the function
they compute); per-element averaging over the devices that hold each channel against a hand
computation; static BatchNorm (EmbracingFL Section 4.5); a weak device holds only its slice; the
planner's width footprints; and rounds through the real server and real devices (DeviceClient over
websockets on 127.0.0.1, in this process), whose result is replayed by hand.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings, device_seed
from edge_sdk.data import load_dataset
from edge_sdk.models.zoo import build_model, model_for_state, scaled, width_shapes
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, train_tail
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.rounds import RoundState
from orchestrator.strategies import DeviceInfo, DeviceReport, Refused, RoundContext, make_strategy
from orchestrator.strategies.selection import Selection
from orchestrator.strategies.width import WidthReduction
from tests.factories import EXACT_TRANSFERS
from profiles.planner import plan_split, plan_width, width_capacity, width_cost, width_footprint

F32 = np.float32
MiB = 1 << 20


def width_selection(name: str, width: float) -> Selection:
    """The channel selection of ``name`` at ``width`` (as the strategy makes it: scalars go whole)."""
    return Selection.of_channels(0, {k: s for k, s in width_shapes(name, width).items() if s})


# -- the zoo at a width ----------------------------------------------------------------------------
def test_scaled_keeps_the_first_ceil_fraction_and_at_least_one() -> None:
    assert [scaled(c, 0.45) for c in (16, 32, 64, 2048)] == [8, 15, 29, 922]
    assert [scaled(c, 0.2) for c in (16, 32, 64)] == [4, 7, 13]
    assert scaled(10, 0.3) == 3 and scaled(3, 0.01) == 1 and scaled(5, 1.0) == 5
    with pytest.raises(ValueError):
        scaled(4, 0.0)
    with pytest.raises(ValueError):
        build_model("digits_mlp", width=0.5)  # its factory has no width ratio


@pytest.mark.parametrize("name", ["resnet20", "leaf_cnn", "mnist_2nn", "tiny"])
@pytest.mark.parametrize("width", [0.45, 0.2])
def test_narrow_state_is_a_leading_slice_of_the_full_state(name: str, width: float) -> None:
    full = build_model(name, seed=0).eval()
    narrow = build_model(name, seed=1, width=width).eval()
    full_state, shapes = full.state_dict(), width_shapes(name, width)
    assert model_for_state({k: tuple(v.shape) for k, v in full_state.items()}) == name
    assert shapes == {k: tuple(v.shape) for k, v in narrow.state_dict().items()}
    assert set(shapes) == set(full_state)
    for k, s in shapes.items():
        assert len(s) == full_state[k].dim() and all(0 < a <= b for a, b in zip(s, full_state[k].shape)), k
    # The model's input and class outputs keep their size: only hidden channels are dropped.
    first, last = next(iter(full_state)), [k for k in full_state if k.endswith("weight")][-1]
    assert shapes[first][1] == full_state[first].shape[1] and shapes[last][0] == full_state[last].shape[0]

    # Ordered dropout: the full model with every element outside the slice set to zero (BatchNorm
    # scale and shift 0, variance 1) computes what the narrow model loaded with the slice computes.
    cut = width_selection(name, width).cut({k: v.numpy() for k, v in full_state.items()}, list(full_state))
    narrow.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in cut.items()})
    masked = {}
    for k, v in full_state.items():
        keep = torch.zeros_like(v, dtype=torch.bool)
        keep[tuple(slice(0, s) for s in shapes[k])] = True
        fill = 1 if k.endswith("running_var") else 0
        masked[k] = torch.where(keep, v, torch.full_like(v, fill)) if v.is_floating_point() else v
    full.load_state_dict(masked)
    x = full.sample_input(3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(narrow(x), full(x), rtol=1e-5, atol=1e-5)


def test_a_weak_device_builds_and_holds_only_its_slice() -> None:
    """build_tail at width 0.2 gives every entry real storage of exactly the slice's shape: the
    full-width ResNet20 is never allocated, and a full-width state does not load into it."""
    shapes = width_shapes("resnet20", 0.2)
    model = build_tail("resnet20", 0, width=0.2)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    assert {k: tuple(t.shape) for k, t in tensors.items()} == shapes
    assert not any(t.is_meta for t in tensors.values())
    held = sum(t.numel() for t in tensors.values())
    full = sum(t.numel() for t in build_model("resnet20", seed=None).state_dict().values())
    assert held == sum(int(np.prod(s)) for s in shapes.values()) and held < 0.06 * full
    state = {k: v.numpy() for k, v in build_model("resnet20", seed=0).state_dict().items()}
    with pytest.raises(ValueError, match="shape"):
        load_tail_state(model, 0, state)
    load_tail_state(model, 0, width_selection("resnet20", 0.2).cut(state, list(state)))


# -- aggregation by hand ---------------------------------------------------------------------------
def tiny_state() -> dict[str, np.ndarray]:
    """tiny (4 features, 3 hidden units, 2 classes) with hand-picked values."""
    return {
        "blocks.fc1.weight": np.arange(12, dtype=F32).reshape(3, 4),
        "blocks.fc1.bias": np.array([1, 2, 3], F32),
        "blocks.head.weight": np.array([[1, 0, -1], [2, 2, 2]], F32),
        "blocks.head.bias": np.array([0.5, -0.5], F32),
    }


def drive(strategy, devices: dict[str, DeviceInfo], state, deltas: dict[str, float], samples: dict[str, int]):
    """One round as the server drives it: configure, one report per instruction (every entry of the
    slice shifted by the device's constant), aggregate. Returns (instructions, result)."""
    ctx = RoundContext(round=1, global_state=state, devices=devices, state=RoundState(1, deadline=1e18),
                       blocks=("fc1", "head"))
    instructions = strategy.configure(ctx)
    for ins in instructions:
        ctx.state.issue(ins.device_id, "train")
    for ins in instructions:
        sent = ins.selection.cut(state, list(state))
        tensors = {k: np.full(v.shape, deltas[ins.device_id], v.dtype) for k, v in sent.items()}
        assert ins.selection.check(tensors, state, list(state)) is None  # what the server lets through
        report = DeviceReport(ins.device_id, 1, "train", devices[ins.device_id].role, samples[ins.device_id],
                              (0, 2), {"loss_before": 1.0, "loss_after": 0.5}, tensors, ins.selection)
        strategy.on_report(report, ctx)
        ctx.state.on_report(ins.device_id, "train", True)
    return instructions, strategy.aggregate(ctx)


def test_each_channel_is_averaged_over_the_devices_that_hold_it() -> None:
    """Strong s (width 1: units 0-2), moderate m (0.66: units 0-1), weak w (0.33: unit 0); deltas
    1, 2, 4 with 10, 30 and 60 samples. Unit 0 is held by all three: (10 + 60 + 240) / 100 = 3.1;
    unit 1 by s and m: (10 + 60) / 40 = 1.75; unit 2 by s only: 1. The head's bias (its class
    outputs keep full size) is held by all: 3.1."""
    state = tiny_state()
    devices = {"s": DeviceInfo("s", "strong", 0, 10), "m": DeviceInfo("m", "moderate", 1, 30),
               "w": DeviceInfo("w", "weak", 1, 60)}
    strategy = make_strategy("width", moderate="0.66", weak="0.33")  # options arrive as text from -O
    instructions, result = drive(strategy, devices, state, {"s": 1.0, "m": 2.0, "w": 4.0},
                                 {"s": 10, "m": 30, "w": 60})
    by_device = {i.device_id: i for i in instructions}
    assert by_device["s"].selection.kind == "tail" and by_device["s"].config == {}
    assert by_device["m"].config == {"width": 0.66} and by_device["w"].config == {"width": 0.33}
    assert by_device["w"].selection.channels["blocks.fc1.weight"] == (1, 4)
    assert by_device["m"].selection.channels["blocks.head.weight"] == (2, 2)

    unit = np.array([3.1, 1.75, 1.0])
    new = result.state
    np.testing.assert_allclose(new["blocks.fc1.weight"], state["blocks.fc1.weight"] + unit[:, None], rtol=1e-6)
    np.testing.assert_allclose(new["blocks.fc1.bias"], state["blocks.fc1.bias"] + unit, rtol=1e-6)
    np.testing.assert_allclose(new["blocks.head.weight"], state["blocks.head.weight"] + unit[None, :], rtol=1e-6)
    np.testing.assert_allclose(new["blocks.head.bias"], state["blocks.head.bias"] + 3.1, rtol=1e-6)
    assert result.roles == {"strong": 1, "moderate": 1, "weak": 1} and result.num_samples == 100
    assert result.extra["method"].startswith("width reduction") and result.extra["devices_per_width"] == {
        "1": 1, "0.66": 1, "0.33": 1}

    # Without the strong device, unit 2 (row 2 of fc1, column 2 of the head) has no holder: it keeps
    # its value bit for bit; uniform weights: unit 0 = (2 + 4) / 2, unit 1 = 2.
    _, result = drive(make_strategy("width", moderate=0.66, weak=0.33, weighting="uniform"),
                      {k: devices[k] for k in ("m", "w")}, state, {"m": 2.0, "w": 4.0}, {"m": 30, "w": 60})
    new = result.state
    np.testing.assert_allclose(new["blocks.fc1.weight"][:2], state["blocks.fc1.weight"][:2] + np.array([[3.0], [2.0]]))
    assert np.array_equal(new["blocks.fc1.weight"][2], state["blocks.fc1.weight"][2])
    assert new["blocks.fc1.bias"][2] == state["blocks.fc1.bias"][2]
    assert np.array_equal(new["blocks.head.weight"][:, 2], state["blocks.head.weight"][:, 2])
    np.testing.assert_allclose(new["blocks.head.bias"], state["blocks.head.bias"] + 3.0)


def test_devices_of_one_role_share_one_payload_and_torchless_ones_are_left_out() -> None:
    state = tiny_state()
    devices = {
        "w1": DeviceInfo("w1", "weak", 1, 10, runtimes=("onnxruntime", "torch")),
        "w2": DeviceInfo("w2", "weak", 1, 10, runtimes=("onnxruntime", "torch")),
        "w3": DeviceInfo("w3", "weak", 1, 10, runtimes=("onnxruntime",)),  # no torch: no width slice
        "s1": DeviceInfo("s1", "strong", 0, 10, runtimes=("onnxruntime",)),  # full width: any backend
    }
    strategy = WidthReduction(weak=0.33)
    ctx = RoundContext(round=1, global_state=state, devices=devices, state=RoundState(1, deadline=1e18))
    instructions = {i.device_id: i for i in strategy.configure(ctx)}
    assert sorted(instructions) == ["s1", "w1", "w2"]
    assert instructions["w1"].selection is instructions["w2"].selection
    assert instructions["s1"].selection.key() == Selection.tail(0).key()
    result = strategy.aggregate(ctx)
    assert result.extra["skipped_no_torch"] == ["w3"]
    # A report of a partial tail is not width reduction's.
    with pytest.raises(Refused):
        strategy.configure(ctx)
        strategy.on_report(DeviceReport("w1", 1, "train", "weak", 10, (1, 2), {}, {}, Selection.tail(1)), ctx)


@pytest.mark.parametrize("bn", ["full", "static", "global"])
def test_batchnorm_statistics_of_narrow_models_are_not_folded(bn: str) -> None:
    """Section 4.5 (Table 9): with bn="full" the running statistics come from full-width devices
    only, "static" never folds them, "global" averages them per channel over every holder."""
    state = {k: v.numpy().copy() for k, v in build_model("resnet20", seed=0).state_dict().items()}
    devices = {"s": DeviceInfo("s", "strong", 0, 10), "w": DeviceInfo("w", "weak", 8, 30)}
    _, result = drive(WidthReduction(bn=bn), devices, state, {"s": 1.0, "w": 3.0}, {"s": 10, "w": 30})
    mean, weight = "blocks.stem.bn.running_mean", "blocks.stem.bn.weight"
    narrow = scaled(16, 0.2)  # the weak device holds the stem's first 4 channels
    both = (10 * 1.0 + 30 * 3.0) / 40
    # Parameters: per channel over the holders, whatever bn says.
    np.testing.assert_allclose(result.state[weight][:narrow], state[weight][:narrow] + both, rtol=1e-6)
    np.testing.assert_allclose(result.state[weight][narrow:], state[weight][narrow:] + 1.0, rtol=1e-6)
    expected = {"full": np.full(16, 1.0), "static": np.zeros(16),
                "global": np.r_[np.full(narrow, both), np.full(16 - narrow, 1.0)]}[bn]
    np.testing.assert_allclose(result.state[mean] - state[mean], expected, rtol=1e-6)


# -- the planner by width --------------------------------------------------------------------------
def test_width_footprints_shrink_with_the_width_and_plan_roles() -> None:
    runtime = 200 * MiB
    feet = {r: width_footprint("resnet20", r, 32, runtime_bytes=runtime, local_samples=256).total
            for r in (1.0, 0.45, 0.2)}
    assert feet[1.0] > feet[0.45] > feet[0.2] > runtime
    assert feet[1.0] == width_cost("resnet20", 1.0).footprint(0, 32, runtime_bytes=runtime, local_samples=256).total
    # Appendix 6.4's Table 10 (capacities 0.43 and 0.18) keeps 7/16 and 3/16 of every layer's
    # channels (its activation counts say so): the ratios 0.4375 and 0.1875 here; 0.45 and 0.2,
    # rounded up, keep a channel more in some layers.
    assert width_capacity("resnet20", 0.4375) == pytest.approx(0.43, abs=0.005)
    assert width_capacity("resnet20", 0.1875) == pytest.approx(0.18, abs=0.01)
    assert 0.43 < width_capacity("resnet20", 0.45) < 0.50 and 0.18 < width_capacity("resnet20", 0.2) < 0.25
    for budget, role in ((feet[1.0], "strong"), (feet[1.0] - 1, "moderate"), (feet[0.45], "moderate"),
                         (feet[0.45] - 1, "weak"), (feet[0.2], "weak")):
        plan = plan_width("resnet20", budget, 32, runtime=runtime, local_samples=256)
        assert (plan.role, plan.split, plan.chunks) == (role, 0, []) and plan.footprint_bytes <= budget
        assert plan.width == {"strong": 1.0, "moderate": 0.45, "weak": 0.2}[role]
    with pytest.raises(ValueError, match="does not fit"):
        plan_width("resnet20", feet[0.2] - 1, 32, runtime=runtime, local_samples=256)


def test_the_fleet_budgets_give_each_device_its_role_under_either_method() -> None:
    """profiles/fleets/cifar10-resnet20-mixed.toml: moderate Pi 4 boards get runtime+100 MiB and
    weak entry phones runtime+68 MiB with 256 CIFAR-10 samples each; a strong phone holds the whole
    model. Split planning and width planning name the same role for each budget."""
    runtime = 300 * MiB
    cost = width_cost("resnet20", 1.0)
    for extra, role in ((100, "moderate"), (68, "weak"), (400, "strong")):
        budget = runtime + extra * MiB
        assert plan_split(cost, budget, 32, runtime=runtime, local_samples=256).role == role
        assert plan_width("resnet20", budget, 32, runtime=runtime, local_samples=256).role == role


# -- rounds through the real server and devices ----------------------------------------------------
async def _round_trip(tmp_path: Path, model: str, options: dict, launches: list[tuple[str, dict, int]],
                      data: tuple[np.ndarray, np.ndarray], **config_kw):
    """Serve ``model`` with the width strategy; run one in-process DeviceClient per launch
    ``(device id, hello labels, budget)``, each on its own 40 samples of ``data``. The norm bound is
    off unless asked for: the tests compare the round with the strategy's own arithmetic."""
    config_kw.setdefault("norm_bound", 0)
    config_kw.setdefault("direction_trust", False)  # the hand average: the paper's rule, no server weighting
    config_kw = {**EXACT_TRANSFERS, **config_kw}  # the hand average of float32 updates, the slices' bytes as sent
    config = ServerConfig(model=model, strategy="width", strategy_options=options, rounds=1,
                          min_devices=len(launches), local_steps=3, batch_size=8, lr=0.1, deadline_s=60,
                          store_dir=tmp_path / "store", allow_forced_split=True, **config_kw)
    events: list[tuple[str, dict]] = []
    orch, server = await start_orchestrator(config, lambda kind, d: events.append((kind, d)))
    initial = {k: v.copy() for k, v in orch.global_state.items()}
    x, y = data
    clients = [DeviceClient(DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=device_id,
                                         budget_bytes=budget, labels=labels, backend="torch"),
                            x[40 * i: 40 * (i + 1)], y[40 * i: 40 * (i + 1)])
               for i, (device_id, labels, budget) in enumerate(launches)]
    await asyncio.wait_for(asyncio.gather(*(c.run() for c in clients)), 120)
    history = await server
    return orch, config, initial, history, events, clients


def test_a_round_through_the_server_and_devices_is_the_hand_average(tmp_path: Path) -> None:
    """tiny on synthetic data: a strong device (width 1), and two weak ones (the planner's role at a
    forced split) at width 0.33 (one hidden unit of three). Each device's update is replayed outside
    the system (the same slice, seed and trainer) and the new global state is their per-unit average."""
    data = load_dataset("synthetic", split="train")
    launches = [("strong-0", {}, 1 << 30), ("weak-1", {"force_split": "1"}, 1 << 30),
                ("weak-2", {"force_split": "1"}, 1 << 30)]
    orch, config, initial, history, events, clients = asyncio.run(_round_trip(
        tmp_path, "tiny", {"weak": 0.33}, launches, (data.x, data.y), eval_data="synthetic"))
    metrics = history[0]
    assert metrics["reported"] == 3 and metrics["rejected"] == 0 and metrics["over_budget"] == []
    assert metrics["strategy"] == "width" and metrics["devices_per_width"] == {"1": 1, "0.33": 2}
    assert {d["device"]: d["role"] for k, d in events if k == "registered"} == {
        "strong-0": "strong", "weak-1": "weak", "weak-2": "weak"}

    # What each device downloaded: a weak device got the width-0.33 slice only.
    sent = {}
    for kind, d in events:
        if kind == "sent" and d["kind"] == "model":
            sent[d["device"]] = d["bytes"]
    slice_state = width_selection("tiny", 0.33).cut(initial, list(initial))
    assert sent["weak-1"] == sent["weak-2"] == len(p.encode_tensors(slice_state)) < sent["strong-0"]
    assert all(r.trained == (0, 2) for c in clients for r in c.reports)

    round_seed = config.seed * 100_003 + 1
    deltas, counts = {}, {}
    for i, (device_id, _, _) in enumerate(launches):
        width = 1.0 if device_id.startswith("strong") else 0.33
        sent_state = width_selection("tiny", width).cut(initial, list(initial))
        model = build_tail("tiny", 0, width=width)
        load_tail_state(model, 0, sent_state)
        cfg = TrainConfig(local_steps=config.local_steps, batch_size=config.batch_size, lr=config.lr,
                          momentum=config.momentum, weight_decay=config.weight_decay,
                          seed=device_seed(round_seed, device_id))
        x, y = data.x[40 * i: 40 * (i + 1)], data.y[40 * i: 40 * (i + 1)]
        result = train_tail(model, 0, x, y, cfg, {k: np.array(v) for k, v in sent_state.items()})
        deltas[device_id], counts[device_id] = result.deltas, result.num_samples
    for name, old in initial.items():
        total, weight = np.zeros(old.shape), np.zeros(old.shape)
        for device_id, d in deltas.items():
            region = tuple(slice(0, s) for s in d[name].shape)
            total[region] += counts[device_id] * d[name]
            weight[region] += counts[device_id]
        expected = old + total / weight
        np.testing.assert_allclose(orch.global_state[name], expected, rtol=0, atol=2e-6, err_msg=name)
        assert not np.allclose(orch.global_state[name], old)


def test_the_server_checks_each_width_slice_against_the_device_budget(tmp_path: Path) -> None:
    """ResNet20 on random images: a weak device (the split planner's role for its budget) trains the
    width-0.2 slice; asked for width 0.45, which its budget cannot hold, it is skipped (over_budget)."""
    from profiles.runtime import runtime_memory

    runtime = runtime_memory().training
    need = {r: width_footprint("resnet20", r, 32, runtime_bytes=runtime, local_samples=40).total for r in (0.2, 0.45)}
    budget = (need[0.2] + need[0.45]) // 2  # holds the weak slice, not the moderate one
    rng = np.random.default_rng(0)
    data = (rng.random((120, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, 120))
    launches = [("strong-0", {}, 4 << 30), ("weak-1", {"force_split": "9"}, budget)]
    for weak, skipped in ((0.2, []), (0.45, ["weak-1"])):
        _, _, initial, history, events, clients = asyncio.run(_round_trip(
            tmp_path / str(weak), "resnet20", {"weak": weak}, launches, data, eval_every=0))
        metrics = history[0]
        assert metrics["over_budget"] == skipped, metrics
        assert metrics["reported"] == 2 - len(skipped) and metrics["roles"].get("weak", 0) == 1 - len(skipped)
        weak_reports = [r for r in clients[1].reports if r.phase == "train"]
        assert len(weak_reports) == 1 - len(skipped)
        if not skipped:
            assert weak_reports[0].metrics["backend"] == "torch"
