"""The journal of rounds: when each began, whom it selected, and its completion.

A round is complete when its journal row says so; that row is committed (``synchronous=FULL``)
only after its checkpoint is durably on disk (:meth:`Checkpoints.write
<orchestrator.store.checkpoints.Checkpoints.write>`), and it records the checkpoint's sha256. A
crash at any point therefore leaves either the new round complete with an intact checkpoint, or the
previous round as the last complete one: a completed round is never lost.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping

import numpy as np

from orchestrator.store.checkpoints import Checkpoints
from orchestrator.store.database import Database, StoreError, dumps, round_number

__all__ = ["Rounds", "require_open"]


class Rounds:
    """``store.rounds``: begin and complete rounds; read them back."""

    def __init__(self, db: Database, checkpoints: Checkpoints) -> None:
        self.db, self.checkpoints = db, checkpoints

    def begin(self, round: int, selected: list[str]) -> None:
        """Journal the start of a round. Re-beginning an incomplete round (after a crash) resets it
        (its reports are forgotten)."""
        round = round_number(round)
        with self.db.write() as db:
            row = db.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is not None and row["finished"] is not None:
                raise StoreError(f"round {round} is already complete; cannot begin it again")
            last = db.execute("SELECT MAX(round) AS r FROM rounds WHERE finished IS NOT NULL").fetchone()["r"]
            if last is not None and round <= last:
                raise StoreError(f"round {round} is not after the last completed round {last}")
            db.execute("DELETE FROM reports WHERE round = ?", (round,))
            db.execute("""INSERT INTO rounds(round, started, selected) VALUES (?, ?, ?)
                          ON CONFLICT(round) DO UPDATE SET started = excluded.started, selected = excluded.selected""",
                       (round, time.time(), dumps(list(selected))))

    def complete(self, round: int, state: Mapping[str, np.ndarray], metrics: Mapping[str, object]) -> None:
        """Write the round's checkpoint durably, then mark the round complete in the journal."""
        round = round_number(round)
        with self.db.lock:
            with self.db.write() as db:
                require_open(db, round)
            name, digest = self.checkpoints.write(round, state)
            # The checkpoint is durable; now the single commit that makes the round complete.
            with self.db.write(durable=True) as db:
                db.execute("UPDATE rounds SET finished = ?, metrics = ?, checkpoint = ?, sha256 = ? WHERE round = ?",
                           (time.time(), dumps(metrics), name, digest, round))
            self.checkpoints.prune()

    def completed(self) -> int:
        """The number of the last completed round, 0 if none: a run resumed from this store starts
        at the round after it. Reads the journal only (no checkpoint is read or checked)."""
        row = self.db.one("SELECT MAX(round) AS r FROM rounds WHERE finished IS NOT NULL")
        return int(row["r"] or 0)

    def all(self) -> list[dict]:
        """Every journaled round: started/finished times, selected devices, reports journaled, metrics,
        and its checkpoint's file and sha256."""
        rows = self.db.read("""SELECT r.*, (SELECT COUNT(*) FROM reports u WHERE u.round = r.round) AS reported
                               FROM rounds r ORDER BY r.round""")
        return [{"round": r["round"], "started": r["started"], "finished": r["finished"],
                 "complete": r["finished"] is not None, "selected": json.loads(r["selected"]),
                 "reported": r["reported"], "metrics": None if r["metrics"] is None else json.loads(r["metrics"]),
                 "checkpoint": r["checkpoint"], "sha256": r["sha256"]}
                for r in rows]


def require_open(db: sqlite3.Connection, round: int, late: str = "") -> None:
    """Raise :class:`StoreError` unless round ``round`` was begun and is not complete yet (``late``:
    what came late, for the message). Called inside the transaction that writes to the round."""
    row = db.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
    if row is None:
        raise StoreError(f"round {round} was not begun; call store.rounds.begin first")
    if row["finished"] is not None:
        raise StoreError(f"round {round} is already complete{late}")
