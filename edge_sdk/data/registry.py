"""The research datasets in one table, and the one way to load them (:func:`load_dataset`).

Each entry (:class:`DatasetSpec`) names the dataset, its loader, its natural clients (a FEMNIST
writer, a Tiny Shakespeare speaking role, a Fed-TCGA-BRCA region, a MovieLens user: what
``partition(..., "natural")`` splits by), where its files are and what it needs installed. A loader
registers itself with :func:`register_dataset` beside its code, as torchvision registers its models,
and ``edge_sdk.data`` imports every loader module, so the table is complete whenever it is read.
Adding a dataset is one entry plus its loader; nothing else (the device's ``--data``, fleet files,
the server's evaluation data) names datasets.

The data root is a setting, never guessed: ``root=`` (a device's ``--data-root`` or ``data-root``,
``ServerConfig.data_root``, a fleet's ``data_root``, ``edgetrain emulate --data-root``), else
``$EDGETRAIN_DATA``. Datasets that ship with a package (scikit-learn's digits) or are made on the spot
(``synthetic``) need none. Nothing is downloaded: absent files raise :class:`DatasetUnavailable`,
one line naming the dataset, the folder looked for and the setting.

numpy only: a loader imports what else it needs (Pillow) when it runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge_sdk.fileio import atomic_write

__all__ = ["CACHE_ENV", "DATA_ENV", "DATASETS", "SPLITS", "Dataset", "DatasetSpec", "DatasetUnavailable",
           "cache_root", "data_root", "dataset_spec", "load_dataset", "locate_dataset", "register_dataset", "require"]

SPLITS: tuple[str, ...] = ("train", "test")
DATA_ENV = "EDGETRAIN_DATA"
CACHE_ENV = "EDGETRAIN_CACHE"
#: How a person sets the data root, for error messages: every front end's spelling.
ROOT_SETTINGS = (f"--data-root DIR (data-root in a device's settings, data_root in a server's config or a fleet's "
                 f"[fleet] table) or ${DATA_ENV}")


class DatasetUnavailable(FileNotFoundError):
    """The dataset's files are not on this machine (nothing is downloaded at run time)."""


