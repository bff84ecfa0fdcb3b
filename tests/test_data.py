"""Datasets and partitions: shapes and counts of the real data, coverage, skew, determinism."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.data import DatasetUnavailable, data_root, load_dataset, parse_partition, partition
from tests.shared_data import REPO, need



# -- partition -------------------------------------------------------------------------------
def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts) if parts else np.array([], np.int64)
    assert len(joined) == n
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 400),
    classes=st.integers(1, 12),
    clients=st.integers(1, 30),
    scheme=st.sampled_from(["iid", "dirichlet", "natural"]),
    alpha=st.floats(0.01, 100),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_every_index_goes_to_exactly_one_client(n, classes, clients, scheme, alpha, seed, data):
    labels = np.random.default_rng(seed).integers(0, classes, n)
    if scheme == "natural":
        labels = np.random.default_rng(seed).integers(0, max(clients, n // 3) + 1, n)  # group ids
        if len(np.unique(labels)) < clients:
            with pytest.raises(ValueError, match="groups for"):
                partition(labels, clients, scheme, seed=seed)
            return
    elif n < clients:
        with pytest.raises(ValueError, match="cannot give"):
            partition(labels, clients, scheme, alpha=alpha, seed=seed)
        return
    min_size = data.draw(st.integers(1, max(1, n // clients))) if scheme != "natural" else 1
    parts = partition(labels, clients, scheme, alpha=alpha, seed=seed, min_size=min_size)
    assert len(parts) == clients
    assert_exact_cover(parts, n)
    assert all(p.dtype.kind == "i" and np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    assert min(len(p) for p in parts) >= min_size
    if scheme == "iid":
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    if scheme == "natural":  # groups stay whole: no group id appears in two clients
        owners = [set(labels[p].tolist()) for p in parts]
        assert sum(len(o) for o in owners) == len(set().union(*owners))


def label_entropy(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    values = []
    for p in parts:
        freq = np.bincount(labels[p], minlength=classes) / len(p)
        freq = freq[freq > 0]
        values.append(float(-(freq * np.log(freq)).sum()))
    return float(np.mean(values))


def test_small_alpha_skews_labels():
    labels = np.random.default_rng(0).integers(0, 10, 5000)
    iid = label_entropy(labels, partition(labels, 50, "iid"), 10)
    skewed = label_entropy(labels, partition(labels, 50, "dirichlet", alpha=0.1), 10)
    mild = label_entropy(labels, partition(labels, 50, "dirichlet", alpha=100.0), 10)
    assert iid > 0.95 * np.log(10)  # near uniform
    assert skewed < 0.5 * iid  # alpha 0.1: a client sees few classes
    assert skewed < mild  # larger alpha approaches IID
    assert mild > 0.9 * iid


def test_dirichlet_repairs_clients_below_min_size():
    labels = np.zeros(200, np.int64)  # one class, tiny alpha: most clients would get nothing
    parts = partition(labels, 20, "dirichlet", alpha=0.01, min_size=5, seed=3)
    assert min(len(p) for p in parts) >= 5
    assert_exact_cover(parts, 200)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "natural"])
def test_partitions_are_deterministic_given_the_seed(scheme):
    labels = np.random.default_rng(1).integers(0, 40, 1000)
    a = partition(labels, 8, scheme, alpha=0.3, seed=7)
    b = partition(labels, 8, scheme, alpha=0.3, seed=7)
    c = partition(labels, 8, scheme, alpha=0.3, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_natural_keeps_groups_whole_and_can_take_two_per_client():
    groups = np.repeat(np.arange(30), np.arange(1, 31))  # 30 writers of different sizes
    parts = partition(groups, 15, "natural", groups_per_client=2, seed=0)
    assert [len(np.unique(groups[p])) for p in parts] == [2] * 15
    for p in parts:  # every sample of each chosen group
        for g in np.unique(groups[p]):
            assert np.sum(groups[p] == g) == np.sum(groups == g)
    spread = partition(groups, 7, "natural")
    assert sorted(len(np.unique(groups[p])) for p in spread) == [4, 4, 4, 4, 4, 5, 5]
    with pytest.raises(ValueError, match="30 groups for 31 clients"):
        partition(groups, 31, "natural")
    with pytest.raises(ValueError, match="needs 32 groups, there are 30"):
        partition(groups, 16, "natural", groups_per_client=2)


def test_bad_partition_arguments():
    labels = np.arange(10)
    with pytest.raises(ValueError, match="unknown partition scheme 'random'"):
        partition(labels, 2, "random")
    with pytest.raises(ValueError, match="alpha must be positive"):
        partition(labels, 2, "dirichlet", alpha=0)
    with pytest.raises(ValueError, match="num_clients"):
        partition(labels, 0, "iid")
    with pytest.raises(ValueError, match="one-dimensional"):
        partition(labels.reshape(2, 5), 2, "iid")


def test_parse_partition():
    assert parse_partition("dirichlet:0.3") == ("dirichlet", 0.3)
    assert parse_partition("dirichlet") == ("dirichlet", 0.5)
    assert parse_partition("IID") == ("iid", 0.5)
    assert parse_partition("natural", default_alpha=0.1) == ("natural", 0.1)
    for bad, fragment in [
        ("dirichlet:x", "must be a number"),
        ("dirichlet:-1", "positive"),
        ("iid:3", "takes no parameter"),
        ("shards", "unknown partition scheme"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            parse_partition(bad)


# -- datasets --------------------------------------------------------------------------------
def test_digits_loads_with_a_fixed_split():
    train = load_dataset("digits")
    test = load_dataset("digits", split="test")
    assert train.x.shape == (1438, 64) and test.x.shape == (359, 64)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert 0.0 <= train.x.min() and train.x.max() <= 1.0 and train.x.max() == 1.0
    assert train.num_classes == 10 and set(np.unique(train.y)) == set(range(10))
    again = load_dataset("digits")
    np.testing.assert_array_equal(train.x, again.x)  # the split is seeded
    rows = {r.tobytes() for r in train.x}
    assert sum(r.tobytes() in rows for r in test.x) < 5  # disjoint but for duplicate images
    small = load_dataset("digits", limit=100)
    assert len(small) == 100 and np.array_equal(small.x, train.x[:100])


def test_importing_the_data_package_stays_lean():
    code = (
        "import sys, edge_sdk.data\n"
        "bad = [m for m in ('torch', 'onnx', 'sklearn', 'PIL') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_unknown_and_missing_datasets_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="unknown split"):
        load_dataset("digits", split="validation")
    for name in ("femnist", "cifar10", "movielens"):
        with pytest.raises(DatasetUnavailable, match="nothing is downloaded"):
            load_dataset(name, root=tmp_path)
    assert data_root(tmp_path) == tmp_path


@pytest.mark.slow
def test_femnist_counts_match_the_readme():
    root = need("femnist_leaf_flic")
    train = load_dataset("femnist", root=root)
    test = load_dataset("femnist", root=root, split="test")
    # README: 110 writers with both train and test: 14,697 train / 1,695 test; 62 classes
    assert train.x.shape == (14_697, 1, 28, 28) and test.x.shape == (1_695, 1, 28, 28)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert len(train.info["writers"]) == 110 and train.info["writers"] == test.info["writers"]
    assert len(np.unique(train.groups)) == 110 and len(np.unique(test.groups)) == 110
    assert train.num_classes == 62 and 0 <= train.y.min() and train.y.max() <= 61
    assert 0.0 <= train.x.min() and train.x.max() <= 1.0
    parts = partition(train.groups, 55, "natural", groups_per_client=2)  # the paper: 2 writers each
    assert_exact_cover(parts, len(train))


def test_mnist_test_split_matches_the_readme(tmp_path):
    root = need("mnist")
    test = load_dataset("mnist", root=root, split="test")
    # README: 10,000 test images; the first labels of MNIST's t10k file are 7 2 1 0 4.
    assert test.x.shape == (10_000, 784) and test.x.dtype == np.float32 and test.y.dtype == np.int64
    assert test.y[:5].tolist() == [7, 2, 1, 0, 4] and np.bincount(test.y).tolist()[:2] == [980, 1135]
    assert 0.0 == test.x.min() and test.x.max() == 1.0
    # A file that is not idx is refused with its name.
    bad = tmp_path / "mnist"
    bad.mkdir()
    import gzip

    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        with gzip.open(bad / name, "wb") as f:
            f.write(b"not an idx file")
    with pytest.raises(ValueError, match="not an idx file"):
        load_dataset("mnist", root=tmp_path, split="test")


def test_movielens_counts_match_the_readme():
    root = need("movielens_latest_small")
    train = load_dataset("movielens", root=root)
    test = load_dataset("movielens", root=root, split="test")
    assert len(train) + len(test) == 100_836
    assert train.info == {"num_users": 610, "num_items": 9_742}
    assert train.x.dtype == np.int64 and train.x.shape[1] == 2 and train.y.dtype == np.float32
    assert len(np.unique(train.groups)) == 610 and len(np.unique(test.groups)) == 610
    assert train.x[:, 0].max() == 609 and train.x[:, 1].max() < 9_742
    np.testing.assert_array_equal(train.groups, train.x[:, 0])
    assert set(np.unique(train.y)) <= {0.5 * k for k in range(1, 11)}
    assert 0.19 < len(test) / 100_836 < 0.21


def test_movielens_lr_features_come_from_the_users_own_training_ratings():
    """The FedSubAvg paper's feature structure: per-user group features (from training ratings only),
    the movie, and their crosses; hot group rows, cold movie rows."""
    root = need("movielens_latest_small")
    ratings = load_dataset("movielens", root=root)
    train = load_dataset("movielens_lr", root=root)
    test = load_dataset("movielens_lr", root=root, split="test")
    items = ratings.info["num_items"]
    assert train.x.shape == (len(ratings), 5) and train.info["rows"] == (7, 2, items, 7 * items, 2 * items)
    np.testing.assert_array_equal(train.y, (ratings.y >= 4).astype(np.float32))
    np.testing.assert_array_equal(train.x[:, 2], ratings.x[:, 1])
    np.testing.assert_array_equal(train.x[:, 3], train.x[:, 0] * items + train.x[:, 2])
    np.testing.assert_array_equal(train.x[:, 4], train.x[:, 1] * items + train.x[:, 2])
    for d in (train, test):
        for column in (0, 1):  # one group per user, the same in both splits
            per_user = {(int(u), int(g)) for u, g in zip(d.groups, d.x[:, column])}
            assert len(per_user) == len({u for u, _ in per_user})
    by_user = dict(zip(train.groups.tolist(), train.x[:, 0].tolist()))
    assert all(by_user[int(u)] == int(g) for u, g in zip(test.groups, test.x[:, 0]))
    # activity follows the number of training ratings: more ratings, never a lower group
    counts = np.bincount(train.groups)
    order = np.argsort(counts, kind="stable")
    groups = np.array([by_user[int(u)] for u in order])
    assert np.all(np.diff(groups) >= 0) and set(groups.tolist()) == set(range(7))
    # heat: every group row is involved by dozens of users, most movies by few
    users_per_item = np.bincount(np.unique(np.stack([train.groups, train.x[:, 2]], 1), axis=0)[:, 1], minlength=items)
    users_per_group = np.bincount(np.unique(np.stack([train.groups, train.x[:, 0]], 1), axis=0)[:, 1])
    assert users_per_group.min() > 50 and np.median(users_per_item[users_per_item > 0]) < 5


def test_cifar10_decodes_a_balanced_subset_and_caches_it(tmp_path):
    root = need("cifar10_jpg")
    first = load_dataset("cifar10", root=root, split="test", limit=200, cache_dir=tmp_path)
    assert first.x.shape == (200, 3, 32, 32) and first.x.dtype == np.float32
    assert np.bincount(first.y, minlength=10).tolist() == [20] * 10
    assert abs(float(first.x.mean())) < 0.5 and 0.5 < float(first.x.std()) < 1.5  # normalised
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert len(cached) == 2 and all(name.endswith(".npy") for name in cached)
    again = load_dataset("cifar10", root=root, split="test", limit=200, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.x, again.x)
    np.testing.assert_array_equal(first.y, again.y)


def test_memory_mapped_copy_equals_the_parsed_dataset(tmp_path) -> None:
    """What devices load (mmap=True) is the same data, mapped from a cache written once."""
    for name in ("digits", "synthetic"):
        parsed = load_dataset(name, split="train")
        first = load_dataset(name, split="train", mmap=True, cache_dir=tmp_path)
        again = load_dataset(name, split="train", mmap=True, cache_dir=tmp_path)
        for d in (first, again):
            assert isinstance(d.x, np.memmap) and isinstance(d.y, np.memmap)
            np.testing.assert_array_equal(d.x, parsed.x)
            np.testing.assert_array_equal(d.y, parsed.y)
            assert (d.num_classes, d.name) == (parsed.num_classes, parsed.name)
    limited = load_dataset("digits", split="train", limit=100, mmap=True, cache_dir=tmp_path)
    assert len(limited) == 100
    assert len(list(tmp_path.glob("*.json"))) == 3  # one cache entry per (dataset, split, limit)
