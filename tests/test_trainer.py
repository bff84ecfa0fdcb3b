"""The device's torch trainer: its optimiser, its deltas, and that the frozen prefix is never built."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from edge_sdk.models import build_model
from edge_sdk.trainer import MomentumSGD, TrainConfig, build_tail, load_tail_state, tail_state, train_tail


def test_momentum_sgd_matches_torch_optim_sgd() -> None:
    torch.manual_seed(0)
    ours, ref = build_model("digits_mlp", seed=1), build_model("digits_mlp", seed=1)
    opt_ours = MomentumSGD(list(ours.parameters()), lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for _ in range(5):
        x, y = torch.rand(16, 64), torch.randint(0, 10, (16,))
        for model, opt in ((ours, opt_ours), (ref, opt_ref)):
            opt.zero_grad()
            model.loss(model(x), y).backward()
            opt.step()
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_deltas_are_trained_minus_received_and_only_for_the_tail() -> None:
    full = build_model("digits_mlp", seed=0)
    split = 2
    received = tail_state(full, split)
    kept = {n: a.copy() for n, a in received.items()}
    x = full(torch.rand(64, 64), 0, split).detach().numpy()
    y = np.random.default_rng(0).integers(0, 10, 64)
    config = TrainConfig(local_steps=3, lr=0.1)

    # Deltas taken in place against the received tail (what a device does) ...
    result = train_tail(build_and_load(received, split), split, x, y, config, initial=received)
    assert set(result.deltas) == set(full.state_names(split))
    assert result.loss_after < result.loss_before
    assert all(np.abs(d).max() > 0 for d in result.deltas.values())
    # ... leave the received state as it was, and equal the deltas of the same steps taken against
    # a copy of the weights made before training.
    for name, array in received.items():
        np.testing.assert_array_equal(array, kept[name])
    replay = train_tail(build_and_load(received, split), split, x, y, config)
    for name in result.deltas:
        np.testing.assert_allclose(result.deltas[name], replay.deltas[name], atol=1e-7)


def build_and_load(state: dict[str, np.ndarray], split: int, model: str = "digits_mlp"):
    tail = build_tail(model, split)
    load_tail_state(tail, split, state)
    return tail


def test_weak_tail_never_materialises_the_prefix() -> None:
    tail = build_tail("resnet20", 7)
    real = [n for n, p in tail.named_parameters() if not p.is_meta]
    meta = [n for n, p in tail.named_parameters() if p.is_meta]
    assert real and meta
    assert all(tail.block_of(n) >= 7 for n in real) and all(tail.block_of(n) < 7 for n in meta)
    assert sum(p.numel() for p in tail.parameters() if not p.is_meta) == 206_346


def test_training_does_not_load_torch_optim() -> None:
    """torch.optim pulls in sympy and torch._dynamo (~70 MiB); a device's training step must not."""
    code = (
        "import sys, numpy as np, torch\n"
        "from edge_sdk.trainer import warm_up, build_tail, train_tail, TrainConfig, load_tail_state, tail_state\n"
        "from edge_sdk.models import build_model\n"
        "warm_up()\n"
        "full = build_model('tiny'); t = build_tail('tiny', 0); load_tail_state(t, 0, tail_state(full, 0))\n"
        "train_tail(t, 0, np.random.rand(8, 4).astype('float32'), np.zeros(8, dtype='int64'), TrainConfig(local_steps=2))\n"
        "print('sympy' in sys.modules, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"], out


def test_tail_with_server_weights_computes_what_the_full_model_computes() -> None:
    for name, split in (("bilstm", 1), ("resnet20", 4), ("leaf_cnn", 2)):
        full = build_model(name, seed=0).eval()
        tail = build_tail(name, split)
        load_tail_state(tail, split, tail_state(full, split))
        tail.eval()
        with torch.no_grad():
            h = full(full.sample_input(3), 0, split)
            torch.testing.assert_close(tail(h, start=split), full(h, start=split), rtol=0, atol=0, msg=name)


def test_the_proximal_term_is_fedprox_objective() -> None:
    """prox_mu adds (mu / 2) ||w - w_t||^2 to the local loss: the same weights as autograd of that objective."""
    full = build_model("tiny", seed=0)
    received = tail_state(full, 0)
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 2, 8)
    mu = 0.7
    config = TrainConfig(local_steps=4, batch_size=8, lr=0.2, momentum=0.0, weight_decay=0.0, prox_mu=mu)
    result = train_tail(build_and_load(received, 0, "tiny"), 0, x, y, config, initial=received)

    ref = build_and_load(received, 0, "tiny")
    anchor = {n: torch.from_numpy(v.copy()) for n, v in received.items()}
    for _ in range(4):  # batch == all samples: the same batches as train_tail
        ref.zero_grad()
        loss = ref.loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss = loss + mu / 2 * sum(((p - anchor[n]) ** 2).sum() for n, p in ref.named_parameters())
        loss.backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.2 * p.grad
    for n, p in ref.named_parameters():
        np.testing.assert_allclose(result.deltas[n], p.detach().numpy() - received[n], rtol=1e-5, atol=1e-6)
    plain = train_tail(build_and_load(received, 0, "tiny"), 0, x, y, TrainConfig(local_steps=4, batch_size=8, lr=0.2,
                       momentum=0.0, weight_decay=0.0), initial=received)
    assert any(not np.allclose(plain.deltas[n], result.deltas[n]) for n in plain.deltas)