@dataclass(frozen=True)
class Dataset:
    """Samples ``x`` with targets ``y``.

    ``groups`` is each sample's natural client (a FEMNIST writer, a MovieLens user) when the data
    has one, for ``partition(..., "natural")``. ``num_classes`` is 0 for targets that are not classes
    (a rating, a survival time). ``info`` carries loader-specific facts (MovieLens ``num_users``/``num_items``,
    FEMNIST ``writers``).
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str
    groups: np.ndarray | None = None
    info: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} samples but {len(self.y)} targets")
        if self.groups is not None and len(self.groups) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.y)} samples but {len(self.groups)} group ids")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray) -> Dataset:
        """The samples at ``indices`` (one client's share after :func:`partition`)."""
        indices = np.asarray(indices)
        return Dataset(
            x=self.x[indices],
            y=self.y[indices],
            num_classes=self.num_classes,
            name=self.name,
            groups=None if self.groups is None else self.groups[indices],
            info=self.info,
        )


#: ``loader(where, split)``: ``where`` is the dataset's folder under the data root, its file inside
#: an installed package, or None for a dataset made on the spot. With ``subsets`` it also takes
#: ``limit=`` and ``cache=`` (CIFAR-10 decodes only the images asked for, and caches them).
Loader = Callable[..., Dataset]


@dataclass(frozen=True)
class DatasetSpec:
    """One entry of the table.

    ``path``: the dataset's folder under the data root ("" when it needs no root). ``package_file``:
    instead, a file inside an installed package, ``package/relative/path`` (found without importing
    the package). ``groups``: its natural client in words ("" when it has none). ``needs``: the pip
    package its loader or its file comes with ("" when the core install has it)."""

    name: str
    loader: Loader
    description: str
    path: str = ""
    package_file: str = ""
    groups: str = ""
    needs: str = ""
    subsets: bool = False

    def where(self, root: Path | str | None = None) -> Path | None:
        """The dataset's folder (or file), checked present; None for a generated dataset.
        Raises :class:`DatasetUnavailable` naming the dataset, the place looked at and the setting."""
        if self.package_file:
            return self._in_package()
        if not self.path:
            return None
        base, source = _root(root)
        if base is None:
            raise DatasetUnavailable(
                f"dataset {self.name!r} reads {self.path}/ under the data root, and no data root is set: give "
                f"{ROOT_SETTINGS}; nothing is downloaded")
        folder = base / self.path
        if not folder.exists():
            raise DatasetUnavailable(
                f"dataset {self.name!r}: {folder} is absent (data root {base}{source}); point {ROOT_SETTINGS} at the "
                f"folder that holds {self.path}/; nothing is downloaded")
        return folder

    def _in_package(self) -> Path:
        package, _, inside = self.package_file.partition("/")
        spec = importlib.util.find_spec(package)  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise DatasetUnavailable(f"dataset {self.name!r} ships with {self.needs or package}: "
                                     f"pip install {self.needs or package}")
        return require(Path(list(spec.submodule_search_locations)[0]) / inside, self.name)


#: Every dataset by name, in registration order (``edge_sdk.data`` imports every loader module).
DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(name: str, *, description: str, path: str = "", package_file: str = "", groups: str = "",
                     needs: str = "", subsets: bool = False) -> Callable[[Loader], Loader]:
    """Decorator: the function below is the loader of dataset ``name`` (see :class:`DatasetSpec`)."""

    def add(loader: Loader) -> Loader:
        if name in DATASETS:
            raise ValueError(f"dataset {name!r} is registered twice")
        DATASETS[name] = DatasetSpec(name, loader, description, path, package_file, groups, needs, subsets)
        return loader

    return add


def dataset_spec(name: str) -> DatasetSpec:
    """The entry of dataset ``name``; ValueError naming the known ones."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


def locate_dataset(name: str, root: Path | str | None = None) -> Path | None:
    """Where dataset ``name``'s files are (:meth:`DatasetSpec.where`): checks it can load before a run starts."""
    return dataset_spec(name).where(root)


def data_root(root: Path | str | None = None) -> Path | None:
    """The data root: ``root`` if given, else ``$EDGETRAIN_DATA``, else None (none set)."""
    return _root(root)[0]


def _root(root: Path | str | None) -> tuple[Path | None, str]:
    if root is not None and str(root):
        return Path(root), ""
    env = os.environ.get(DATA_ENV)
    return (Path(env), f", from ${DATA_ENV}") if env else (None, "")


def require(path: Path, name: str) -> Path:
    """``path``, a file or folder a loader of dataset ``name`` reads; DatasetUnavailable if absent."""
    if not path.exists():
        raise DatasetUnavailable(f"dataset {name!r}: {path} is absent (see the datasets folder's README); "
                                 "nothing is downloaded")
    return path


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """Where decoded arrays are cached: ``cache_dir``, ``$EDGETRAIN_CACHE``, or ``~/.cache/edgetrain``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "edgetrain"


def load_dataset(
    name: str,
    *,
    root: Path | str | None = None,
    split: str = "train",
    limit: int | None = None,
    cache_dir: Path | str | None = None,
    mmap: bool = False,
) -> Dataset:
    """Load ``split`` of dataset ``name`` (a key of :data:`DATASETS`) from the data root ``root``
    (default ``$EDGETRAIN_DATA``; see the module docstring).

    ``limit`` caps the number of samples: CIFAR-10 then decodes only a class-balanced subset
    (60,000 JPEGs take a while); other datasets keep their first ``limit`` samples.

    With ``mmap`` the arrays are memory-mapped from .npy files in the cache (written on first
    use): what a device does, since parsing a whole dataset (FEMNIST's JSON peaks near 700 MiB)
    costs more than a small device's budget, while from a map it copies only its own shard.
    """
    spec = dataset_spec(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    where = spec.where(root)
    if mmap:
        return _mapped(spec, where, split, limit, cache_root(cache_dir))
    return _load(spec, where, split, limit, cache_root(cache_dir))


def _load(spec: DatasetSpec, where: Path | None, split: str, limit: int | None, cache: Path) -> Dataset:
    try:
        data = spec.loader(where, split, limit=limit, cache=cache) if spec.subsets else spec.loader(where, split)
    except ImportError as e:
        if not spec.needs:
            raise
        raise DatasetUnavailable(f"dataset {spec.name!r} needs {spec.needs}: pip install {spec.needs} ({e})") from None
    return data if limit is None or limit >= len(data) else data.subset(np.arange(limit))


def _source_key(where: Path | None) -> str:
    """Identity of a dataset's source files (path, size, modification time), for cache names."""
    if where is None:
        return "builtin"
    files = sorted(p for p in where.rglob("*") if p.is_file()) if where.is_dir() else [where]
    ident = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _mapped(spec: DatasetSpec, where: Path | None, split: str, limit: int | None, cache: Path) -> Dataset:
    stem = cache / f"{spec.name}-{_source_key(where)}-{split}-{'all' if limit is None else limit}"
    meta_path = stem.with_suffix(".json")
    if not meta_path.is_file():
        data = _load(spec, where, split, limit, cache)
        cache.mkdir(parents=True, exist_ok=True)
        save_npy(stem.with_suffix(".x.npy"), np.ascontiguousarray(data.x))
        save_npy(stem.with_suffix(".y.npy"), np.ascontiguousarray(data.y))
        if data.groups is not None:
            save_npy(stem.with_suffix(".groups.npy"), np.ascontiguousarray(data.groups))
        meta = {"name": data.name, "num_classes": data.num_classes, "groups": data.groups is not None,
                "info": {k: list(v) if isinstance(v, tuple) else v for k, v in data.info.items()}}
        # Written last: its presence means the arrays are complete.
        atomic_write(meta_path, json.dumps(meta).encode(), durable=False)
    meta = json.loads(meta_path.read_text())
    return Dataset(
        x=np.load(stem.with_suffix(".x.npy"), mmap_mode="r"),
        y=np.load(stem.with_suffix(".y.npy"), mmap_mode="r"),
        num_classes=int(meta["num_classes"]),
        name=str(meta["name"]),
        groups=np.load(stem.with_suffix(".groups.npy"), mmap_mode="r") if meta["groups"] else None,
        info={k: tuple(v) if isinstance(v, list) else v for k, v in meta["info"].items()},
    )


def save_npy(path: Path, array: np.ndarray) -> None:
    """An array into the cache. Other device processes may map it at the same time; rebuilt if lost,
    so not fsynced."""
    atomic_write(path, writer=lambda f: np.save(f, array), durable=False)
