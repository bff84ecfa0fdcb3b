"""Per-block update norms of committed rounds: the history the norm bound is set from
(orchestrator/aggregation/normbound.py)."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.store.database import Database, round_number

__all__ = ["Norms"]


class Norms:
    """``store.norms``: (round, device, block) -> the split it trained from and its update's norm."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, round: int, rows: Iterable[tuple[str, int, int, float]]) -> None:
        """Journal the per-block norms of a round's accepted updates: (device, block, split, norm).
        Recording a round again (after a crash before its completion) replaces its rows."""
        round = round_number(round)
        with self.db.write() as db:
            db.executemany(
                "INSERT OR REPLACE INTO norm_history(round, device_id, block, split, norm) VALUES (?, ?, ?, ?, ?)",
                [(round, d, int(b), int(s), float(n)) for d, b, s, n in rows])

    def history(self, per_block: int) -> list[dict]:
        """The last ``per_block`` norms of every block, from completed rounds only, oldest first."""
        if "norm_history" not in self.db.tables():  # a read-only view of a store older than the table
            return []
        rows = self.db.read(
            """SELECT * FROM (
                   SELECT n.*, ROW_NUMBER() OVER (PARTITION BY block ORDER BY n.round DESC, device_id) AS k
                   FROM norm_history n JOIN rounds r ON r.round = n.round WHERE r.finished IS NOT NULL)
               WHERE k <= ? ORDER BY round, device_id, block""", (per_block,))
        return [{"round": r["round"], "device_id": r["device_id"], "block": r["block"], "split": r["split"],
                 "norm": r["norm"]} for r in rows]
