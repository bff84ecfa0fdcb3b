"""ONNX chunk export (every zoo model, chained in onnxruntime) and the content-addressed chunk cache."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest
import torch

from edge_sdk.forward import ActivationCache, ChunkRunner
from edge_sdk.models.zoo import MODEL_NAMES, build_model, digits_mlp
from exporters.cache import ChunkCache, chunk_id
from exporters.onnx_export import ChunkIO, ExportError, ExportSettings, chunk_io, export_chunk, verify_chunk

# Chunkings to export and chain: every block boundary for the small models; for the large ones the
# chunks a moderate/weak device is given (ResNet20 split 7, LEAF CNN split 3, BiLSTM split 2).
CHAINS: dict[str, list[list[tuple[int, int]]]] = {
    "tiny": [[(0, 1), (1, 2)]],
    "mnist_2nn": [[(0, 1), (1, 2)]],
    "mnist_cnn": [[(0, 2), (2, 3)]],
    "digits_mlp": [[(0, 1), (1, 2), (2, 3), (3, 4)], [(0, 2), (2, 4)]],
    "recommender": [[(0, 1), (1, 2), (2, 3)]],
    "movielens_lr": [[(0, 1)]],  # one block: never frozen on a device, exported whole as a check
    "bilstm": [[(0, 1), (1, 2)]],
    "resnet20": [[(0, 4), (4, 7)]],
    "leaf_cnn": [[(0, 2), (2, 3)]],
    "char_lstm": [[(0, 1), (1, 2)]],  # embedding, then the LSTM: the chunks a weak device runs
    "cox_linear": [[(0, 1)]],  # one block: exported whole as a check
    # Transformers: the embedding, then blocks with causal attention (the mask built in forward).
    "char_transformer_tiny": [[(0, 1), (1, 3)]],
    "char_transformer": [[(0, 2), (2, 5)]],
    "char_transformer_phone": [[(0, 1), (1, 2)]],
}
TOLERANCE = 1e-5


def _with_running_stats(model):
    """Give BatchNorm layers non-default running statistics, so eval mode differs visibly from train."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(model.sample_input(8) * 3.0 + 0.5 if model.input_dtype.is_floating_point else model.sample_input(8))
    return model.eval()


@pytest.fixture(scope="module")
def models():
    return {name: _with_running_stats(build_model(name, seed=7)) for name in MODEL_NAMES}


@pytest.fixture(scope="module")
def narrow():
    """The zoo's digits MLP blocks at a small width: quick to export for the cache tests."""
    with torch.random.fork_rng():
        torch.manual_seed(4)
        return digits_mlp(width=64).eval()


@pytest.fixture(scope="module")
def exported(models):
    """ONNX bytes and export seconds for every chunk in CHAINS."""
    result = {}
    for name, chains in CHAINS.items():
        for chain in chains:
            for start, stop in chain:
                if (name, start, stop) not in result:
                    began = time.perf_counter()
                    data = export_chunk(models[name], start, stop)
                    result[name, start, stop] = (data, time.perf_counter() - began)
    return result


def test_chains_cover_every_model():
    assert set(CHAINS) == set(MODEL_NAMES)


@pytest.mark.parametrize(
    "name,chain", [(name, chain) for name, chains in CHAINS.items() for chain in chains], ids=str
)
def test_chained_chunks_match_torch_eval(models, exported, name, chain):
    model = models[name]
    x = model.sample_input(7, generator=torch.Generator().manual_seed(11))
    cache = ActivationCache.from_array(x.numpy())
    for start, stop in chain:
        data, seconds = exported[name, start, stop]
        with ChunkRunner(data) as runner:
            cache = cache.apply(runner, batch_size=3)
        with torch.no_grad():
            expected = model(x, 0, stop).numpy()
        diff = float(np.abs(cache.array - expected).max())
        print(f"{name} [{start},{stop}) export {seconds:.3f}s {len(data):,} B max|ort-torch| {diff:.2e}")
        assert cache.array.shape == expected.shape
        assert diff <= TOLERANCE, f"{name} blocks [0, {stop}) differ by {diff}"


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_batch_one_and_seven_run(models, exported, name):
    model = models[name]
    for (model_name, start, stop), (data, _) in exported.items():
        if model_name != name:
            continue
        io = chunk_io(model, start, stop)
        with ChunkRunner(data) as runner:
            assert runner.input_shape == io.input_shape and runner.output_shape == io.output_shape
            for batch in (1, 7):
                with torch.no_grad():
                    x = model(model.sample_input(batch), 0, start) if start else model.sample_input(batch)
                    expected = model(x, start, stop).numpy()
                out = runner.run(x.numpy())
                assert out.shape == (batch, *io.output_shape)
                np.testing.assert_allclose(out, expected, atol=TOLERANCE)


