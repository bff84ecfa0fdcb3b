"""Device bundles: what a device provisioned offline needs to take part in training.

A bundle is an uncompressed tar archive holding ``manifest.json``, the frozen chunks of blocks
[0, split) as ONNX files, and the trainable tail (blocks [split, L)) as ``tail.npz``. A tail may
carry only some rows of a sparse table (a FedSubAvg submodel: the rows the device's data touches),
their values under the table's name and their indices under ``rows/<name>``; the manifest lists
them (``TailEntry.rows``) and :meth:`Bundle.tail` returns them as ``RowSparse``. The manifest
names every file with its sha256 and the shapes flowing between the chunks, and carries a digest
of its own content, so that any damaged or edited byte is caught before the device runs anything.
(The checksums detect accidents and tampering with a bundle in transit; they are not a signature.)

A bundle for a device without torch also carries the tail's training graph (``train_graph.bin``:
the payload an ONNX Runtime device receives, exported and verified against torch autograd), listed
in the manifest as ``train_graph``; :meth:`Bundle.train_graph` returns it for
:class:`edge_sdk.ort_trainer.OrtTail`. Bundles without one omit the field.

Online, a device started with a bundle (:class:`HeldPayloads`) takes the chunks and the training
graph from it instead of downloading them, whenever the server's payload has the same bytes. The
server names each payload by a digest of the bytes a device holds once it has it (``Instruction.digests``:
the sha256 of the payload as it travels, or of what a delta download rebuilds), and that depends on
the server's transfer settings. A bundle is therefore written for them (``Manifest.transfer``: the
chunk and graph codecs and the download delta): a chunk under a download delta is held as the bytes
the device would rebuild (its float32 weights on the delta's grid), and each entry records the digest
the server names it by (``served_sha256``); the device compares that with the instruction's digest
and fetches only the payloads whose digests differ.

Chunks are read one at a time, straight from the archive, so a weak device never holds all of
them (EmbracingFL, Algorithm 1). This module needs numpy only (ONNX Runtime to run what it reads).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_sdk.protocol.tensors import RowSparse

if TYPE_CHECKING:
    from edge_sdk.forward import ChunkRunner
    from edge_sdk.ort_trainer import TrainGraph

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_FORMAT_VERSION",
    "Bundle",
    "BundleError",
    "ChunkEntry",
    "EXACT_TRANSFER",
    "GraphEntry",
    "HeldPayload",
    "HeldPayloads",
    "Manifest",
    "ROWS_PREFIX",
    "RowsEntry",
    "TailEntry",
    "TensorEntry",
    "load_bundle",
    "manifest_digest",
]

BUNDLE_FORMAT = "edgetrain-bundle"
BUNDLE_FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_MAX_MANIFEST_BYTES = 16 * 1024 * 1024
_READ_BLOCK = 1 << 20
#: Key prefix, in the tail's .npz, of a row-selected table's row indices.
ROWS_PREFIX = "rows/"


class BundleError(ValueError):
    """A bundle is malformed, damaged, or inconsistent with its manifest."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ChunkEntry:
    """One frozen chunk: blocks [start, stop) as ONNX in ``file``; shapes are per sample."""

    id: str
    start: int
    stop: int
    file: str
    sha256: str
    size: int
    input_shape: tuple[int, ...]
    input_dtype: str
    output_shape: tuple[int, ...]
    output_dtype: str
    served_sha256: str = ""  # the digest the server names it by under Manifest.transfer ("": sha256)


@dataclass(frozen=True)
class RowsEntry:
    """A table of the tail carried as ``count`` of its ``num_rows`` rows (its tensor's first dimension)."""

    name: str
    num_rows: int
    count: int


@dataclass(frozen=True)
class TailEntry:
    """The trainable blocks [start, stop) as named arrays in ``file`` (numpy .npz)."""

    file: str
    sha256: str
    size: int
    start: int
    stop: int
    input_shape: tuple[int, ...]
    input_dtype: str
    tensors: tuple[TensorEntry, ...]
    rows: tuple[RowsEntry, ...] = ()


@dataclass(frozen=True)
class GraphEntry:
    """The training graph of blocks [split, L) (``edge_sdk.ort_trainer.TrainGraph`` bytes) in ``file``."""

    id: str  # the content id the server would ship it under (exporters.train_export.train_graph_id)
    file: str
    sha256: str
    size: int
    split: int
    served_sha256: str = ""  # the digest the server names it by under Manifest.transfer ("": sha256)


