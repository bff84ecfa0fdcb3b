"""An app's own training data, handed to a device: arrays, batches, a folder of images, a table.

A device trains on what the app gives it, not on a research dataset the project splits up. Every
source answers the same four questions (:class:`DataSource`): the shape of one sample, how many
labels there are, how many samples, and the samples themselves in batches. A device takes any of
them (``DeviceClient(config, source)``) and keeps ``DeviceClient(config, x, y)`` for plain arrays.

- :class:`ArraySource`: numpy arrays already in memory (no copy).
- :class:`BatchSource`: an iterable of ``(x, y)`` batches, or a callable returning one (a generator
  function), for data read from elsewhere or arriving over time; read once per device run, into
  memory or, with ``spool_dir``, into a memory-mapped file so a large set never sits in RAM.
- :class:`ImageFolderSource`: ``root/<label>/*.png|jpg``, labels from the subfolder names (needs
  Pillow: ``pip install pillow``; the core install has no image decoder).
- :class:`TabularSource`: a ``.npz`` (arrays ``x`` and ``y``), a ``.npy`` or a ``.csv`` table whose
  label is one column.
- :class:`TextSource`: a UTF-8 ``.txt`` file of the device's own text, as next-character samples in
  a language model's vocabulary (a keyboard's typed text, a person's messages).

Only numpy is imported here; Pillow loads when an image folder is read.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "IMAGE_SUFFIXES",
    "TABLE_SUFFIXES",
    "VOCABULARIES",
    "ArraySource",
    "BatchSource",
    "DataSource",
    "DataSourceError",
    "ImageFolderSource",
    "TabularSource",
    "TextSource",
    "as_source",
    "vocabulary",
    "source_arrays",
]

#: Files an image folder reads (by suffix, case-insensitive).
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
#: Files a table is read from.
TABLE_SUFFIXES: tuple[str, ...] = (".npz", ".npy", ".csv")


class DataSourceError(ValueError):
    """The app's data cannot be read as asked: a missing file, a bad label column, mismatched shapes."""


@runtime_checkable
class DataSource(Protocol):
    """What a device needs to know about its local data, and the data itself in batches.

    ``input_shape`` is one sample's shape (without the batch axis), ``num_classes`` the number of
    labels (None for a regression target). ``batches`` yields ``(x, y)`` pairs whose first axes
    agree, ``batch_size`` samples each (the last may be shorter), covering every sample once."""

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    @property
    def num_classes(self) -> int | None: ...

    def __len__(self) -> int: ...

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...


def _array(a: object) -> np.ndarray:
    """``a`` as an array, a numpy array (a memory map too) as it is."""
    return a if isinstance(a, np.ndarray) else np.asarray(a)


def _label_count(y: np.ndarray) -> int | None:
    """Classes of integer labels 0..K-1 (K = largest + 1); None for float (regression) targets."""
    if y.dtype.kind not in "iu" or len(y) == 0:
        return None
    return int(y.max()) + 1


def _checked(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim < 1 or len(x) != len(y):
        raise DataSourceError(f"{what}: {len(x) if x.ndim else 0} samples but {len(y)} labels")
    if len(x) == 0:
        raise DataSourceError(f"{what} holds no samples")
    return x, y


class ArraySource:
    """Samples and labels already in memory (or memory-mapped): used as they are, never copied."""

    def __init__(self, x: np.ndarray, y: np.ndarray, *, num_classes: int | None = None) -> None:
        self.x, self.y = _checked(_array(x), _array(y), "the arrays")
        self._num_classes = num_classes if num_classes is not None else _label_count(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])

    @property
    def num_classes(self) -> int | None:
        return self._num_classes

    def __len__(self) -> int:
        return len(self.x)

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(0, len(self.x), max(1, batch_size)):
            yield self.x[i:i + batch_size], self.y[i:i + batch_size]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x, self.y


