"""A content-addressed cache of exported ONNX chunks.

The weights change every round, so the server names each model state with a version; the frozen
chunks of version r are exported once and then streamed to every device selected in round r.
A chunk's id is the sha256 of (model name, model version, block range, export settings), so the
same id always means the same bytes, and a device or a bundle can name a chunk by it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from edge_sdk.fileio import atomic_write
from edge_sdk.models.layered import LayeredModel
from exporters.onnx_export import ExportSettings, export_chunk

__all__ = ["CacheStats", "ChunkCache", "chunk_id"]

_ID_FORMAT = 1  # bump when the canonical encoding below changes


def chunk_id(
    model_name: str, model_version: str | int, start: int, stop: int, settings: ExportSettings
) -> str:
    """sha256 (hex) of a canonical encoding of what determines a chunk's bytes.

    Versions compare as text: 3 and "3" name the same model version.
    """
    if isinstance(model_version, bool) or not isinstance(model_version, (str, int)):
        raise TypeError(f"model_version must be a str or int, not {type(model_version).__name__}")
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
        raise ValueError(f"bad block range [{start}, {stop})")
    key = {
        "format": _ID_FORMAT,
        "model": model_name,
        "version": str(model_version),
        "start": start,
        "stop": stop,
        "settings": settings.as_dict(),
    }
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was created (``exports`` counts calls to the exporter)."""

    hits: int
    misses: int
    exports: int
    disk_hits: int
    evictions: int
    entries: int
    bytes: int


class ChunkCache:
    """Exported chunks kept in memory (LRU under ``max_bytes``) and optionally in ``directory``.

    With a directory, every export is also written there (``<id>.onnx`` plus ``<id>.json``, which
    records the key and the sha256 of the bytes), so a restarted server serves them without
    exporting again; the directory is not bounded by ``max_bytes`` (see :meth:`prune_disk`).

    Safe to call from several threads (an asyncio server calls it through ``asyncio.to_thread``):
    exports run one at a time, and a chunk that several callers ask for at once is exported once.
    A hit on disk counts as a memory miss and a disk hit.
    An export runs on a copy of the model taken when it starts (exporting rewires and re-modes the
    module it runs on), so the caller's model is never touched; the caller must not change the
    model's weights while that copy is taken.
    """

    def __init__(
        self,
        max_bytes: int,
        directory: Path | str | None = None,
        *,
        settings: ExportSettings = ExportSettings(),
    ) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.settings = settings
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # guards the entries and counters
        self._export_lock = threading.Lock()  # one export at a time
        self._hits = self._misses = self._exports = self._disk_hits = self._evictions = 0

    # -- public API ----------------------------------------------------------------------
    def chunk_id(self, model: LayeredModel, version: str | int, start: int, stop: int) -> str:
        return chunk_id(model.name, version, start, stop, self.settings)

    def get_or_export(self, model: LayeredModel, version: str | int, start: int, stop: int) -> tuple[str, bytes]:
        """The id and ONNX bytes of blocks [start, stop) of ``model`` at ``version``; exports on a miss."""
        model._check_range(start, stop)
        cid = self.chunk_id(model, version, start, stop)
        data = self._lookup(cid, count=True)
        if data is not None:
            return cid, data
        with self._export_lock:
            data = self._lookup(cid, count=False)  # another caller may have exported it meanwhile
            if data is not None:
                return cid, data
            data = self._load_from_disk(cid)
            if data is None:
                data = export_chunk(copy.deepcopy(model), start, stop, settings=self.settings)
                with self._lock:
                    self._exports += 1
                self._store_on_disk(cid, data, model.name, version, start, stop)
            self._insert(cid, data)
        return cid, data

    def get(self, cid: str) -> bytes | None:
        """Bytes of an already exported chunk by id (memory, then disk), or None."""
        data = self._lookup(cid, count=False)
        if data is None:
            data = self._load_from_disk(cid)
            if data is not None:
                self._insert(cid, data)
        return data

    def __contains__(self, cid: object) -> bool:
        with self._lock:
            return cid in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                exports=self._exports,
                disk_hits=self._disk_hits,
                evictions=self._evictions,
                entries=len(self._entries),
                bytes=self._bytes,
            )

    def clear(self) -> None:
        """Drop the in-memory entries (the on-disk store stays)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def prune_disk(self, max_bytes: int) -> int:
        """Delete the oldest on-disk chunks until the store holds at most ``max_bytes``; returns how many.

        Chunks of past versions are never asked for again, so a long-running server calls this
        now and then (for instance once per round).
        """
        if self.directory is None:
            return 0
        with self._export_lock:
            files = sorted(self.directory.glob("*.onnx"), key=lambda p: p.stat().st_mtime)
            total = sum(p.stat().st_size for p in files)
            removed = 0
            for path in files:
                if total <= max_bytes:
                    break
                total -= path.stat().st_size
                path.with_suffix(".json").unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                removed += 1
            return removed

    # -- memory --------------------------------------------------------------------------
    def _lookup(self, cid: str, *, count: bool) -> bytes | None:
        with self._lock:
            data = self._entries.get(cid)
            if data is not None:
                self._entries.move_to_end(cid)
            if count:
                if data is None:
                    self._misses += 1
                else:
                    self._hits += 1
            return data

    def _insert(self, cid: str, data: bytes) -> None:
        with self._lock:
            if cid in self._entries or len(data) > self.max_bytes:
                return  # too large to keep: served once (and from disk if there is a directory)
            self._entries[cid] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= len(old)
                self._evictions += 1

    # -- disk ----------------------------------------------------------------------------
    def _paths(self, cid: str) -> tuple[Path, Path]:
        assert self.directory is not None
        return self.directory / f"{cid}.onnx", self.directory / f"{cid}.json"

    def _load_from_disk(self, cid: str) -> bytes | None:
        if self.directory is None:
            return None
        onnx_path, meta_path = self._paths(cid)
        try:
            meta = json.loads(meta_path.read_text())
            data = onnx_path.read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("id") != cid or meta.get("sha256") != hashlib.sha256(data).hexdigest():
            # A damaged entry: drop it and export again.
            onnx_path.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._disk_hits += 1
        return data

    def _store_on_disk(
        self, cid: str, data: bytes, model_name: str, version: str | int, start: int, stop: int
    ) -> None:
        if self.directory is None:
            return
        onnx_path, meta_path = self._paths(cid)
        meta = {
            "id": cid,
            "model": model_name,
            "version": str(version),
            "start": start,
            "stop": stop,
            "settings": self.settings.as_dict(),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
        # The bytes first, the record last: a record on disk means its bytes are complete.
        atomic_write(onnx_path, data)
        atomic_write(meta_path, json.dumps(meta, sort_keys=True, indent=1).encode())
