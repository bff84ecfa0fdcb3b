"""Writing a file so that readers see either the old file or the whole new one, never a part.

Every writer of the project that replaces a file others may read at the same time (dataset caches
shared by device processes, checkpoints, chunk caches, bundles, the runtime-memory cache) goes
through :func:`atomic_write`: the data goes to a temporary file in the same directory (a rename is
atomic only within one file system), which then replaces the target with ``os.replace``. With
``durable`` the file is fsynced before the rename and the directory after it, so that after a
power cut the target holds the old bytes or the new ones, not an empty file.

Temporary files are named ``.<target name>.<random>.tmp`` (:data:`TEMP_GLOB` matches them): a
crash between creating and renaming one leaves such a file behind, and an owner of a directory can
remove them with :func:`remove_leftovers` when nobody else writes there.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TEMP_GLOB", "atomic_write", "remove_leftovers"]

#: Glob pattern of the temporary files :func:`atomic_write` creates (and leaves only after a crash).
TEMP_GLOB = ".*.tmp"

BytesLike = bytes | bytearray | memoryview


def atomic_write(
    path: str | os.PathLike[str],
    data: BytesLike | None = None,
    *,
    writer: Callable[[BinaryIO], None] | None = None,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``data`` (or with what ``writer`` writes to the open binary file).

    Exactly one of ``data`` and ``writer`` is given. ``durable`` fsyncs the file and its directory
    (a checkpoint); without it the replacement is still atomic for readers but may be lost in a
    power cut (a cache that can be rebuilt). On any failure the temporary file is removed, the
    old file is left as it was, and the error propagates.
    """
    if (data is None) == (writer is None):
        raise TypeError("atomic_write needs exactly one of data and writer")
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if writer is not None:
                writer(f)
            else:
                f.write(data)  # type: ignore[arg-type]
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_directory(target.parent)


def remove_leftovers(directory: str | os.PathLike[str]) -> int:
    """Remove the temporary files of writes into ``directory`` that a crash interrupted.

    Only for a directory whose owner knows no write is under way (a store opening its own folder).
    Returns how many were removed."""
    removed = 0
    for leftover in Path(directory).glob(TEMP_GLOB):
        leftover.unlink(missing_ok=True)
        removed += 1
    return removed


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
