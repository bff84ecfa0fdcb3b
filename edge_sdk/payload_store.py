"""The payloads a device keeps by content hash, so that none is downloaded twice.

A frozen chunk, a training graph, the tail's weights: each payload a device downloads is kept under
its sha256 in a folder (the ``payload-cache`` setting) within a byte budget
(``payload-cache-size``), the least recently used dropped first. Across rounds and reconnects, and
after the device process restarts, a payload whose sha256 an instruction names
(``Instruction.digests``) and the store holds is fetched with ``Fetch.held``, and the server sends
none of its bytes (docs/protocol.md, "Held payloads"). Bytes read back are checked against their
sha256 before use: a damaged file is dropped and the payload downloaded again.

Without a folder the store keeps payloads in memory, within the same budget (the budget counts
against nothing else: set it to what the device can spare).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from pathlib import Path

from edge_sdk.fileio import atomic_write, remove_leftovers

__all__ = ["PayloadStore"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class PayloadStore:
    """Payload bytes by sha256, at most ``max_bytes`` of them, in ``folder`` or in memory."""

    def __init__(self, folder: Path | str | None, max_bytes: int) -> None:
        self.folder = None if folder is None or str(folder) == "" else Path(folder)
        self.max_bytes = int(max_bytes)
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._memory: dict[str, bytes] = {}
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(self.folder)
            found = []
            for path in self.folder.iterdir():
                if _SHA256_HEX.fullmatch(path.name) and path.is_file():
                    st = path.stat()
                    found.append((st.st_mtime, path.name, st.st_size))
            for _, sha, size in sorted(found):
                self._sizes[sha] = size
            self._evict(0)

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def held_bytes(self) -> int:
        return sum(self._sizes.values())

    def get(self, sha256: str) -> bytes | None:
        """The held bytes of ``sha256`` (checked), or None."""
        if sha256 not in self._sizes:
            return None
        data = self._memory.get(sha256) if self.folder is None else self._read(sha256)
        if data is None or hashlib.sha256(data).hexdigest() != sha256:
            self.drop(sha256)
            return None
        self._sizes.move_to_end(sha256)
        if self.folder is not None:
            os.utime(self.folder / sha256)  # most recently used, for the next process too
        return data

    def put(self, sha256: str, data: bytes | memoryview) -> bool:
        """Keep ``data`` (whose sha256 the caller verified) unless it exceeds the whole budget."""
        size = len(data)
        if not _SHA256_HEX.fullmatch(sha256) or size > self.max_bytes:
            return False
        if sha256 in self._sizes:
            self._sizes.move_to_end(sha256)
            return True
        self._evict(size)
        if self.folder is None:
            self._memory[sha256] = bytes(data)
        else:
            atomic_write(self.folder / sha256, data, durable=False)  # checked when read back
        self._sizes[sha256] = size
        return True

    def drop(self, sha256: str) -> None:
        self._sizes.pop(sha256, None)
        self._memory.pop(sha256, None)
        if self.folder is not None:
            (self.folder / sha256).unlink(missing_ok=True)

    def _read(self, sha256: str) -> bytes | None:
        try:
            return (self.folder / sha256).read_bytes()  # type: ignore[operator]
        except OSError:
            return None

    def _evict(self, incoming: int) -> None:
        """Drop the least recently used payloads until ``incoming`` more bytes fit the budget."""
        total = sum(self._sizes.values())
        while self._sizes and total + incoming > self.max_bytes:
            sha, size = next(iter(self._sizes.items()))
            self.drop(sha)
            total -= size
