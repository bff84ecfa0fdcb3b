"""The device's side of the multi-step forward pass: frozen ONNX chunks run in ONNX Runtime.

EmbracingFL, Algorithm 1 (Multi-Step Forward Pass): a weak device receives the frozen input-side
layers y one chunk at a time (line 2), feeds its local data D through the chunk and stores only the
output activations D-bar (line 3), discards the chunk before it receives the next one, and finally
receives the trainable output-side layers z (line 4), which it trains on D-bar (Algorithm 2).

This module needs numpy and onnxruntime only: no torch, no onnx.
"""

from __future__ import annotations

import base64
import mmap
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

__all__ = ["ActivationCache", "ChunkRunner", "Storage", "multi_step_forward", "take_rows"]

Storage = Literal["memory", "disk"]

# ONNX tensor element types as onnxruntime names them -> numpy dtypes.
_ORT_DTYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(bool)": np.dtype(np.bool_),
}


def _numpy_dtype(ort_type: str) -> np.dtype:
    try:
        return _ORT_DTYPES[ort_type]
    except KeyError:
        raise ValueError(f"unsupported ONNX tensor type {ort_type}") from None


def _sample_shape(shape: list[int | str | None]) -> tuple[int | None, ...]:
    """Per-sample shape of an ONNX input/output: the batch axis dropped, symbolic axes as None."""
    return tuple(d if isinstance(d, int) else None for d in shape[1:])


