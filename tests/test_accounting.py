"""Memory accounting against EmbracingFL Table 1, and the footprint against a real training step."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from edge_sdk.models import build_model
from profiles.accounting import SECURE_ROUND_BYTES, ModelCost, TrainingMemory, measure_model

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def resnet20() -> ModelCost:
    return measure_model(build_model("resnet20"))


@pytest.fixture(scope="module")
def leaf_cnn() -> ModelCost:
    return measure_model(build_model("leaf_cnn"))


@pytest.fixture(scope="module")
def bilstm() -> ModelCost:
    return measure_model(build_model("bilstm"))


# -- ResNet20 (CIFAR-10) ------------------------------------------------------------------------
def test_resnet20_splits_are_the_papers_removed_layers(resnet20):
    # Moderate: "the first conv. layer + the first 3 residual blocks"; weak: "+ the first 6".
    assert resnet20.block_names[:4] == ["stem", "stage1_block1", "stage1_block2", "stage1_block3"]
    assert resnet20.block_names[4:7] == ["stage2_block1", "stage2_block2", "stage2_block3"]


def test_resnet20_trainable_parameters_match_table1(resnet20):
    assert resnet20.trainable_params(0) == 272_474  # the paper prints 272,762: see the next test
    assert resnet20.trainable_params(4) == 257_994
    assert resnet20.trainable_params(7) == 206_346


def test_resnet20_table1_counts_a_projection_shortcut_in_the_first_stage():
    """Table 1's 272,762 is 288 more than our 272,474, all of it in the stem + stage 1 (the moderate
    and weak counts match exactly). 288 = a 1x1 conv 16->16 (256) + its BatchNorm (32): the paper's
    ResNet20 gives the first block of *every* stage a projection shortcut, as Keras's ResNet v2
    example does. That shortcut's conv output (16 x 32 x 32 per sample) is also the activation
    difference, so with it both of Table 1's strong numbers come out exactly."""
    model = build_model("resnet20")
    model.block(1).shortcut = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
    paper = measure_model(model)
    assert paper.trainable_params(0) == 272_762
    assert paper.activations(0, batch=32) == 6_947_136
    assert paper.activations(4, batch=32) == 2_752_832
    assert paper.activations(7, batch=32) == 917_824
    assert round(paper.capacity(4, batch=32), 2) == 0.42
    assert round(paper.capacity(7, batch=32), 2) == 0.16


def test_resnet20_activations_and_capacities(resnet20):
    # Table 1's activations are the conv and dense outputs of a batch of 32.
    assert resnet20.activations(4, batch=32) == 2_752_832
    assert resnet20.activations(7, batch=32) == 917_824
    # Without the stage-1 projection our model keeps one 16x32x32 map per sample less.
    assert resnet20.activations(0, batch=32) == 6_947_136 - 32 * 16 * 32 * 32
    assert resnet20.capacity(0) == 1.0
    assert resnet20.capacity(4, batch=32) == pytest.approx(0.42, abs=0.05)
    assert resnet20.capacity(7, batch=32) == pytest.approx(0.16, abs=0.05)
    # Capacity shrinks as more blocks are frozen.
    caps = [resnet20.capacity(k) for k in range(len(resnet20))]
    assert caps == sorted(caps, reverse=True)


# -- LEAF CNN (FEMNIST) -------------------------------------------------------------------------
def test_leaf_cnn_matches_table1(leaf_cnn):
    assert [leaf_cnn.trainable_params(k) for k in (0, 2, 3)] == [6_603_710, 6_551_614, 127_038]
    # Table 1's FEMNIST activations are those of one sample: conv1 25,088 + conv2 12,544 +
    # dense1 2,048 + dense2 62.
    assert [leaf_cnn.activations(k, batch=1) for k in (0, 2, 3)] == [39_742, 2_110, 62]
    assert leaf_cnn.capacity(2, batch=1) == pytest.approx(0.99, abs=0.05)
    assert leaf_cnn.capacity(3, batch=1) == pytest.approx(0.02, abs=0.05)
    assert round(leaf_cnn.capacity(2, batch=1), 2) == 0.99
    assert round(leaf_cnn.capacity(3, batch=1), 2) == 0.02