@dataclass
class _Spool:
    """Batches appended to one raw file, mapped back as a single array when complete."""

    directory: Path
    path: Path = field(init=False)
    rows: int = 0
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="samples-", suffix=".bin", dir=self.directory)
        os.close(fd)
        self.path = Path(name)

    def append(self, batch: np.ndarray) -> None:
        if self.shape is None:
            self.shape, self.dtype = batch.shape[1:], batch.dtype
        with open(self.path, "ab") as f:
            f.write(np.ascontiguousarray(batch, dtype=self.dtype).tobytes())
        self.rows += len(batch)

    def array(self) -> np.ndarray:
        assert self.shape is not None and self.dtype is not None
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.rows, *self.shape))


class BatchSource:
    """Batches from the app: an iterable of ``(x, y)`` pairs, or a callable that returns one.

    The batches are read once, when the device first asks (a callable is called then, so a
    device built for the next run sees what has arrived since). With ``spool_dir`` the samples go
    to a file there and are memory-mapped back, so a set larger than memory trains all the same;
    without, they are concatenated in memory."""

    def __init__(self, batches: Iterable[tuple[np.ndarray, np.ndarray]] | Callable[[], Iterable],
                 *, spool_dir: str | os.PathLike[str] | None = None, num_classes: int | None = None) -> None:
        self._batches = batches
        self._spool_dir = None if spool_dir is None else Path(spool_dir)
        self._num_classes = num_classes
        self._read: ArraySource | None = None

    def _source(self) -> ArraySource:
        if self._read is None:
            self._read = self._read_all()
        return self._read

    def _read_all(self) -> ArraySource:
        given = self._batches() if callable(self._batches) else self._batches
        spool = _Spool(self._spool_dir) if self._spool_dir is not None else None
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        shape: tuple[int, ...] | None = None
        for i, pair in enumerate(given):
            try:
                xb, yb = (np.asarray(a) for a in pair)
            except (TypeError, ValueError):
                raise DataSourceError(f"batch {i} is not an (x, y) pair") from None
            _checked(xb, yb, f"batch {i}")
            if shape is not None and xb.shape[1:] != shape:
                raise DataSourceError(f"batch {i} has samples of shape {xb.shape[1:]}, earlier ones {shape}")
            shape = xb.shape[1:]
            ys.append(yb)
            if spool is not None:
                spool.append(xb)
            else:
                xs.append(xb)
        if not ys:
            raise DataSourceError("the batches hold no samples")
        x = spool.array() if spool is not None else np.concatenate(xs)
        return ArraySource(x, np.concatenate(ys), num_classes=self._num_classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._source().input_shape

    @property
    def num_classes(self) -> int | None:
        return self._source().num_classes

    def __len__(self) -> int:
        return len(self._source())

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self._source().batches(batch_size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._source().arrays()


class ImageFolderSource:
    """``root/<label>/<image>``: one subfolder per label (sorted names are labels 0, 1, ...).

    Each image is converted to ``mode`` ("L" grey, "RGB"), resized to ``size`` (width, height;
    default: the first image's), scaled by ``scale`` (pixels 0..255 to 0..1 by default) and laid
    out channels-first (C, H, W) as the zoo's image models expect, or flattened with ``flatten``.
    Pillow is needed to read them (an optional extra: ``pip install pillow``)."""

    def __init__(self, root: str | os.PathLike[str], *, size: tuple[int, int] | None = None, mode: str = "RGB",
                 scale: float = 1 / 255, flatten: bool = False) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataSourceError(f"no image folder at {self.root}")
        if mode not in ("L", "RGB"):
            raise DataSourceError(f"image mode must be L or RGB, not {mode!r}")
        self.classes = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        self.files = [(f, label) for label, name in enumerate(self.classes)
                      for f in sorted((self.root / name).iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
        if not self.files:
            raise DataSourceError(f"{self.root} holds no images in label subfolders ({self.root}/<label>/*.png)")
        self.mode, self.scale, self.flatten = mode, scale, flatten
        self.size = size or self._open(self.files[0][0]).size

    def _open(self, path: Path):
        try:
            from PIL import Image
        except ModuleNotFoundError:
            raise DataSourceError("reading an image folder needs Pillow: pip install pillow") from None
        try:
            with Image.open(path) as image:
                return image.convert(self.mode)
        except OSError as e:
            raise DataSourceError(f"{path}: not a readable image ({e})") from None

    def _pixels(self, path: Path) -> np.ndarray:
        image = self._open(path)
        if image.size != tuple(self.size):
            image = image.resize(tuple(self.size))
        a = np.asarray(image, dtype=np.float32) * np.float32(self.scale)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)  # (C, H, W)
        return a.reshape(-1) if self.flatten else a

    @property
    def input_shape(self) -> tuple[int, ...]:
        channels, (w, h) = (1 if self.mode == "L" else 3), self.size
        return (channels * h * w,) if self.flatten else (channels, h, w)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.files)

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        step = max(1, batch_size)
        for i in range(0, len(self.files), step):
            part = self.files[i:i + step]
            yield np.stack([self._pixels(f) for f, _ in part]), np.array([lab for _, lab in part], np.int64)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        x = np.empty((len(self), *self.input_shape), np.float32)  # one array, filled in place
        for i, (f, _) in enumerate(self.files):
            x[i] = self._pixels(f)
        return x, np.array([lab for _, lab in self.files], np.int64)


class _Read:
    """A source read whole into an :class:`ArraySource` (``_array``) that answers for it."""

    _array: ArraySource

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._array.input_shape

    @property
    def num_classes(self) -> int | None:
        return self._array.num_classes

    def __len__(self) -> int:
        return len(self._array)

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self._array.batches(batch_size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._array.arrays()


class TabularSource(_Read):
    """A table of samples: ``.npz`` with arrays ``x`` and ``y`` (names set by ``x_key``/``y_key``),
    or a ``.npy``/``.csv`` table whose ``label_column`` (an index, or a CSV header name; default the
    last) is the label and whose other columns are the features. ``input_shape`` reshapes each row
    (e.g. 784 columns to (1, 28, 28)). Whole-number labels are classes; others a regression target."""

    def __init__(self, path: str | os.PathLike[str], *, label_column: int | str = -1, x_key: str = "x",
                 y_key: str = "y", input_shape: tuple[int, ...] | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataSourceError(f"no data file at {self.path}")
        suffix = self.path.suffix.lower()
        if suffix not in TABLE_SUFFIXES:
            raise DataSourceError(f"{self.path}: a table is a {', '.join(TABLE_SUFFIXES)} file")
        if suffix == ".npz":
            x, y = self._npz(x_key, y_key)
        else:
            table, header = self._csv() if suffix == ".csv" else (self._npy(), None)
            x, y = _split_label(table, _column(label_column, header, table.shape[1], self.path))
        if input_shape is not None:
            if math.prod(input_shape) != math.prod(x.shape[1:]):
                raise DataSourceError(f"{self.path}: rows of {math.prod(x.shape[1:])} values cannot take the "
                                      f"shape {tuple(input_shape)}")
            x = x.reshape(len(x), *input_shape)
        self._array = ArraySource(x, y)

    def _npz(self, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.path, allow_pickle=False) as data:
            missing = [k for k in (x_key, y_key) if k not in data.files]
            if missing:
                raise DataSourceError(f"{self.path} has no array {missing[0]!r} (it holds {', '.join(data.files)})")
            return _checked(data[x_key], data[y_key], str(self.path))

    def _npy(self) -> np.ndarray:
        table = np.load(self.path, allow_pickle=False, mmap_mode="r")
        if table.ndim != 2:
            raise DataSourceError(f"{self.path}: a .npy table is 2-D (rows, columns), got shape {table.shape}")
        return table

    def _csv(self) -> tuple[np.ndarray, list[str] | None]:
        with open(self.path, newline="") as f:
            first = next(csv.reader(f), None)
        if first is None:
            raise DataSourceError(f"{self.path} is empty")
        header = None if all(_is_number(c) for c in first) else [c.strip() for c in first]
        try:
            table = np.loadtxt(self.path, delimiter=",", skiprows=1 if header else 0, ndmin=2, dtype=np.float64)
        except ValueError as e:
            raise DataSourceError(f"{self.path}: every cell but the header must be a number ({e})") from None
        return table, header



#: Named vocabularies of the zoo's character models: a character's id is its index. Tiny
#: Shakespeare's 65 characters (``edge_sdk.data.shakespeare``: the sorted characters of its text).
VOCABULARIES: dict[str, str] = {
    "tinyshakespeare": "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
}


def vocabulary(spec: str) -> str:
    """The characters a vocabulary setting names: a :data:`VOCABULARIES` name, or a UTF-8 file
    holding them (its distinct characters, sorted, are the vocabulary)."""
    if spec in VOCABULARIES:
        return VOCABULARIES[spec]
    path = Path(spec)
    if not path.is_file():
        raise DataSourceError(f"vocabulary {spec!r} is neither a named one ({', '.join(VOCABULARIES)}) nor a file")
    return "".join(sorted(set(path.read_text(encoding="utf-8"))))


class TextSource(_Read):
    """A device's own UTF-8 text as next-character prediction samples: windows of ``context``
    character ids (every ``stride`` characters), each labelled with the id of the character after
    it, as the ``tinyshakespeare`` dataset's (``edge_sdk.data.shakespeare.windows``). Ids are
    positions in ``chars``, the model's vocabulary (:func:`vocabulary`); characters outside it are
    left out of the text and counted (``skipped``). ``num_classes`` is the vocabulary's size."""

    def __init__(self, path: str | os.PathLike[str], chars: str, *, context: int = 40, stride: int = 8) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataSourceError(f"no text file at {self.path}")
        if context < 1 or stride < 1 or not chars:
            raise DataSourceError(f"{self.path}: context and stride must be positive, and the vocabulary not empty")
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataSourceError(f"{self.path} is not UTF-8 text ({e})") from None
        table = {c: i for i, c in enumerate(chars)}
        ids = np.fromiter((table[c] for c in text if c in table), dtype=np.int64)
        self.skipped = len(text) - len(ids)
        if len(ids) <= context:
            raise DataSourceError(f"{self.path}: {len(ids)} characters of the model's vocabulary, fewer than one "
                                  f"sample of {context} and the character after it")
        from edge_sdk.data.shakespeare import windows

        self._array = ArraySource(*windows(ids, context, stride), num_classes=len(chars))



def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _column(label: int | str, header: list[str] | None, columns: int, path: Path) -> int:
    """The label column's index from an index (negative counts from the end) or a header name."""
    if isinstance(label, str) and not label.lstrip("-").isdigit():
        if header is None or label not in header:
            raise DataSourceError(f"{path} has no column named {label!r}"
                                  + (f" (columns: {', '.join(header)})" if header else " (it has no header row)"))
        return header.index(label)
    index = int(label)
    if not -columns <= index < columns or columns < 2:
        raise DataSourceError(f"{path}: label column {index} outside its {columns} columns")
    return index % columns


def _split_label(table: np.ndarray, column: int) -> tuple[np.ndarray, np.ndarray]:
    """Features (float32) and labels (int64 if every label is whole, else float32) of a table."""
    labels = np.asarray(table[:, column])
    x = np.delete(np.asarray(table), column, axis=1).astype(np.float32)
    whole = bool(np.all(np.isfinite(labels)) and np.all(labels == np.round(labels)) and labels.min() >= 0)
    return x, labels.astype(np.int64 if whole else np.float32)


def as_source(data: object, y: np.ndarray | None = None) -> DataSource:
    """Whatever an app hands a device, as a :class:`DataSource`: a source as it is, arrays ``x, y``
    (or an ``(x, y)`` tuple), an iterable of batches or a callable returning one."""
    if y is not None:
        return ArraySource(data, y)  # type: ignore[arg-type]
    if isinstance(data, DataSource):
        return data
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(a, np.ndarray) for a in data):
        return ArraySource(*data)
    if callable(data) or isinstance(data, Iterable):
        return BatchSource(data)  # type: ignore[arg-type]
    raise DataSourceError(f"cannot train on a {type(data).__name__}: give arrays x, y, a DataSource, "
                          "or batches of (x, y)")


def source_arrays(source: DataSource, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """A source's samples and labels as two arrays: its own (no copy) where it has them, else its
    batches concatenated."""
    own = getattr(source, "arrays", None)
    if callable(own):
        x, y = own()
    else:
        pairs = list(source.batches(batch_size))
        if not pairs:
            raise DataSourceError("the data source yielded no batches")
        x, y = np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
    return _checked(_array(x), _array(y), "the data source")
