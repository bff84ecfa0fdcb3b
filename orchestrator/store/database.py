"""The one owner of a run's SQLite connection: WAL mode, the lock every repository shares,
transactions, and the schema's version (orchestrator/store/schema.py migrates it on a writable open).

Repositories (``orchestrator/store/*.py``) hold no connection of their own: they ask this object to
read (:meth:`Database.read`, :meth:`Database.one`) or to write in one transaction
(:meth:`Database.write`), so one store is one connection and one lock however many concerns it keeps.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = ["Database", "StoreError", "dumps", "round_number"]


class StoreError(RuntimeError):
    """The journal and the caller disagree (e.g. completing a round that was never begun)."""


class Database:
    """One SQLite connection in autocommit mode, shared by a store's repositories; safe from several threads.

    Writable: the journal is put in WAL mode (a reader never blocks the writer, a killed writer
    leaves the last commit intact) with ``synchronous=NORMAL``; :meth:`write` with ``durable=True``
    commits under ``synchronous=FULL`` (a round's completion). Read-only (``readonly=True``): opened
    with ``mode=ro``, so any write fails and nothing on disk changes.
    """

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path, self.readonly = Path(path), readonly
        #: Re-entrant: a repository may hold it across a file write and the commit that follows it.
        self.lock = threading.RLock()
        if readonly:
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       check_same_thread=False, timeout=30.0)
        else:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        if readonly:
            return
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            self._db.close()
            raise StoreError(f"could not put {self.path} in WAL mode (got {mode!r})")
        # NORMAL survives a killed process; write(durable=True) switches to FULL for its own commit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")

    # -- reading -------------------------------------------------------------------------------
    def read(self, sql: str, args: Sequence[object] = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self._db.execute(sql, args).fetchall()

    def one(self, sql: str, args: Sequence[object] = ()) -> sqlite3.Row | None:
        with self.lock:
            return self._db.execute(sql, args).fetchone()

    def tables(self) -> set[str]:
        """The tables the journal holds now (a read-only view of an older store may lack some)."""
        return {r["name"] for r in self.read("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def version(self) -> int:
        """The schema version this journal was migrated to (0: never; orchestrator/store/schema.py)."""
        return int(self.one("PRAGMA user_version")[0])

    # -- writing -------------------------------------------------------------------------------
    @contextmanager
    def write(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) under the lock; yields the
        connection to execute on. ``durable``: the commit is fsynced before this returns."""
        with self.lock:
            if durable:
                self._db.execute("PRAGMA synchronous=FULL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            finally:
                if durable:
                    self._db.execute("PRAGMA synchronous=NORMAL")

    def close(self) -> None:
        with self.lock:
            self._db.close()


def round_number(round: object) -> int:
    """A round number as the journal keys it: a non-negative integer (numpy's too)."""
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
        raise ValueError(f"round must be a non-negative integer, got {round!r}")
    return int(round)


def dumps(value: object) -> str:
    """JSON text of a value the journal keeps (numpy scalars and arrays, paths and sets allowed)."""
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (Path, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot store {type(value).__name__} in the journal: {value!r}")