# -- BiLSTM (IMDB) ------------------------------------------------------------------------------
def test_bilstm_differs_from_table1_by_torchs_second_lstm_bias(bilstm):
    """torch's LSTM has two bias vectors per gate (bias_ih and bias_hh), Keras one: 2 directions
    x 4 gates x 256 units = 2,048 more parameters than the paper's 3,611,137."""
    lstm = build_model("bilstm").block(1).lstm
    second_bias = lstm.bias_hh_l0.numel() + lstm.bias_hh_l0_reverse.numel()
    assert second_bias == 2 * 4 * 256 == 2_048
    assert bilstm.trainable_params(0) == 3_613_185 == 3_611_137 + second_bias
    assert bilstm.trainable_params(1) == 1_051_137 + second_bias  # Table 1's moderate client
    # The embedding output is not an activation (Table 1: moderate keeps as many as strong).
    assert bilstm.activations(0, batch=1) == bilstm.activations(1, batch=1) == 256 * 512 + 1


# -- what is counted ----------------------------------------------------------------------------
def test_saved_tensors_are_the_ones_the_docstring_names(resnet20, leaf_cnn):
    stem = resnet20.blocks[0]
    # conv -> BN -> ReLU: BN's input and the ReLU's output per sample (the conv's input is the
    # block's input, counted as the cached input), and BN's per-channel mean and inverse std.
    assert stem.saved_elements == 2 * 16 * 32 * 32
    assert stem.saved_fixed_elements == 2 * 16
    assert stem.buffers == 16 + 16 + 1  # running mean, running var, batches tracked
    # Max-pooling keeps int64 indices of its output: 32 x 14 x 14 per sample after conv1.
    assert leaf_cnn.blocks[0].saved_other_bytes == 8 * 32 * 14 * 14
    # conv2's input (pooled conv1 output) is kept by conv2 alone.
    assert leaf_cnn.blocks[1].input_saved and not leaf_cnn.blocks[0].input_saved
    # A 5x5 convolution's unfolded patches count in the training peak, not in inference.
    conv2 = leaf_cnn.blocks[1]
    assert conv2.train_peak_elements >= 32 * 25 * 14 * 14
    assert conv2.peak_elements < 32 * 25 * 14 * 14


def test_measuring_leaves_the_model_and_random_state_alone():
    model = build_model("resnet20")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    rng = torch.random.get_rng_state()
    measure_model(model)
    assert not model.training
    assert torch.equal(torch.random.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_cost_round_trips_through_plain_data(resnet20):
    data = json.loads(json.dumps(resnet20.to_dict()))
    assert ModelCost.from_dict(data) == resnet20


# -- the footprint ------------------------------------------------------------------------------
def test_footprint_parts(resnet20):
    fp = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB)
    p = resnet20.trainable_params(4)
    buffers = sum(b.buffers for b in resnet20.blocks[4:])
    # weight + grad + momentum + the received tail the deltas are taken against, float32
    assert fp.trainable_state == (4 * p + 2 * buffers) * 4
    assert fp.tail_weights == (p + buffers) * 4
    assert fp.cached_input == 32 * 16 * 32 * 32 * 4  # one batch of stage 1's output
    assert fp.activations > resnet20.saved_bytes(4, 32) > resnet20.activations(4, 32) * 4
    assert fp.frozen_chunk == max(resnet20.chunk_bytes(i, i + 1, 32) for i in range(4))
    assert fp.model_bytes == pytest.approx(max(fp.streaming, fp.training) * 1.10, abs=1)
    assert fp.total == fp.model_bytes + 100 * MiB + TrainingMemory().process_bytes
    # The knobs move the parts they name.
    adam = resnet20.footprint(4, batch=32, memory=TrainingMemory(optimizer_copies=2))
    assert adam.trainable_state - fp.trainable_state == p * 4
    half = resnet20.footprint(4, batch=32, memory=TrainingMemory(dtype="float16"))
    assert half.cached_input * 2 == fp.cached_input
    both = resnet20.footprint(4, batch=32, memory=TrainingMemory(sequential_phases=False))
    assert both.model_bytes > fp.model_bytes
    # Activations scale with the batch, parameters do not.
    big = resnet20.footprint(4, batch=128)
    assert big.trainable_state == fp.trainable_state
    assert big.activations > 3.9 * fp.activations
    # The whole model streams nothing.
    assert resnet20.footprint(0).frozen_chunk == 0
    # A device's own data is held through both phases: 100 CIFAR images, float32.
    with_data = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB, local_samples=100)
    assert with_data.local_data == 100 * 3 * 32 * 32 * 4
    # ... and so are the cached activations of every local sample (stage 1's output) while the tail trains.
    assert with_data.cached_input == 100 * 16 * 32 * 32 * 4
    assert with_data.model_bytes == pytest.approx(
        (max(with_data.streaming, with_data.training) + with_data.local_data) * 1.10, abs=1)


