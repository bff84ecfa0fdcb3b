"""The loaders of the research datasets and their entries in the dataset table
(:mod:`edge_sdk.data.registry`): scikit-learn's digits (always there), the synthetic sets, and the
papers' datasets read from the data root (FEMNIST, MNIST, CIFAR-10, MovieLens).

numpy only at import time: Pillow is imported inside the loader that needs it, and the digits are read
from the CSV inside scikit-learn without importing it, so a device that trains on its own data never
pays for them.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np

from edge_sdk.data.registry import Dataset, DatasetUnavailable, locate_dataset, register_dataset, require, save_npy

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
# Per-channel mean and standard deviation of the CIFAR-10 training images (the usual constants).
CIFAR10_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR10_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)

_DIGITS_SEED = 0
_DIGITS_TEST_FRACTION = 0.2
_MOVIELENS_TEST_FRACTION = 0.2
_SHUFFLE_SEED = 0


# -- digits ----------------------------------------------------------------------------------
@register_dataset("digits", package_file="sklearn/datasets/data/digits.csv.gz", needs="scikit-learn",
                  description="scikit-learn's 8x8 digits: 1,797 images, 10 classes (the demo's)")
def _digits(csv_file: Path, split: str) -> Dataset:
    """scikit-learn's bundled 8x8 digits: 1,797 samples, pixels 0..16 scaled to [0, 1].

    The CSV that ships inside scikit-learn is read directly: importing scikit-learn would cost a
    device process about 80 MiB of memory for nothing.
    """
    raw = np.loadtxt(csv_file, delimiter=",", dtype=np.float64)
    x = (raw[:, :-1] / 16.0).astype(np.float32)
    y = raw[:, -1].astype(np.int64)
    order = np.random.default_rng(_DIGITS_SEED).permutation(len(y))
    n_test = int(round(len(y) * _DIGITS_TEST_FRACTION))
    idx = np.sort(order[:n_test] if split == "test" else order[n_test:])
    return Dataset(x=x[idx], y=y[idx], num_classes=10, name="digits")


# -- FEMNIST ---------------------------------------------------------------------------------
@register_dataset("femnist", path="femnist_leaf_flic", groups="writer",
                  description="FEMNIST (LEAF): 28x28 handwritten characters, 62 classes, one client per writer")
def _femnist(base: Path, split: str) -> Dataset:
    """LEAF FEMNIST shards (``femnist_leaf_flic/{train,test}/*.json.gz``).

    Only writers present in both splits are kept, so a writer's ``groups`` index is the same in
    train and test (index into the sorted writer ids, listed in ``info["writers"]``).
    """
    shards = {s: sorted(require(base / s, "femnist").glob("*.json.gz")) for s in ("train", "test")}
    for s, files in shards.items():
        if not files:
            raise DatasetUnavailable(f"FEMNIST {s} split at {base / s} has no .json.gz shards")
    loaded = {s: [_read_leaf_shard(f) for f in files] for s, files in shards.items()}
    users = {s: {u for shard in loaded[s] for u in shard["users"]} for s in loaded}
    writers = sorted(users["train"] & users["test"])
    index = {w: i for i, w in enumerate(writers)}
    xs, ys, gs = [], [], []
    for shard in loaded[split]:
        for user in shard["users"]:
            if user not in index:
                continue
            data = shard["user_data"][user]
            xs.append(np.asarray(data["x"], dtype=np.float32).reshape(-1, 1, 28, 28))
            ys.append(np.asarray(data["y"], dtype=np.int64))
            gs.append(np.full(len(data["y"]), index[user], dtype=np.int64))
    return Dataset(
        x=np.concatenate(xs),
        y=np.concatenate(ys),
        num_classes=62,
        name="femnist",
        groups=np.concatenate(gs),
        info={"writers": tuple(writers)},
    )


# MNIST's idx files; the staged training images are rebuilt from PNG copies (datasets README).
_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.approx-from-png.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


@register_dataset("mnist", path="mnist", description="MNIST: 28x28 handwritten digits, flattened to 784 features")
def _mnist(base: Path, split: str) -> Dataset:
    """MNIST (``mnist/*.gz``, idx format): x is (N, 784) float32 in [0, 1], flattened row by row as
    the FedALIGN and VaRSeL papers' logistic and 2NN models take it; y the digit (0..9)."""
    images, labels = (_read_idx(require(base / f, "mnist")) for f in _MNIST_FILES[split])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"MNIST {split}: images {images.shape} and labels {labels.shape} do not match")
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return Dataset(x=x, y=labels.astype(np.int64), num_classes=10, name="mnist")


def _read_idx(path: Path) -> np.ndarray:
    """One gzipped idx file (unsigned bytes): magic 0x0000 08 <ndim>, big-endian sizes, the data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data for dimensions {dims}")
    return data.reshape(dims)


def _read_leaf_shard(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        shard = json.load(f)
    if not {"users", "user_data"} <= set(shard):
        raise ValueError(f"{path} is not a LEAF shard (keys {sorted(shard)})")
    return shard


# -- CIFAR-10 --------------------------------------------------------------------------------
@register_dataset("cifar10", path="cifar10_jpg", needs="pillow", subsets=True,
                  description="CIFAR-10: 32x32 colour images, 10 classes")
def _cifar10(folder: Path, split: str, *, limit: int | None, cache: Path) -> Dataset:
    """CIFAR-10 JPEGs in ``cifar10_jpg/cifar10_jpg.tar.gz``, decoded once and cached as .npy.

    Images are (N, 3, 32, 32) float32 normalised per channel; the cache holds the uint8 pixels.
    """
    archive = require(folder / "cifar10_jpg.tar.gz", "cifar10")
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = cache / f"cifar10-{key}-{split}-{'all' if limit is None else limit}"
    x_path, y_path = stem.with_suffix(".x.npy"), stem.with_suffix(".y.npy")
    if x_path.is_file() and y_path.is_file():
        pixels, labels = np.load(x_path), np.load(y_path)
    else:
        pixels, labels = _decode_cifar10(archive, split, limit)
        cache.mkdir(parents=True, exist_ok=True)
        save_npy(x_path, pixels)
        save_npy(y_path, labels)
    x = (pixels.astype(np.float32) / 255.0 - CIFAR10_MEAN[:, None, None]) / CIFAR10_STD[:, None, None]
    return Dataset(x=x, y=labels, num_classes=10, name="cifar10", info={"classes": CIFAR10_CLASSES})


def _decode_cifar10(archive: Path, split: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image  # only this loader needs Pillow

    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) >= 3 and parts[-3] == split and parts[-1].lower().endswith(".jpg"):
                if parts[-2] not in CIFAR10_CLASSES:
                    raise ValueError(f"{archive}: unexpected class folder {parts[-2]!r} in {member.name}")
                members.append(member)
        if not members:
            raise DatasetUnavailable(f"{archive} holds no {split}/<class>/*.jpg images")
        members.sort(key=lambda m: m.name)
        if limit is not None and limit < len(members):
            members = _balanced(members, limit)
        members.sort(key=lambda m: m.offset_data)  # read forward through the gzip stream once
        pixels = np.empty((len(members), 3, 32, 32), dtype=np.uint8)
        labels = np.empty(len(members), dtype=np.int64)
        for i, member in enumerate(members):
            f = tar.extractfile(member)
            assert f is not None
            with Image.open(f) as image:
                array = np.asarray(image.convert("RGB"), dtype=np.uint8)
            if array.shape != (32, 32, 3):
                raise ValueError(f"{member.name}: expected a 32x32 RGB image, got {array.shape}")
            pixels[i] = array.transpose(2, 0, 1)
            labels[i] = CIFAR10_CLASSES.index(member.name.split("/")[-2])
    order = np.random.default_rng(_SHUFFLE_SEED).permutation(len(labels))  # classes interleaved
    return pixels[order], labels[order]


def _balanced(members: list[tarfile.TarInfo], limit: int) -> list[tarfile.TarInfo]:
    """The first files of each class in name order, as equal per class as ``limit`` allows."""
    by_class: dict[str, list[tarfile.TarInfo]] = {}
    for m in members:
        by_class.setdefault(m.name.split("/")[-2], []).append(m)
    chosen: list[tarfile.TarInfo] = []
    depth = 0
    while len(chosen) < limit:
        for cls in CIFAR10_CLASSES:
            files = by_class.get(cls, [])
            if depth < len(files) and len(chosen) < limit:
                chosen.append(files[depth])
        depth += 1
    return chosen


# -- MovieLens -------------------------------------------------------------------------------
@register_dataset("movielens", path="movielens_latest_small", groups="user",
                  description="MovieLens latest-small: (user, movie) -> rating, one client per user")
def _movielens(base: Path, split: str) -> Dataset:
    """MovieLens latest-small ratings: x = (user index, item index), y = rating, groups = user.

    Users are indexed by sorted userId; items by sorted movieId over ``movies.csv`` (every movie,
    rated or not) when present, else over the rated movies. Each user's most recent 20% of
    ratings (at least one) form the test split, so every user appears in both splits.
    """
    ratings = require(base / "ratings.csv", "movielens")
    table = np.loadtxt(ratings, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    if table.shape[1] != 4:
        raise ValueError(f"{ratings}: expected userId,movieId,rating,timestamp columns, got {table.shape[1]}")
    user_ids = table[:, 0].astype(np.int64)
    movie_ids = table[:, 1].astype(np.int64)
    rating = table[:, 2].astype(np.float32)
    timestamp = table[:, 3].astype(np.int64)
    movies = base / "movies.csv"
    if movies.is_file():
        with open(movies, newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            next(rows)
            catalogue = np.unique(np.array([int(row[0]) for row in rows], dtype=np.int64))
        catalogue = np.union1d(catalogue, movie_ids)
    else:
        catalogue = np.unique(movie_ids)
    users = np.unique(user_ids)
    user_index = np.searchsorted(users, user_ids)
    item_index = np.searchsorted(catalogue, movie_ids)
    # Per-user temporal hold-out: rank each rating within its user by (timestamp, movieId).
    order = np.lexsort((movie_ids, timestamp, user_index))
    counts = np.bincount(user_index, minlength=len(users))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.repeat(starts, counts)
    n_test = np.maximum(1, np.round(counts * _MOVIELENS_TEST_FRACTION).astype(np.int64))
    is_test = rank >= (counts - n_test)[user_index]
    keep = np.flatnonzero(is_test if split == "test" else ~is_test)
    return Dataset(
        x=np.stack([user_index[keep], item_index[keep]], axis=1),
        y=rating[keep],
        num_classes=0,
        name="movielens",
        groups=user_index[keep],
        info={"num_users": int(len(users)), "num_items": int(len(catalogue))},
    )


MOVIELENS_ACTIVITY_GROUPS = 7  # in place of the paper's 7 age groups
MOVIELENS_TASTE_GROUPS = 2  # in place of its 2 genders
MOVIELENS_LR_COLUMNS: tuple[str, ...] = ("activity", "taste", "item", "activity_item", "taste_item")


def _quantile_groups(values: np.ndarray, groups: int) -> np.ndarray:
    edges = np.quantile(values, np.linspace(0, 1, groups + 1)[1:-1])
    return np.searchsorted(edges, values, side="right")


@register_dataset("movielens_lr", path="movielens_latest_small", groups="user",
                  description="MovieLens latest-small as the FedSubAvg paper's one-hot rating classification")
def _movielens_lr(base: Path, split: str) -> Dataset:
    """MovieLens rating classification with the hot-and-cold FedSubAvg paper's feature structure.

    The paper (Section 5.1) one-hot encodes gender, age, movie, gender x movie and age x movie into a
    logistic regression, and labels ratings 4-5 positive. latest-small has no gender or age, so two
    per-user features of the same cardinality stand in for them, each computed from the user's own
    training ratings only (what the user's device knows): ``activity``, the user's number of
    training ratings in 7 quantile groups, and ``taste``, whether the user's share of positive
    training ratings is above the median. x = one row index per column of
    ``MOVIELENS_LR_COLUMNS`` (each column indexes its own table; the crosses are
    ``group * num_items + item``); y = 1 for a rating >= 4; groups = user. The group features are
    hot (hundreds of devices involve each row), movies cold, the crosses colder.
    """
    train = _movielens(base, "train")
    users = int(train.info["num_users"])
    items = int(train.info["num_items"])
    counts = np.bincount(train.groups, minlength=users)
    positives = np.bincount(train.groups, weights=(train.y >= 4), minlength=users)
    active = counts > 0
    activity = np.zeros(users, np.int64)
    activity[active] = _quantile_groups(counts[active].astype(np.float64), MOVIELENS_ACTIVITY_GROUPS)
    share = np.where(active, positives / np.maximum(counts, 1), 0.0)
    taste = (share > np.median(share[active])).astype(np.int64)
    d = train if split == "train" else _movielens(base, split)
    u, m = d.x[:, 0].astype(np.int64), d.x[:, 1].astype(np.int64)
    x = np.stack([activity[u], taste[u], m, activity[u] * items + m, taste[u] * items + m], axis=1)
    return Dataset(x=x, y=(d.y >= 4).astype(np.float32), num_classes=2, name="movielens_lr", groups=d.groups,
                   info={**d.info, "columns": MOVIELENS_LR_COLUMNS,
                         "rows": (MOVIELENS_ACTIVITY_GROUPS, MOVIELENS_TASTE_GROUPS, items,
                                  MOVIELENS_ACTIVITY_GROUPS * items, MOVIELENS_TASTE_GROUPS * items)})


def movielens_genres(root: Path | str | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per item index of the ``movielens`` dataset (the same catalogue order), its genre indices from
    ``movies.csv``, padded with -1: shape ``(items, max genres)``; and the genre names.

    latest-small has no user gender, age or occupation, so the features of the rating classifier
    (FedSubAvg, bench/fedsubavg_movielens.py) are user id, movie id and these genres.
    """
    base = locate_dataset("movielens", root)
    assert base is not None
    movies = require(base / "movies.csv", "movielens")
    table = np.loadtxt(require(base / "ratings.csv", "movielens"), delimiter=",", skiprows=1,
                       dtype=np.float64, ndmin=2)
    with open(movies, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
    catalogue = np.union1d(np.unique(ids), table[:, 1].astype(np.int64))
    names = sorted({g for r in rows for g in r[2].split("|") if g and g != "(no genres listed)"})
    index = {g: i for i, g in enumerate(names)}
    per_item: list[list[int]] = [[] for _ in range(len(catalogue))]
    for movie_id, r in zip(ids, rows):
        per_item[int(np.searchsorted(catalogue, movie_id))] = [index[g] for g in r[2].split("|") if g in index]
    width = max(1, max(len(g) for g in per_item))
    out = np.full((len(catalogue), width), -1, dtype=np.int64)
    for i, g in enumerate(per_item):
        out[i, : len(g)] = g
    return out, tuple(names)


# -- synthetic -------------------------------------------------------------------------------
@register_dataset("synthetic", description="two Gaussian blobs in 4 dimensions (exact tests)")
def _synthetic(where: None, split: str) -> Dataset:
    """Two Gaussian blobs in 4 dimensions (400 train / 100 test): for exact tests of the tiny model."""
    rng = np.random.default_rng(1234 if split == "train" else 4321)
    n = 400 if split == "train" else 100
    y = rng.integers(0, 2, size=n).astype(np.int64)
    centres = np.array([[-1.0, 0.5, 0.0, 1.0], [1.0, -0.5, 0.5, -1.0]], dtype=np.float32)
    x = (centres[y] + rng.normal(0.0, 0.8, size=(n, 4))).astype(np.float32)
    return Dataset(x, y, 2, "synthetic")


@register_dataset("synthetic_ratings", groups="user",
                  description="MovieLens-shaped ratings of 40 users (sparse-submodel tests)")
def _synthetic_ratings(where: None, split: str) -> Dataset:
    """MovieLens-shaped ratings made up on the spot (nothing to download): 40 users each rating 30
    of 9,742 items, rating = 3 + <u, v> from rank-4 latent factors, clipped to [0.5, 5]. Indexes the
    recommender's tables exactly as MovieLens latest-small does; each user's last 6 ratings are
    the test split. For tests of sparse submodels, which need few rows of a large table per device."""
    rng = np.random.default_rng(2024)
    users, items, per_user, test_per_user = 40, 9_742, 30, 6
    u = rng.normal(0, 0.7, size=(users, 4))
    v = rng.normal(0, 0.7, size=(items, 4))
    pairs = np.stack([np.repeat(np.arange(users), per_user),
                      np.concatenate([rng.choice(items, per_user, replace=False) for _ in range(users)])], axis=1)
    rating = np.clip(3 + np.einsum("ij,ij->i", u[pairs[:, 0]], v[pairs[:, 1]]), 0.5, 5.0).astype(np.float32)
    is_test = np.tile(np.arange(per_user) >= per_user - test_per_user, users)
    keep = np.flatnonzero(is_test if split == "test" else ~is_test)
    return Dataset(pairs[keep].astype(np.int64), rating[keep], 0, "synthetic_ratings", groups=pairs[keep, 0],
                   info={"num_users": users, "num_items": items})
