"""Memory-mapped shards of emulated devices (emulator.shards)."""

from __future__ import annotations

import os

import numpy as np

from emulator.shards import UNUSED_DAYS, mapped_rows, prune_unused, shard_path


def _source(tmp_path, values: np.ndarray) -> np.memmap:
    path = tmp_path / "data-train-all.x.npy"
    np.save(path, values)
    return np.load(path, mmap_mode="r")


def test_mapped_rows_match_a_copy_and_are_a_read_only_map(tmp_path):
    x = _source(tmp_path, np.arange(60, dtype=np.float32).reshape(20, 3))
    idx = np.array([7, 2, 19, 4])
    rows = mapped_rows(x, idx)
    assert isinstance(rows, np.memmap) and not rows.flags.writeable
    np.testing.assert_array_equal(rows, np.asarray(x)[idx])
    again = mapped_rows(x, idx)  # the same file, not a second one
    assert again.filename == rows.filename
    assert len(list((tmp_path / "shards").iterdir())) == 1


def test_other_rows_or_a_rewritten_dataset_get_their_own_shard(tmp_path):
    x = _source(tmp_path, np.zeros((10, 2), dtype=np.float32))
    first = mapped_rows(x, np.array([1, 2]))
    assert shard_path(x, np.array([2, 1])) != shard_path(x, np.array([1, 2]))
    # The dataset's cache is rebuilt with other values: a stale shard must not be served.
    path = tmp_path / "data-train-all.x.npy"
    np.save(path, np.ones((10, 2), dtype=np.float32))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    fresh = mapped_rows(np.load(path, mmap_mode="r"), np.array([1, 2]))
    np.testing.assert_array_equal(fresh, np.ones((2, 2), dtype=np.float32))
    np.testing.assert_array_equal(first, np.zeros((2, 2), dtype=np.float32))


def test_an_array_in_memory_is_copied(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = mapped_rows(x, np.array([5, 0]))
    assert not isinstance(rows, np.memmap)
    np.testing.assert_array_equal(rows, x[[5, 0]])


def test_shards_unused_for_days_are_removed_when_a_new_one_is_written(tmp_path):
    """The folder keeps recent runs' partitions, not every seed's ever tried: a shard nobody used
    for UNUSED_DAYS goes when a new one is written; one used since, even if written long ago, stays."""
    x = _source(tmp_path, np.arange(40, dtype=np.float32).reshape(20, 2))
    old, reused = mapped_rows(x, np.array([0, 1])), mapped_rows(x, np.array([2, 3]))
    long_ago = os.stat(old.filename).st_mtime - (UNUSED_DAYS + 1) * 86400
    for f in (old.filename, reused.filename):
        os.utime(f, (long_ago, long_ago))
    mapped_rows(x, np.array([2, 3]))  # used again today
    mapped_rows(x, np.array([4, 5]))  # a new shard: the folder is pruned
    left = {p.name for p in (tmp_path / "shards").iterdir()}
    assert os.path.basename(old.filename) not in left
    assert os.path.basename(reused.filename) in left and len(left) == 2
    np.testing.assert_array_equal(old, np.asarray(x)[[0, 1]])  # a map still held keeps its pages


def test_a_worker_cutting_many_shards_prunes_once_after_them(tmp_path):
    """mapped_rows(prune=False) leaves the folder as it is (a scan per shard made cutting N shards
    quadratic); prune_unused then removes what no run used for UNUSED_DAYS, and keeps the rest."""
    x = _source(tmp_path, np.arange(40, dtype=np.float32).reshape(20, 2))
    old = mapped_rows(x, np.array([0, 1]))
    long_ago = os.stat(old.filename).st_mtime - (UNUSED_DAYS + 1) * 86400
    os.utime(old.filename, (long_ago, long_ago))
    fresh = [mapped_rows(x, np.array([2 * i, 2 * i + 1]), prune=False) for i in range(1, 4)]
    assert os.path.basename(old.filename) in {p.name for p in (tmp_path / "shards").iterdir()}
    prune_unused(tmp_path / "shards")
    left = {p.name for p in (tmp_path / "shards").iterdir()}
    assert left == {os.path.basename(f.filename) for f in fresh}