def test_a_secure_round_is_in_the_footprint(resnet20):
    """A secure run's devices hold the secure round's libraries for good, and while uploading the
    tail, its frame and its masked words (profiles.accounting, TrainingMemory.secured)."""
    plain = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB)
    secure = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB, memory=TrainingMemory().secured())
    held = (resnet20.trainable_params(4) + sum(b.params - b.trainable_params + b.buffers
                                               for b in resnet20.blocks[4:])) * 4
    assert (plain.upload, secure.upload) == (2 * held, 3 * held)
    # With momentum, training holds more than either upload: only the libraries add.
    assert secure.model_bytes == plain.model_bytes
    assert secure.total - plain.total == SECURE_ROUND_BYTES
    # The upload is a phase of its own: the peak when it is the largest.
    assert dataclasses.replace(secure, upload=10**12).model_bytes == pytest.approx(1.1e12, abs=1)


def test_the_update_codecs_workspace_is_in_the_upload(resnet20):
    """Under EDEN (the default update codec) the upload holds one slice's rotation workspace and the
    record's packed signs (2 bits a value sent) beside the tail's values and frame; a codec declaring
    nothing (none, float16) adds nothing (profiles.accounting, TrainingMemory.with_update_codec)."""
    from edge_sdk.codecs.eden import workspace_bytes

    plain = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB)
    eden = resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB, memory=TrainingMemory().with_update_codec("eden2"))
    values = resnet20.trainable_params(4) + sum(b.params - b.trainable_params + b.buffers for b in resnet20.blocks[4:])
    assert 2 * MiB <= workspace_bytes() <= 4 * MiB
    assert eden.upload - plain.upload == workspace_bytes() + (2 * values + 7) // 8
    for name in ("none", "float16"):
        assert resnet20.footprint(4, batch=32, runtime_bytes=100 * MiB,
                                  memory=TrainingMemory().with_update_codec(name)).upload == plain.upload


def test_chunks_must_cover_the_frozen_blocks(resnet20):
    resnet20.footprint(4, chunks=[(0, 2), (2, 4)])
    for bad in ([(0, 2)], [(0, 2), (3, 4)], [(1, 4)], [(0, 5)]):
        with pytest.raises(ValueError, match="cover"):
            resnet20.footprint(4, chunks=bad)


def test_bad_input_gets_a_clear_error(resnet20):
    with pytest.raises(ValueError, match="split 11 outside"):
        resnet20.footprint(11)
    with pytest.raises(ValueError, match="batch size"):
        resnet20.capacity(3, batch=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        TrainingMemory(dtype="int8")
    with pytest.raises(ValueError, match="optimizer_copies"):
        TrainingMemory(optimizer_copies=-1)


_STEP = textwrap.dedent(
    """
    import ctypes, gc, json, sys
    import psutil, torch
    from edge_sdk.models import build_model

    split, batch = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    model = build_model("resnet20").train()
    for i in range(split):
        model.block(i).requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)

    def inputs(b):
        with torch.no_grad():
            x = model.sample_input(b)
            return (model(x, 0, split) if split else x), torch.randint(0, 10, (b,))

    def step(h, y):
        loss = model.loss(model(h, split), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def high_water_mark():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    step(*inputs(2))  # kernels and optimizer state, at a tiny batch
    h, y = inputs(batch)  # the tail's cached input
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = psutil.Process().memory_info().rss
    step(h, y)
    print(json.dumps({"growth": high_water_mark() - base}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("split", [0, 7])
def test_footprint_covers_a_real_training_step(resnet20, split):
    """The training phase as accounted (with the margin) holds the peak RSS growth of a real step.

    The tail trains on its input computed beforehand (the cached activations), as on a device.
    """
    out = subprocess.run(
        [sys.executable, "-c", _STEP, str(split), "32"], capture_output=True, text=True, timeout=300, check=True
    )
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    fp = resnet20.footprint(split, batch=32)
    accounted = (fp.training - fp.cached_input) * (1 + fp.margin)
    message = f"measured {growth / MiB:.1f} MiB, accounted {accounted / MiB:.1f} MiB"
    assert 0.4 * accounted < growth <= accounted, message


def test_measuring_again_and_again_does_not_pile_up_copies():
    """A server measures every model it serves; each measurement's working copy must be freed."""
    import subprocess
    import sys

    code = (
        "import psutil\n"
        "from edge_sdk.models import build_model\n"
        "from profiles.accounting import measure_model\n"
        "m = build_model('digits_mlp'); measure_model(m)\n"  # 34 MB of weights per working copy
        "rss = psutil.Process().memory_info().rss\n"
        "for _ in range(5): measure_model(m)\n"
        "print((psutil.Process().memory_info().rss - rss) >> 20)\n"
    )
    grown = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown < 40, f"RSS grew {grown} MiB over 5 measurements"