@pytest.mark.parametrize("name,start,stop", [("resnet20", 4, 7), ("recommender", 0, 2)])
def test_dynamo_exporter_gives_a_dynamic_batch(models, name, start, stop):
    model = models[name]
    data = export_chunk(model, start, stop, settings=ExportSettings(exporter="dynamo"))
    with ChunkRunner(data) as runner:
        for batch in (1, 7):
            with torch.no_grad():
                x = model(model.sample_input(batch), 0, start) if start else model.sample_input(batch)
                expected = model(x, start, stop).numpy()
            np.testing.assert_allclose(runner.run(x.numpy()), expected, atol=TOLERANCE)


def test_export_is_frozen_and_restores_modes():
    model = build_model("resnet20", seed=2)
    model.train()
    model.block(3).eval()  # a mixed state must come back exactly
    modes = {name: m.training for name, m in model.named_modules()}
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    data = export_chunk(model, 0, 4)
    assert {name: m.training for name, m in model.named_modules()} == modes
    for k, v in model.state_dict().items():
        if k in stats:
            assert torch.equal(v, stats[k]), f"export changed {k}"
    assert verify_chunk(model, 0, 4, data) <= TOLERANCE
    # the chunk computes eval mode (running statistics), not train mode (batch statistics)
    x = model.sample_input(6)
    with torch.no_grad():
        train_out = copy.deepcopy(model).train()(x, 0, 4).numpy()
    with ChunkRunner(data) as runner:
        out = runner.run(x.numpy())
    assert np.abs(out - train_out).max() > 1e-2


def test_verify_reports_a_chunk_that_no_longer_matches(narrow):
    model = copy.deepcopy(narrow)
    data = export_chunk(model, 0, 2)
    assert verify_chunk(model, 0, 2, data, tolerance=TOLERANCE) <= TOLERANCE
    with torch.no_grad():
        model.block(1)[0].bias.add_(0.5)  # the server's weights moved on; the chunk did not
    diff = verify_chunk(model, 0, 2, data)
    assert diff >= 0.4
    with pytest.raises(ExportError, match=r"differs from torch eval by 0\.\d+ \(tolerance 1e-05 x max\(1, [\d.]+\)\) at batch 4"):
        verify_chunk(model, 0, 2, data, tolerance=TOLERANCE)
    with pytest.raises(ExportError, match="not a loadable ONNX model"):
        verify_chunk(model, 0, 2, b"garbage", tolerance=TOLERANCE)


def test_bad_ranges_and_settings_are_rejected(models):
    with pytest.raises(ValueError, match=r"block range \[2, 2\)"):
        export_chunk(models["tiny"], 2, 2)
    with pytest.raises(ValueError, match=r"block range \[0, 3\)"):
        export_chunk(models["tiny"], 0, 3)
    with pytest.raises(ValueError, match="exporter"):
        ExportSettings(exporter="tflite")
    with pytest.raises(ValueError, match="verify_batch"):
        ExportSettings(verify_batch=1)
    with pytest.raises(ValueError, match="tolerance"):
        ExportSettings(tolerance=float("nan"))
    with pytest.raises(ValueError, match="opset"):
        ExportSettings(opset=9)


def test_chunk_io_follows_the_prefix(models):
    assert chunk_io(models["resnet20"], 4, 7) == ChunkIO((16, 32, 32), "float32", (32, 16, 16), "float32")
    assert chunk_io(models["bilstm"], 0, 1) == ChunkIO((256,), "int64", (256, 256), "float32")
    assert chunk_io(models["leaf_cnn"], 2, 3).output_shape == (2048,)


