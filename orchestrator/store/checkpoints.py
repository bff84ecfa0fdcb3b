"""Checkpoints: the model of each completed round, one ``.npz`` file per round, checked against the
sha256 the journal recorded when the round completed (:class:`~orchestrator.store.rounds.Rounds`).

A checkpoint is written with the project's atomic write (temp file, fsync, ``os.replace``, fsync of
the directory) before the journal marks its round complete. A checkpoint whose bytes no longer
match the journal (truncated, edited, deleted) cannot come from a crash under that protocol; it
means the disk or a person changed it, and reading it raises :class:`CheckpointCorrupted` naming
the file and the intact rounds, instead of silently resuming from an older model.
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edge_sdk.fileio import atomic_write, remove_leftovers
from orchestrator.store.database import Database, StoreError, round_number

__all__ = ["CheckpointCorrupted", "Checkpoints", "checkpoint_name", "write_checkpoint"]


class CheckpointCorrupted(StoreError):
    """A completed round's checkpoint is missing or does not match its recorded sha256."""


def checkpoint_name(round: int) -> str:
    return f"round-{round:06d}.npz"


_COMPLETED = "SELECT round, checkpoint, sha256 FROM rounds WHERE finished IS NOT NULL ORDER BY round DESC"


class Checkpoints:
    """The checkpoint files of a store (``directory``), the last ``keep`` of them kept (``keep=0``: a
    read-only store, which never creates, prunes or removes a file)."""

    def __init__(self, db: Database, directory: Path, *, keep: int) -> None:
        self.db, self.directory, self.keep = db, Path(directory), keep
        if keep:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_leftovers(self.directory)  # writes a crash interrupted

    def write(self, round: int, state: Mapping[str, np.ndarray]) -> tuple[str, str]:
        """Write round ``round``'s model durably; its file's name and sha256, for the journal."""
        path = self.directory / checkpoint_name(round)
        return path.name, write_checkpoint(path, state)

    def prune(self) -> None:
        """Delete checkpoints of completed rounds older than the last ``keep`` (journal rows stay)."""
        rows = self.db.read("SELECT checkpoint FROM rounds WHERE finished IS NOT NULL AND checkpoint IS NOT NULL "
                            "ORDER BY round DESC")
        keep = {r["checkpoint"] for r in rows[: self.keep]}
        for path in self.directory.glob("round-*.npz"):
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def last(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """The last completed round and its model, verified against the journal's sha256 (None: no
        round is complete). Raises :class:`CheckpointCorrupted` if that checkpoint is missing or damaged."""
        rows = self.db.read(_COMPLETED)
        if not rows:
            return None
        return rows[0]["round"], self._verified(rows[0], rows)

    def read(self, round: int) -> dict[str, np.ndarray]:
        """The model of completed round ``round``, verified against the journal's sha256. A LookupError
        when the round is not complete or its checkpoint was pruned (only the last ``keep`` are kept);
        :class:`CheckpointCorrupted` when the last completed round's is missing, or any is damaged."""
        round = round_number(round)
        rows = self.db.read(_COMPLETED)
        row = next((r for r in rows if r["round"] == round), None)
        if row is None:
            done = f"the last completed round is {rows[0]['round']}" if rows else "no round is complete"
            raise LookupError(f"round {round} is not a completed round of {self.directory.parent} ({done})")
        if row is not rows[0] and not (self.directory / row["checkpoint"]).is_file():
            kept = sorted(r["round"] for r in rows if (self.directory / r["checkpoint"]).is_file())
            raise LookupError(f"the checkpoint of round {round} is no longer in {self.directory} (a store keeps "
                              f"the last few; rounds with one: {', '.join(map(str, kept)) or 'none'})")
        return self._verified(row, rows)

    def _verified(self, row: sqlite3.Row, rows: list[sqlite3.Row]) -> dict[str, np.ndarray]:
        """The checkpoint of journal row ``row``, read and checked against its sha256."""
        path = self.directory / row["checkpoint"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointCorrupted(self._corruption(row["round"], path, "is missing", rows)) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != row["sha256"]:
            what = f"has sha256 {actual[:12]}..., the journal recorded {row['sha256'][:12]}..."
            raise CheckpointCorrupted(self._corruption(row["round"], path, what, rows))
        return _read_checkpoint(data, path)

    def _corruption(self, round: int, path: Path, what: str, rows: list[sqlite3.Row]) -> str:
        intact = [r["round"] for r in rows
                  if r["round"] != round and (self.directory / r["checkpoint"]).is_file()
                  and _sha256_file(self.directory / r["checkpoint"]) == r["sha256"]]
        hint = f"intact checkpoints remain for rounds {sorted(intact)}" if intact else "no other intact checkpoint remains"
        return (f"checkpoint of completed round {round} ({path}) {what}; it was changed or removed after it was written, "
                f"so the run cannot resume from it ({hint})")


def write_checkpoint(path: Path, state: Mapping[str, np.ndarray]) -> str:
    """Atomically and durably write ``state`` as .npz (edge_sdk.fileio.atomic_write); return its sha256."""
    buffer = io.BytesIO()
    arrays = {}
    for key, value in state.items():
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"checkpoint entry {key!r} is not a numeric array")
        arrays[key] = array
    np.savez(buffer, **arrays)
    data = buffer.getbuffer()
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(path, data)
    return digest


def _read_checkpoint(data: bytes, path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointCorrupted(f"checkpoint {path} matches its sha256 but cannot be read: {exc}") from exc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