#: The transfer settings a bundle is written for when its manifest names none (every payload exact).
EXACT_TRANSFER = {"chunk_codec": "none", "graph_codec": "none", "download_delta": "none"}


@dataclass(frozen=True)
class Manifest:
    format_version: int
    model: str
    model_version: str
    num_blocks: int
    block_names: tuple[str, ...]
    split: int
    role: str | None
    device_class: str | None
    input_shape: tuple[int, ...]
    input_dtype: str
    export: dict[str, Any]
    chunks: tuple[ChunkEntry, ...]
    tail: TailEntry
    train_graph: GraphEntry | None = None  # for a device that trains without torch
    # The server transfer settings the payloads are held for (keys of EXACT_TRANSFER); empty: exact.
    transfer: dict[str, str] = field(default_factory=dict)

    def held_form(self, kind: str) -> str:
        """How the server's payloads of ``kind`` travel under :attr:`transfer`: ``delta int4``, or a codec."""
        t = {**EXACT_TRANSFER, **self.transfer}
        if kind == "chunk" and t["download_delta"] != "none":
            return f"delta {t['download_delta']}"
        return t["graph_codec" if kind == "train_graph" else "chunk_codec"]

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-ready data, with its ``format`` tag and ``digest``."""
        body = {"format": BUNDLE_FORMAT, **asdict(self)}
        if self.train_graph is None:
            del body["train_graph"]  # bundles without a graph read as they always have
        if not self.transfer:
            del body["transfer"]
        body = json.loads(json.dumps(body))  # tuples -> lists, as they come back from JSON
        body["digest"] = manifest_digest(body)
        return body

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1).encode("utf-8")

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Parse and check a manifest: format, digest, field types, and that its parts fit together."""
        if not isinstance(data, dict):
            raise BundleError("manifest must be a JSON object")
        if data.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"not an edgetrain bundle manifest (format {data.get('format')!r})")
        version = data.get("format_version")
        if version != BUNDLE_FORMAT_VERSION:
            raise BundleError(
                f"bundle format version {version!r} is not supported (this SDK reads {BUNDLE_FORMAT_VERSION})"
            )
        digest = manifest_digest(data)
        if data.get("digest") != digest:
            raise BundleError(
                f"manifest digest mismatch: recorded {data.get('digest')!r}, content gives {digest}"
                " (the manifest was edited or damaged)"
            )
        try:
            manifest = cls(
                format_version=_int(data, "format_version"),
                model=_str(data, "model"),
                model_version=_str(data, "model_version"),
                num_blocks=_int(data, "num_blocks"),
                block_names=tuple(_str_list(data, "block_names")),
                split=_int(data, "split"),
                role=_opt_str(data, "role"),
                device_class=_opt_str(data, "device_class"),
                input_shape=_shape(data, "input_shape"),
                input_dtype=_dtype(data, "input_dtype"),
                export=_dict(data, "export"),
                chunks=tuple(_chunk(c, i) for i, c in enumerate(_list(data, "chunks"))),
                tail=_tail(_dict(data, "tail")),
                train_graph=_graph(_dict(data, "train_graph")) if "train_graph" in data else None,
                transfer=_transfer(data),
            )
        except (KeyError, TypeError) as exc:
            raise BundleError(f"malformed manifest: {exc}") from None
        manifest._check_consistent()
        return manifest

    def _check_consistent(self) -> None:
        if self.num_blocks < 1 or len(self.block_names) != self.num_blocks:
            raise BundleError(f"manifest lists {len(self.block_names)} block names for {self.num_blocks} blocks")
        if not 0 <= self.split < self.num_blocks:
            raise BundleError(f"split {self.split} outside [0, {self.num_blocks})")
        # The chunks cover [0, split) in order, each output feeding the next input.
        position, shape, dtype = 0, self.input_shape, self.input_dtype
        for i, c in enumerate(self.chunks):
            if c.start != position or not c.start < c.stop:
                raise BundleError(f"chunk {i} covers blocks [{c.start}, {c.stop}), expected a range from {position}")
            if (c.input_shape, c.input_dtype) != (shape, dtype):
                raise BundleError(
                    f"chunk {i} takes {c.input_dtype}{list(c.input_shape)} but receives {dtype}{list(shape)}"
                )
            position, shape, dtype = c.stop, c.output_shape, c.output_dtype
        if position != self.split:
            raise BundleError(f"chunks cover blocks [0, {position}) but the split is {self.split}")
        t = self.tail
        if (t.start, t.stop) != (self.split, self.num_blocks):
            raise BundleError(f"tail covers blocks [{t.start}, {t.stop}), expected [{self.split}, {self.num_blocks})")
        if (t.input_shape, t.input_dtype) != (shape, dtype):
            raise BundleError(f"tail takes {t.input_dtype}{list(t.input_shape)} but receives {dtype}{list(shape)}")
        tail_blocks = set(self.block_names[self.split :])
        for tensor in t.tensors:
            parts = tensor.name.split(".")
            if len(parts) < 3 or parts[0] != "blocks" or parts[1] not in tail_blocks:
                raise BundleError(f"tail tensor {tensor.name!r} is not in the trainable blocks")
        shapes = {tensor.name: tensor.shape for tensor in t.tensors}
        for r in t.rows:
            shape = shapes.get(r.name)
            if shape is None or not shape or shape[0] != r.count or not 0 <= r.count <= r.num_rows:
                raise BundleError(f"tail rows of {r.name!r}: {r.count} of {r.num_rows} rows, but its tensor is {shape}")
        if len({r.name for r in t.rows}) != len(t.rows):
            raise BundleError("tail lists a table's rows twice")
        files = [c.file for c in self.chunks] + [t.file]
        if self.train_graph is not None:
            if self.train_graph.split != self.split:
                raise BundleError(f"training graph of split {self.train_graph.split} in a bundle of split {self.split}")
            files.append(self.train_graph.file)
        if len(set(files)) != len(files) or MANIFEST_NAME in files:
            raise BundleError(f"manifest file names are not distinct: {files}")


