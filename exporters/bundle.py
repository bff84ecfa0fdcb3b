"""Write device bundles: a model's frozen chunks and trainable tail for a device provisioned offline.

The format (manifest, checksums, reading) is defined device-side in :mod:`edge_sdk.bundle`;
this module produces it from a layered model. A bundle for a device without torch also carries
the tail's training graph (``train_graph=True``), exported and verified like the server's.

A bundle is written for the server's transfer settings (``transfer``: its chunk and graph codecs and
download delta), so that a device holds each payload as it would after downloading it, under the
digest the server names it by (:func:`served`): a chunk under a download delta as the bytes a device
rebuilds from the whole delta payload (``Q(chunk)``, deterministic nearest rounding), a payload
through a lossless codec as its plain bytes, named by the sha256 of their encoding.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edge_sdk.bundle import (
    BUNDLE_FORMAT_VERSION,
    EXACT_TRANSFER,
    MANIFEST_NAME,
    ROWS_PREFIX,
    ChunkEntry,
    GraphEntry,
    Manifest,
    RowsEntry,
    TailEntry,
    TensorEntry,
)
from edge_sdk.fileio import atomic_write
from edge_sdk.models.layered import LayeredModel
from exporters.cache import ChunkCache, chunk_id
from exporters.onnx_export import ExportSettings, chunk_io, export_chunk
from exporters.train_export import TrainGraphCache

__all__ = ["TAIL_FILE", "TRAIN_GRAPH_FILE", "check_chunks", "cut_rows", "served", "tail_arrays", "write_bundle"]

TAIL_FILE = "tail.npz"
TRAIN_GRAPH_FILE = "train_graph.bin"


def check_chunks(chunks: Sequence[tuple[int, int]], split: int, num_blocks: int) -> list[tuple[int, int]]:
    """The chunks as a list, after checking that they cover blocks [0, split) in order without gaps."""
    if not 0 <= split < num_blocks:
        raise ValueError(f"split {split} outside [0, {num_blocks}): a device must train at least one block")
    ranges = [(int(a), int(b)) for a, b in chunks]
    position = 0
    for start, stop in ranges:
        if start != position or not start < stop:
            raise ValueError(f"chunks {ranges} must cover blocks [0, {split}) in order; [{start}, {stop}) does not follow {position}")
        position = stop
    if position != split:
        raise ValueError(f"chunks {ranges} cover blocks [0, {position}) but the split is {split}")
    return ranges


def tail_arrays(model: LayeredModel, split: int) -> dict[str, np.ndarray]:
    """State (parameters and buffers) of blocks [split, L) as numpy arrays, by state name."""
    state = model.state_dict()
    return {name: state[name].detach().cpu().numpy().copy() for name in model.state_names(split)}


def cut_rows(model: LayeredModel, split: int, tail: dict[str, np.ndarray],
             rows: Mapping[str, Sequence[int] | np.ndarray]) -> tuple[dict[str, np.ndarray], list[RowsEntry]]:
    """``tail`` with each sparse table named in ``rows`` cut to those rows (a FedSubAvg submodel),
    plus the row indices under ``rows/<table>``: a device with declared rows gets a bundle that
    grows with its rows, never with the tables (issue 12)."""
    tables = getattr(model, "sparse_inputs", {})
    out = dict(tail)
    entries: list[RowsEntry] = []
    for name in sorted(rows):
        if name not in tables:
            raise ValueError(f"{name!r} is not a sparse table of {model.name} (tables: {sorted(tables)})")
        if name not in tail:
            raise ValueError(f"{name!r} is frozen at split {split}: only trained tables are cut to rows")
        idx = np.unique(np.asarray(rows[name], dtype=np.int64))
        table = tail[name]
        if idx.size and (idx[0] < 0 or idx[-1] >= table.shape[0]):
            raise ValueError(f"rows of {name!r} outside [0, {table.shape[0]})")
        out[name] = np.ascontiguousarray(table[idx])
        out[ROWS_PREFIX + name] = idx
        entries.append(RowsEntry(name, int(table.shape[0]), int(idx.size)))
    return out, entries


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def served(kind: str, data: bytes, transfer: Mapping[str, str]) -> tuple[bytes, str]:
    """A payload of ``kind`` (``chunk`` or ``train_graph``) as a device holds it once downloaded under
    the server's ``transfer`` settings, and the digest the server's instruction names it by
    (orchestrator/server/payloads.py: a delta payload's ``recon``, else the sha256 of what travels)."""
    t = {**EXACT_TRANSFER, **transfer}
    if kind == "chunk" and t["download_delta"] != "none":
        from edge_sdk.codecs.delta import encode_delta
        from exporters.weights import onnx_regions

        _, recon = encode_delta(data, onnx_regions(data), None, int(t["download_delta"].removeprefix("int")))
        return recon, _sha256(recon)
    codec = t["graph_codec" if kind == "train_graph" else "chunk_codec"]
    if codec == "none":
        return data, _sha256(data)
    from edge_sdk.wire_codecs import encode_payload

    return data, _sha256(encode_payload(data, codec, kind))


def write_bundle(
    model: LayeredModel,
    plan_split: int,
    chunks: Sequence[tuple[int, int]],
    out: str | os.PathLike[str],
    *,
    version: str | int,
    device_class: str | None = None,
    role: str | None = None,
    settings: ExportSettings = ExportSettings(),
    cache: ChunkCache | None = None,
    rows: Mapping[str, Sequence[int] | np.ndarray] | None = None,
    train_graph: bool = False,
    graph_cache: TrainGraphCache | None = None,
    transfer: Mapping[str, str] | None = None,
) -> Manifest:
    """Export blocks [0, plan_split) as ``chunks`` and write them with the tail to the archive ``out``.

    ``rows`` (sparse table entry -> the rows the device's data touches) cuts each such table of the
    tail to those rows (:func:`cut_rows`), as the server's row selections do on the wire.

    With a ``cache`` (whose settings are then used), chunks already exported for this version are
    reused. The archive is written to a temporary file and moved into place, so ``out`` is either
    the old file or a complete bundle.

    ``train_graph`` adds the tail's training graph, for a device class that trains with ONNX Runtime
    (no torch): from ``graph_cache`` when given, else exported and verified here. A tail the export
    check refuses raises :class:`~exporters.onnx_export.ExportError` (plan that device at another
    split, or give it torch). Not with ``rows``: a row-selected table has no training graph.

    ``transfer`` names the server's transfer settings the payloads are held for (keys ``chunk_codec``,
    ``graph_codec``, ``download_delta``; :func:`served`); None: every payload exact, as a server with
    all of them ``none`` sends it.
    """
    if train_graph and rows:
        raise ValueError("a bundle with row-selected tables has no training graph (those tables train with torch)")
    ranges = check_chunks(chunks, plan_split, len(model))
    if cache is not None:
        settings = cache.settings
    transfer = {**EXACT_TRANSFER, **(transfer or {})}
    unknown = set(transfer) - set(EXACT_TRANSFER)
    if unknown:
        raise ValueError(f"transfer settings {sorted(unknown)} are not a bundle's (it knows {sorted(EXACT_TRANSFER)})")
    files: list[tuple[str, bytes]] = []
    entries = [_chunk_entry(model, index, start, stop, version, settings, cache, files, transfer)
               for index, (start, stop) in enumerate(ranges)]
    graph_entry = None
    if train_graph:
        gid, graph_bytes = (graph_cache or TrainGraphCache()).get_or_export(model, plan_split)
        files.append((TRAIN_GRAPH_FILE, graph_bytes))
        graph_entry = GraphEntry(id=gid, file=TRAIN_GRAPH_FILE, sha256=_sha256(graph_bytes), size=len(graph_bytes),
                                 split=plan_split, served_sha256=served("train_graph", graph_bytes, transfer)[1])
    model_in = chunk_io(model, 0, len(model))
    manifest = Manifest(
        format_version=BUNDLE_FORMAT_VERSION,
        model=model.name,
        model_version=str(version),
        num_blocks=len(model),
        block_names=tuple(model.block_names),
        split=plan_split,
        role=role,
        device_class=device_class,
        input_shape=model_in.input_shape,
        input_dtype=model_in.input_dtype,
        export=settings.as_dict(),
        chunks=tuple(entries),
        tail=_tail_entry(model, plan_split, rows or {}, files),
        train_graph=graph_entry,
        transfer=transfer,
    )
    manifest._check_consistent()
    _write_tar(Path(out), [(MANIFEST_NAME, manifest.to_json()), *files])
    return manifest


def _chunk_entry(model: LayeredModel, index: int, start: int, stop: int, version: str | int,
                 settings: ExportSettings, cache: ChunkCache | None, files: list[tuple[str, bytes]],
                 transfer: Mapping[str, str]) -> ChunkEntry:
    """Blocks [start, stop) exported (or taken from ``cache``), held as the server's ``transfer``
    settings deliver them (:func:`served`), added to ``files``, and their manifest entry."""
    if cache is not None:
        cid, data = cache.get_or_export(model, version, start, stop)
    else:
        cid, data = chunk_id(model.name, version, start, stop, settings), export_chunk(
            model, start, stop, settings=settings
        )
    data, digest = served("chunk", data, transfer)
    io_ = chunk_io(model, start, stop)
    name = f"chunks/{index:03d}-blocks-{start}-{stop}.onnx"
    files.append((name, data))
    return ChunkEntry(
        id=cid,
        start=start,
        stop=stop,
        file=name,
        sha256=_sha256(data),
        size=len(data),
        input_shape=io_.input_shape,
        input_dtype=io_.input_dtype,
        output_shape=io_.output_shape,
        output_dtype=io_.output_dtype,
        served_sha256=digest,
    )


def _tail_entry(model: LayeredModel, split: int, rows: Mapping[str, Sequence[int] | np.ndarray],
                files: list[tuple[str, bytes]]) -> TailEntry:
    """The trainable tail (cut to ``rows``) added to ``files``, and its manifest entry."""
    tail, row_entries = cut_rows(model, split, tail_arrays(model, split), rows)
    tail_bytes = _npz_bytes(tail)
    tail_in = chunk_io(model, split, len(model))
    files.append((TAIL_FILE, tail_bytes))
    return TailEntry(
        file=TAIL_FILE,
        sha256=_sha256(tail_bytes),
        size=len(tail_bytes),
        start=split,
        stop=len(model),
        input_shape=tail_in.input_shape,
        input_dtype=tail_in.input_dtype,
        tensors=tuple(TensorEntry(n, tuple(a.shape), str(a.dtype)) for n, a in tail.items()
                      if not n.startswith(ROWS_PREFIX)),
        rows=tuple(row_entries),
    )


def _write_tar(out: Path, files: list[tuple[str, bytes]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(f: BinaryIO) -> None:
        # Uncompressed: ONNX weights barely compress, and plain members can be read in place.
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for name, data in files:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o644
                archive.addfile(info, io.BytesIO(data))

    atomic_write(out, writer=write)
