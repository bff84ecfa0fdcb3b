"""The zoo's decoder-only transformer: built from its registry entry with options, every split of the
test-sized one exports a training graph verified against torch autograd, and float buffers are held as
constants or refused with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edge_sdk.models import LayeredModel, build_model, model_spec
from edge_sdk.ort_trainer import TrainGraph
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache, export_train_graph, train_graph_refusal, verify_train_graph

TINY = "char_transformer_tiny"


@pytest.fixture(scope="session")
def graphs(request: pytest.FixtureRequest) -> TrainGraphCache:
    """The same on-disk cache as tests/test_train_export.py's (a graph is exported once per recipe)."""
    return TrainGraphCache(request.config.cache.mkdir("edgetrain-train-graphs"))


def test_the_zoo_entry_builds_a_causal_language_model() -> None:
    model = build_model(TINY, seed=0)
    assert model.block_names == ["embed", "block1", "block2", "head"]
    assert model.input_dtype == torch.int64 and model.input_shape == (40,) and model.num_outputs == 65
    x = model.sample_input(3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
        changed = x.clone()
        changed[:, 0] = (changed[:, 0] + 1) % 65  # the first character: visible to the last position
        assert out.shape == (3, 65) and not torch.allclose(out, model(changed))
        # Causal: block outputs at position t do not depend on characters after t.
        h = model(x, 0, 2)
        later = x.clone()
        later[:, 20:] = (later[:, 20:] + 7) % 65
        assert torch.allclose(h[:, :20], model(later, 0, 2)[:, :20], atol=1e-6)
        assert not torch.allclose(h[:, 20:], model(later, 0, 2)[:, 20:])


def test_model_options_name_the_architecture() -> None:
    """``name@key=value``: a factory's keyword options, in one canonical spelling."""
    assert model_spec("char_transformer@rank=0").name == "char_transformer"
    spec = model_spec("char_transformer@layers=4,rank=8")
    assert spec.name == "char_transformer@rank=8" and spec.dataset == "tinyshakespeare"
    adapted = build_model(spec.name, seed=0)
    assert adapted.name == "char_transformer@rank=8"
    plain = build_model("char_transformer", seed=0)
    assert adapted.trainable_parameters() > plain.trainable_parameters()
    with pytest.raises(ValueError, match="unknown option 'depth=3'.*rank"):
        model_spec("char_transformer@depth=3")
    with pytest.raises(ValueError, match="is not a int"):
        model_spec("char_transformer@rank=two")


#: Splits 0 and 1 (the longest tails, about 20 s each on 2 cores from a fresh clone) in the slow tier,
#: where the JavaScript device's transformer splits read them; 2 and 3 (the same block kinds) quick.
@pytest.mark.parametrize("split", [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow),
                                   2, 3])
def test_every_split_of_the_test_sized_transformer_exports_a_verified_graph(split: int, graphs) -> None:
    model = build_model(TINY, seed=0)
    assert train_graph_refusal(model, split) is None
    _, data = graphs.get_or_export(model, split)
    graph = TrainGraph.from_bytes(data)
    assert set(graph.params) == set(model.state_names(split, trainable_only=True)) and graph.buffers == ()
    # Loss, every gradient and the evaluation output against torch autograd in float64, two batch sizes.
    assert verify_train_graph(model, split, data, tolerance=1e-4) <= 1.0