def _forward_count(model, block: int = 0) -> list[int]:
    """Forward passes through one block of the model, counted by a hook."""
    calls = [0]
    model.block(block).register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_loss_before_is_the_first_steps_own_loss_on_a_mode_free_tail() -> None:
    """With one batch of loss samples (a train report's default) the first step's batch is scored:
    the loss before training is that step's loss, one forward pass fewer, and the same number a
    separate evaluation of that batch gives."""
    from edge_sdk.trainer import _mean_loss, mode_free
    from edge_sdk.training import sample_plan

    model = build_model("mnist_cnn", seed=0)
    state = tail_state(model, 0)
    x = np.random.default_rng(1).random((300, 784), dtype=np.float32)
    y = np.random.default_rng(2).integers(0, 10, 300)
    config = TrainConfig(local_steps=4, batch_size=32, lr=0.05, eval_samples=32, seed=3)
    eval_idx, batches = sample_plan(len(x), config)
    assert eval_idx is batches[0] and mode_free(model, 0)
    # The steps are the ones drawn with any other number of loss samples.
    other = sample_plan(len(x), TrainConfig(local_steps=4, batch_size=32, eval_samples=512, seed=3))[1]
    assert all(np.array_equal(a, b) for a, b in zip(batches, other))
    expected = _mean_loss(build_and_load(state, 0, "mnist_cnn"), 0, x, y, eval_idx, 32)

    tail = build_and_load(state, 0, "mnist_cnn")
    calls = _forward_count(tail)
    result = train_tail(tail, 0, x, y, config, state)
    assert calls[0] == config.local_steps + 1  # the steps and the loss after; none for the loss before
    assert abs(result.loss_before - expected) <= 1e-6 * abs(expected)


def test_a_tail_with_dropout_or_batch_statistics_scores_the_loss_before_apart() -> None:
    """Dropout and BatchNorm compute another function in training mode: the loss before training
    is an evaluation-mode pass of its own, as the loss after is."""
    from edge_sdk.trainer import _mean_loss, mode_free
    from edge_sdk.training import sample_plan

    for name, split in (("bilstm", 0), ("resnet20", 8)):
        model = build_model(name, seed=0)
        assert not mode_free(model, split)
    model = build_model("resnet20", seed=0)
    split = 8
    state = tail_state(model, split)
    x = model(torch.rand(96, 3, 32, 32), 0, split).detach().numpy()
    y = np.random.default_rng(0).integers(0, 10, 96)
    config = TrainConfig(local_steps=2, batch_size=32, lr=0.05, eval_samples=32, seed=1)
    eval_idx, _ = sample_plan(len(x), config)
    expected = _mean_loss(build_and_load(state, split, "resnet20"), split, x, y, eval_idx, 32)
    tail = build_and_load(state, split, "resnet20")
    calls = _forward_count(tail, split)
    result = train_tail(tail, split, x, y, config, state)
    assert calls[0] == config.local_steps + 2
    assert result.loss_before == expected


def test_without_the_loss_after_a_round_is_its_steps_and_reports_their_mean_loss() -> None:
    """A server that does not need the loss after training (TrainConfig.loss_after off) saves its
    forward pass: on a mode-free tail the round is its steps and nothing else, the update is the same,
    and the report has the mean of the steps' own losses instead."""
    import dataclasses
    import math

    model = build_model("mnist_cnn", seed=0)
    state = tail_state(model, 0)
    x = np.random.default_rng(1).random((300, 784), dtype=np.float32)
    y = np.random.default_rng(2).integers(0, 10, 300)
    on = TrainConfig(local_steps=4, batch_size=32, lr=0.05, eval_samples=32, seed=3)
    off = dataclasses.replace(on, loss_after=False)
    step_losses: list[float] = []
    tail = build_and_load(state, 0, "mnist_cnn")
    loss_of = tail.loss

    def recorded(out, yb):  # each step's loss, as the steps see it
        loss = loss_of(out, yb)
        step_losses.append(loss.item())
        return loss

    tail.loss = recorded
    calls = _forward_count(tail)
    without = train_tail(tail, 0, x, y, off, state)
    assert calls[0] == off.local_steps
    assert math.isnan(without.loss_after)
    assert abs(without.loss_steps - sum(step_losses) / len(step_losses)) <= 1e-12
    assert without.loss_before == step_losses[0]
    scored = train_tail(build_and_load(state, 0, "mnist_cnn"), 0, x, y, on, state)
    assert math.isfinite(scored.loss_after) and scored.loss_steps == without.loss_steps
    for name, delta in scored.deltas.items():
        assert np.array_equal(delta, without.deltas[name])
