"""The server's memory across restarts: one SQLite journal and the model checkpoints, in one folder,
so a killed server resumes from its last completed round.

Layout of a run directory::

    journal.sqlite3            WAL-mode SQLite, schema versioned and migrated (schema.py)
    checkpoints/round-000012.npz

A :class:`Store` is one connection (:class:`~orchestrator.store.database.Database`, the only owner of
transactions and the schema) and one repository per concern, each an attribute::

    store.meta         run settings (model, strategy, seed, config)      meta.py
    store.devices      devices seen: profile, plan, first and last seen   devices.py
    store.rounds       rounds begun and completed (the journal)           rounds.py
    store.reports      each device's report of each round and phase       reports.py
    store.transfers    payloads moved each round                          reports.py
    store.checkpoints  the model of each completed round, sha256-checked  checkpoints.py
    store.credentials  device credentials with their identity keys        credentials.py
    store.proofs       the replay cache of accepted credential proofs     credentials.py
    store.closures     connections ended for cause                        closures.py
    store.norms        per-block update norms (the norm bound's history)  norms.py
    store.privacy      the privacy ledger after each release              privacy.py
    store.buffer       updates folded into a buffered run's open buffer   buffer.py
    store.paces        each device's measured pace (straggler pacing)     paces.py

Callers go through a repository (``store.rounds.complete(...)``, ``store.reports.all(round)``); SQL
lives in this package only (tests/test_sql_in_store_only.py). A feature that keeps something new adds
a repository module, a migration (schema.py) and an attribute here, not methods on :class:`Store`.

A round is complete when its journal row says so; that row is committed only after its checkpoint
is durably on disk (rounds.py): a crash at any point leaves either the new round complete with an
intact checkpoint, or the previous round as the last complete one.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.store.checkpoints import CheckpointCorrupted, Checkpoints, checkpoint_name, write_checkpoint
from orchestrator.store.closures import MAX_CLOSURES, Closures
from orchestrator.store.credentials import Credentials, Proofs
from orchestrator.store.database import Database, StoreError
from orchestrator.store.devices import Devices
from orchestrator.store.meta import Meta
from orchestrator.store.buffer import Buffer
from orchestrator.store.norms import Norms
from orchestrator.store.paces import Paces
from orchestrator.store.privacy import Privacy
from orchestrator.store.reports import Reports, Transfers
from orchestrator.store.rounds import Rounds
from orchestrator.store.schema import migrate

__all__ = ["CHECKPOINTS", "JOURNAL", "MAX_CLOSURES", "CheckpointCorrupted", "Store", "StoreError", "checkpoint_name",
           "write_checkpoint"]

JOURNAL = "journal.sqlite3"
CHECKPOINTS = "checkpoints"

#: Tables a journal holds from its first commit: a read-only view of a folder without them waits for its writer.
_READ_TABLES = {"meta", "devices", "rounds", "reports"}


class Store:
    """A run's journal and checkpoints in one folder: its repositories over one connection. Safe to
    use from several threads; ``keep``: how many of the newest checkpoints are kept."""

    def __init__(self, directory: Path | str, *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        db = Database(self.directory / JOURNAL)
        try:
            migrate(db, self.directory)
        except BaseException:
            db.close()
            raise
        self._repositories(db, keep)

    @classmethod
    def open_readonly(cls, directory: Path | str) -> Store:
        """The store in ``directory``, opened to read only: nothing is created, changed, migrated or
        pruned, so it may watch a run that is still going (the journal is in WAL mode: a reader never
        blocks the writer). Its repositories read as on a writable store (``rounds.all()``,
        ``reports.all()``, ``devices.all()``, ``meta.get()``, ``rounds.completed()``,
        ``checkpoints.last()``, ...); a write fails. Raises FileNotFoundError when ``directory``
        holds no journal yet."""
        store = cls.__new__(cls)
        store.directory = Path(directory)
        journal = store.directory / JOURNAL
        if not journal.is_file():
            raise FileNotFoundError(f"{store.directory} holds no journal ({JOURNAL})")
        db = Database(journal, readonly=True)
        if not _READ_TABLES <= db.tables():  # a writer is creating it this moment
            db.close()
            raise FileNotFoundError(f"{store.directory} holds no journal yet ({JOURNAL} has no tables)")
        store._repositories(db, keep=0)
        return store

    def _repositories(self, db: Database, keep: int) -> None:
        self.db = db
        self.meta, self.devices = Meta(db), Devices(db)
        self.checkpoints = Checkpoints(db, self.directory / CHECKPOINTS, keep=keep)
        self.rounds = Rounds(db, self.checkpoints)
        self.reports, self.transfers = Reports(db), Transfers(db)
        self.credentials, self.proofs, self.closures = Credentials(db), Proofs(db), Closures(db)
        self.norms, self.privacy, self.buffer = Norms(db), Privacy(db), Buffer(db)
        self.paces = Paces(db)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
