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

A device started from its command line keeps them by default (``payload-cache = "auto"``,
:func:`payload_folder`): on disk, so the store costs the device's memory budget nothing but the payload
it reads back, which it would otherwise have downloaded into the same memory.

Delta downloads (docs/protocol.md, "Delta downloads") also need to know which payload a device holds
for each *slot* (a chunk or tail of the previous rounds that the next version replaces): the store
keeps that map too (:meth:`PayloadStore.slot`), in ``slots.json`` beside the payloads, so a device
process that restarts names its base and gets a delta rather than the whole payload. The file is
written atomically and read leniently: a damaged or hand-edited one is an empty map (a slot is a
guess that costs nothing if wrong: the server sends the whole payload for a base it does not hold).

A process that runs many devices (an emulator's lightweight worker: each device its own store) writes
a payload's bytes once: a store that keeps a payload another store of the process has written links
that file into its own folder (a hard link, :data:`_WRITTEN`) instead of writing the bytes again; each
store still holds, counts and evicts its own name for it, and reads it back checked. Where the link
cannot be made (the file was evicted meanwhile, another filesystem) the bytes are written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import OrderedDict
from pathlib import Path

from edge_sdk.fileio import atomic_write, remove_leftovers

__all__ = ["AUTO", "OFF", "PAYLOAD_CACHE_ENV", "PayloadStore", "payload_folder"]

#: ``payload-cache`` values other than a folder: a folder of the device's own under the user's cache
#: (the default), or no store.
AUTO, OFF = "auto", "off"
#: Where the ``auto`` folders go, when set (else ``payloads`` in :func:`edge_sdk.data.registry.cache_root`).
PAYLOAD_CACHE_ENV = "EDGETRAIN_PAYLOAD_CACHE"

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: The payload files this process's stores wrote, by sha256, the most recent last: another store of
#: the process links one of these instead of writing the same bytes (an emulator's worker of many
#: devices: 10 devices of a worker keeping a 1.6 MB model wrote 16 MB a round; now 1.6 MB).
_WRITTEN: OrderedDict[str, Path] = OrderedDict()
_WRITTEN_MAX = 64
_SLOTS = "slots.json"
#: The most slots kept: a model has a few chunks and a tail per split; more is not a device's map.
MAX_SLOTS = 256


def payload_folder(setting: str, server: str, device_id: str) -> Path | None:
    """The folder a device's ``payload-cache`` setting names: None for ``off`` (or empty); for ``auto``,
    ``<root>/<host>-<port>/<device id>``, where root is ``$EDGETRAIN_PAYLOAD_CACHE``, else ``payloads`` in
    the user's edgetrain cache (``$EDGETRAIN_CACHE``, else ``~/.cache/edgetrain``): one folder per server
    and device, kept across restarts, so two devices of a machine, or one device of two servers, never
    share a slot map. The JavaScript device names the same folder (``payloadFolder``)."""
    if setting in ("", OFF):
        return None
    if setting != AUTO:
        return Path(setting)
    from urllib.parse import urlsplit

    from edge_sdk.data.registry import cache_root

    url = urlsplit(server)
    port = url.port or (443 if url.scheme.lower() == "wss" else 80)
    root = os.environ.get(PAYLOAD_CACHE_ENV) or cache_root() / "payloads"
    return Path(root) / f"{(url.hostname or 'server').replace(':', '_')}-{port}" / device_id


class PayloadStore:
    """Payload bytes by sha256, at most ``max_bytes`` of them, in ``folder`` or in memory."""

    def __init__(self, folder: Path | str | None, max_bytes: int) -> None:
        self.folder = None if folder is None or str(folder) == "" else Path(folder)
        self.max_bytes = int(max_bytes)
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._memory: dict[str, bytes] = {}
        self._slots: dict[str, str] = {}  # slot -> sha256 of the payload held for it (delta downloads)
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
            self._slots = self._read_slots()

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
            _WRITTEN.pop(sha256, None)  # a damaged file is linked no more: the next store writes the bytes
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
            self._write(sha256, data)
        self._sizes[sha256] = size
        return True

    def _write(self, sha256: str, data: bytes | memoryview) -> None:
        """The payload's file in this store's folder: a link to the file another store of this
        process wrote for the same sha256, else the bytes written (atomically; checked when read back)."""
        target = self.folder / sha256  # type: ignore[operator]
        written = _WRITTEN.get(sha256)
        if written is not None and written != target and _link(written, target):
            return
        atomic_write(target, data, durable=False)
        _WRITTEN[sha256] = target
        _WRITTEN.move_to_end(sha256)
        while len(_WRITTEN) > _WRITTEN_MAX:
            _WRITTEN.popitem(last=False)

    def slot(self, name: str) -> str:
        """The sha256 of the payload held for slot ``name`` ("" if none, or no longer held)."""
        sha = self._slots.get(name, "")
        return sha if sha in self._sizes else ""

    def set_slot(self, name: str, sha256: str) -> None:
        """Slot ``name`` now holds payload ``sha256`` (which the store keeps); saved for a restart."""
        if sha256 not in self._sizes or self._slots.get(name) == sha256:
            return
        self._slots.pop(name, None)
        self._slots[name] = sha256
        while len(self._slots) > MAX_SLOTS:  # the oldest first
            del self._slots[next(iter(self._slots))]
        if self.folder is not None:
            atomic_write(self.folder / _SLOTS, json.dumps(self._slots).encode(), durable=False)

    def _read_slots(self) -> dict[str, str]:
        try:
            found = json.loads((self.folder / _SLOTS).read_text(encoding="utf-8"))  # type: ignore[operator]
        except (OSError, ValueError):
            return {}
        if not isinstance(found, dict):
            return {}
        return {k: v for k, v in list(found.items())[-MAX_SLOTS:]
                if isinstance(k, str) and isinstance(v, str) and _SHA256_HEX.fullmatch(v)}

    def drop(self, sha256: str) -> None:
        self._sizes.pop(sha256, None)
        self._memory.pop(sha256, None)
        if self.folder is not None:
            path = self.folder / sha256
            if _WRITTEN.get(sha256) == path:
                del _WRITTEN[sha256]
            path.unlink(missing_ok=True)

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


def _link(source: Path, target: Path) -> bool:
    """Make ``target`` a hard link to ``source``, atomically (a temporary name, then a rename, as
    :func:`~edge_sdk.fileio.atomic_write` replaces a file). False where it cannot be made: the source
    is gone (evicted by its store), the folders are on two filesystems, links are not supported."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.link.tmp")
    try:
        os.link(source, tmp)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True
