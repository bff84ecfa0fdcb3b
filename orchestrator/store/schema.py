"""The journal's schema, one migration per version, applied when a store is opened to write.

A store keeps its schema's version in SQLite's ``user_version``. Opening a writable store runs the
migrations after that version in one transaction (``BEGIN IMMEDIATE``: two processes opening an old
store at once migrate it once), so a store written by an older version opens, resumes and keeps its
rounds. A new repository that needs a table or a column adds a migration here, never edits an old one:

* version 1: the journal as the first store wrote it (meta, devices, rounds, reports, credentials,
  proofs, closures, transfers; norm history and privacy, which that version created on first use).
  A fresh store and a store of that version (``user_version`` 0, tables present) both reach it.
* version 2: each credential's identity key (``credentials.identity``, the Ed25519 public key its
  secure rounds are signed with, edge_sdk.secagg.binding), which that version kept in a JSON file
  beside the store (``secagg_roster.json``): the file's keys move into the journal and the file is removed.
* version 3: the updates folded into a buffered run's open buffer (``buffer``, orchestrator/store/buffer.py).
* version 4: each device's measured pace (``paces``, orchestrator/store/paces.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.store.database import Database, StoreError

__all__ = ["LEGACY_ROSTER", "MIGRATIONS", "VERSION", "migrate"]

log = logging.getLogger("edgetrain.store")

#: Where the previous version kept identity keys (device id -> hex), beside the journal.
LEGACY_ROSTER = "secagg_roster.json"

_VERSION_1 = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    plan TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    selected TEXT NOT NULL,
    metrics TEXT,
    checkpoint TEXT,
    sha256 TEXT
);
CREATE TABLE IF NOT EXISTS credentials (
    device_id TEXT PRIMARY KEY,
    key BLOB NOT NULL,
    samples INTEGER,
    enrolled REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS proofs (
    device_id TEXT NOT NULL,
    nonce TEXT NOT NULL,
    seen REAL NOT NULL,
    PRIMARY KEY (device_id, nonce)
);
CREATE INDEX IF NOT EXISTS proofs_seen ON proofs(seen);
CREATE TABLE IF NOT EXISTS closures (
    at REAL NOT NULL,
    device_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    round INTEGER,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    phase TEXT NOT NULL,
    received REAL NOT NULL,
    accepted INTEGER,
    info TEXT NOT NULL,
    PRIMARY KEY (round, device_id, phase)
);
CREATE TABLE IF NOT EXISTS transfers (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    payload_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    direction TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    held INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transfers_round ON transfers(round);
CREATE TABLE IF NOT EXISTS norm_history (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    block INTEGER NOT NULL,
    split INTEGER NOT NULL,
    norm REAL NOT NULL,
    PRIMARY KEY (round, device_id, block)
);
CREATE TABLE IF NOT EXISTS privacy (
    round INTEGER PRIMARY KEY,
    state TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class Migration:
    """What brings a journal from ``version - 1`` to ``version``: SQL statements, then ``then``
    (given the transaction's connection and the store's folder) for what SQL alone cannot do."""

    version: int
    sql: str
    then: Callable[[sqlite3.Connection, Path], None] | None = None

    def apply(self, db: sqlite3.Connection, directory: Path) -> None:
        for statement in self.sql.split(";"):
            if statement.strip():
                db.execute(statement)
        if self.then is not None:
            self.then(db, directory)
        db.execute(f"PRAGMA user_version = {int(self.version)}")


def _absorb_roster(db: sqlite3.Connection, directory: Path) -> None:
    """Move the identity keys of a legacy roster file into their credentials (a key already in the
    journal is kept: the file may be a leftover of a crash after its keys moved)."""
    path = directory / LEGACY_ROSTER
    if not path.is_file():
        return
    roster = json.loads(path.read_text(encoding="utf-8"))
    orphans = []
    for device_id, key in sorted(roster.items()):
        cur = db.execute("UPDATE credentials SET identity = ? WHERE device_id = ? AND identity IS NULL",
                         (bytes.fromhex(key), device_id))
        if cur.rowcount == 0 and db.execute("SELECT 1 FROM credentials WHERE device_id = ?",
                                            (device_id,)).fetchone() is None:
            orphans.append(device_id)
    if orphans:  # a key without a credential: no secret of it was issued by this store, nothing can use it
        log.warning("%s: identity keys of %d devices without a credential were dropped: %s", path, len(orphans),
                    ", ".join(orphans[:10]))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, _VERSION_1),
    Migration(2, "ALTER TABLE credentials ADD COLUMN identity BLOB", then=_absorb_roster),
    Migration(3, """CREATE TABLE IF NOT EXISTS buffer (
        round INTEGER NOT NULL,
        device_id TEXT NOT NULL,
        phase TEXT NOT NULL,
        tensors BLOB NOT NULL,
        weight REAL NOT NULL,
        info TEXT NOT NULL,
        PRIMARY KEY (round, device_id, phase)
    )"""),
    Migration(4, """CREATE TABLE IF NOT EXISTS paces (
        device_id TEXT PRIMARY KEY,
        overhead_s REAL NOT NULL,
        step_s REAL NOT NULL,
        updated REAL NOT NULL
    )"""),
)
VERSION = MIGRATIONS[-1].version


def migrate(db: Database, directory: Path) -> int:
    """Bring the journal in ``directory`` to :data:`VERSION`; returns the version it had. A journal
    from a newer version is refused (this code would not know its tables)."""
    with db.write() as conn:
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if found > VERSION:
            raise StoreError(f"{db.path} has schema version {found}; this edgetrain knows up to {VERSION}")
        for migration in MIGRATIONS[found:]:
            migration.apply(conn, directory)
        if found >= 2:
            _absorb_roster(conn, directory)  # a roster a crash left behind after its keys moved
    (directory / LEGACY_ROSTER).unlink(missing_ok=True)  # its keys are committed in the journal
    return found
