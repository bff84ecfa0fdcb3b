"""A bundle for a device without torch carries the tail's training graph: the device runs the frozen
chunks and trains the tail from the bundle alone in ONNX Runtime, as the torch trainer would."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.bundle import BundleError, load_bundle
from edge_sdk.forward import multi_step_forward
from edge_sdk.models import build_model
from edge_sdk.ort_trainer import OrtTail, evaluate_tail_ort, train_tail_ort
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, train_tail
from exporters.bundle import TRAIN_GRAPH_FILE, write_bundle
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache

SPLIT = 2  # digits_mlp: fc1, fc2 frozen; fc3 and head trained


@pytest.fixture(scope="module")
def graphs(request: pytest.FixtureRequest) -> TrainGraphCache:
    return TrainGraphCache(request.config.cache.mkdir("edgetrain-train-graphs"))


@pytest.fixture(scope="module")
def model():
    return build_model("digits_mlp", seed=0)


@pytest.fixture(scope="module")
def bundle_path(model, graphs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "weak.tar"
    write_bundle(model, SPLIT, [(0, 1), (1, 2)], out, version=3, role="weak", train_graph=True, graph_cache=graphs)
    return out


def test_a_device_trains_from_the_bundle_with_onnx_runtime(model, bundle_path: Path, graphs) -> None:
    bundle = load_bundle(bundle_path)
    graph = bundle.train_graph()
    assert graph is not None and (graph.model, graph.split) == ("digits_mlp", SPLIT)
    assert bundle.manifest.train_graph.id == graphs.graph_id(model, SPLIT)  # what the server would ship
    state = bundle.tail()
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32) * 16
    y = rng.integers(0, 10, 64)
    h = multi_step_forward(bundle.iter_chunks(), x).array
    config = TrainConfig(local_steps=5, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-4, seed=1)

    got = train_tail_ort(OrtTail(graph), state, h, y, config)

    tail = build_tail("digits_mlp", SPLIT)
    load_tail_state(tail, SPLIT, state)
    expected = train_tail(tail, SPLIT, h, y, config, state)
    assert got.loss_after < got.loss_before
    assert got.loss_after == pytest.approx(expected.loss_after, rel=1e-3, abs=1e-4)
    assert set(got.deltas) == set(expected.deltas) == set(state)
    for name, d in expected.deltas.items():
        assert np.abs(d).max() > 0, name
        assert float(np.abs(got.deltas[name] - d).max()) <= 2e-3 * float(np.abs(d).max()), name
    trained = {n: state[n] + got.deltas[n] for n in state}
    assert evaluate_tail_ort(OrtTail(graph), trained, h, y, config)["loss"] < got.loss_before


def test_the_training_graph_is_checked_like_every_file(bundle_path: Path, tmp_path: Path) -> None:
    with tarfile.open(bundle_path) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]
    assert json.loads(members["manifest.json"])["train_graph"]["file"] == TRAIN_GRAPH_FILE
    damaged = bytearray(members[TRAIN_GRAPH_FILE])
    damaged[len(damaged) // 2] ^= 1
    out = tmp_path / "damaged.tar"
    with tarfile.open(out, "w") as archive:
        for name, data in {**members, TRAIN_GRAPH_FILE: bytes(damaged)}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match="sha256 of train_graph.bin"):
        load_bundle(out)


def test_a_torch_bundle_has_no_graph_and_a_refused_tail_gets_none(model, graphs, tmp_path: Path) -> None:
    out = tmp_path / "strong.tar"
    manifest = write_bundle(model, 0, [], out, version=3)
    assert manifest.train_graph is None and "train_graph" not in manifest.to_dict()
    assert load_bundle(out).train_graph() is None
    # A tail whose training graph is refused (here up front: row-sparse tables) gets no bundle.
    recommender = build_model("recommender", seed=None)
    with pytest.raises(ExportError, match="row-sparse embedding tables"):
        write_bundle(recommender, 0, [], tmp_path / "stem.tar", version=3, train_graph=True, graph_cache=graphs)
    assert not (tmp_path / "stem.tar").exists()


def test_cli_writes_a_bundle_for_a_device_without_torch(tmp_path: Path, graphs: TrainGraphCache) -> None:
    from typer.testing import CliRunner

    from edgetrain.cli import _register, app

    _register()
    out = tmp_path / "ort.tar"
    result = CliRunner().invoke(app, ["bundle", "--model", "digits_mlp", "--split", "3", "--backend",
                                      "onnxruntime", "--graph-dir", str(graphs.directory), "--out", str(out)])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(out)
    graph = bundle.train_graph()
    assert graph is not None and graph.split == bundle.manifest.split
    assert "training graph" in result.output
