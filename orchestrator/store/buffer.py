"""The updates folded into the open buffer of a buffered run (docs/buffered.md, "What a restart keeps").

A buffered round holds its updates in memory until ``buffer_size`` of them step the model; a server
killed before then would lose updates its devices were told were taken. Each folded update is journaled
here as it is folded (its tensors as folded, already scaled by their staleness weight, and its weight),
before its device's ack, so a resumed run refolds exactly these into the buffer it reopens; the rows of
buffers at or before the last completed round are never refolded (a crash between the round's
completion and their removal folds nothing twice)."""

from __future__ import annotations

import json

from orchestrator.store.database import Database, round_number

__all__ = ["Buffer"]


class Buffer:
    """``store.buffer``: (buffer round, device, phase) -> an update as folded, its weight and journal row."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, round: int, device_id: str, phase: str, tensors: bytes, weight: float, info: dict) -> None:
        """Journal one folded update of buffer ``round`` (``tensors``: encode_tensors of it as folded)."""
        with self.db.write() as db:
            db.execute("INSERT OR REPLACE INTO buffer(round, device_id, phase, tensors, weight, info) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (round_number(round), device_id, phase, tensors, float(weight), json.dumps(info)))

    def held(self, round: int) -> list[dict]:
        """The updates journaled for buffer ``round``, in the order they were folded; none for a round
        already completed."""
        rows = self.db.read(
            """SELECT b.* FROM buffer b WHERE b.round = ? AND NOT EXISTS
                   (SELECT 1 FROM rounds r WHERE r.round = b.round AND r.finished IS NOT NULL)
               ORDER BY b.rowid""", (round_number(round),))
        return [{"device_id": r["device_id"], "phase": r["phase"], "tensors": bytes(r["tensors"]),
                 "weight": r["weight"], "info": json.loads(r["info"])} for r in rows]

    def forget(self, up_to: int) -> None:
        """Drop the rows of buffers up to ``up_to`` (their rounds are complete: never refolded)."""
        with self.db.write() as db:
            db.execute("DELETE FROM buffer WHERE round <= ?", (round_number(up_to),))