class ChunkRunner:
    """One frozen chunk (an ONNX model with a dynamic batch axis) in an ONNX Runtime session.

    The session is tuned for small devices rather than throughput: a fixed number of intra-op
    threads, sequential execution, and no memory-pattern planning (it pre-allocates one block for
    all of a run's intermediates). The CPU memory arena stays on: without it every intermediate
    goes through malloc, and glibc keeps the freed large blocks, so the resident set grows more.
    Peak RSS growth while running ResNet20 blocks [0, 4), [4, 7), [7, 10) one after the other,
    1 thread, measured on the project's machine (arena / memory pattern):
    on / on (the ORT default) +28 MiB at batch 32, +99 MiB at batch 256;
    on / off (used here) +23 MiB and +66 MiB; off / off +38 MiB and +195 MiB.

    The model bytes are not kept: once the session is built the caller can drop them.
    """

    def __init__(
        self,
        onnx_bytes: bytes,
        *,
        threads: int = 1,
        memory_arena: bool = True,
        memory_pattern: bool = False,
    ) -> None:
        if not isinstance(onnx_bytes, (bytes, bytearray, memoryview)):
            raise TypeError(f"onnx_bytes must be bytes, not {type(onnx_bytes).__name__}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.enable_cpu_mem_arena = memory_arena
        options.enable_mem_pattern = memory_pattern
        options.log_severity_level = 3  # errors only
        try:
            session = ort.InferenceSession(bytes(onnx_bytes), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ValueError(f"not a loadable ONNX model: {exc}") from exc
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError(
                f"a chunk has one input and one output; this model has {len(inputs)} and {len(outputs)}"
            )
        self._session: ort.InferenceSession | None = session
        self.threads = threads
        self.input_name: str = inputs[0].name
        self.output_name: str = outputs[0].name
        self.input_shape = _sample_shape(inputs[0].shape)
        self.output_shape = _sample_shape(outputs[0].shape)
        self.input_dtype = _numpy_dtype(inputs[0].type)
        self.output_dtype = _numpy_dtype(outputs[0].type)

    @property
    def closed(self) -> bool:
        return self._session is None

    def run(self, x: np.ndarray) -> np.ndarray:
        """Run the chunk on one batch ``x`` of shape ``(batch, *input_shape)``."""
        if self._session is None:
            raise RuntimeError("this chunk runner is closed")
        x = np.asarray(x)
        if x.ndim != len(self.input_shape) + 1 or any(
            want is not None and got != want for got, want in zip(x.shape[1:], self.input_shape)
        ):
            expected = ", ".join("?" if d is None else str(d) for d in self.input_shape)
            raise ValueError(f"chunk input must have shape (batch, {expected}), got {x.shape}")
        if x.dtype != self.input_dtype:
            if not np.can_cast(x.dtype, self.input_dtype, casting="same_kind"):
                raise ValueError(f"chunk input must be {self.input_dtype}, got {x.dtype}")
            x = x.astype(self.input_dtype)
        (out,) = self._session.run([self.output_name], {self.input_name: np.ascontiguousarray(x)})
        return out

    def close(self) -> None:
        """Drop the session so that ONNX Runtime frees the chunk's weights and buffers."""
        self._session = None

    def __enter__(self) -> ChunkRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ActivationCache:
    """Activations of the local data at one depth of the model (D-bar in Algorithm 1, line 3).

    Kept either in memory (a numpy array) or on disk (a read-only ``numpy.memmap`` over a file that
    :meth:`close` deletes). The caller picks the storage from its memory budget.
    """

    def __init__(self, array: np.ndarray, *, storage: Storage = "memory", path: Path | None = None) -> None:
        self._array: np.ndarray | None = array
        self.storage: Storage = storage
        self.path = path

    @classmethod
    def from_array(cls, x: np.ndarray) -> ActivationCache:
        """Wrap the device's input data (no copy); closing this cache leaves ``x`` untouched."""
        x = np.asarray(x)
        if x.ndim < 1:
            raise ValueError("activations need a leading sample axis")
        return cls(x)

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            raise ValueError("this activation cache is closed")
        return self._array

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def closed(self) -> bool:
        return self._array is None

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def apply(
        self,
        runner: ChunkRunner,
        *,
        batch_size: int = 64,
        storage: Storage = "memory",
        directory: str | os.PathLike[str] | None = None,
    ) -> ActivationCache:
        """Run ``runner`` over these activations in batches; return the outputs as a new cache.

        Algorithm 1, line 3: D-bar = Feed-Forward(y, D). On success this cache is closed (the
        previous activations are freed, and deleted if on disk); on failure it is left as it was.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if storage not in ("memory", "disk"):
            raise ValueError(f"storage must be 'memory' or 'disk', got {storage!r}")
        if storage == "disk" and directory is None:
            raise ValueError("disk storage needs a directory")
        source = self.array
        n = source.shape[0]
        if n == 0:
            raise ValueError("no samples to run the chunk on")
        writer = _MemoryWriter() if storage == "memory" else _DiskWriter(Path(directory))  # type: ignore[arg-type]
        pages = _PageReleaser(source if self.path is not None else None)
        try:
            for begin in range(0, n, batch_size):
                writer.write(runner.run(source[begin : begin + batch_size]), n)
                pages.release_rows(begin + batch_size)
            result = writer.finish()
        except BaseException:
            writer.abort()
            raise
        self.close()
        return result

    def close(self) -> None:
        """Free the activations; a disk-backed cache deletes its file."""
        # A memmap's mapping closes once no view of it remains; unlinking first is fine on POSIX.
        self._array = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def __enter__(self) -> ActivationCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten disk cache must not leave its file behind.
        if getattr(self, "path", None) is not None:
            self.close()


def _file_mapping(source: object) -> mmap.mmap | None:
    """The mmap behind ``source`` if it is a read-only mapping of a whole file (a disk cache), else None.

    Only such mappings have their pages dropped: a private or writable mapping could lose data,
    and a view would not start at the mapping's first byte.
    """
    if getattr(mmap, "MADV_DONTNEED", None) is None:
        return None
    if not (isinstance(source, np.memmap) and source.mode == "r" and not source.offset):
        return None
    return getattr(source, "_mmap", None)


def take_rows(source: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``source[rows]`` (``rows``: integer indices) as an array of its own; from a disk-backed
    cache, without mapping any of its pages into the resident set.

    Training reads a disk cache one batch at a time, in random order. Through the mapping, every
    page a batch touches would stay resident (and the kernel's read-ahead brings in most of the
    file at the first fault), so after a few steps the whole cache would be resident, as if it were
    kept in memory. The rows are read from the file instead (``pread``, consecutive rows in one
    call), so a batch costs its own bytes and nothing more.
    """
    rows = np.asarray(rows)
    if _file_mapping(source) is None or rows.ndim != 1 or rows.dtype.kind not in "iu" or not source.flags.c_contiguous:
        return np.array(source[rows], copy=True)
    n = source.shape[0]
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise IndexError(f"row index out of range for {n} rows")
    rows = np.where(rows < 0, rows + n, rows)
    out = np.empty((len(rows), *source.shape[1:]), dtype=source.dtype)
    if not len(rows):
        return out
    row_bytes = source.strides[0]
    flat = out.reshape(len(rows), -1).view(np.uint8)
    fd = os.open(source.filename, os.O_RDONLY)
    try:
        begin = 0
        for end in range(1, len(rows) + 1):  # runs of consecutive rows, one read each
            if end < len(rows) and rows[end] == rows[end - 1] + 1:
                continue
            want = (end - begin) * row_bytes
            view = memoryview(flat[begin:end]).cast("B")
            got = os.preadv(fd, [view], int(rows[begin]) * row_bytes)
            if got != want:
                raise OSError(f"short read from {source.filename}: {got} of {want} bytes")
            begin = end
    finally:
        os.close(fd)
    return out


class _PageReleaser:
    """Drops the pages of a disk-backed source from the resident set once they have been read.

    A read-only file mapping's pages are clean and can be re-read from the file, so telling the
    kernel they are not needed (``MADV_DONTNEED``) only lowers RSS; without it a pass over a
    disk cache would map the whole file in.
    """

    def __init__(self, source: np.ndarray | None) -> None:
        self._mmap = _file_mapping(source)
        self._advice = getattr(mmap, "MADV_DONTNEED", None)
        self._row_bytes = source.strides[0] if self._mmap is not None else 0  # type: ignore[union-attr]
        self._released = 0

    def release_rows(self, rows: int) -> None:
        if self._mmap is None:
            return
        end = min(rows * self._row_bytes, len(self._mmap)) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > self._released:
            self._mmap.madvise(self._advice, self._released, end - self._released)
            self._released = end


class _MemoryWriter:
    """Collects batches into one preallocated array (allocated when the first batch shows the shape)."""

    def __init__(self) -> None:
        self._array: np.ndarray | None = None
        self._filled = 0

    def write(self, batch: np.ndarray, total: int) -> None:
        if self._array is None:
            self._array = np.empty((total, *batch.shape[1:]), dtype=batch.dtype)
        self._array[self._filled : self._filled + len(batch)] = batch
        self._filled += len(batch)

    def finish(self) -> ActivationCache:
        assert self._array is not None and self._filled == len(self._array)
        return ActivationCache(self._array, storage="memory")

    def abort(self) -> None:
        self._array = None


class _DiskWriter:
    """Appends batches to a file, then maps it read-only.

    Writing with plain file writes (not through a writable mapping) keeps at most one batch of
    activations resident while the chunk runs; the read-only mapping afterwards pages data in on use.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="activations-", suffix=".bin", dir=directory)
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        self._filled = 0

    def write(self, batch: np.ndarray, total: int) -> None:
        if self._shape is None:
            self._shape, self._dtype = (total, *batch.shape[1:]), batch.dtype
        np.ascontiguousarray(batch, dtype=self._dtype).tofile(self._file)
        self._filled += len(batch)

    def finish(self) -> ActivationCache:
        assert self._shape is not None and self._filled == self._shape[0]
        self._file.close()
        array = np.memmap(self.path, dtype=self._dtype, mode="r", shape=self._shape)
        return ActivationCache(array, storage="disk", path=self.path)

    def abort(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def multi_step_forward(
    chunks: Iterable[bytes],
    x: np.ndarray | ActivationCache,
    *,
    batch_size: int = 64,
    storage: Storage = "memory",
    directory: str | os.PathLike[str] | None = None,
    threads: int = 1,
) -> ActivationCache:
    """Run the frozen chunks in order over ``x``; return the activations that feed the trainable tail.

    EmbracingFL Algorithm 1: for every chunk of y, receive it (line 2), feed the current activations
    through it and store the output (line 3), then discard it before the next one arrives (line 4).
    ``chunks`` may be a generator that fetches each chunk only when asked, so that at most one chunk
    is held at a time.
    """
    cache = x if isinstance(x, ActivationCache) else ActivationCache.from_array(x)
    for blob in chunks:
        runner = ChunkRunner(blob, threads=threads)
        del blob  # the session holds its own copy of the weights
        try:
            cache = cache.apply(runner, batch_size=batch_size, storage=storage, directory=directory)
        finally:
            runner.close()
    return cache


#: A one-node ONNX graph (Relu over a (batch, 64) float input), 84 bytes, for :func:`warm_up`.
_WARM_UP_ONNX = base64.b64decode(
    "CAk6SgoMCgF4EgF5IgRSZWx1EgZ3YXJtdXBaGAoBeBITChEIARINCgcSBWJhdGNoCgIIQGIYCgF5EhMKEQgBEg0KBxIFYmF0Y2gKAghAQgQKABAS"
)


def warm_up(threads: int = 1) -> None:
    """Open, run and close one tiny session, as a device does with its first chunk.

    What ONNX Runtime keeps after its first session (thread pools, kernel registries) stays for
    the life of the process; the runtime's memory is measured after this (profiles.runtime).
    """
    with ChunkRunner(_WARM_UP_ONNX, threads=threads) as runner:
        runner.run(np.zeros((32, 64), dtype=np.float32))