def manifest_digest(data: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a manifest without its ``digest`` field."""
    body = {k: v for k, v in data.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# -- manifest field readers (raise KeyError/TypeError, turned into BundleError above) ----------
def _get(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in data:
        raise KeyError(f"missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise TypeError(f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _int(data: dict[str, Any], key: str) -> int:
    return _get(data, key, int)


def _str(data: dict[str, Any], key: str) -> str:
    return _get(data, key, str)


def _opt_str(data: dict[str, Any], key: str) -> str | None:
    return None if data.get(key, None) is None else _str(data, key)


def _served(data: dict[str, Any]) -> str:
    """An entry's ``served_sha256`` (absent in bundles written before it: "")."""
    return _str(data, "served_sha256") if "served_sha256" in data else ""


def _transfer(data: dict[str, Any]) -> dict[str, str]:
    """The manifest's transfer settings (absent: {}, every payload exact), of known keys only."""
    if "transfer" not in data:
        return {}
    transfer = _dict(data, "transfer")
    if set(transfer) - set(EXACT_TRANSFER) or not all(isinstance(v, str) for v in transfer.values()):
        raise TypeError(f"field 'transfer' must map some of {sorted(EXACT_TRANSFER)} to names")
    return dict(transfer)


def _dict(data: dict[str, Any], key: str) -> dict[str, Any]:
    return _get(data, key, dict)


def _list(data: dict[str, Any], key: str) -> list[Any]:
    return _get(data, key, list)


def _str_list(data: dict[str, Any], key: str) -> list[str]:
    values = _list(data, key)
    if not all(isinstance(v, str) for v in values):
        raise TypeError(f"field {key!r} must list strings")
    return values


def _shape(data: dict[str, Any], key: str) -> tuple[int, ...]:
    values = _list(data, key)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TypeError(f"field {key!r} must list non-negative integers")
    return tuple(values)


def _dtype(data: dict[str, Any], key: str) -> str:
    name = _str(data, key)
    try:
        np.dtype(name)
    except TypeError:
        raise TypeError(f"field {key!r} names no numpy dtype: {name!r}") from None
    return name


def _chunk(data: Any, index: int) -> ChunkEntry:
    if not isinstance(data, dict):
        raise TypeError(f"chunk {index} must be an object")
    return ChunkEntry(
        id=_str(data, "id"),
        start=_int(data, "start"),
        stop=_int(data, "stop"),
        file=_str(data, "file"),
        sha256=_str(data, "sha256"),
        size=_int(data, "size"),
        input_shape=_shape(data, "input_shape"),
        input_dtype=_dtype(data, "input_dtype"),
        output_shape=_shape(data, "output_shape"),
        output_dtype=_dtype(data, "output_dtype"),
        served_sha256=_served(data),
    )


def _tail(data: dict[str, Any]) -> TailEntry:
    tensors = []
    for i, t in enumerate(_list(data, "tensors")):
        if not isinstance(t, dict):
            raise TypeError(f"tail tensor {i} must be an object")
        tensors.append(TensorEntry(name=_str(t, "name"), shape=_shape(t, "shape"), dtype=_dtype(t, "dtype")))
    rows = []
    for i, r in enumerate(data.get("rows", [])):  # absent in bundles of whole tables
        if not isinstance(r, dict):
            raise TypeError(f"tail rows entry {i} must be an object")
        rows.append(RowsEntry(name=_str(r, "name"), num_rows=_int(r, "num_rows"), count=_int(r, "count")))
    return TailEntry(
        file=_str(data, "file"),
        sha256=_str(data, "sha256"),
        size=_int(data, "size"),
        start=_int(data, "start"),
        stop=_int(data, "stop"),
        input_shape=_shape(data, "input_shape"),
        input_dtype=_dtype(data, "input_dtype"),
        tensors=tuple(tensors),
        rows=tuple(rows),
    )


def _graph(data: dict[str, Any]) -> GraphEntry:
    return GraphEntry(id=_str(data, "id"), file=_str(data, "file"), sha256=_str(data, "sha256"),
                      size=_int(data, "size"), split=_int(data, "split"), served_sha256=_served(data))


# -- reading a bundle ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Member:
    offset: int
    size: int


class Bundle:
    """A checked bundle on disk. Chunks and the tail are read from the archive when asked for."""

    def __init__(self, path: Path, manifest: Manifest, members: dict[str, _Member]) -> None:
        self.path = path
        self.manifest = manifest
        self._members = members

    def __len__(self) -> int:
        return len(self.manifest.chunks)

    def _read(self, name: str, sha256: str) -> bytes:
        member = self._members[name]
        with open(self.path, "rb") as f:
            f.seek(member.offset)
            data = f.read(member.size)
        if len(data) != member.size or hashlib.sha256(data).hexdigest() != sha256:
            raise BundleError(f"{name} in {self.path} changed since the bundle was loaded (sha256 mismatch)")
        return data

    def chunk_bytes(self, index: int) -> bytes:
        """ONNX bytes of chunk ``index`` (checked against its sha256 again as it is read)."""
        entry = self.manifest.chunks[index]
        return self._read(entry.file, entry.sha256)

    def iter_chunks(self) -> Iterator[bytes]:
        """The chunks' bytes in order, one at a time (feed to :func:`edge_sdk.forward.multi_step_forward`)."""
        for index in range(len(self.manifest.chunks)):
            yield self.chunk_bytes(index)

    def runner(self, index: int, *, threads: int = 1) -> ChunkRunner:
        """An ONNX Runtime session for chunk ``index``, checked against the manifest's shapes."""
        from edge_sdk.forward import ChunkRunner

        entry = self.manifest.chunks[index]
        runner = ChunkRunner(self.chunk_bytes(index), threads=threads)
        for what, got, want in (
            ("input", (runner.input_shape, str(runner.input_dtype)), (entry.input_shape, entry.input_dtype)),
            ("output", (runner.output_shape, str(runner.output_dtype)), (entry.output_shape, entry.output_dtype)),
        ):
            if not _fits(got, want):
                runner.close()
                raise BundleError(f"chunk {index} {what} is {got} in its ONNX but {want} in the manifest")
        return runner

    def train_graph(self) -> TrainGraph | None:
        """The tail's training graph (None in a bundle without one), checked against the manifest:
        an :class:`edge_sdk.ort_trainer.OrtTail` trains :meth:`tail` with it, without torch."""
        entry = self.manifest.train_graph
        if entry is None:
            return None
        from edge_sdk.ort_trainer import TrainGraph

        try:
            graph = TrainGraph.from_bytes(self._read(entry.file, entry.sha256))
        except ValueError as exc:
            raise BundleError(f"{entry.file}: {exc}") from exc
        m = self.manifest
        if (graph.model, graph.split) != (m.model, m.split):
            raise BundleError(f"{entry.file} trains {graph.model} from split {graph.split}, the bundle holds "
                              f"{m.model} from split {m.split}")
        names = {t.name for t in m.tail.tensors}
        if not set(graph.params) | set(graph.buffers) <= names:
            raise BundleError(f"{entry.file} names tensors the tail does not hold: "
                              f"{sorted(set(graph.params) | set(graph.buffers) - names)}")
        return graph

    def tail(self) -> dict[str, np.ndarray | RowSparse]:
        """The trainable blocks' tensors by state name, as the server sent them; a row-selected table
        as :class:`RowSparse` (what a model payload of rows holds: edge_sdk.trainer loads either)."""
        entry = self.manifest.tail
        data = self._read(entry.file, entry.sha256)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (OSError, ValueError) as exc:
            raise BundleError(f"{entry.file} is not a readable .npz: {exc}") from exc
        expected = {t.name: t for t in entry.tensors}
        row_keys = {ROWS_PREFIX + r.name: r for r in entry.rows}
        if set(arrays) != set(expected) | set(row_keys):
            raise BundleError(
                f"{entry.file} holds {sorted(arrays)} but the manifest lists {sorted(expected)} "
                f"and row indices {sorted(row_keys)}"
            )
        out: dict[str, np.ndarray | RowSparse] = {}
        for name, t in expected.items():
            array = arrays[name]
            if array.shape != t.shape or str(array.dtype) != t.dtype:
                raise BundleError(
                    f"tail tensor {name} is {array.dtype}{list(array.shape)}, manifest says {t.dtype}{list(t.shape)}"
                )
            out[name] = array
        for key, r in row_keys.items():
            idx = arrays[key]
            if (idx.dtype != np.int64 or idx.shape != (r.count,)
                    or (idx.size and (idx[0] < 0 or idx[-1] >= r.num_rows or np.any(np.diff(idx) <= 0)))):
                raise BundleError(f"{key} must be {r.count} increasing int64 rows in [0, {r.num_rows})")
            out[r.name] = RowSparse(idx, out[r.name], r.num_rows)
        return out


def _fits(got: tuple[tuple[int | None, ...], str], want: tuple[tuple[int, ...], str]) -> bool:
    (got_shape, got_dtype), (want_shape, want_dtype) = got, want
    return (
        got_dtype == want_dtype
        and len(got_shape) == len(want_shape)
        and all(g is None or g == w for g, w in zip(got_shape, want_shape))
    )


def _hash_member(f: Any, member: _Member) -> str:
    digest = hashlib.sha256()
    f.seek(member.offset)
    remaining = member.size
    while remaining:
        block = f.read(min(_READ_BLOCK, remaining))
        if not block:
            break
        digest.update(block)
        remaining -= len(block)
    return digest.hexdigest()


def load_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open and check a bundle: format version, manifest digest and consistency, every file and sha256.

    Raises :class:`BundleError` on any mismatch. Files are hashed in blocks, never held whole.
    """
    path = Path(path)
    try:
        with tarfile.open(path, "r:") as archive:
            members: dict[str, _Member] = {}
            for info in archive:
                if info.isdir():
                    continue  # a re-packed archive may list its folders
                if not info.isfile():
                    raise BundleError(f"{path}: archive entry {info.name!r} is not a regular file")
                if info.name in members:
                    raise BundleError(f"{path}: archive holds {info.name!r} twice")
                members[info.name] = _Member(info.offset_data, info.size)
    except FileNotFoundError:
        raise BundleError(f"{path}: no such bundle") from None
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{path}: not a bundle archive ({exc})") from exc

    if MANIFEST_NAME not in members:
        raise BundleError(f"{path}: {MANIFEST_NAME} is missing")
    with open(path, "rb") as f:
        m = members[MANIFEST_NAME]
        if m.size > _MAX_MANIFEST_BYTES:
            raise BundleError(f"{path}: {MANIFEST_NAME} is {m.size} bytes, more than a manifest can be")
        f.seek(m.offset)
        try:
            data = json.loads(f.read(m.size))
        except ValueError as exc:
            raise BundleError(f"{path}: {MANIFEST_NAME} is not valid JSON ({exc})") from exc
        manifest = Manifest.from_dict(data)

        files = {c.file: (c.sha256, c.size) for c in manifest.chunks}
        files[manifest.tail.file] = (manifest.tail.sha256, manifest.tail.size)
        if manifest.train_graph is not None:
            files[manifest.train_graph.file] = (manifest.train_graph.sha256, manifest.train_graph.size)
        missing = sorted(set(files) - set(members))
        if missing:
            raise BundleError(f"{path}: files listed in the manifest are missing: {missing}")
        extra = sorted(set(members) - set(files) - {MANIFEST_NAME})
        if extra:
            raise BundleError(f"{path}: files not listed in the manifest: {extra}")
        for name, (sha256, size) in files.items():
            member = members[name]
            if member.size != size:
                raise BundleError(f"{path}: {name} is {member.size} bytes, the manifest says {size}")
            actual = _hash_member(f, member)
            if actual != sha256:
                raise BundleError(f"{path}: sha256 of {name} is {actual}, the manifest says {sha256}")
    return Bundle(path, manifest, members)


# -- a bundle online ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldPayload:
    """A payload a bundle holds: a chunk of blocks [start, stop) or the training graph (start = stop =
    split), under the id the server ships it as, with its size and sha256 (its content address), and
    ``served``: the digest the server names it by under the bundle's transfer settings."""

    id: str
    kind: str
    start: int
    stop: int
    size: int
    sha256: str
    file: str
    served: str = ""

    @property
    def plain(self) -> bool:
        """Whether the server's digest names the held bytes themselves (not an encoding of them)."""
        return self.served == self.sha256


class HeldPayloads:
    """The chunks and training graph of a bundle, for a device that joins a server with it.

    A payload is found by its id, or (a chunk) by its block range when the server's version moved
    past the bundle's; the device uses the bundle's bytes when the server names the payload by the
    digest the bundle recorded for it (:meth:`matches`), and downloads it otherwise. Where it does not,
    :meth:`mismatch` says in one line whether the bundle was written for other transfer settings."""

    def __init__(self, bundle: Bundle) -> None:
        m = bundle.manifest
        self.bundle = bundle
        held = [HeldPayload(c.id, "chunk", c.start, c.stop, c.size, c.sha256, c.file, c.served_sha256 or c.sha256)
                for c in m.chunks]
        if m.train_graph is not None:
            g = m.train_graph
            held.append(HeldPayload(g.id, "train_graph", g.split, g.split, g.size, g.sha256, g.file,
                                    g.served_sha256 or g.sha256))
        self._by_id = {h.id: h for h in held}
        self._by_range = {(h.start, h.stop): h for h in held if h.kind == "chunk"}
        self._told: set[str] = set()  # payload kinds whose transfer mismatch was reported

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> HeldPayloads:
        """A bundle's payloads, the bundle checked first (:func:`load_bundle`)."""
        return cls(load_bundle(path))

    def serves(self, model: str, num_blocks: int) -> bool:
        """Whether the bundle holds parts of the server's model (its welcome's ``model`` and block
        count): a zoo name must be the bundle's; a ``package.module:factory`` is known by its blocks."""
        m = self.bundle.manifest
        return num_blocks == m.num_blocks and (":" in model or model == m.model)

    def find(self, payload_id: str, block_range: tuple[int, int] | None = None) -> HeldPayload | None:
        """The held payload the server may be shipping as ``payload_id`` (None: download it)."""
        found = self._by_id.get(payload_id)
        if found is None and block_range is not None:
            found = self._by_range.get((int(block_range[0]), int(block_range[1])))
        return found

    @staticmethod
    def matches(held: HeldPayload, digest: str) -> bool:
        """Whether the server's payload, named by ``digest`` (the instruction's), is the held one."""
        return bool(digest) and digest == held.served

    def mismatch(self, kind: str, meta: dict[str, Any]) -> str | None:
        """Why the bundle's payloads of ``kind`` cannot match the server's, once per kind: the server
        sends them under other transfer settings (``meta``: a transfer's, naming its codec) than the
        bundle was written for. None when the settings agree (the server's model moved on) or it was said."""
        codec = str(meta.get("codec", "none"))
        held = self.bundle.manifest.held_form(kind)
        same = held.startswith("delta") if codec == "delta" else held == codec
        if same or kind in self._told:
            return None
        self._told.add(kind)
        served = "delta-coded" if codec == "delta" else f"through codec {codec}"
        return (f"bundle {self.bundle.path}: the server sends {kind} payloads {served}, the bundle holds them for "
                f"{held}, so they are downloaded; write it for the server's settings "
                "(edgetrain bundle --chunk-codec/--graph-codec/--download-delta as edgetrain serve runs)")

    def read(self, held: HeldPayload) -> bytes:
        """The held payload's bytes, checked against their sha256 again as they are read."""
        return self.bundle._read(held.file, held.sha256)
