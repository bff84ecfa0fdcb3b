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
read a partial one. Every use marks its file as used; writing a new one removes the shard files no
run has used for :data:`UNUSED_DAYS` days, so the folder holds the partitions of recent runs, not
of every seed ever tried. A worker cutting thousands of shards prunes once after them
(:func:`prune_unused`): a scan of the folder per shard written made cutting N shards O(N^2) file
system calls (10,000 devices: no device had connected after two minutes).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import time
from pathlib import Path

import numpy as np

from edge_sdk.fileio import atomic_write

__all__ = ["UNUSED_DAYS", "mapped_rows", "prune_unused", "shard_path"]

#: Shard files not used for this long are removed when a new one is written.
UNUSED_DAYS = 3.0


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


def mapped_rows(source: np.ndarray, idx: np.ndarray, *, prune: bool = True) -> np.ndarray:
    """``source[idx]`` as a read-only memory map of a file of its own (written on first use, then
    the folder pruned unless ``prune`` is false: a caller cutting many calls :func:`prune_unused`
    once after them); a plain copy when ``source`` is not mapped from a file."""
    idx = np.asarray(idx)
    path = shard_path(source, idx) if isinstance(source, np.memmap) else None
    if path is None:
        return np.asarray(source[idx])
    try:
        os.utime(path)  # used now: kept by the pruning below
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(source[idx]))
        atomic_write(path, buf.getbuffer(), durable=False)
        if prune:
            prune_unused(path.parent)
    return np.load(path, mmap_mode="r")


def prune_unused(folder: Path, unused_days: float = UNUSED_DAYS) -> None:
    """Remove the shard files of ``folder`` no run used for ``unused_days`` (a run mapping one keeps its pages)."""
    unused_since = time.time() - unused_days * 86400
    for old in Path(folder).glob("*.npy"):
        with contextlib.suppress(FileNotFoundError):  # another worker pruned it first
            if old.stat().st_mtime < unused_since:
                old.unlink()
