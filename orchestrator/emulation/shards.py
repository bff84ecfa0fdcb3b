"""Emulated devices' shards as memory-mapped files, so an idle device holds no copy of its data.

A lightweight worker runs many devices in one process. Copied out of the dataset (``x[idx]``),
every device's shard is anonymous memory for the whole run, although a round reads only a few
batches of it: at 20 MNIST devices, 188 MB across the workers. :func:`mapped_rows` writes a
device's rows once to a file of their own beside the dataset's memory-mapped cache and maps it
read-only: the pages a round touches come from the page cache (shared, clean, dropped under
pressure) and the rest are never resident.

The file's name is a hash of the dataset file it was cut from (path, size, modification time)
and of the rows, so a rebuilt dataset or another partition gets a new file; a shard file is
written atomically (:func:`edge_sdk.fileio.atomic_write`), so concurrent workers or runs never
read a partial one.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from edge_sdk.fileio import atomic_write

__all__ = ["mapped_rows", "shard_path"]


def shard_path(source: np.memmap, idx: np.ndarray) -> Path | None:
    """Where the rows ``idx`` of ``source`` are kept (None: ``source`` is not a file mapping)."""
    filename = getattr(source, "filename", None)
    if filename is None:
        return None
    path = Path(filename)
    st = os.stat(path)
    h = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{source.shape}|{source.dtype}".encode())
    h.update(np.ascontiguousarray(idx, dtype=np.int64).tobytes())
    return path.parent / "shards" / f"{path.name.removesuffix('.npy')}-{h.hexdigest()[:24]}.npy"


def mapped_rows(source: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``source[idx]`` as a read-only memory map of a file of its own (written on first use); a
    plain copy when ``source`` is not mapped from a file."""
    idx = np.asarray(idx)
    path = shard_path(source, idx) if isinstance(source, np.memmap) else None
    if path is None:
        return np.asarray(source[idx])
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(source[idx]))
        atomic_write(path, buf.getbuffer(), durable=False)
    return np.load(path, mmap_mode="r")
