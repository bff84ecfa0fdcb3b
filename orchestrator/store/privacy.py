"""The privacy ledger (and clips) as they stood after each round's release
(orchestrator/aggregation/privacy/), so a resumed run continues its accounting."""

from __future__ import annotations

import json
from collections.abc import Mapping

from orchestrator.store.database import Database, dumps, round_number

__all__ = ["Privacy"]


class Privacy:
    """``store.privacy``: round -> the ledger's state after that round's release."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, round: int, state: Mapping[str, object], *, durable: bool = False) -> None:
        """Journal the privacy ledger (and clips) as they stand after round ``round``'s release.
        Recording a round again (a retried attempt, or a crash before its completion) replaces it.
        ``durable``: synced to disk before it returns (a release that is about to be made)."""
        round = round_number(round)
        with self.db.write(durable=durable) as db:
            db.execute("INSERT OR REPLACE INTO privacy(round, state) VALUES (?, ?)", (round, dumps(state)))

    def accounted(self) -> dict | None:
        """The ledger as last journaled, its round completed or not (None: none yet). Ledgers are
        cumulative and a round is journaled before its noise is drawn (``PrivateRelease.release``), so
        this one counts every release the run ever made, including one cut short by a crash: a
        resumed run continues it, and its rerun of that round is accounted once more."""
        if "privacy" not in self.db.tables():
            return None
        row = self.db.one("SELECT state FROM privacy ORDER BY round DESC LIMIT 1")
        return None if row is None else json.loads(row["state"])

    def last(self) -> dict | None:
        """The privacy state journaled with the last completed round (None: none yet), which a
        resumed run continues: a round cut before its completion is run again, and accounted again."""
        if "privacy" not in self.db.tables():  # a read-only view of a store older than the table
            return None
        row = self.db.one("""SELECT p.state FROM privacy p JOIN rounds r ON r.round = p.round
                             WHERE r.finished IS NOT NULL ORDER BY p.round DESC LIMIT 1""")
        return None if row is None else json.loads(row["state"])