class _Shifted(nn.Module):
    """A linear layer plus a float buffer no training step changes (as a causal mask would be)."""

    def __init__(self, persistent: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("offset", torch.linspace(-1, 1, 3), persistent=persistent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.offset


def _buffered(persistent: bool) -> LayeredModel:
    torch.manual_seed(0)
    return LayeredModel("buffered", [("fc1", nn.Linear(4, 4)), ("head", _Shifted(persistent))], input_shape=(4,),
                        num_outputs=3)


def test_a_constant_float_buffer_is_held_in_the_graph_or_refused_with_the_reason() -> None:
    data = export_train_graph(_buffered(persistent=False), 1)  # verified against torch inside
    assert TrainGraph.from_bytes(data).buffers == ()
    with pytest.raises(ExportError, match=r"buffer 'blocks\.head\.offset' is kept in the model's state but no training step "
                                          r"changes it.*persistent=False"):
        export_train_graph(_buffered(persistent=True), 1)


# -- memory: attention is context squared per head --------------------------------------------------
def test_the_accounting_counts_attention_as_context_squared_per_head() -> None:
    """Doubling the context doubles a block's linear activations and quadruples its attention
    matrices (heads x T^2 per sample), which the footprint holds for backward and while computing."""
    from profiles.accounting import measure_model

    short, long = (measure_model(build_model(f"{TINY}@context={t}", seed=None)) for t in (40, 80))
    heads = 2
    for cost, t in ((short, 40), (long, 80)):
        blocks = {b.name: b for b in cost.blocks}
        assert blocks["block1"].attention_elements == blocks["block2"].attention_elements == heads * t * t
        assert blocks["embed"].attention_elements == blocks["head"].attention_elements == 0
        # Kept for backward (the paper's a counts it) and both scores and weights alive at once.
        assert blocks["block1"].activations >= heads * t * t and blocks["block1"].peak_elements >= 2 * heads * t * t
        assert blocks["block1"].saved_elements >= heads * t * t  # autograd saved the weights
    extra = short.blocks[1].attention_elements * 3  # the T^2 part grows by 4x: 3 more of it
    assert long.blocks[1].attention_elements - short.blocks[1].attention_elements == extra
    batch = 32
    grown = long.footprint(1, batch).activations - short.footprint(1, batch).activations
    assert grown >= 2 * batch * extra * 4  # two blocks' attention, float32


@pytest.mark.slow  # a whole-command run; the quick tier keeps a sibling
def test_edgetrain_profile_shows_each_blocks_attention(tmp_path) -> None:
    from tests.test_planner import edgetrain

    out = edgetrain("--model", f"{TINY}@context=64", "--budget", "1GiB", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line.split() for line in out.stdout.splitlines() if len(line.split()) > 3
            and line.split()[0].isdigit()}
    assert "attn/sample" in out.stdout
    assert rows["block1"][4] == f"{2 * 64 * 64:,}" and rows["head"][4] == "0"


# -- the Python ONNX Runtime device follows torch ---------------------------------------------------
def _role_windows(chars: int = 6_000):
    """The windows of the longest speaking role's first ``chars`` characters (real text)."""
    from edge_sdk.data.shakespeare import SEQ_LEN, load_roles, windows
    from tests.shared_data import need

    roles, vocab = load_roles(need("tinyshakespeare"))
    role = max(roles, key=lambda r: len(r.text))
    return windows(vocab.encode(role.text[:chars]), SEQ_LEN, 8)


@pytest.mark.parametrize("split", [0, 2])
def test_the_onnx_runtime_device_follows_torchs_trajectory(split: int, graphs) -> None:
    """Three rounds of five local steps on a speaking role's text, each round from the state the
    previous one left: the training graph in ONNX Runtime (the device without torch) and torch
    give the same losses and deltas round after round, and the model learns."""
    import numpy as np

    from edge_sdk.ort_trainer import OrtTail, train_tail_ort
    from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, tail_state, train_tail

    model = build_model(TINY, seed=0)
    _, data = graphs.get_or_export(model, split)
    x, y = _role_windows()
    if split:  # the tail's input: the frozen blocks' output, as a device's forward pass caches it
        with torch.no_grad():
            x = model(torch.from_numpy(x), 0, split).numpy()
    ours = theirs = tail_state(model, split)
    first = last = None
    for round_no in range(3):
        config = TrainConfig(local_steps=5, batch_size=16, lr=0.3, momentum=0.9, weight_decay=1e-4, seed=round_no)
        tail = build_tail(TINY, split)
        load_tail_state(tail, split, theirs)
        expected = train_tail(tail, split, x, y, config, theirs)
        got = train_tail_ort(OrtTail(TrainGraph.from_bytes(data)), ours, x, y, config)
        assert got.loss_before == pytest.approx(expected.loss_before, rel=1e-4)
        assert got.loss_after == pytest.approx(expected.loss_after, rel=2e-3)
        assert set(got.deltas) == set(expected.deltas) == set(model.state_names(split))
        for n, d in expected.deltas.items():
            assert float(np.linalg.norm(got.deltas[n] - d)) <= 2e-2 * max(1e-6, float(np.linalg.norm(d))), n
        ours = {n: ours[n] + got.deltas[n] for n in ours}
        theirs = {n: theirs[n] + expected.deltas[n] for n in theirs}
        first = expected.loss_before if first is None else first
        last = got.loss_after
    assert last < first - 0.3, (first, last)  # it learnt the role's characters