# -- the chunk cache --------------------------------------------------------------------------
def test_chunk_id_is_a_canonical_hash():
    settings = ExportSettings()
    cid = chunk_id("tiny", 3, 0, 1, settings)
    assert len(cid) == 64 and int(cid, 16) >= 0
    assert cid == chunk_id("tiny", "3", 0, 1, ExportSettings())
    distinct = {
        cid,
        chunk_id("tiny", 4, 0, 1, settings),
        chunk_id("tiny", 3, 0, 2, settings),
        chunk_id("tiny", 3, 1, 2, settings),
        chunk_id("digits_mlp", 3, 0, 1, settings),
        chunk_id("tiny", 3, 0, 1, ExportSettings(exporter="dynamo")),
        chunk_id("tiny", 3, 0, 1, ExportSettings(tolerance=1e-3)),
    }
    assert len(distinct) == 7
    with pytest.raises(TypeError):
        chunk_id("tiny", True, 0, 1, settings)
    with pytest.raises(ValueError):
        chunk_id("tiny", 1, 1, 1, settings)


def test_cache_exports_once_then_hits(narrow):
    cache = ChunkCache(10 * 2**20)
    model = narrow
    cid, data = cache.get_or_export(model, 5, 0, 2)
    assert cid == chunk_id("digits_mlp", 5, 0, 2, cache.settings)
    for _ in range(3):
        again_id, again = cache.get_or_export(model, 5, 0, 2)
        assert again_id == cid and again is data
    s = cache.stats
    assert (s.exports, s.misses, s.hits, s.entries, s.bytes) == (1, 1, 3, 1, len(data))
    assert cache.get(cid) is data and cid in cache
    # a new round's weights come with a new version: a new id and a new export
    new_id, _ = cache.get_or_export(model, 6, 0, 2)
    assert new_id != cid and cache.stats.exports == 2


def test_cache_evicts_least_recently_used_under_its_bound(narrow):
    model = narrow
    sizes = [len(export_chunk(model, i, i + 1)) for i in range(3)]
    cache = ChunkCache(sizes[0] + sizes[1] + 100)
    first, _ = cache.get_or_export(model, 1, 0, 1)
    second, _ = cache.get_or_export(model, 1, 1, 2)
    cache.get_or_export(model, 1, 0, 1)  # touch: the second is now least recently used
    third, _ = cache.get_or_export(model, 1, 2, 3)
    s = cache.stats
    assert s.evictions == 1 and s.bytes <= cache.max_bytes
    assert first in cache and third in cache and second not in cache
    cache.get_or_export(model, 1, 1, 2)
    assert cache.stats.exports == 4
    # a chunk larger than the whole bound is served but not kept
    small = ChunkCache(100)
    cid, data = small.get_or_export(model, 1, 0, 1)
    assert len(data) > 100 and cid not in small and small.stats.bytes == 0


def test_cache_survives_a_restart_on_disk(models, tmp_path):
    model = models["tiny"]
    cid, data = ChunkCache(2**20, tmp_path).get_or_export(model, "r1", 0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{cid}.json", f"{cid}.onnx"]
    restarted = ChunkCache(2**20, tmp_path)
    again_id, again = restarted.get_or_export(model, "r1", 0, 1)
    assert (again_id, again) == (cid, data)
    assert restarted.stats.exports == 0 and restarted.stats.disk_hits == 1
    # a damaged file is detected by its recorded sha256 and exported again
    (tmp_path / f"{cid}.onnx").write_bytes(data[:-10])
    third = ChunkCache(2**20, tmp_path)
    assert third.get_or_export(model, "r1", 0, 1) == (cid, data)
    assert third.stats.exports == 1 and third.stats.disk_hits == 0
    assert (tmp_path / f"{cid}.onnx").read_bytes() == data
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    # pruning keeps the store under a bound, oldest first
    third.get_or_export(model, "r2", 0, 1)
    assert third.prune_disk(len(data) + 1) == 1
    assert len(list(tmp_path.glob("*.onnx"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1


def test_concurrent_requests_export_once(narrow):
    cache = ChunkCache(2**24)
    model = narrow
    results: list[tuple[str, bytes]] = []
    barrier = threading.Barrier(4)

    def worker():
        barrier.wait()
        results.append(cache.get_or_export(model, 9, 0, 4))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len({r[0] for r in results}) == 1 and len({r[1] for r in results}) == 1
    assert cache.stats.exports == 1
