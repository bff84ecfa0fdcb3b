"""The device's ONNX forward runner and activation cache (EmbracingFL Algorithm 1, device side)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.forward import ActivationCache, ChunkRunner, multi_step_forward
from edge_sdk.models.zoo import build_model, digits_mlp
from exporters.onnx_export import export_chunk

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def digits():
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = digits_mlp(width=32).eval()  # the zoo's block structure, narrow enough to be quick
    chunks = [export_chunk(model, i, i + 1) for i in range(3)]
    return model, chunks


@pytest.fixture(scope="module")
def tiny_chunk():
    model = build_model("tiny", seed=1).eval()
    return model, export_chunk(model, 0, 1)


def test_runner_computes_the_linear_block(tiny_chunk):
    model, data = tiny_chunk
    fc = model.block(0)
    weight, bias = fc.weight.detach().numpy(), fc.bias.detach().numpy()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with ChunkRunner(data) as runner:
        assert runner.input_shape == (4,) and runner.output_shape == (3,)
        assert runner.input_dtype == np.float32 and runner.output_dtype == np.float32
        np.testing.assert_allclose(runner.run(x), x @ weight.T + bias, rtol=1e-6, atol=1e-6)
        # float64 input is cast to the chunk's float32; batch sizes are free.
        np.testing.assert_allclose(runner.run(x[:1].astype(np.float64)), x[:1] @ weight.T + bias, atol=1e-6)


def test_runner_rejects_bad_input_and_use_after_close(tiny_chunk):
    _, data = tiny_chunk
    runner = ChunkRunner(data, threads=2)
    with pytest.raises(ValueError, match=r"shape \(batch, 4\)"):
        runner.run(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"shape \(batch, 4\)"):
        runner.run(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="must be float32"):
        runner.run(np.zeros((2, 4), np.complex64))
    runner.close()
    assert runner.closed
    with pytest.raises(RuntimeError, match="closed"):
        runner.run(np.zeros((2, 4), np.float32))


def test_runner_rejects_bad_bytes_and_arguments(tiny_chunk):
    with pytest.raises(ValueError, match="not a loadable ONNX model"):
        ChunkRunner(b"definitely not onnx")
    with pytest.raises(TypeError):
        ChunkRunner("model.onnx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threads"):
        ChunkRunner(tiny_chunk[1], threads=0)


def _torch_prefix(model, x: np.ndarray, stop: int) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x), 0, stop).numpy()


def test_disk_cache_equals_memory_cache_and_deletes_its_file(digits, tmp_path):
    model, chunks = digits
    x = np.random.default_rng(1).random((23, 64), dtype=np.float32)  # 23: not a multiple of the batch
    in_memory = ActivationCache.from_array(x)
    on_disk = ActivationCache.from_array(x)
    files_seen = []
    for stop, data in enumerate(chunks, start=1):
        with ChunkRunner(data) as runner:
            in_memory = in_memory.apply(runner, batch_size=5, storage="memory")
            previous = on_disk.path
            on_disk = on_disk.apply(runner, batch_size=5, storage="disk", directory=tmp_path)
        # applying a chunk frees the previous cache: its file is gone, only the new one is there
        assert previous is None or not previous.exists()
        assert on_disk.storage == "disk" and isinstance(on_disk.array, np.memmap)
        assert sorted(tmp_path.iterdir()) == [on_disk.path]
        files_seen.append(on_disk.path)
        assert in_memory.storage == "memory" and not isinstance(in_memory.array, np.memmap)
        np.testing.assert_array_equal(np.asarray(on_disk.array), in_memory.array)
        np.testing.assert_allclose(in_memory.array, _torch_prefix(model, x, stop), atol=1e-5)
        assert on_disk.nbytes == in_memory.nbytes == 23 * in_memory.array.shape[1] * 4
    assert len(set(files_seen)) == 3
    path = on_disk.path
    on_disk.close()
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        on_disk.array
    # the input array handed to from_array survives the pipeline
    assert x.shape == (23, 64) and np.isfinite(x).all()


def test_disk_cache_reads_back_after_its_pages_are_released(tiny_chunk, tmp_path):
    from edge_sdk.forward import _PageReleaser

    _, data = tiny_chunk
    x = np.random.default_rng(3).random((5000, 4), dtype=np.float32)
    with ChunkRunner(data) as runner:
        cache = ActivationCache.from_array(x).apply(runner, batch_size=512, storage="disk", directory=tmp_path)
        expected = runner.run(x)
    pages = _PageReleaser(cache.array)
    assert pages._mmap is not None  # the disk cache's mapping qualifies
    pages.release_rows(len(cache))
    assert pages._released > 0
    np.testing.assert_array_equal(np.asarray(cache.array), expected)  # pages come back from the file
    assert _PageReleaser(x)._mmap is None  # never on memory the caller owns
    cache.close()


def test_take_rows_reads_a_disk_cache_without_keeping_its_pages(tmp_path):
    """Random batches from a disk cache: the rows it holds, and the mapping stays out of the resident set."""
    from edge_sdk.forward import _DiskWriter, take_rows

    rng = np.random.default_rng(5)
    x = rng.random((2048, 8, 16, 16), dtype=np.float32)  # 16 MiB of 8 KiB rows
    writer = _DiskWriter(tmp_path)
    for begin in range(0, len(x), 256):
        writer.write(x[begin : begin + 256], len(x))
    cache = writer.finish()
    source = cache.array
    for rows in (np.sort(rng.choice(len(x), 32, replace=False)), np.array([0, 1, 2, 2047, 5, 4, -1]),
                 np.arange(100, 164), np.array([], np.int64)):
        got = take_rows(source, rows)
        np.testing.assert_array_equal(got, x[rows])
        assert got.flags.owndata and not isinstance(got, np.memmap)
    with pytest.raises(IndexError):
        take_rows(source, np.array([len(x)]))
    # mincore is not in Python: the resident pages of the mapping are read from /proc/self/smaps.
    start = source.ctypes.data

    def resident_kib() -> int:
        inside = False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= start < hi
            elif inside and head[0] == "Rss:":
                return int(head[1])
        return 0

    for _ in range(20):
        take_rows(source, np.sort(rng.choice(len(x), 32, replace=False)))
    assert resident_kib() <= 64
    for _ in range(20):  # the same batches read through the mapping page most of it in
        np.array(source[np.sort(rng.choice(len(x), 32, replace=False))])
    assert resident_kib() > 4096
    assert isinstance(take_rows(x, np.array([3, 1])), np.ndarray)  # plain arrays: ordinary indexing
    np.testing.assert_array_equal(take_rows(x, np.array([3, 1])), x[[3, 1]])
    cache.close()


def test_apply_failure_keeps_the_previous_cache_and_leaves_no_file(tiny_chunk, tmp_path):
    _, data = tiny_chunk
    cache = ActivationCache.from_array(np.zeros((6, 5), np.float32))  # wrong width for the chunk
    with ChunkRunner(data) as runner, pytest.raises(ValueError, match="shape"):
        cache.apply(runner, batch_size=4, storage="disk", directory=tmp_path)
    assert not cache.closed and cache.array.shape == (6, 5)
    assert list(tmp_path.iterdir()) == []
    with ChunkRunner(data) as runner:
        with pytest.raises(ValueError, match="storage"):
            cache.apply(runner, storage="cloud")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="directory"):
            cache.apply(runner, storage="disk")
        with pytest.raises(ValueError, match="batch_size"):
            cache.apply(runner, batch_size=0)


def test_multi_step_forward_pulls_one_chunk_at_a_time(digits, tmp_path):
    model, chunks = digits
    x = np.random.default_rng(2).random((17, 64), dtype=np.float32)
    pulled: list[int] = []

    def fetch():  # stands in for "ask the server for the next chunk" (Algorithm 1, line 4)
        for i, data in enumerate(chunks):
            pulled.append(i)
            yield data

    cache = multi_step_forward(fetch(), x, batch_size=8, storage="disk", directory=tmp_path)
    assert pulled == [0, 1, 2]
    np.testing.assert_allclose(cache.array, _torch_prefix(model, x, 3), atol=1e-5)
    assert cache.array.shape == (17, 32)  # width 32
    cache.close()
    assert list(tmp_path.iterdir()) == []


def test_device_modules_do_not_import_torch_or_onnx():
    code = (
        "import sys, edge_sdk.forward, edge_sdk.bundle; "
        "bad = sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"device modules imported {result.stdout.strip()} {result.stderr[-2000:]}"
